"""The options an application shares with ``ibe-pubsub``: read from the same TOML file and
``IBE_PUBSUB_*`` variables as the CLI, and the key server's key trusted through the same
known-servers file, so a program and the commands run from one set-up.

Precedence as in the CLI: an explicit argument > ``IBE_PUBSUB_<OPTION>`` > the file's table
(``[peer.run]`` for a subscriber, ``[publish]`` for a publisher; keys spelt with ``_`` or
``-``) > the default. The file is ``config_file``, else ``$IBE_PUBSUB_CONFIG``, else
``./ibe-pubsub.toml`` if it exists. Options of the commands the client has no use for
(``events_out``, ``routing``, ...) are left to the commands.
"""

from __future__ import annotations

import base64
import binascii
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from ibe_pubsub.client.exceptions import ConfigError, wrapped
from ibe_pubsub.peer import (
    KnownServers,
    ThresholdAccess,
    default_known_servers_path,
    file_token,
)

Role = Literal["subscriber", "publisher"]
ENV_PREFIX = "IBE_PUBSUB_"
DEFAULT_CONFIG_FILE = "ibe-pubsub.toml"
#: The CLI command whose table configures each role.
TABLES: dict[Role, tuple[str, ...]] = {"subscriber": ("peer", "run"), "publisher": ("publish",)}
_CONNECTION = ("server", "threshold_file", "threshold_access", "token", "server_key",
               "known_servers", "ca_file", "insecure_transport", "bundle")
#: Options read per role, by their CLI names.
OPTIONS: dict[Role, tuple[str, ...]] = {
    "subscriber": (*_CONNECTION, "listen", "subscribe"),
    "publisher": (*_CONNECTION, "advertise", "stream_window", "stream_max_events"),
}
#: CLI names -> keyword arguments of ``connect``.
RENAMED = {"subscribe": "subscription", "advertise": "advertisement"}
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off"}


def load_options(role: Role, *, config_file: str | Path | None = None,
                 environ: Mapping[str, str] | None = None, **explicit: Any) -> dict[str, Any]:
    """Keyword arguments for ``Subscriber.connect`` (``role="subscriber"``) or
    ``Publisher.connect`` (``"publisher"``): ``explicit`` ones that are not None over the
    environment over the file. ConfigError if the file or a value cannot be used.
    ``threshold_file`` and ``threshold_access`` make ``server`` a :class:`ThresholdAccess`
    (where one layer names a key server and a higher one a deployment, or the other way
    round, the higher one wins)."""
    env = os.environ if environ is None else environ
    table = _table(read_config_file(config_file, env), TABLES[role])
    layers: list[dict[str, Any]] = [{}, {}, {k: v for k, v in explicit.items()
                                             if v is not None}]
    for name in OPTIONS[role]:
        if (env_name := ENV_PREFIX + name.upper()) in env:
            layers[1][name] = _coerce(name, env[env_name], env_name)
        if name in table:
            layers[0][name] = _coerce(name, table[name], f"[{'.'.join(TABLES[role])}] {name}")
    options: dict[str, Any] = {}
    for layer in layers:  # the file, the environment, the arguments: each over the last
        layer = {RENAMED.get(name, name): value for name, value in layer.items()}
        if "threshold_file" in layer or "threshold_access" in layer:
            if "server" in layer:
                raise ConfigError("keys come from one key server (server) or a threshold "
                                  "deployment (threshold_file), not both")
            options.pop("server", None)
        elif "server" in layer:
            options.pop("threshold_file", None)
            options.pop("threshold_access", None)
        options |= layer
    if "threshold_file" in options or "threshold_access" in options:
        if not {"threshold_file", "threshold_access"} <= set(options):
            raise ConfigError("threshold_file and threshold_access go together")
        options["server"] = ThresholdAccess(options.pop("threshold_file"),
                                            options.pop("threshold_access"))
    return options


def read_config_file(path: str | Path | None, env: Mapping[str, str] = os.environ
                     ) -> dict[str, Any]:
    """The TOML file the CLI reads too: ``path``, else ``$IBE_PUBSUB_CONFIG``, else
    ``./ibe-pubsub.toml`` if it exists (ConfigError if it cannot be read or parsed)."""
    chosen = path or env.get(ENV_PREFIX + "CONFIG")
    if chosen is None:
        if not Path(DEFAULT_CONFIG_FILE).is_file():
            return {}
        chosen = DEFAULT_CONFIG_FILE
    try:
        with open(chosen, "rb") as handle:
            return tomllib.load(handle)
    except OSError as exc:
        raise ConfigError(f"cannot read the configuration file {chosen}: "
                          f"{exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"configuration file {chosen} is not valid TOML: {exc}") from exc


def _table(config: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    """The command's table, keys spelt with underscores."""
    table: Any = config
    for name in path:
        table = table.get(name, {}) if isinstance(table, dict) else {}
    out: dict[str, Any] = {}
    for key, value in (table.items() if isinstance(table, dict) else ()):
        name = key.replace("-", "_")
        if name in out:
            raise ConfigError(f"[{'.'.join(path)}] sets {name} twice (with '-' and with '_')")
        out[name] = value
    return out


def _coerce(name: str, raw: Any, origin: str) -> Any:
    """A value of the file or the environment as ``connect`` takes it."""
    if name == "insecure_transport":
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in _TRUE | _FALSE:
            return text in _TRUE
        raise ConfigError(f"{origin}: expected a boolean, got {raw!r}")
    if name == "stream_window":
        return _duration(raw, origin)
    if name == "stream_max_events":
        try:
            return int(raw)
        except ValueError as exc:
            raise ConfigError(f"{origin}: expected an integer, got {raw!r}") from exc
    return str(raw)


def _duration(raw: Any, origin: str) -> float:
    """Seconds, from a number or a text such as ``1s``, ``250ms``, ``2m`` (as the CLI)."""
    text = str(raw).strip()
    unit = next((u for u in ("ms", "s", "m", "h") if text.endswith(u)), "")
    try:
        seconds = float(text.removesuffix(unit)) * _DURATION_UNITS.get(unit, 1.0)
    except ValueError:
        seconds = 0.0
    if not 0 < seconds < float("inf"):
        raise ConfigError(f"{origin}: expected a positive duration such as 1s or 250ms, "
                          f"got {raw!r}")
    return seconds


def server_trust(server_key: bytes | str | None,
                 known_servers: str | Path | KnownServers | None
                 ) -> tuple[bytes | None, KnownServers | None]:
    """The pinned signing key (raw or base64), or else the known-servers file that records
    it on first contact (the CLI's by default), as ``peer run`` and ``publish`` trust it."""
    if server_key:
        if isinstance(server_key, str):
            try:
                server_key = base64.b64decode(server_key, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise ConfigError("server_key must be base64") from exc
        if len(server_key) != 32:
            raise ConfigError("server_key must be a raw 32-byte Ed25519 key (or its base64)")
        return server_key, None
    if isinstance(known_servers, KnownServers):
        return None, known_servers
    return None, KnownServers(Path(known_servers) if known_servers
                              else default_known_servers_path())


def identity_token(token: str | None, bundle: str | None) -> str:
    """The token given, else the one in the bundle file (as ``--token`` and ``--bundle``)."""
    if token:
        return token
    if bundle is not None:
        with wrapped(ConfigError):
            found = file_token(bundle)
        if found is not None:
            return found
        raise ConfigError(f"bundle {bundle} carries no token (its identity was not created "
                          "by bulk issuance): give the identity's token")
    raise ConfigError("a token is required (or a bundle that carries one)")
