"""What every package's commands share: the user-facing error, argument types, `bench`.

It imports nothing of the project, so any package's ``cli`` module can use it
without import cycles through the dispatcher.
"""

from __future__ import annotations

import argparse
import ssl


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


def add_ca_file(parser: argparse.ArgumentParser) -> None:
    """``--ca-file``, for every command that talks to the key server."""
    parser.add_argument("--ca-file", type=ca_file, metavar="PEM",
                        help="trust the key server's TLS certificate if this CA signed it "
                        "(default: the system's CAs)")


def add_insecure_transport(parser: argparse.ArgumentParser) -> None:
    """``--insecure-transport``, for every command that opens peer links."""
    parser.add_argument("--insecure-transport", action="store_true",
                        help="plaintext peer links that take each peer's claimed address on "
                        "trust, so one connection can eclipse a peer (for experiments only; "
                        "default: mutual TLS with certificates from the key server)")


def _parse(kind: type, text: str, expected: str):  # type: ignore[no-untyped-def]
    try:
        return kind(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from exc


def bench_group(subparsers: argparse._SubParsersAction) -> argparse._SubParsersAction:
    """The shared `bench` command group; each package adds its own benchmark to it."""
    bench = subparsers.choices.get("bench")
    if bench is None:
        bench = subparsers.add_parser("bench", help="benchmarks that write JSON and a PNG plot",
                                      description="Benchmarks; each writes JSON and a PNG plot.")
        bench.add_subparsers(dest="bench", metavar="BENCHMARK")
    return next(a for a in bench._actions if isinstance(a, argparse._SubParsersAction))
