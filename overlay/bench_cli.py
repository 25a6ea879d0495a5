"""`ibe-pubsub bench overlay`: registers the evaluation in the shared `bench` group."""

from __future__ import annotations

import argparse
from pathlib import Path

from credentials.cli import _int_list, bench_group


def _names(text: str) -> list[str]:
    from overlay.bench_overlay import EXPERIMENTS

    names = [x.strip() for x in text.split(",") if x.strip()]
    unknown = sorted(set(names) - set(EXPERIMENTS))
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown experiment(s) {', '.join(unknown) or '(none)'}; "
            f"choose from {', '.join(EXPERIMENTS)}")
    return names


def _run(args: argparse.Namespace) -> int:
    from overlay.bench_overlay import EXPERIMENTS, Bench, Sizes
    from overlay.simulator import LatencyModel
    from peer.cli import CommandError

    try:
        sizes = Sizes(
            peers=tuple(args.peers), max_children=args.max_children,
            degree_peers=args.degree_peers, degrees=tuple(args.degrees),
            dissemination_peers=tuple(args.dissemination_peers), publishers=args.publishers,
            events_per_publisher=args.events_per_publisher,
            routing_peers=tuple(args.routing_peers), subscribers=tuple(args.subscribers),
            encryption_events=args.encryption_events,
            calibration_peers=args.calibration_peers,
            calibration_events=args.calibration_events,
            loopback_peers=args.loopback_peers, loopback_events=args.loopback_events)
        if args.latency_median_ms <= 0 or args.latency_sigma < 0 or args.workers < 1:
            raise ValueError("latency median must be > 0, sigma >= 0 and workers >= 1")
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    bench = Bench(Path(args.out), sizes, LatencyModel(args.latency_median_ms / 1e3,
                                                      args.latency_sigma),
                  seed=args.seed, workers=args.workers, min_seconds=args.min_seconds,
                  experiments=args.experiments or EXPERIMENTS)
    summary = bench.run()
    for name, values in summary.get("overhead_ms", {}).items():
        shown = ", ".join("-" if v is None else f"{v:.0f}" for v in values)
        print(f"security overhead, {name}: {shown} ms")
    if summary.get("loopback_ratio"):
        print(f"loopback: real processes / simulator mean dissemination delay = "
              f"{summary['loopback_ratio']:.2f}")
    if "ours_ops_per_event" in summary:
        print(f"our encryption: {summary['ours_ops_per_event']:.0f} operations per event "
              "whatever the number of subscribers")
    print(f"wrote {args.out}/*.json and *.png in {summary['seconds']} s")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = bench_group(subparsers).add_parser(
        "overlay", help="connection and dissemination delays, OHF vs MCR, encryption "
        "operations per event (the report's section 8, and more)",
        description="Run the evaluation: crypto costs measured on real cryptography, then "
        "the simulator (secure vs plaintext) for connection delay vs peers and vs out-degree, "
        "dissemination delay vs peers, OHF vs MCR, and encryption operations per event vs "
        "subscribers for four schemes. Writes JSON and a PNG plot per experiment into --out.")
    p.add_argument("--out", default="bench/overlay", help="output directory")
    p.add_argument("--experiments", type=_names, default=None,
                   help="comma-separated subset of connection,degree,dissemination,routing,"
                   "encryption,loopback (default: all)")
    p.add_argument("--peers", type=_int_list, default=[100, 200, 400, 800],
                   help="peer counts of the connection experiment (default 100,200,400,800)")
    p.add_argument("--max-children", type=int, default=4,
                   help="out-degree of the experiments over peers (default 4)")
    p.add_argument("--degree-peers", type=int, default=400,
                   help="peers of the out-degree experiment (default 400)")
    p.add_argument("--degrees", type=_int_list, default=[2, 3, 4, 6, 8],
                   help="maximum out-degrees (default 2,3,4,6,8)")
    p.add_argument("--dissemination-peers", type=_int_list, default=[100, 200, 400],
                   help="peer counts of the dissemination experiment (default 100,200,400)")
    p.add_argument("--publishers", type=int, default=160, help="publishers (default 160)")
    p.add_argument("--events-per-publisher", type=int, default=10,
                   help="events each publisher publishes (default 10)")
    p.add_argument("--routing-peers", type=_int_list, default=[100, 200],
                   help="peer counts of the OHF vs MCR experiment (default 100,200)")
    p.add_argument("--subscribers", type=_int_list,
                   default=[10, 20, 50, 100, 200, 500, 1000, 2000, 5000],
                   help="subscriber counts of the encryption experiment")
    p.add_argument("--encryption-events", type=int, default=50,
                   help="events measured per subscriber count (default 50)")
    p.add_argument("--calibration-peers", type=int, default=20,
                   help="peers of the real-cryptography run that measures costs (default 20)")
    p.add_argument("--calibration-events", type=int, default=10,
                   help="events of that run (default 10)")
    p.add_argument("--loopback-peers", type=int, default=20,
                   help="subscriber processes of the loopback cross-check, at most 50 "
                   "(default 20)")
    p.add_argument("--loopback-events", type=int, default=20,
                   help="events of the loopback cross-check (default 20)")
    p.add_argument("--latency-median-ms", type=float, default=40.0,
                   help="median one-way link delay, log-normal per link (default 40)")
    p.add_argument("--latency-sigma", type=float, default=0.5,
                   help="shape of the log-normal link delays (default 0.5)")
    p.add_argument("--seed", type=int, default=1, help="random seed (default 1)")
    p.add_argument("--workers", type=int, default=2,
                   help="simulator processes run in parallel (default 2)")
    p.add_argument("--min-seconds", type=float, default=0.1,
                   help="measuring time per priced operation of the encryption experiment")
    p.set_defaults(handler=_run)
