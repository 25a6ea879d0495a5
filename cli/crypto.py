"""``ibe-pubsub crypto``: tools around the cryptographic scheme (``crypto vectors``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ibe_pubsub.cli.arguments import CommandError, non_negative_int


def register(subparsers: argparse._SubParsersAction) -> None:
    crypto = subparsers.add_parser(
        "crypto", help="tools around the cryptographic scheme (e.g. test vectors)",
        description="Tools around the pairing-based scheme (version 2).")
    commands = crypto.add_subparsers(dest="crypto", metavar="COMMAND")
    vectors = commands.add_parser(
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


def _run_vectors(args: argparse.Namespace) -> int:
    import json

    from ibe_pubsub.credentials import VECTORS_FILE, SchemaError, build_vectors, vectors_json

    values = None
    if args.values is not None:
        try:
            values = json.loads(args.values)
        except json.JSONDecodeError as exc:
            raise CommandError(f"--values is not valid JSON: {exc}") from exc
        if not isinstance(values, dict):
            raise CommandError("--values must be a JSON object of attribute values")
    try:
        text = vectors_json(build_vectors(args.seed, values))
    except (SchemaError, ValueError) as exc:  # bad values, or a seed beyond 64 bits
        raise CommandError(str(exc)) from exc
    path = Path(args.out) / VECTORS_FILE
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text)
    except OSError as exc:
        raise CommandError(f"cannot write the vectors to {args.out}: {exc}") from exc
    print(f"wrote {path}")
    return 0
