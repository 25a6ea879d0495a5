"""``ibe-pubsub bench``: every benchmark, each a subcommand that writes JSON (and, all but
transport, a PNG plot). The measuring code is in :mod:`ibe_pubsub.evaluation`, imported by
the handlers only."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ibe_pubsub.cli.arguments import (
    CommandError,
    add_fine_depth,
    add_partitions,
    add_schema,
    int_list,
    non_negative_float,
    positive_duration,
    positive_int,
    positive_int_list,
    spark_extra,
    write_json_atomically,
)
from ibe_pubsub.credentials import notice
from ibe_pubsub.evaluation import (
    DEFAULT_EXPERIMENTS,
    DROPPER_KINDS,
    EXACTNESS_SCHEMAS,
    EXPERIMENTS,
    WARMUP_RATE,
    Sizes,
    pyplot,
)

if TYPE_CHECKING:
    from ibe_pubsub.evaluation import BenchSettings


def register(subparsers: argparse._SubParsersAction) -> None:
    group = subparsers.add_parser(
        "bench", help="benchmarks that write JSON (most also a PNG plot)",
        description="Benchmarks; each writes JSON (to bench/ unless told otherwise) and, "
        "all but transport, a PNG plot.")
    bench = group.add_subparsers(dest="bench", metavar="BENCHMARK")
    for add in (_register_crypto, _register_streams, _register_keyserver, _register_overlay,
                _register_exactness, _register_bulk, _register_transport,
                _register_monitoring, _register_e2e, _register_soak):
        add(bench)


# -- bench crypto, bench streams -----------------------------------------------------------

def _run_crypto(args: argparse.Namespace) -> int:
    from ibe_pubsub.evaluation import run_crypto_bench

    pyplot()  # without the bench extra, fail before the run rather than after it
    report = run_crypto_bench(Path(args.json), args.dims, args.bits, args.min_seconds, args.backend)
    print(f"{'algorithm':26} {'d':>2} {'bits':>4} {'ms':>9} {'floor ms':>9} {'ratio':>6}")
    for r in report["algorithms"]:
        print(f"{r['algorithm']:26} {r['d']:>2} {r['bits']:>4} {r['ms']:9.3f} "
              f"{r['floor_ms']:9.3f} {r['ratio']:6.2f}")
    raw = report["raw"]
    print(f"pairing {raw['pairing_ms']:.3f} ms; multi-pairing of 7 {raw['multi_pairing_7_ms']:.3f}"
          f" ms vs 7 pairings {raw['seven_pairings_ms']:.3f} ms")
    print(f"wrote {args.json} and {Path(args.json).with_suffix('.png')}")
    return 0


def _run_streams(args: argparse.Namespace) -> int:
    from ibe_pubsub.evaluation import GOALS, run_streams_bench

    pyplot()
    if not args.seconds > 0:
        raise CommandError("--seconds must be more than 0")
    report = run_streams_bench(Path(args.json), args.seconds, args.backend)
    print(f"{'scenario':9} {'publisher/s':>12} {'floor':>9} {'subscriber/s':>13} {'floor':>9}"
          f" {'goal':>6}")
    for name, r in report["scenarios"].items():
        print(f"{name:9} {r['publisher_events_per_s']:12.0f} "
              f"{r['publisher_floor_events_per_s']:9.0f} {r['subscriber_events_per_s']:13.0f}"
              f" {r['subscriber_floor_events_per_s']:9.0f} {GOALS.get(name, ''):>6}")
    print("events/s per core, from CPU time")
    print(f"wrote {args.json} and {Path(args.json).with_suffix('.png')}")
    return 0


def _output_and_backend(parser: argparse.ArgumentParser, default_json: str) -> None:
    parser.add_argument("--json", default=default_json, metavar="FILE",
                        help="output JSON file (the plot is written next to it as .png)")
    parser.add_argument("--backend", choices=["mcl", "charm"], default=None,
                        help="pairing backend (default: $IBE_PUBSUB_BACKEND or mcl)")


def _register_crypto(bench: argparse._SubParsersAction) -> None:
    crypto = bench.add_parser(
        "crypto", help="raw pairing operations and every algorithm of docs/scheme.md vs its floor",
        description="Measure the pairing backend's raw operations and each algorithm of "
        "docs/scheme.md for several attribute counts and widths; write JSON and a PNG plot.")
    crypto.add_argument("--dims", type=int_list, default=[1, 2, 4, 8],
                        help="attribute counts d, comma-separated (default 1,2,4,8)")
    crypto.add_argument("--bits", type=int_list, default=[8, 16, 32],
                        help="bits per attribute, comma-separated (default 8,16,32)")
    crypto.add_argument("--min-seconds", type=float, default=0.3,
                        help="minimum measuring time per operation (default 0.3)")
    _output_and_backend(crypto, "bench/crypto.json")
    crypto.set_defaults(handler=_run_crypto)


def _register_streams(bench: argparse._SubParsersAction) -> None:
    streams = bench.add_parser(
        "streams", help="a stream's publisher and subscriber events/s per core, four scenarios",
        description="Measure events per second per core (CPU time) of a stream's publisher "
        "(encrypt and sign) and subscriber (decode, decrypt, verify) on the stock schema, in "
        "four scenarios: fresh (no reuse), reused (every entry reused), ticks (fixed symbol, "
        "price a random walk of cent steps from 150.00, random trade sizes) and ticks8 (the "
        "same with 8 price and 8 volume bits), each against the floor of its public-key "
        "operations priced in the same run. Writes JSON and a PNG plot.")
    streams.add_argument("--seconds", type=float, default=3.0,
                         help="CPU seconds of publishing per scenario (default 3)")
    _output_and_backend(streams, "bench/streams.json")
    streams.set_defaults(handler=_run_streams)


# -- bench keyserver -------------------------------------------------------------------------

def _run_keyserver(args: argparse.Namespace) -> int:
    from ibe_pubsub.evaluation import BenchSettings, run_bench

    settings = BenchSettings(clients=args.clients, seconds=args.seconds,
                             subscription=args.subscription, max_credentials=args.max_credentials,
                             workers=args.workers)
    if args.replicas is not None:
        return _bench_replicas(args, settings)
    if not args.no_plot:
        pyplot()
    plot = None if args.no_plot else Path(args.plot or Path(args.json).with_suffix(".png"))
    if args.threshold is not None:
        from ibe_pubsub.evaluation import run_threshold_bench

        result = run_threshold_bench(settings, *args.threshold, Path(args.json), plot)
    else:
        result = run_bench(settings, Path(args.json), plot)
    print(json.dumps(result["summary"], indent=1))
    print(f"wrote {args.json}" + (f" and {plot}" if plot else ""))
    return 0


def _bench_replicas(args: argparse.Namespace, settings: BenchSettings) -> int:
    from ibe_pubsub.evaluation import PostgresUnavailable, run_replica_bench

    cores = args.cores or list(range(args.replicas))
    if len(cores) < args.replicas:
        raise CommandError(f"--cores lists {len(cores)} cores for {args.replicas} replicas")
    try:
        result = run_replica_bench(settings, args.replicas, cores, args.postgres_url,
                                   Path(args.json))
    except (PostgresUnavailable, ValueError) as exc:
        raise CommandError(str(exc)) from exc
    print(json.dumps(result["summary"], indent=1))
    print(f"wrote {args.json}")
    return 0


def _cores(text: str) -> list[int]:
    try:
        cores = [int(c) for c in text.split(",")]
    except ValueError:
        cores = []
    if not cores or min(cores) < 0:
        raise argparse.ArgumentTypeError(f"expected core numbers like 0,1, got {text!r}")
    return cores


def _threshold(text: str) -> tuple[int, int]:
    t, of, n = text.partition("-of-")
    if not of or not t.isdigit() or not n.isdigit() or not 2 <= int(t) <= int(n) or int(n) < (
            2 * int(t) - 1) or int(n) > 16:
        raise argparse.ArgumentTypeError(f"expected T-of-N with 2 <= T, 2T-1 <= N <= 16, like "
                                         f"3-of-5, got {text!r}")
    return int(t), int(n)


def _register_keyserver(bench: argparse._SubParsersAction) -> None:
    p = bench.add_parser(
        "keyserver", help="credential keys per second over HTTP vs. key generation alone",
        description="Starts a key server, measures credential keys issued per second by "
        "key generation alone (the floor, all cores) and over HTTP with concurrent "
        "clients, and p50/p99 enrolment latency.")
    p.add_argument("--json", default="bench/keyserver.json", metavar="FILE",
                   help="output JSON file")
    p.add_argument("--plot", help="output PNG (default: next to --json)")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.add_argument("--clients", type=positive_int, default=32, help="concurrent HTTP clients")
    p.add_argument("--seconds", type=float, default=20.0, help="duration of each phase")
    p.add_argument("--workers", type=positive_int, help="issuer processes (default: cores)")
    p.add_argument("--subscription", default='symbol prefix "IB" and price in [10, 20]',
                   help="the subscription every client enrols")
    p.add_argument("--max-credentials", type=positive_int, default=4,
                   help="credentials per numeric attribute")
    p.add_argument("--replicas", type=positive_int, metavar="N",
                   help="instead: 1 replica, then N replicas of one key store on one "
                   "PostgreSQL database, each pinned to one core (taskset) with one issuer "
                   "worker; writes keys/s of both and their ratio (no plot)")
    p.add_argument("--threshold", type=_threshold, metavar="T-of-N",
                   help="instead: a threshold deployment of N members on 127.0.0.1 (e.g. "
                   "3-of-5) against the single server, same clients: client-observed keys/s, "
                   "latency, and CPU seconds per combined key against T single-server keys")
    p.add_argument("--cores", type=_cores, metavar="LIST",
                   help="with --replicas: the cores to pin them to, e.g. 2,3 (default 0..N-1)")
    p.add_argument("--postgres-url", metavar="URL",
                   help="with --replicas: a PostgreSQL server where the benchmark may create "
                   "databases (default: a throwaway cluster from the local initdb/pg_ctl)")
    p.set_defaults(handler=_run_keyserver)



# -- bench overlay ---------------------------------------------------------------------------

def _names(text: str) -> list[str]:
    return _choices(EXPERIMENTS, "experiment(s)")(text)


def _run_overlay(args: argparse.Namespace) -> int:
    from ibe_pubsub.evaluation import Bench
    from ibe_pubsub.overlay import LatencyModel

    pyplot()
    try:
        sizes = Sizes(
            peers=tuple(args.peers), max_children=args.max_children,
            degree_peers=args.degree_peers, degrees=tuple(args.degrees),
            dissemination_peers=tuple(args.dissemination_peers), publishers=args.publishers,
            events_per_publisher=args.events_per_publisher,
            routing_peers=tuple(args.routing_peers),
            routing_credentials=args.routing_credentials,
            routing_fine_depth=args.routing_fine_depth,
            tree_subscribers=tuple(args.tree_subscribers), subscribers=tuple(args.subscribers),
            encryption_events=args.encryption_events,
            calibration_peers=args.calibration_peers,
            calibration_events=args.calibration_events,
            loopback_peers=args.loopback_peers, loopback_events=args.loopback_events,
            droppers=tuple(args.droppers), dropper_subscribers=args.dropper_subscribers,
            dropper_events=args.dropper_events, dropper_seeds=args.dropper_seeds,
            dropper_kinds=tuple(args.dropper_kinds))
        if args.latency_median_ms <= 0 or args.latency_sigma < 0 or args.workers < 1:
            raise CommandError("latency median must be > 0, sigma >= 0 and workers >= 1")
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    bench = Bench(Path(args.out), sizes, LatencyModel(args.latency_median_ms / 1e3,
                                                      args.latency_sigma),
                  seed=args.seed, workers=args.workers, min_seconds=args.min_seconds,
                  experiments=args.experiments or DEFAULT_EXPERIMENTS)
    summary = bench.run()
    if args.graph:
        _graph(args)
    for name, by_stat in summary.get("overhead_ms", {}).items():
        for stat, values in by_stat.items():
            shown = ", ".join("-" if v is None else f"{v:.0f}" for v in values)
            print(f"security overhead, {name} ({stat}): {shown} ms")
    if summary.get("loopback_ratio"):
        print(f"loopback: real processes / simulator mean dissemination delay = "
              f"{summary['loopback_ratio']:.2f}")
    for label, row in summary.get("droppers", {}).items():
        print(f"droppers, {label}: honest delivery {row['undefended']:.1%} undefended, "
              f"{row['before']:.1%} with the former defaults, {row['defended']:.1%} with "
              f"today's, event messages x{row['event_message_ratio']:.2f}; dropping parents "
              f"that owed an event replaced: {row['owed_replaced_share']:.0%}, "
              + ("90 % not within the run" if row["owed_replaced_90_s"] is None
                 else f"90 % within {row['owed_replaced_90_s']:.1f} s of the first each owed"))
    if "ours_ops_per_event" in summary:
        print(f"our encryption: {summary['ours_ops_per_event']:.0f} operations per event "
              "whatever the number of subscribers")
    print(f"wrote {args.out}/*.json and *.png in {summary['seconds']} s")
    if "loopback_error" in summary:
        raise CommandError(f"the loopback cross-check failed: {summary['loopback_error']}")
    return 0


def _graph(args: argparse.Namespace) -> None:
    from ibe_pubsub.credentials import default_schema
    from ibe_pubsub.evaluation import Setting, draw_run
    from ibe_pubsub.overlay import CostTable, LatencyModel

    setting = Setting(default_schema(), CostTable.default(),
                      LatencyModel(args.latency_median_ms / 1e3, args.latency_sigma), args.seed)
    draw_run(setting, args.graph_subscribers, args.max_children, args.graph)
    print(f"wrote {args.graph}")


def _dropper_kinds(text: str) -> list[str]:
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    if not kinds or any(k not in DROPPER_KINDS for k in kinds):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated kinds among {_csv(DROPPER_KINDS)}, got {text!r}")
    return kinds


def fraction_list(text: str) -> list[float]:
    """Comma-separated fractions in [0, 1), e.g. ``0,0.1,0.2``."""
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or any(not 0.0 <= v < 1.0 for v in values):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated fractions in [0, 1), got {text!r}")
    return values


def _csv(values: tuple[object, ...]) -> str:
    return ",".join(map(str, values))


def _register_overlay(bench: argparse._SubParsersAction) -> None:
    d = Sizes()
    p = bench.add_parser(
        "overlay", help="connection and dissemination delays, OHF vs MCR, encryption "
        "operations per event (the report's section 8, and more)",
        description="Run the evaluation: crypto costs measured on real cryptography, then "
        "the simulator (secure vs plaintext) for connection delay vs peers and vs out-degree, "
        "dissemination delay vs peers, OHF vs MCR, tree shape in the stock schema, "
        "encryption operations per event vs "
        "subscribers for four schemes, a cross-check against real peer processes on "
        "loopback, and delivery when a fraction of subscribers drop the events they should "
        "forward, with the repair off and on; on request (--experiments streams), "
        "dissemination at ten times the report's event rate on real cryptography, without "
        "and with streams (the first --dissemination-peers size; slow). Writes JSON and a "
        "PNG plot per experiment into --out.")
    p.add_argument("--out", default="bench/overlay", help="output directory")
    p.add_argument("--graph", metavar="FILE.png",
                   help="also draw the attribute trees of a simulated run of the stock "
                   "schema (--graph-subscribers subscribers, --max-children) when it settled")
    p.add_argument("--graph-subscribers", type=positive_int, default=12, metavar="N",
                   help="subscribers of the --graph run (default 12)")
    p.add_argument("--experiments", type=_names, default=None,
                   help="comma-separated subset of connection,degree,dissemination,routing,"
                   "trees,encryption,loopback,droppers,streams (default: all but streams)")
    p.add_argument("--droppers", type=fraction_list, default=list(d.droppers),
                   metavar="FRACTIONS",
                   help="fractions of subscribers that forward no event in the droppers "
                   f"experiment, comma-separated (default {_csv(d.droppers)})")
    p.add_argument("--dropper-kinds", type=_dropper_kinds, default=list(d.dropper_kinds),
                   metavar="KINDS",
                   help="droppers that only drop (plain), also name no ancestor in heartbeat "
                   "answers (lying), or also send no repair traffic and pass on no search "
                   f"for a further parent (refusing); default {_csv(d.dropper_kinds)}")
    for flag, value, what in (
            ("--peers", d.peers, "peer counts of the connection experiment"),
            ("--degrees", d.degrees, "maximum out-degrees of the out-degree experiment"),
            ("--dissemination-peers", d.dissemination_peers,
             "peer counts of the dissemination experiment"),
            ("--routing-peers", d.routing_peers, "peer counts of the OHF vs MCR experiment"),
            ("--tree-subscribers", d.tree_subscribers,
             "subscriber counts of the stock-schema tree-shape experiment"),
            ("--subscribers", d.subscribers, "subscriber counts of the encryption experiment")):
        p.add_argument(flag, type=int_list, default=list(value),
                       help=f"{what}, comma-separated (default {_csv(value)})")
    for flag, value, what in (
            ("--max-children", d.max_children, "out-degree of the experiments over peers"),
            ("--degree-peers", d.degree_peers, "peers of the out-degree experiment"),
            ("--publishers", d.publishers, "publishers of the dissemination experiments"),
            ("--events-per-publisher", d.events_per_publisher, "events each publisher sends"),
            ("--encryption-events", d.encryption_events,
             "events measured per subscriber count"),
            ("--calibration-peers", d.calibration_peers,
             "peers of the real-cryptography run that measures the costs"),
            ("--calibration-events", d.calibration_events, "events of that run"),
            ("--loopback-peers", d.loopback_peers,
             "subscriber processes of the loopback cross-check, at most 50"),
            ("--loopback-events", d.loopback_events, "events of the loopback cross-check"),
            ("--dropper-subscribers", d.dropper_subscribers,
             "subscribers of the droppers experiment"),
            ("--dropper-events", d.dropper_events, "events of the droppers experiment"),
            ("--dropper-seeds", d.dropper_seeds,
             "seeds (from --seed on) each setting of the droppers experiment runs on"),
            ("--routing-credentials", d.routing_credentials,
             "credentials (virtual peers) per subscriber in the OHF vs MCR experiment"),
            ("--routing-fine-depth", d.routing_fine_depth,
             "levels of fine credentials MCR routes with"),
            ("--seed", 1, "random seed"),
            ("--workers", 2, "simulator processes run in parallel")):
        p.add_argument(flag, type=int, default=value, help=f"{what} (default {value})")
    p.add_argument("--latency-median-ms", type=float, default=40.0,
                   help="median one-way link delay; each link's is drawn log-normal once "
                   "(default 40)")
    p.add_argument("--latency-sigma", type=float, default=0.5,
                   help="shape of the log-normal link delays (default 0.5)")
    p.add_argument("--min-seconds", type=float, default=0.1,
                   help="measuring time per priced operation of the encryption experiment "
                   "(default 0.1)")
    p.set_defaults(handler=_run_overlay)



# -- bench exactness -------------------------------------------------------------------------

def _choices(allowed: tuple[str, ...], what: str) -> Callable[[str], list[str]]:
    """A parser of a comma-separated subset of ``allowed``."""
    def parse(text: str) -> list[str]:
        names = [x.strip() for x in text.split(",") if x.strip()]
        unknown = sorted(set(names) - set(allowed))
        if unknown or not names:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {', '.join(unknown) or '(none)'}; "
                f"choose from {', '.join(allowed)}")
        return names
    return parse


def _run_exactness(args: argparse.Namespace) -> int:
    from ibe_pubsub.evaluation import exactness

    churn = {"both": (False, True), "on": (True,), "off": (False,)}[args.churn]
    todo = exactness.cases(args.schemas, args.routing, args.subscribers, churn,
                           range(1, args.seeds + 1))
    report = exactness.run(todo, exactness.Timing(events=args.events), args.workers,
                           lambda m: print(f"[bench exactness] {m}", file=sys.stderr,
                                           flush=True))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    s = report["summary"]
    print(f"{s['runs']} runs: {s['expected']} expected deliveries, {s['missing']} missed "
          f"({s['runs_with_misses']} runs), {s['extra']} extra; {s['not_owed']} matching "
          f"pairs not owed (joining, leaving or cut off); {s['wall_s']} s wall, "
          f"{s['cpu_s']} s CPU; wrote {out}")
    if s["missing"] or s["extra"]:
        raise CommandError(f"delivery was not exact in "
                           f"{s['runs_with_misses'] + s['runs_with_extras']} runs")
    return 0


def _register_exactness(bench: argparse._SubParsersAction) -> None:
    p = bench.add_parser(
        "exactness", help="exact delivery over many seeds, schemas and sizes, OHF and MCR, "
        "with and without churn",
        description="Run the simulator (plaintext crypto, uneven link delays) over every "
        "combination of schema, routing, size, churn and seed, and check that every "
        "subscriber got exactly the events it is owed: those its subscription matches, "
        "published while it was linked to the root (from its join until it left, crashed "
        "or was cut off by a crash or leave above it, with a 2 s grace at both ends). "
        "Writes every run and a summary as JSON; exits non-zero if any run missed or "
        "added a delivery.")
    p.add_argument("--out", default="bench/exactness.json", help="output JSON file")
    p.add_argument("--seeds", type=positive_int, default=13,
                   help="seeds 1..N of every combination (default 13: 208 runs)")
    p.add_argument("--schemas", type=_choices(EXACTNESS_SCHEMAS, "schema(s)"),
                   default=list(EXACTNESS_SCHEMAS),
                   help=f"comma-separated schemas (default {','.join(EXACTNESS_SCHEMAS)})")
    p.add_argument("--routing", type=_choices(("ohf", "mcr"), "routing(s)"), default=["ohf", "mcr"],
                   help="comma-separated routings (default ohf,mcr)")
    p.add_argument("--subscribers", type=positive_int_list, default=[40, 120],
                   help="comma-separated subscriber counts (default 40,120)")
    p.add_argument("--churn", choices=("both", "on", "off"), default="both",
                   help="runs with churn (a fifth of the subscribers leave or crash and as "
                   "many join while events are published), without, or both (default)")
    p.add_argument("--events", type=positive_int, default=200,
                   help="events per run, 50 ms apart (default 200)")
    p.add_argument("--workers", type=positive_int, default=2,
                   help="simulator processes run in parallel (default 2)")
    p.set_defaults(handler=_run_exactness)


# -- bench bulk ------------------------------------------------------------------------------

def _run_bulk(args: argparse.Namespace) -> int:
    with spark_extra():
        from ibe_pubsub.evaluation import run_bulk_bench
        from ibe_pubsub.pipelines import SparkStartError

    pyplot()
    json_path = Path(args.json)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    spark_log = None if args.verbose else json_path.with_suffix(".spark.log")
    try:
        report = run_bulk_bench(json_path, args.schema, args.requests, args.master, args.partitions,
                      args.fine_depth, spark_log=spark_log)
    except SparkStartError as exc:
        raise CommandError(f"cannot start Spark: {exc}") from exc
    python, spark = report["python"], report["spark"]
    print(f"one Python process: {python['rows_per_s']:.0f} requests/s "
          f"({python['seconds']:.1f} s; {python['rows_per_cpu_s']:.0f} per CPU second; "
          f"peak RSS {python['peak_rss_mb']['driver']:.0f} MB)")
    memory = ", ".join(f"{group} {mb:.0f} MB" for group, mb in spark["peak_rss_mb"].items())
    print(f"Spark {spark['master']}: {spark['rows_per_s']:.0f} requests/s "
          f"({spark['seconds']:.1f} s, plus {spark['startup_seconds']:.1f} s start-up; "
          f"peak RSS {memory})")
    print(f"ratio Spark/Python: {report['ratio']:.2f}")
    print(f"wrote {args.json} and {Path(args.json).with_suffix('.png')}")
    return 0


def _register_bulk(bench: argparse._SubParsersAction) -> None:
    bulk = bench.add_parser(
        "bulk", help="requests/s of the Spark decomposition vs one Python process",
        description="Decompose synthetic requests with Spark and with the same function "
        "in one plain Python process; write requests/s of both (the plain process also per "
        "CPU second), their ratio, peak memory and the load average as JSON and a PNG "
        "plot. Spark's own logs go next to the JSON as .spark.log (-v shows them).")
    bulk.add_argument("--json", default="bench/bulk.json", metavar="FILE",
                      help="output JSON file (the plot goes next to it as .png)")
    bulk.add_argument("--requests", type=positive_int, default=1_000_000,
                      help="number of synthetic requests (default 1000000)")
    add_schema(bulk)
    bulk.add_argument("--master", default="local[2]",
                      help="Spark master URL, e.g. spark://host:7077 (default local[2])")
    add_partitions(bulk)
    add_fine_depth(bulk)
    bulk.set_defaults(handler=_run_bulk)


# -- bench transport -------------------------------------------------------------------------

def _run_transport(args: argparse.Namespace) -> int:
    from ibe_pubsub.evaluation import run_transport_bench

    result = run_transport_bench(args.connections)
    print(f"{result['connections']} connections on loopback: mutual TLS "
          f"{result['tls_ms']:.2f} ms, plaintext {result['plaintext_ms']:.2f} ms per "
          f"connection (+{result['tls_overhead_ms']:.2f} ms)", file=sys.stderr)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    write_json_atomically(args.json, result)
    print(f"wrote {args.json}")
    return 0


# -- bench monitoring ----------------------------------------------------------------------

def _run_monitoring(args: argparse.Namespace) -> int:
    from ibe_pubsub.evaluation import plot_monitoring, run_monitoring_bench

    pyplot()
    result = run_monitoring_bench(args.pairs, args.events, args.interval, args.scrape_interval)
    notice(f"--http on/off: CPU x{result['window_cpu_ratio_on_off']:.3f} while "
           f"disseminating (x{result['cpu_ratio_on_off']:.3f} over the processes' lives), "
           f"mean delay "
           f"{result['on']['delay_ms_mean']:.1f} vs {result['off']['delay_ms_mean']:.1f} ms "
           f"({result['scrapes']} scrapes); one scrape costs a peer "
           f"{1000 * result['cpu_seconds_per_scrape']:.2f} ms CPU, "
           f"{result['scrape_cpu_share']:.2%} of its CPU at one scrape per interval")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    write_json_atomically(args.json, result)
    plot_monitoring(result, Path(args.json).with_suffix(".png"))
    print(f"wrote {args.json} and {Path(args.json).with_suffix('.png')}")
    return 0


def _register_transport(bench: argparse._SubParsersAction) -> None:
    transport = bench.add_parser(
        "transport", help="the cost of opening an authenticated peer link",
        description="Open --connections fresh peer links on loopback, each one TCP connect, "
                    "a mutual TLS 1.3 handshake with Ed25519 certificates from a throwaway "
                    "CA, HELLO both ways and a first frame, then the same in plaintext; "
                    "prints the mean milliseconds per connection and writes them to --json.")
    transport.add_argument("--connections", type=positive_int, default=200,
                           help="connections per mode")
    transport.add_argument("--json", default="bench/transport.json", metavar="FILE",
                           help="output JSON file")
    transport.set_defaults(handler=_run_transport)



def _register_monitoring(bench: argparse._SubParsersAction) -> None:
    monitoring = bench.add_parser(
        "monitoring", help="the cost of a peer's --http endpoint, scraped, in CPU and delay",
        description="One overlay on loopback with subscribers in pairs of equal "
                    "subscriptions, one of each pair serving --http and scraped (/metrics and "
                    "/status) every --scrape-interval, the other not; publishes --events and "
                    "compares the pairs' CPU seconds (process time) and dissemination delay.")
    monitoring.add_argument("--pairs", type=positive_int, default=10,
                            help="subscriber pairs")
    monitoring.add_argument("--events", type=positive_int, default=300, help="events")
    monitoring.add_argument("--interval", type=non_negative_float, default=0.05,
                            help="seconds between events")
    monitoring.add_argument("--scrape-interval", type=positive_duration, default=15.0,
                            metavar="DURATION", help="time between scrapes of each peer "
                            "(default 15s, a usual Prometheus setting)")
    monitoring.add_argument("--json", default="bench/monitoring.json", metavar="FILE",
                            help="output JSON file (the PNG goes next to it)")
    monitoring.set_defaults(handler=_run_monitoring)


# -- bench e2e -------------------------------------------------------------------------------

E2E_MODES = ("streams", "v2")


def _e2e_modes(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    if not modes or set(modes) - set(E2E_MODES):
        raise argparse.ArgumentTypeError(f"expected some of {','.join(E2E_MODES)}, got {text!r}")
    return list(dict.fromkeys(modes))


def _e2e_rates(text: str) -> list[str]:
    """Comma-separated offered rates: events/s, or ``P%`` of the capacity measured by the
    phases before it (e.g. ``800,80%``)."""
    rates = [r.strip() for r in text.split(",") if r.strip()]
    for k, rate in enumerate(rates):
        try:
            value = float(rate[:-1] if rate.endswith("%") else rate)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{rate!r} is neither events/s nor a "
                                             "percentage such as 80%") from None
        if not (0 < value < math.inf and (value <= 100 or not rate.endswith("%"))):
            raise argparse.ArgumentTypeError(f"{rate!r}: a rate is above 0, a share of the "
                                             "capacity at most 100%")
        if rate.endswith("%") and k == 0:
            raise argparse.ArgumentTypeError(f"{rate!r}: a share of the capacity needs a "
                                             "rate before it that saturates the system")
    if not rates:
        raise argparse.ArgumentTypeError(f"expected comma-separated rates, got {text!r}")
    return rates


def _run_e2e(args: argparse.Namespace) -> int:
    from ibe_pubsub.evaluation import run_e2e_bench

    pyplot()
    rates = {"streams": args.rates, "v2": args.v2_rates}
    plot = Path(args.plot or Path(args.json).with_suffix(".png"))
    report = run_e2e_bench({m: rates[m] for m in args.modes}, args.seconds, args.warmup,
                           args.in_process_seconds, plot)
    print(f"{'mode':7} {'rate':>5} {'side':5} {'delivered':>9} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'CPU ms/event (all processes)':>29}")
    for mode, rows in report["modes"].items():
        for row in rows:
            for side in ("ours", "nats"):
                r = row[side]
                print(f"{mode:7} {row['rate']:5g} {side:5} {r['delivered_ratio']:9.3f} "
                      f"{r['delay_ms'].get('p50', 0):7.1f} {r['delay_ms'].get('p99', 0):7.1f} "
                      f"{r['cpu_ms_all_per_event'] or 0:29.2f}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    write_json_atomically(args.json, report)
    print(f"wrote {args.json} and {plot}")
    return 0


def _register_e2e(bench: argparse._SubParsersAction) -> None:
    e2e = bench.add_parser(
        "e2e", help="end-to-end delivery, delay and CPU of real processes vs NATS + AES-GCM",
        description="Start a key server, a root of every tree and 4 subscriber processes on "
        "loopback (mutual TLS, real cryptography) and a publisher using the application API; "
        "publish at each offered rate for --seconds (event k due at start + k/rate), then the "
        "same through nats-server with AES-GCM payloads and 4 subscribers. Reports delivered/"
        "expected, delay p50/p95/p99 and each process's CPU per event, and each role's "
        "in-process cost (bench streams) for comparison. Writes JSON and a PNG plot.")
    e2e.add_argument("--modes", type=_e2e_modes, default=list(E2E_MODES),
                     help="streams (a stream whose values stay in their cells) and/or v2 "
                     "(a fresh event each time), comma-separated (default streams,v2)")
    e2e.add_argument("--rates", type=_e2e_rates, default=["100", "250", "500", "1500"],
                     help="offered events/s of the streams mode, or P%% of the capacity the "
                     "phases before it measured (the highest rate the publisher achieved), "
                     "e.g. 800,80%% (default 100,250,500,1500)")
    e2e.add_argument("--v2-rates", type=_e2e_rates, default=["5", "10", "20"],
                     help="offered events/s of the v2 mode, as --rates (default 5,10,20)")
    e2e.add_argument("--warmup", type=non_negative_float, default=2.0,
                     help=f"seconds each mode's publishers publish at {WARMUP_RATE:g} "
                     "events/s before the measured phases, unmeasured: a feed's first "
                     "events pay its session certificate and cold caches once in its life "
                     "(0: measure from the first event; default 2)")
    e2e.add_argument("--seconds", type=positive_duration, default=3.0,
                     help="seconds of publishing per rate (default 3)")
    e2e.add_argument("--in-process-seconds", type=non_negative_float, default=1.0,
                     help="CPU seconds of each role's in-process measurement (0: skip it; "
                     "default 1)")
    e2e.add_argument("--json", default="bench/e2e.json", metavar="FILE",
                     help="output JSON file (default bench/e2e.json)")
    e2e.add_argument("--plot", metavar="FILE",
                     help="output PNG (default: next to the JSON file)")
    e2e.set_defaults(handler=_run_e2e)


# -- bench soak ------------------------------------------------------------------------------

def _run_soak(args: argparse.Namespace) -> int:
    import tempfile
    from contextlib import nullcontext

    from ibe_pubsub.evaluation import (
        BenchSettingsError,
        SoakSettings,
        fresh_database,
        plot_soak,
        postgres_cluster,
        run_soak,
        soak_network,
    )

    pyplot()
    try:
        settings = SoakSettings(
            minutes=args.minutes, subscribers=args.subscribers, steady=args.steady,
            epoch_seconds=args.epoch_seconds, grace_seconds=args.grace_seconds,
            kill_every=args.kill_every, failure_timeout=args.failure_timeout, seed=args.seed,
            drain=args.drain, group=args.group, link_delay_ms=args.link_delay_ms,
            link_loss=args.link_loss, partition_seconds=args.partition)
    except BenchSettingsError as exc:
        raise CommandError(str(exc)) from exc
    json_path = Path(args.json)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="soak-", dir=json_path.parent))
    notice(f"soak: {args.minutes:g} minutes; every process's log goes to {workdir}")
    postgres = args.postgres or args.postgres_url is not None
    outside = ("--postgres-url names a server outside the namespaces"
               if args.postgres_url is not None else None)
    # The namespaces first: a throwaway PostgreSQL then starts inside them.
    with (soak_network(settings, workdir, notice, outside) as (network, skipped),
          postgres_cluster(args.postgres_url) if postgres else nullcontext(None) as cluster):
        database = fresh_database(cluster) if cluster is not None else None
        report = run_soak(settings, workdir, notice, database, network, skipped)
    write_json_atomically(json_path, report)
    plot = json_path.with_suffix(".png")
    plot_soak(report, plot)
    v = report["verdict"]
    print(f"owed {v['owed']}, delivered {v['delivered']}, lost outside fault windows "
          f"{v['lost']}, missed inside them {sum(v['missed_in_fault_windows'].values())}, "
          f"duplicates {v['duplicates']}, wrong {v['wrong_deliveries']}, revoked publisher "
          f"after its grace {v['revoked_after_grace']}, crashed {len(v['crashed'])}, left "
          f"running {len(v['left_running'])}, audit mismatches {len(v['audit_mismatches'])}, "
          f"key server 5xx answers {sum(v['server_errors'].values())}, "
          f"memory and descriptors flat: {v['all_flat']}")
    for kind, stats in v["settled_s"].items():
        print(f"  {kind}: settled in median {stats.get('median', 0):.1f} s, p95 "
              f"{stats.get('p95', 0):.1f} s over {stats['count']}")
    print(f"wrote {json_path} and {plot}; {'passed' if report['passed'] else 'FAILED'}")
    return 0 if report["passed"] else 1


def _register_soak(bench: argparse._SubParsersAction) -> None:
    soak = bench.add_parser(
        "soak", help="real processes for a long run under kills, restarts, rollovers and a "
        "revocation, every delivery checked",
        description="Start a key server with short epochs, a root per tree, --subscribers "
        "subscribers (OHF and MCR alternating) and three live feeds (version-2 events, a "
        "stream, and a publisher revoked half-way) on loopback (in network namespaces of "
        "their own with --group, as root), and inject faults on a "
        "schedule the seed fixes: SIGKILL of a subscriber every --kill-every seconds "
        "(restarted after a pause), SIGSTOP of one for longer than the failure timeout, "
        "SIGKILL of a root and of the key server (both restarted), the revocation, and, "
        "as root, a cut of the link to --group subscribers that run in a network namespace "
        "of their own behind a delaying, lossy link (see --link-delay-ms). Then "
        "check that every event a subscriber's predicate matches, sent while it was "
        "attached and settled, was delivered to it exactly once outside the declared fault "
        "windows; that nothing of the revoked publisher came after its last epoch plus "
        "grace; that no process crashed or was left running; that the audit log holds "
        "every enrolment and refusal the processes saw; and that the key server never "
        "answered with a 5xx status. A fault window excuses only the misses of the "
        "subscribers the fault can reach (its victim and those below it in a tree at the "
        "time; everyone for a root or the key server); window_coverage reports the share "
        "of the run inside some window. Also reports whether resident memory and held "
        "descriptors (all but established TCP connections) stayed flat, without failing "
        "the run. Writes JSON (with a per-minute timeline) and a PNG; exits 1 if a check "
        "failed.")
    soak.add_argument("--minutes", type=float, default=30.0, help="length of the run")
    soak.add_argument("--subscribers", type=positive_int, default=24, help="subscribers")
    soak.add_argument("--steady", type=int, default=6,
                      help="subscribers never killed or stopped, whose memory is followed")
    soak.add_argument("--epoch-seconds", type=positive_int, default=120,
                      help="epoch length: a rollover every this many seconds")
    soak.add_argument("--grace-seconds", type=positive_int, default=30,
                      help="grace window before each rollover")
    soak.add_argument("--kill-every", type=positive_duration, default=20.0,
                      metavar="DURATION", help="time between subscriber kills (default 20s)")
    soak.add_argument("--failure-timeout", type=positive_duration, default=5.0,
                      metavar="DURATION", help="the peers' --failure-timeout (default 5s)")
    soak.add_argument("--drain", type=positive_duration, default=15.0, metavar="DURATION",
                      help="time for the last events to arrive after the feeds end (default "
                      "15s)")
    soak.add_argument("--seed", type=int, default=1, help="seed of the schedule, the "
                      "subscriptions and the events")
    soak.add_argument("--group", type=int, default=4,
                      help="subscribers run as if on another host, in a network namespace "
                      "of their own behind an emulated link that is cut once (needs root, "
                      "ip and iptables, and is off with --postgres-url; without them the "
                      "run says why and goes on; 0: none)")
    soak.add_argument("--link-delay-ms", type=float, default=20.0,
                      help="delay each way on the group's link, in milliseconds")
    soak.add_argument("--link-loss", type=float, default=0.01,
                      help="share of the packets the group's link drops")
    soak.add_argument("--partition", type=positive_duration, default=20.0, metavar="DURATION",
                      help="how long the group's link is cut (default 20s)")
    soak.add_argument("--postgres", action="store_true",
                      help="the key server on PostgreSQL, in a throwaway cluster from the "
                      "local initdb/pg_ctl (default: SQLite)")
    soak.add_argument("--postgres-url", metavar="URL",
                      help="the key server on PostgreSQL, in a new database on this server "
                      "(implies --postgres)")
    soak.add_argument("--json", default="bench/soak.json", metavar="FILE",
                      help="output JSON file (the PNG and the run's directory go next to it)")
    soak.set_defaults(handler=_run_soak)
