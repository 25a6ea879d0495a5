"""What every package's commands share: the user-facing error, argument types, `bench`.

It imports nothing of the project at module level, so any package's ``cli`` module can
use it without import cycles through the dispatcher.
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ibe_pubsub.credentials.schema import Schema


class CommandError(Exception):
    """A user-facing failure: the dispatcher prints it as one line and exits with status 2."""


def positive_int(text: str) -> int:
    value = _parse(int, text, "an integer")
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = _parse(int, text, "an integer")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def non_negative_float(text: str) -> float:
    value = _parse(float, text, "a number")
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {text}")
    return value


#: Units a duration may be given in, as seconds.
DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def positive_duration(text: str) -> float:
    """Seconds, from e.g. ``1s``, ``250ms``, ``2m`` or a bare number of seconds."""
    stripped = str(text).strip()
    unit = next((u for u in ("ms", "s", "m", "h") if stripped.endswith(u)), "")
    value = _parse(float, stripped.removesuffix(unit), "a duration such as 1s or 250ms")
    seconds = value * DURATION_UNITS.get(unit, 1.0)
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive duration, got {text!r}")
    return seconds


def int_list(text: str) -> list[int]:
    """Comma-separated integers, e.g. ``1,2,4``."""
    return [_parse(int, x, "comma-separated integers") for x in text.split(",") if x.strip()]


def ca_file(text: str) -> str:
    """A PEM file of CA certificates, loaded once here so a bad one fails before any work."""
    try:
        ssl.create_default_context(cafile=text)
    except OSError as exc:  # ssl.SSLError is one
        raise argparse.ArgumentTypeError(f"cannot load CA certificates from {text}: "
                                         f"{exc.strerror or exc}") from exc
    return text


def schema_argument(text: str) -> Schema:
    """``--schema``: a built-in schema name (``stocks``) or a schema TOML file, loaded and
    checked while parsing, so a wrong one fails with argparse's usage and error line
    before any work."""
    from ibe_pubsub.credentials.schema import SchemaError, resolve_schema

    try:
        return resolve_schema(text)
    except SchemaError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def add_schema(parser: argparse.ArgumentParser, required: bool = False) -> None:
    """``--schema``, for every command that needs the event space (default: ``stocks``)."""
    from ibe_pubsub.credentials.schema import BUILTIN_SCHEMAS

    help_text = f"built-in schema ({', '.join(BUILTIN_SCHEMAS)}) or schema TOML file"
    if required:
        parser.add_argument("--schema", type=schema_argument, required=True,
                            metavar="NAME|FILE", help=help_text)
    else:
        parser.add_argument("--schema", type=schema_argument, default="stocks",
                            metavar="NAME|FILE", help=help_text + " (default: %(default)s)")


def add_ca_file(parser: argparse.ArgumentParser) -> None:
    """``--ca-file``, for every command that talks to the key server."""
    parser.add_argument("--ca-file", type=ca_file, metavar="PEM",
                        help="trust the key server's TLS certificate if this CA signed it "
                        "(default: the system's CAs)")


def add_admin_token(parser: argparse.ArgumentParser) -> None:
    """``--admin-token`` and ``--admin-token-file``, for every admin command (read with
    :func:`admin_token`)."""
    parser.add_argument("--admin-token", metavar="TOKEN",
                        help="the key server's admin token (better: $IBE_PUBSUB_ADMIN_TOKEN "
                        "or --admin-token-file than the command line)")
    parser.add_argument("--admin-token-file", metavar="FILE",
                        help="read the admin token from this file, e.g. the key server's "
                        "DATA/admin.token")


def admin_token(args: argparse.Namespace) -> str:
    """The admin token given by :func:`add_admin_token`'s options (the token itself first)."""
    token = args.admin_token
    if not token and args.admin_token_file:
        try:
            token = Path(args.admin_token_file).read_text().strip()
        except OSError as exc:
            raise CommandError(f"cannot read the admin token from {args.admin_token_file}: "
                               f"{exc.strerror or exc}") from exc
        except UnicodeDecodeError as exc:
            raise CommandError(f"{args.admin_token_file} is not an admin token file "
                               "(not text)") from exc
        if not token:
            raise CommandError(f"{args.admin_token_file} is empty")
    if not token:
        raise CommandError("the admin token is required: --admin-token-file FILE, "
                           "$IBE_PUBSUB_ADMIN_TOKEN or --admin-token")
    return str(token)


def add_insecure_transport(parser: argparse.ArgumentParser) -> None:
    """``--insecure-transport``, for every command that opens peer links."""
    parser.add_argument("--insecure-transport", action="store_true",
                        help="plaintext peer links that take each peer's claimed address on "
                        "trust, so one connection can eclipse a peer (for experiments only; "
                        "default: mutual TLS with certificates from the key server)")


def add_log_format(parser: argparse.ArgumentParser) -> None:
    """``--log-format``, for every long-running command that logs."""
    parser.add_argument("--log-format", choices=("text", "json"), default="text",
                        help="log lines as text, or one JSON object per line {time, level, "
                        "logger, message} for log shippers (default: %(default)s); either "
                        "way control characters from the network are escaped")


def write_json_atomically(path: str, data: dict[str, Any]) -> None:
    """Write a command's JSON output file (--ready-file, --stats-out, ...) whole or not at
    all, so a script polling for it never reads half of it."""
    tmp = f"{path}.tmp{os.getpid()}"
    Path(tmp).write_text(json.dumps(data, sort_keys=True))
    os.replace(tmp, path)


def _parse(kind: type, text: str, expected: str):  # type: ignore[no-untyped-def]
    try:
        return kind(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from exc


def bench_group(subparsers: argparse._SubParsersAction) -> argparse._SubParsersAction:
    """The shared `bench` command group; each package adds its own benchmark to it."""
    bench = subparsers.choices.get("bench")
    if bench is None:
        bench = subparsers.add_parser(
            "bench", help="benchmarks that write JSON and a PNG plot",
            description="Benchmarks; each writes JSON (to bench/ unless told otherwise) and, "
            "all but transport, a PNG plot.")
        bench.add_subparsers(dest="bench", metavar="BENCHMARK")
    return next(a for a in bench._actions if isinstance(a, argparse._SubParsersAction))
