"""The parser class of every ``ibe-pubsub`` command: defaults in ``--help``, global options
anywhere.

The dispatcher's top parser is a :class:`CommandParser`, and argparse builds every
subcommand's parser with the class of its parent, so each command in the tree, however
deep, shows its defaults and takes ``-v`` and ``--config`` after its name as well as
before. It imports nothing of the project, like :mod:`cli.arguments`.
"""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Sequence
from typing import Any

#: Options of the whole command, not of one subcommand (no TOML key or IBE_PUBSUB_ variable
#: of a subcommand sets them).
GLOBAL_DESTS = frozenset({"config", "verbose"})


class DefaultsFormatter(argparse.HelpFormatter):
    """Appends "(default: X)" to an option's help, unless its text already speaks of its
    default or it has none worth showing (None, False, empty, a count's 0)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if not action.option_strings or "default" in text.lower() or not _shown(action):
            return text
        shown = _format(action.default).replace("%", "%%")
        return f"{text} (default: {shown})" if text else f"(default: {shown})"

    def _split_lines(self, text: str, width: int) -> list[str]:
        """As argparse's, but never breaking a word at a hyphen (ibe-pubsub, host names)."""
        return textwrap.wrap(self._whitespace_matcher.sub(" ", text).strip(), width,
                             break_on_hyphens=False)


def _shown(action: argparse.Action) -> bool:
    default = action.default
    if isinstance(action, argparse._CountAction):
        return False
    if default is None or default is False or default is argparse.SUPPRESS:
        return False
    return not (isinstance(default, str | list | tuple) and not default)


def _format(default: Any) -> str:
    """As the user would type it: lists comma-separated, like the options that take them."""
    if isinstance(default, list | tuple):
        return ",".join(map(str, default))
    return str(default)


class _Subcommands(argparse._SubParsersAction):
    """Adds up the ``-v`` counts given before and after a subcommand's name; argparse would
    let the subcommand's count replace the one given before it."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[Any] | None, option_string: str | None = None) -> None:
        before = getattr(namespace, "verbose", 0)
        namespace.verbose = 0
        super().__call__(parser, namespace, values, option_string)
        namespace.verbose += before


class CommandParser(argparse.ArgumentParser):
    """A parser of the command tree; ``top`` for the dispatcher's own, which holds the
    global options' defaults (below it they default to nothing, so that a subcommand that
    is not given them keeps the values given before its name)."""

    def __init__(self, *args: Any, top: bool = False, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", _Subcommands)
        group = self.add_argument_group(
            "global options (also accepted after the command)" if top
            else "global options (also accepted before the command)")
        unset = {} if top else {"default": argparse.SUPPRESS}
        group.add_argument("--config", metavar="FILE", **unset,
                           help="TOML configuration file (default: $IBE_PUBSUB_CONFIG, else "
                           "./ibe-pubsub.toml if it exists)")
        group.add_argument("-v", "--verbose", action="count", **({"default": 0} | unset),
                           help="more log output (repeatable)")
