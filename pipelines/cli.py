"""Commands of the pipelines package: `bulk decompose`, `bulk issue` and `bench bulk`.

Spark and pyarrow are imported by the handlers only, so the rest of the CLI works
without the ``spark`` extra installed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from peer.arguments import CommandError, add_ca_file, bench_group, positive_int

if TYPE_CHECKING:
    from credentials.schema import Schema
    from pipelines.layout import Summary
    from pipelines.requests import Settings

MAX_CHUNK_SIZE = 2000  # the key server's limit of items per bulk request


def _schema(path: str) -> Schema:
    from credentials.schema import SchemaError, load_schema

    try:
        return load_schema(path)
    except OSError as exc:
        raise CommandError(f"cannot read the schema {path}: {exc.strerror}") from exc
    except SchemaError as exc:
        raise CommandError(f"schema {path}: {exc}") from exc


def _decompose(args: argparse.Namespace) -> int:
    try:
        from pipelines.layout import LayoutError
        from pipelines.local_job import run_local
        from pipelines.requests import Settings
    except ImportError as exc:
        raise CommandError(f"{exc.name} is missing; install the 'spark' extra") from exc

    settings = Settings(_schema(args.schema), args.fine_depth, args.max_credentials)
    source, out = Path(args.input), Path(args.output)
    try:
        if args.engine == "python":
            summary = run_local(settings, source, out, args.overwrite)
        else:
            summary = _decompose_spark(args, settings, source, out)
    except LayoutError as exc:
        raise CommandError(str(exc)) from exc
    print(summary.line())
    print(f"wrote {out / 'credentials'}, {out / 'rejected'} and {out / 'summary.json'}")
    return 0


def _decompose_spark(args: argparse.Namespace, settings: Settings, source: Path,
                     out: Path) -> Summary:
    try:
        from pyspark.errors import PySparkException

        from pipelines.spark_job import run_spark, spark_session
    except ImportError as exc:
        raise CommandError(f"{exc.name} is missing; install the 'spark' extra") from exc
    print(f"bulk decompose: starting Spark ({args.master})", file=sys.stderr, flush=True)
    spark = spark_session(args.master, args.partitions, args.driver_memory)
    try:
        return run_spark(spark, settings, source, out, args.overwrite)
    except PySparkException as exc:
        raise CommandError(f"Spark job failed: {str(exc).splitlines()[0]}") from exc
    finally:
        spark.stop()


def _issue(args: argparse.Namespace) -> int:
    from keyserver.client import KeyServerClient
    from pipelines.issue import IssueError, IssueOptions, issue_bulk
    from pipelines.keydir import KeyDirError
    from pipelines.layout import LayoutError

    if not args.admin_token:
        raise CommandError("the admin token is required: --admin-token or "
                           "$IBE_PUBSUB_ADMIN_TOKEN")
    if args.chunk_size > MAX_CHUNK_SIZE:
        raise CommandError(f"--chunk-size is at most {MAX_CHUNK_SIZE}")
    options = IssueOptions(args.chunk_size, args.chunk_rows, "next" if args.next_epoch else None)
    with KeyServerClient(args.server, args.admin_token, timeout=args.timeout,
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


def _bench(args: argparse.Namespace) -> int:
    from credentials.schema import default_schema
    from pipelines.bench import main

    schema = _schema(args.schema) if args.schema else default_schema()
    report = main(Path(args.json), schema, args.requests, args.master, args.partitions,
                  args.fine_depth)
    python, spark = report["python"], report["spark"]
    print(f"one Python process: {python['rows_per_s']:.0f} requests/s "
          f"({python['seconds']:.1f} s)")
    print(f"Spark {spark['master']}: {spark['rows_per_s']:.0f} requests/s "
          f"({spark['seconds']:.1f} s, plus {spark['startup_seconds']:.1f} s start-up)")
    print(f"ratio Spark/Python: {report['ratio']:.2f}")
    print(f"wrote {args.json} and {Path(args.json).with_suffix('.png')}")
    return 0


def _spark_options(parser: argparse.ArgumentParser, master: str) -> None:
    parser.add_argument("--master", default=master,
                        help=f"Spark master URL, e.g. spark://host:7077 (default {master})")
    parser.add_argument("--partitions", type=positive_int, default=8,
                        help="Spark shuffle partitions = parallel decomposition tasks "
                        "(default 8)")


def _decomposition_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--fine-depth", type=int, choices=range(0, 5), default=1,
                        help="split depth of subscribers' fine credentials (0: none; "
                        "default 1)")


def register(subparsers: argparse._SubParsersAction) -> None:
    bulk = subparsers.add_parser(
        "bulk", help="bulk enrolment: decompose requests on Spark, issue keys in chunks",
        description="Enrol many identities at once: `decompose` turns enrolment requests "
        "into credentials (Spark), `issue` gets their keys from the key server.")
    commands = bulk.add_subparsers(dest="bulk", metavar="STEP")

    decompose = commands.add_parser(
        "decompose", help="requests (CSV, JSON lines, Parquet) -> credentials (Parquet)",
        description="Read enrolment requests with the columns identity, role (subscriber or "
        "publisher) and predicate from CSV (with a header), JSON lines or Parquet, chosen by "
        "the extension. Write one row per credential to DIR/credentials, every request that "
        "fails validation with its reason to DIR/rejected, and the counts to "
        "DIR/summary.json.")
    decompose.add_argument("--schema", required=True, help="event-space schema (TOML)")
    decompose.add_argument("--input", required=True,
                           help="file or directory: .csv, .json/.jsonl/.ndjson or .parquet")
    decompose.add_argument("--output", required=True, help="output directory DIR")
    _spark_options(decompose, "local[*]")
    decompose.add_argument("--driver-memory", default="2g",
                           help="Spark driver memory (default 2g)")
    decompose.add_argument("--engine", choices=["spark", "python"], default="spark",
                           help="spark, or python: the same decomposition in this process "
                           "without a JVM (default spark)")
    _decomposition_options(decompose)
    decompose.add_argument("--max-credentials", type=positive_int, default=None,
                           help="cap the credentials per numeric attribute by coarsening "
                           "(default: exact cover)")
    decompose.add_argument("--overwrite", action="store_true",
                           help="replace an earlier decomposition in DIR")
    decompose.set_defaults(handler=_decompose)

    issue = commands.add_parser(
        "issue", help="send decomposed credentials to the key server, write key bundles",
        description="Send DIR/credentials to the key server's bulk issuance in chunks and "
        "write KEYDIR/<identity>.json per identity (secret keys; mode 0600). Resumable: "
        "run the same command again after an interruption and it issues nothing twice.")
    issue.add_argument("--server", required=True, help="key server base URL")
    # Checked in the handler, whose message points to the environment variable too.
    issue.add_argument("--admin-token", default=None,
                       help="the key server's admin token (required; better given as "
                       "$IBE_PUBSUB_ADMIN_TOKEN than on the command line)")
    add_ca_file(issue)
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

    bench = bench_group(subparsers).add_parser(
        "bulk", help="requests/s of the Spark decomposition vs one Python process",
        description="Decompose synthetic requests with Spark and with the same function "
        "in one plain Python process; write rows/s of both and their ratio as JSON and a "
        "PNG plot.")
    bench.add_argument("--json", default="bench/bulk.json",
                       help="output JSON file (the plot goes next to it as .png)")
    bench.add_argument("--requests", type=positive_int, default=1_000_000,
                       help="number of synthetic requests (default 1000000)")
    bench.add_argument("--schema", default=None, help="schema TOML (default: the stocks "
                       "example)")
    _spark_options(bench, "local[2]")
    _decomposition_options(bench)
    bench.set_defaults(handler=_bench)
