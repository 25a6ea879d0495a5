"""Commands of the credentials package: `bench crypto`."""

from __future__ import annotations

import argparse
from pathlib import Path

from peer.arguments import bench_group, int_list


def _run_crypto(args: argparse.Namespace) -> int:
    from credentials.bench import main

    report = main(Path(args.json), args.dims, args.bits, args.min_seconds, args.backend)
    print(f"{'algorithm':26} {'d':>2} {'bits':>4} {'ms':>9} {'floor ms':>9} {'ratio':>6}")
    for r in report["algorithms"]:
        print(f"{r['algorithm']:26} {r['d']:>2} {r['bits']:>4} {r['ms']:9.3f} "
              f"{r['floor_ms']:9.3f} {r['ratio']:6.2f}")
    raw = report["raw"]
    print(f"pairing {raw['pairing_ms']:.3f} ms; multi-pairing of 7 {raw['multi_pairing_7_ms']:.3f}"
          f" ms vs 7 pairings {raw['seven_pairings_ms']:.3f} ms")
    print(f"wrote {args.json} and {Path(args.json).with_suffix('.png')}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    crypto = bench_group(subparsers).add_parser(
        "crypto", help="raw pairing operations and every algorithm of SCHEME.md vs its floor",
        description="Measure the pairing backend's raw operations and each algorithm of "
        "SCHEME.md for several attribute counts and widths; write JSON and a PNG plot.")
    crypto.add_argument("--json", default="bench/crypto.json", help="output JSON file "
                        "(the plot is written next to it as .png)")
    crypto.add_argument("--dims", type=int_list, default=[1, 2, 4, 8],
                        help="attribute counts d, comma-separated (default 1,2,4,8)")
    crypto.add_argument("--bits", type=int_list, default=[8, 16, 32],
                        help="bits per attribute, comma-separated (default 8,16,32)")
    crypto.add_argument("--min-seconds", type=float, default=0.3,
                        help="minimum measuring time per operation (default 0.3)")
    crypto.add_argument("--backend", choices=["mcl", "pymcl", "charm"], default=None,
                        help="pairing backend (default: $IBE_PUBSUB_BACKEND or mcl)")
    crypto.set_defaults(handler=_run_crypto)
