"""Layered configuration for every subcommand: flag > environment > TOML file > default.

Each option of a subcommand can be set, by its destination name, as
* the environment variable ``IBE_PUBSUB_<NAME>`` (upper case), or
* a key in the TOML file's table named after the command path, e.g.
  ``[keyserver.serve] port = 8700`` (``admin_token_file`` or, as on the command line,
  ``admin-token-file``).
The TOML file is ``--config FILE``, else ``$IBE_PUBSUB_CONFIG``, else ``./ibe-pubsub.toml``
if it exists. A table that names no command (a misspelling, or a group such as
``[identity]``) is an error rather than silently ignored, as is an unknown key. Where
options are alternatives (the key server, or a threshold deployment), the one a higher
layer names replaces the other one of lower layers.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from ibe_pubsub.cli.exceptions import CliError
from ibe_pubsub.cli.parser import GLOBAL_DESTS

ENV_PREFIX = "IBE_PUBSUB_"
#: Options of which a command takes one: where its keys come from.
ALTERNATIVES = (frozenset({"server"}), frozenset({"threshold_file", "threshold_access"}))


class ConfigError(CliError):
    """The configuration file or an environment value cannot be used."""


def load_config_file(path: str | None) -> dict[str, Any]:
    """Read the TOML file named by the flag, the environment or the working directory, as
    applications using ``ibe_pubsub.client`` read it."""
    from ibe_pubsub.client import ConfigError as FileError
    from ibe_pubsub.client import read_config_file

    try:
        return read_config_file(path)
    except FileError as exc:
        raise ConfigError(str(exc)) from exc


def section_for(config: dict[str, Any], command_path: list[str]) -> dict[str, Any]:
    """The table of the TOML file that configures one subcommand, its keys spelt with
    underscores (``admin-token-file``, as on the command line, is ``admin_token_file``)."""
    table: Any = config
    for name in command_path:
        table = table.get(name, {}) if isinstance(table, dict) else {}
    section: dict[str, Any] = {}
    for key, value in (table.items() if isinstance(table, dict) else ()):
        if isinstance(value, dict):
            continue
        dest = key.replace("-", "_")
        if dest in section:
            raise ConfigError(f"[{'.'.join(command_path)}] sets {dest} twice "
                              f"(with '-' and with '_')")
        section[dest] = value
    return section


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def check_tables(parser: argparse.ArgumentParser, config: dict[str, Any]) -> None:
    """Refuse tables that configure no command: a misspelt one, or options in a group's
    table (``[identity]`` rather than ``[identity.list]``), which would have no effect."""
    problems: list[str] = []

    def walk(node: argparse.ArgumentParser, table: dict[str, Any], path: list[str]) -> None:
        children = _subcommands(node)
        tables = [f"[{'.'.join([*path, name])}]" for name in sorted(children)]
        if children and any(not isinstance(v, dict) for v in table.values()):
            problems.append(f"[{'.'.join(path)}] is a group, not a command: use "
                            f"{', '.join(tables)}" if path else
                            "options outside any table: use a command's, e.g. [peer.run]")
        for key, value in table.items():
            if not isinstance(value, dict):
                continue
            if key in children:
                walk(children[key], value, [*path, key])
            else:
                hint = f"the tables there: {', '.join(tables)}" if children else (
                    f"[{'.'.join(path)}] has no subcommands")
                problems.append(f"[{'.'.join([*path, key])}] is not a command ({hint})")

    walk(parser, config, [])
    if problems:
        raise ConfigError("configuration file: " + "; ".join(problems))


def _coerce(action: argparse.Action, raw: Any, origin: str) -> Any:
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in {"1", "true", "yes", "on"}:
            return True
        if text in {"0", "false", "no", "off"}:
            return False
        raise ConfigError(f"{origin}: expected a boolean, got {raw!r}")
    if action.type is None:
        return raw
    # A TOML number or list is checked by the option's type like the same text on the command
    # line (a list as its comma-separated form), so the file cannot pass a value it refuses.
    text = ",".join(map(str, raw)) if isinstance(raw, list) else str(raw)
    try:
        return action.type(text)
    except (TypeError, ValueError, argparse.ArgumentTypeError) as exc:
        raise ConfigError(f"{origin}: {exc}") from exc


def _drop_replaced(higher: set[str], lower: dict[str, Any]) -> None:
    """Drop from ``lower`` the alternatives of the options ``higher`` names."""
    for group in ALTERNATIVES:
        if group & higher:
            for other in ALTERNATIVES:
                for dest in other - group:
                    lower.pop(dest, None)


def apply_layers(parser: argparse.ArgumentParser, command_path: list[str],
                 config: dict[str, Any], command_line: list[str] | None = None) -> None:
    """Set the parser's defaults from the TOML section, then from the environment, less
    those of an alternative that a higher layer (the environment, or ``command_line``)
    names."""
    table = section_for(config, command_path)
    known = {action.dest: action for action in parser._actions
             if action.dest != "help" and action.dest not in GLOBAL_DESTS}
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise ConfigError(
            f"unknown option(s) in [{'.'.join(command_path)}]: {', '.join(unknown)} "
            f"(valid: {', '.join(sorted(known))})"
        )
    from_file: dict[str, Any] = {}
    from_env: dict[str, Any] = {}
    for dest, action in known.items():
        if dest in table:
            from_file[dest] = _coerce(action, table[dest],
                                      f"[{'.'.join(command_path)}] {dest}")
        env_name = ENV_PREFIX + dest.upper()
        if env_name in os.environ:
            from_env[dest] = _coerce(action, os.environ[env_name], env_name)
    given = {dest for dest, action in known.items() for word in command_line or ()
             for flag in action.option_strings if word == flag or word.startswith(flag + "=")}
    _drop_replaced(set(from_env), from_file)
    for lower in (from_env, from_file):
        _drop_replaced(given, lower)
    defaults = from_file | from_env
    if defaults:
        parser.set_defaults(**defaults)
        for action in parser._actions:
            if action.dest in defaults:
                action.required = False
