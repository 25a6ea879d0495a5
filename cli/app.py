"""The `ibe-pubsub` command: a dispatcher over the command groups of this package.

Each group's module has a ``register(subparsers)`` function. Each leaf command sets
``handler`` (a function of the parsed arguments returning an exit code) with
``parser.set_defaults``.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

from ibe_pubsub.cli import bench, bridge, bulk, crypto, demo, identity, keyserver, peer, publish
from ibe_pubsub.cli.arguments import CommandError, Interrupted
from ibe_pubsub.cli.config import ConfigError, apply_layers, check_tables, load_config_file
from ibe_pubsub.cli.parser import CommandParser
from ibe_pubsub.credentials import log_formatter, use_log_format
from ibe_pubsub.evaluation import PlotsUnavailable

#: In the order ``ibe-pubsub --help`` lists them, the order a new user meets them in the
#: README: the demo, then an overlay by hand (key server, identities, peers, publishing),
#: bulk enrolment, the bridges to MQTT and NATS, and last the benchmarks and the scheme's
#: test vectors.
COMMAND_GROUPS = (demo, keyserver, identity, peer, publish, bulk, bridge, bench, crypto)


def _version() -> str:
    """The installed package's version (a source checkout run without installing has none)."""
    try:
        return version("ibe-pubsub")
    except PackageNotFoundError:
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = CommandParser(
        prog="ibe-pubsub", top=True,
        description="Secure broker-less content-based publish/subscribe with "
        "identity-based encryption.",
        epilog="Every option can also be set as IBE_PUBSUB_<OPTION> in the environment "
        "or in a TOML file (--config, $IBE_PUBSUB_CONFIG or ./ibe-pubsub.toml) "
        "in a table named after the command, e.g. [keyserver.serve].",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for group in COMMAND_GROUPS:
        group.register(subparsers)
    return parser


def _leaf(parser: argparse.ArgumentParser, argv: Sequence[str]) -> tuple[
        argparse.ArgumentParser, list[str]]:
    """Walk the subcommand tree along argv to the parser of the chosen command."""
    path: list[str] = []
    current = parser
    for token in argv:
        sub = next((a for a in current._actions
                    if isinstance(a, argparse._SubParsersAction)), None)
        if sub is None:
            break
        if token in sub.choices:
            current = sub.choices[token]
            path.append(token)
    return current, path


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; Ctrl-C (even during the imports of start-up) and a reader that
    closed stdout (``ibe-pubsub identity list | head -1``) end it without a traceback."""
    try:
        status = _main(argv)
        sys.stdout.flush()  # a closed pipe shows here, rather than at exit
        return status
    except (KeyboardInterrupt, Interrupted):
        print("ibe-pubsub: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # Python's recipe: stdout goes nowhere, so flushing it at exit cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE


def _main(argv: Sequence[str] | None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    # Only --config is read before the layers apply: a full parse would already insist on
    # required options that the environment or the file are about to supply.
    config_flag = argparse.ArgumentParser(add_help=False)
    config_flag.add_argument("--config")
    try:
        config = load_config_file(config_flag.parse_known_args(args_list)[0].config)
        check_tables(parser, config)
        leaf, path = _leaf(parser, args_list)
        if path:
            apply_layers(leaf, path, config, args_list)
    except (ConfigError, CommandError) as exc:  # CommandError: a file a value names
        return _failed(exc)
    try:
        args = parser.parse_args(args_list)
    except CommandError as exc:  # a file an option names is wrong, not the command line
        return _failed(exc)
    # Log lines quote peers' strings: either formatter escapes control characters in every
    # line, so none can forge another.
    log_handler = logging.StreamHandler()
    log_format = getattr(args, "log_format", "text")
    log_handler.setFormatter(log_formatter(log_format))
    use_log_format(log_format)
    logging.basicConfig(level=logging.WARNING - 10 * min(args.verbose, 2),
                        handlers=[log_handler])
    handler = getattr(args, "handler", None)
    if handler is None:
        _leaf(parser, args_list)[0].print_help()
        return 2
    try:
        return int(handler(args) or 0)
    except (CommandError, PlotsUnavailable) as exc:
        return _failed(exc)


def _failed(exc: ConfigError | CommandError | PlotsUnavailable) -> int:
    """One error line; the status a CommandError carries, else 2."""
    print(f"ibe-pubsub: error: {exc}", file=sys.stderr)
    return getattr(exc, "status", 2)

