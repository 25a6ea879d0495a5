"""`ibe-pubsub bench overlay` and `bench exactness`: register the evaluation and the exact
delivery harness in the shared `bench` group."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from ibe_pubsub.cli.arguments import CommandError, bench_group, int_list, positive_int
from ibe_pubsub.evaluation.sizes import DEFAULT_EXPERIMENTS, EXACTNESS_SCHEMAS, EXPERIMENTS, Sizes


def _names(text: str) -> list[str]:
    return _choices(EXPERIMENTS, "experiment(s)")(text)


def _run(args: argparse.Namespace) -> int:
    from ibe_pubsub.evaluation.bench_overlay import Bench
    from ibe_pubsub.overlay.simulator import LatencyModel

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
            dropper_events=args.dropper_events, dropper_seeds=args.dropper_seeds)
        if args.latency_median_ms <= 0 or args.latency_sigma < 0 or args.workers < 1:
            raise ValueError("latency median must be > 0, sigma >= 0 and workers >= 1")
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
              f"{row['defended']:.1%} with the repair, event messages "
              f"x{row['event_message_ratio']:.2f}")
    if "ours_ops_per_event" in summary:
        print(f"our encryption: {summary['ours_ops_per_event']:.0f} operations per event "
              "whatever the number of subscribers")
    print(f"wrote {args.out}/*.json and *.png in {summary['seconds']} s")
    if "loopback_error" in summary:
        raise CommandError(f"the loopback cross-check failed: {summary['loopback_error']}")
    return 0


def _graph(args: argparse.Namespace) -> None:
    from ibe_pubsub.credentials.schema import default_schema
    from ibe_pubsub.evaluation.delays import Setting
    from ibe_pubsub.evaluation.trees import draw_run
    from ibe_pubsub.overlay.crypto_model import CostTable
    from ibe_pubsub.overlay.simulator import LatencyModel

    setting = Setting(default_schema(), CostTable.default(),
                      LatencyModel(args.latency_median_ms / 1e3, args.latency_sigma), args.seed)
    draw_run(setting, args.graph_subscribers, args.max_children, args.graph)
    print(f"wrote {args.graph}")


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


def _csv(values: tuple[float, ...]) -> str:
    return ",".join(map(str, values))


def register(subparsers: argparse._SubParsersAction) -> None:
    d = Sizes()
    p = bench_group(subparsers).add_parser(
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
    p.set_defaults(handler=_run)
    _register_exactness(bench_group(subparsers))


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

    if not args.subscribers or min(args.seeds, args.events, args.workers,
                                   *args.subscribers) < 1:
        raise CommandError("seeds, events, workers and subscribers must be at least 1")
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
    p.add_argument("--seeds", type=int, default=13,
                   help="seeds 1..N of every combination (default 13: 208 runs)")
    p.add_argument("--schemas", type=_choices(EXACTNESS_SCHEMAS, "schema(s)"),
                   default=list(EXACTNESS_SCHEMAS),
                   help=f"comma-separated schemas (default {','.join(EXACTNESS_SCHEMAS)})")
    p.add_argument("--routing", type=_choices(("ohf", "mcr"), "routing(s)"), default=["ohf", "mcr"],
                   help="comma-separated routings (default ohf,mcr)")
    p.add_argument("--subscribers", type=int_list, default=[40, 120],
                   help="comma-separated subscriber counts (default 40,120)")
    p.add_argument("--churn", choices=("both", "on", "off"), default="both",
                   help="runs with churn (a fifth of the subscribers leave or crash and as "
                   "many join while events are published), without, or both (default)")
    p.add_argument("--events", type=int, default=200,
                   help="events per run, 50 ms apart (default 200)")
    p.add_argument("--workers", type=int, default=2,
                   help="simulator processes run in parallel (default 2)")
    p.set_defaults(handler=_run_exactness)
