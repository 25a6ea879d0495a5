"""``ibe-pubsub demo``: a whole overlay on this machine, every delivery checked."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ibe_pubsub.cli.arguments import CommandError, add_insecure_transport, positive_int


class CouldNotRun(CommandError):
    """The demo could not run (its key server or a peer process failed): status 3, neither
    1 (a delivery went wrong) nor 2 (a mistake of the command line)."""

    status = 3


def register(subparsers: Any) -> None:
    demo = subparsers.add_parser(
        "demo", help="run a whole overlay on this machine and check every delivery",
        description="Start a key server (temporary directory, SQLite, loopback), one root "
                    "peer per attribute, --peers subscriber processes with varied "
                    "subscriptions and one publisher process; publish a stream of stock "
                    "quotes; print per subscriber the events delivered and expected, false "
                    "positives filtered and the mean delivery delay. Exits 1 if any "
                    "subscriber missed an event or got one it should not have, 3 if the "
                    "demo could not run (its key server or a peer process failed).")
    demo.add_argument("--peers", type=positive_int, default=8, help="subscriber processes")
    demo.add_argument("--routing", choices=("ohf", "mcr"), default="ohf",
                      help="one-hop flooding or multi-credential routing")
    demo.add_argument("--events", type=positive_int, default=60, help="events to publish")
    demo.add_argument("--max-children", type=positive_int, default=3,
                      help="children per virtual peer (small: deeper trees)")
    demo.add_argument("--seed", type=int, default=7, help="seed of the generated workload")
    demo.add_argument("--json", metavar="FILE", help="write the full report as JSON")
    demo.add_argument("--graph", metavar="FILE.png",
                      help="draw the attribute trees as the peers report them at the end "
                      "of the run (one panel per attribute, nodes coloured by peer)")
    add_insecure_transport(demo)
    demo.add_argument("--workdir", metavar="DIR",
                      help="keep logs and files here (default: a temporary directory)")
    demo.set_defaults(handler=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from ibe_pubsub.evaluation import DemoError, pyplot, run_demo

    if args.graph:
        pyplot()  # without the bench extra, fail before the demo rather than after it
    try:
        report = run_demo(peers=args.peers, routing=args.routing, events=args.events,
                          seed=args.seed, workdir=args.workdir, max_children=args.max_children,
                          insecure_transport=args.insecure_transport, graph=args.graph)
    except DemoError as exc:
        raise CouldNotRun(str(exc)) from exc
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, sort_keys=True))
    return 0 if report["ok"] else 1
