"""Commands of the credentials package: `bench crypto`, `bench streams`, `crypto vectors`."""

from __future__ import annotations

import argparse
from pathlib import Path

from ibe_pubsub.cli.arguments import CommandError, bench_group, int_list, non_negative_int


def _run_crypto(args: argparse.Namespace) -> int:
    from ibe_pubsub.evaluation.bench_crypto import main

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


def _run_streams(args: argparse.Namespace) -> int:
    from ibe_pubsub.evaluation.bench_streams import GOALS, main

    if not args.seconds > 0:
        raise CommandError("--seconds must be more than 0")
    report = main(Path(args.json), args.seconds, args.backend)
    print(f"{'scenario':9} {'publisher/s':>12} {'floor':>9} {'subscriber/s':>13} {'floor':>9}"
          f" {'goal':>6}")
    for name, r in report["scenarios"].items():
        print(f"{name:9} {r['publisher_events_per_s']:12.0f} "
              f"{r['publisher_floor_events_per_s']:9.0f} {r['subscriber_events_per_s']:13.0f}"
              f" {r['subscriber_floor_events_per_s']:9.0f} {GOALS.get(name, ''):>6}")
    print("events/s per core, from CPU time")
    print(f"wrote {args.json} and {Path(args.json).with_suffix('.png')}")
    return 0


def _run_vectors(args: argparse.Namespace) -> int:
    import json

    from ibe_pubsub.credentials.schema import SchemaError
    from ibe_pubsub.credentials.vectors import write_vectors

    values = None
    if args.values is not None:
        try:
            values = json.loads(args.values)
        except json.JSONDecodeError as exc:
            raise CommandError(f"--values is not valid JSON: {exc}") from exc
        if not isinstance(values, dict):
            raise CommandError("--values must be a JSON object of attribute values")
    try:
        path = write_vectors(Path(args.out), args.seed, values)
    except (SchemaError, ValueError) as exc:  # bad values, or a seed beyond 64 bits
        raise CommandError(str(exc)) from exc
    except OSError as exc:
        raise CommandError(f"cannot write the vectors to {args.out}: {exc}") from exc
    print(f"wrote {path}")
    return 0


def _crypto_group(subparsers: argparse._SubParsersAction) -> argparse._SubParsersAction:
    """The `crypto` command group (created on first use, so other commands can join it)."""
    crypto = subparsers.choices.get("crypto")
    if crypto is None:
        crypto = subparsers.add_parser(
            "crypto", help="tools around the cryptographic scheme (e.g. test vectors)",
            description="Tools around the pairing-based scheme (version 2).")
        crypto.add_subparsers(dest="crypto", metavar="COMMAND")
    return next(a for a in crypto._actions if isinstance(a, argparse._SubParsersAction))


def _register_vectors(subparsers: argparse._SubParsersAction) -> None:
    vectors = _crypto_group(subparsers).add_parser(
        "vectors", help="write deterministic test vectors of the scheme as JSON",
        description="Write deterministic test vectors of scheme version 2 (BLS12-381) to "
        "DIR/vectors.json, for checking another implementation: the master public and "
        "secret keys, the keys of one publisher and of two subscribers (one matching the "
        "3-attribute event, one not), a 1-attribute and a 3-attribute event, and a "
        "connection request, every group element in hex next to the identity bytes it was "
        "hashed from. All randomness, the key server's Ed25519 key included, is derived "
        "from --seed, so equal seeds and values give byte-identical files. The keys are "
        "public by construction: use them for tests only. Field names: docs/wire-format.md.")
    vectors.add_argument("--out", required=True, metavar="DIR",
                         help="directory to write vectors.json into (created if missing)")
    vectors.add_argument("--seed", type=non_negative_int, default=0,
                         help="seed of all randomness, 0 to 2^64-1 (default 0)")
    vectors.add_argument("--values", default=None, metavar="JSON",
                         help="JSON object with values of the 3-attribute event, e.g. "
                         '\'{"symbol": "IBM", "price": 42.5, "qty": 7}\' (attributes '
                         "left out keep these defaults; the 1-attribute event reuses price)")
    vectors.set_defaults(handler=_run_vectors)


def _output_and_backend(parser: argparse.ArgumentParser, default_json: str) -> None:
    parser.add_argument("--json", default=default_json, metavar="FILE",
                        help="output JSON file (the plot is written next to it as .png)")
    parser.add_argument("--backend", choices=["mcl", "charm"], default=None,
                        help="pairing backend (default: $IBE_PUBSUB_BACKEND or mcl)")


def register(subparsers: argparse._SubParsersAction) -> None:
    _register_vectors(subparsers)
    crypto = bench_group(subparsers).add_parser(
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
    streams = bench_group(subparsers).add_parser(
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
