"""``ibe-pubsub bulk``: enrol many identities at once (``decompose``, ``issue``).

Spark and pyarrow are imported by the handlers only, so the rest of the CLI works
without the ``spark`` extra installed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ibe_pubsub.cli.arguments import (
    CommandError,
    add_fine_depth,
    add_key_server,
    add_partitions,
    add_schema,
    admin_token,
    positive_int,
    spark_extra,
)

if TYPE_CHECKING:
    from ibe_pubsub.pipelines import Settings, Summary

MAX_CHUNK_SIZE = 2000  # the key server's limit of items per bulk request
DEFAULT_MASTER = "local[*]"  # of `bulk decompose`
SHOWN_REJECTIONS = 5  # rejections printed after a decomposition; all are in its outputs


def _decompose(args: argparse.Namespace) -> int:
    with spark_extra():
        from ibe_pubsub.pipelines import LayoutError, Settings, run_local, write_csv

    settings = Settings(args.schema, args.fine_depth, args.max_credentials)
    source, out = Path(args.input), Path(args.output)
    rejected_csv = Path(args.rejected_csv) if args.rejected_csv else None
    if rejected_csv and not rejected_csv.parent.is_dir():
        raise CommandError(f"--rejected-csv: the directory {rejected_csv.parent} does not exist")
    try:
        if args.engine == "python":
            summary = run_local(settings, source, out, args.overwrite)
        else:
            summary = _decompose_spark(args, settings, source, out)
    except LayoutError as exc:
        raise CommandError(str(exc)) from exc
    print(summary.line())
    written = [out / "credentials", out / "rejected", out / "summary.json"]
    if rejected_csv:
        try:
            write_csv(out, rejected_csv)
        except OSError as exc:
            raise CommandError(f"cannot write {rejected_csv}: {exc.strerror}") from exc
        written.append(rejected_csv)
    print(f"wrote {', '.join(map(str, written[:-1]))} and {written[-1]}")
    return _decompose_status(summary, out, rejected_csv, args.allow_rejects)


def _decompose_status(summary: Summary, out: Path, rejected_csv: Path | None,
                      allow_rejects: bool) -> int:
    """0 if every request was accepted, or some were and --allow-rejects accepts the rest."""
    from ibe_pubsub.pipelines import first

    counted = ""
    if summary.rejected:
        for line in first(out, SHOWN_REJECTIONS):
            print(f"  rejected: {line}", file=sys.stderr)
        where = f"{rejected_csv} and {out / 'rejected'}" if rejected_csv else \
            f"{out / 'rejected'} (Parquet; --rejected-csv FILE writes them as CSV)"
        counted = f"{summary.rejected} of {summary.requests} request(s) rejected, all in {where}"
    if not summary.accepted:
        print(f"ibe-pubsub: error: no request was accepted; {counted or 'the input has none'}",
              file=sys.stderr)
        return 1
    if not summary.rejected:
        return 0
    if allow_rejects:
        print(f"{counted}; a partial run, as --allow-rejects allows", file=sys.stderr)
        return 0
    print(f"ibe-pubsub: error: {counted}; fix them, or pass --allow-rejects to accept the "
          "partial run", file=sys.stderr)
    return 1


def _decompose_spark(args: argparse.Namespace, settings: Settings, source: Path,
                     out: Path) -> Summary:
    master, remote = _where(args)
    with spark_extra():
        from pyspark.errors import PySparkException

        from ibe_pubsub.pipelines import (
            SPARK_LOG,
            SparkStartError,
            StageProgress,
            connect_session,
            prepare_output,
            request_files,
            run_spark,
            spark_session,
        )
    request_files(source)  # input and output problems show before the JVM's slow start
    prepare_output(out, args.overwrite)
    log = None if args.verbose or remote else out / SPARK_LOG
    if remote:
        print(f"bulk decompose: connecting to the Spark Connect server {remote}; the job "
              "runs there, and its logs are the server's", file=sys.stderr, flush=True)
    else:
        print(f"bulk decompose: starting Spark ({master}); "
              f"{f'its logs go to {log} (-v shows them here)' if log else 'its logs follow'}",
              file=sys.stderr, flush=True)
    try:
        spark = connect_session(remote, args.partitions) if remote else \
            spark_session(master, args.partitions, args.driver_memory, log)
    except SparkStartError as exc:
        raise CommandError(f"cannot start Spark: {exc}; --engine python decomposes without "
                           "Spark or Java") from exc
    try:
        with StageProgress(spark):
            return run_spark(spark, settings, source, out, args.overwrite)
    except PySparkException as exc:
        raise CommandError(f"Spark job failed: {str(exc).splitlines()[0]}"
                           f"{f' (details in {log})' if log else ''}") from exc
    finally:
        spark.stop()


def _where(args: argparse.Namespace) -> tuple[str, str | None]:
    """The master URL, or the Spark Connect server's (then the master is the server's);
    each from its flag, environment variable or configuration file, never both."""
    if args.master and args.remote:
        raise CommandError("--master and --remote exclude each other: --master starts "
                           "Spark here, --remote uses a Spark Connect server's; give one "
                           "(check IBE_PUBSUB_MASTER, IBE_PUBSUB_REMOTE and the "
                           "configuration file too)")
    if args.remote and not args.remote.startswith("sc://"):
        raise CommandError(f"--remote: expected sc://HOST:PORT, got {args.remote!r}")
    return args.master or DEFAULT_MASTER, args.remote


def _issue(args: argparse.Namespace) -> int:
    from ibe_pubsub.keyserver import KeyServerClient
    with spark_extra():
        from ibe_pubsub.pipelines import (
            IssueError,
            IssueOptions,
            KeyDirError,
            LayoutError,
            issue_bulk,
        )

    token = admin_token(args)
    if args.chunk_size > MAX_CHUNK_SIZE:
        raise CommandError(f"--chunk-size is at most {MAX_CHUNK_SIZE}")
    options = IssueOptions(args.chunk_size, args.chunk_rows, "next" if args.next_epoch else None)
    with KeyServerClient(args.server, token, timeout=args.timeout,
                         verify=args.ca_file or True) as client:
        try:
            report = issue_bulk(client, Path(args.input), Path(args.output), options)
        except (IssueError, KeyDirError, LayoutError) as exc:
            raise CommandError(str(exc)) from exc
    print(f"{report.identities} identities: {report.written} bundles written now, "
          f"{report.resumed} from an earlier run, {len(report.errors)} refused; "
          f"{report.chunks_sent} chunks sent in {report.seconds:.1f} s; "
          f"epoch(s) {', '.join(map(str, sorted(report.epochs))) or '-'}")
    if report.errors:
        for error in report.errors[:5]:
            print(f"  refused {error['identity']}: {error['error']}", file=sys.stderr)
        print(f"all refusals: {Path(args.output) / 'errors.jsonl'}", file=sys.stderr)
        return 1
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    bulk = subparsers.add_parser(
        "bulk", help="bulk enrolment: decompose requests on Spark, issue keys in chunks",
        description="Enrol many identities at once: `decompose` turns enrolment requests "
        "into credentials (Spark), `issue` gets their keys from the key server.")
    commands = bulk.add_subparsers(dest="bulk", metavar="STEP")

    decompose = commands.add_parser(
        "decompose", help="requests (CSV, JSON lines, Parquet) -> credentials (Parquet)",
        description="Read enrolment requests with the columns identity, role (subscriber or "
        "publisher) and predicate from CSV, JSON lines or Parquet, chosen by the extension. "
        "CSV: a header line naming the columns (any order, more allowed), then one request "
        'per line; quote a field that holds a comma with " ("" inside is one quote); an '
        'unquoted empty field is missing, a quoted empty predicate "" selects every event. '
        "Write one row per credential to DIR/credentials, every rejected request (a row "
        "that cannot be read, or fails validation) with its file, line and reason to "
        "DIR/rejected, the counts to DIR/summary.json, and Spark's own logs to "
        "DIR/spark.log (with --remote, the Spark Connect server keeps them). Exit status: "
        "0 if every request was accepted; 1 if some were "
        "rejected (0 with --allow-rejects) or none was accepted; 2 if it could not run "
        "(a wrong option or schema, a missing or unreadable input file, an output "
        "directory that holds a decomposition without --overwrite, Spark not starting).")
    add_schema(decompose, required=True)
    decompose.add_argument("--input", required=True,
                           help="file or directory: .csv, .json/.jsonl/.ndjson or .parquet")
    decompose.add_argument("--output", required=True, help="output directory DIR")
    decompose.add_argument("--master", default=None,
                           help="Spark master URL: local[N], spark://host:7077, "
                           f"k8s://https://host:443, ... (default {DEFAULT_MASTER}; not with "
                           "--remote)")
    decompose.add_argument("--remote", default=None, metavar="sc://HOST:PORT",
                           help="run the job through this Spark Connect server, on its "
                           "cluster, instead of starting Spark here (not with --master); "
                           "--input and --output must then be paths the server can reach")
    add_partitions(decompose)
    decompose.add_argument("--driver-memory", default="2g",
                           help="Spark driver memory (default 2g; a Spark Connect server's "
                           "driver has its own)")
    decompose.add_argument("--engine", choices=["spark", "python"], default="spark",
                           help="spark, or python: the same decomposition in this process, "
                           "no Java needed (default spark)")
    add_fine_depth(decompose)
    decompose.add_argument("--max-credentials", type=positive_int, default=None,
                           help="cap the credentials per numeric attribute by coarsening "
                           "(default: exact cover)")
    decompose.add_argument("--overwrite", action="store_true",
                           help="replace an earlier decomposition in DIR")
    decompose.add_argument("--rejected-csv", metavar="FILE", default=None,
                           help="also write the rejections as CSV: file, line, identity, "
                           "reason, row (default: only DIR/rejected, Parquet)")
    decompose.add_argument("--allow-rejects", action="store_true",
                           help="accept a partial run: exit 0 when some requests are "
                           "rejected, as long as one is accepted")
    decompose.set_defaults(handler=_decompose)

    issue = commands.add_parser(
        "issue", help="send decomposed credentials to the key server, write key bundles",
        description="Send DIR/credentials to the key server's bulk issuance in chunks and "
        "write KEYDIR/<identity>.json per identity (secret keys; mode 0600), the bundle its "
        "holder runs `peer run --bundle` or `publish --bundle` with. Resumable: run the "
        "same command again after an interruption and it issues nothing twice. Each epoch "
        "needs a new run into a new KEYDIR (--next-epoch in the grace window).")
    add_key_server(issue, admin=True)
    issue.add_argument("--input", required=True, help="the output DIR of `bulk decompose`")
    issue.add_argument("--output", required=True, help="directory KEYDIR for the bundles")
    issue.add_argument("--chunk-size", type=positive_int, default=50,
                       help=f"identities per request (default 50, at most {MAX_CHUNK_SIZE})")
    issue.add_argument("--chunk-rows", type=positive_int, default=4000,
                       help="credentials per request (default 4000)")
    issue.add_argument("--next-epoch", action="store_true",
                       help="issue keys for the next epoch (only in the grace window)")
    issue.add_argument("--timeout", type=float, default=300.0,
                       help="seconds to wait for one chunk (default 300)")
    issue.set_defaults(handler=_issue)
