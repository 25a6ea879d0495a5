"""What the command groups share: the user-facing error, argument types and the option
blocks several commands take (the key server's address and credentials, ...).

It imports nothing of the project at module level, so that ``ibe-pubsub --help`` stays
cheap: what reads an option imports what it needs when it runs.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import errno
import json
import os
import socket
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ibe_pubsub.cli.exceptions import CliError

if TYPE_CHECKING:
    from ibe_pubsub.credentials import Schema
    from ibe_pubsub.peer import KnownServers, ThresholdAccess


class CommandError(CliError):
    """A user-facing failure: the dispatcher prints it as one line and exits with
    ``status`` (2; a subclass may document another, as the demo's "could not run")."""

    status = 2


class Interrupted(CliError):
    """Ctrl-C, once the command has cleaned up after it (a peer left the overlay): the
    dispatcher reports it as it reports KeyboardInterrupt, "interrupted" and status 130."""


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


def _duration(text: str) -> float:
    stripped = str(text).strip()
    unit = next((u for u in ("ms", "s", "m", "h") if stripped.endswith(u)), "")
    value = _parse(float, stripped.removesuffix(unit), "a duration such as 1s or 250ms")
    return value * DURATION_UNITS.get(unit, 1.0)


def positive_duration(text: str) -> float:
    """Seconds, from e.g. ``1s``, ``250ms``, ``2m`` or a bare number of seconds."""
    seconds = _duration(text)
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive duration, got {text!r}")
    return seconds


def non_negative_duration(text: str) -> float:
    """Like :func:`positive_duration`, 0 allowed."""
    seconds = _duration(text)
    if not 0 <= seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a duration of 0 or more, got {text!r}")
    return seconds


def int_list(text: str) -> list[int]:
    """Comma-separated integers, e.g. ``1,2,4``."""
    return [_parse(int, x, "comma-separated integers") for x in text.split(",") if x.strip()]


def positive_int_list(text: str) -> list[int]:
    """Comma-separated integers of at least 1, e.g. ``40,120``; at least one of them."""
    values = int_list(text)
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"must each be at least 1, got {min(values)}")
    return values


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
    checked while parsing, before any work. An unknown name is a mistake of the command
    line (argparse's usage and error line); a file that does not conform is the file's
    (one error line, no usage)."""
    from ibe_pubsub.credentials import BUILTIN_SCHEMAS, SchemaError, resolve_schema

    try:
        return resolve_schema(text)
    except SchemaError as exc:
        if text not in BUILTIN_SCHEMAS and Path(text).is_file():
            raise CommandError(f"the schema file {exc}") from exc
        raise argparse.ArgumentTypeError(str(exc)) from exc


def add_schema(parser: argparse.ArgumentParser, required: bool = False) -> None:
    """``--schema``, for every command that needs the event space (default: ``stocks``)."""
    from ibe_pubsub.credentials import BUILTIN_SCHEMAS

    help_text = f"built-in schema ({', '.join(BUILTIN_SCHEMAS)}) or schema TOML file"
    if required:
        parser.add_argument("--schema", type=schema_argument, required=True,
                            metavar="NAME|FILE", help=help_text)
    else:
        parser.add_argument("--schema", type=schema_argument, default="stocks",
                            metavar="NAME|FILE", help=help_text + " (default: %(default)s)")


def key_server_url(text: str) -> str:
    """``--server``: an http:// or https:// URL, or ``HOST:PORT`` as ``peer status`` takes
    it, with the scheme the key server serves there by default: plain HTTP on loopback
    only, TLS anywhere else (``keyserver serve`` refuses plain HTTP off loopback)."""
    import ipaddress
    from urllib.parse import urlsplit

    url = str(text).strip()
    if "://" not in url:
        host = urlsplit(f"//{url}").hostname or ""
        try:
            loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        url = f"{'http' if loopback else 'https'}://{url}"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(
            f"expected the key server's URL, http://HOST:PORT or https://HOST:PORT (or "
            f"HOST:PORT), got {text!r}")
    return url


def add_key_server(parser: argparse.ArgumentParser, admin: bool = False,
                   threshold: bool = False) -> None:
    """The options of every command that talks to the key server: ``--server``, the
    credential it presents (the admin token with ``admin``, read with :func:`admin_token`;
    else an identity's token and how the server's signing key is trusted, read with
    :func:`identity_token`, :func:`server_key` and :func:`known_servers`) and ``--ca-file``.
    With ``threshold``, ``--threshold-file`` and ``--threshold-access`` may replace
    ``--server`` (read with :func:`threshold_access`)."""
    parser.add_argument("--server", required=not threshold, type=key_server_url,
                        help="key server URL, e.g. http://127.0.0.1:8700 or https://HOST:PORT; "
                        "HOST:PORT alone means http:// on loopback, https:// elsewhere"
                        + ("; or --threshold-file" if threshold else ""))
    if threshold:
        parser.add_argument("--threshold-file", metavar="FILE",
                            help="instead of --server: the public document (threshold.json) "
                            "of a threshold key service, whose keys are combined from t of "
                            "its n members, each share checked against it (check its "
                            "fingerprint with the operators)")
        parser.add_argument("--threshold-access", metavar="FILE",
                            help="with --threshold-file: this identity's access file, each "
                            "member's URL and its token there (from `identity threshold-add "
                            "--access-file`); --token, --server-key and --known-servers go "
                            "unused then")
    if admin:
        parser.add_argument("--admin-token", metavar="TOKEN",
                            help="the key server's admin token (better: "
                            "$IBE_PUBSUB_ADMIN_TOKEN or --admin-token-file than the command "
                            "line)")
        parser.add_argument("--admin-token-file", metavar="FILE",
                            help="read the admin token from this file, e.g. the key server's "
                            "DATA/admin.token")
    else:
        parser.add_argument("--token",
                            help="the identity's bearer token (better: IBE_PUBSUB_TOKEN)")
        parser.add_argument("--server-key",
                            help="pin the key server's Ed25519 signing key (base64); "
                            "default: trust the key it presents on first contact and refuse "
                            "another one later (see --known-servers)")
        parser.add_argument("--known-servers", metavar="FILE",
                            help="where key servers' keys are recorded on first contact "
                            "(default: ibe-pubsub/known_servers.json in $XDG_CONFIG_HOME or "
                            "~/.config)")
    parser.add_argument("--ca-file", type=ca_file, metavar="PEM",
                        help="trust the key server's TLS certificate if this CA signed it "
                        "(default: the system's CAs)")


def read_admin_token_file(path: str) -> str:
    """The admin token in ``path`` (a key server's DATA/admin.token)."""
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise CommandError(f"cannot read the admin token from {path}: "
                           f"{exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise CommandError(f"{path} is not an admin token file (not text)") from exc
    if not token:
        raise CommandError(f"{path} is empty")
    return token


def admin_token(args: argparse.Namespace) -> str:
    """The admin token given by :func:`add_admin_token`'s options (the token itself first)."""
    token = args.admin_token
    if not token and args.admin_token_file:
        token = read_admin_token_file(args.admin_token_file)
    if not token:
        raise CommandError("the admin token is required: --admin-token-file FILE, "
                           "$IBE_PUBSUB_ADMIN_TOKEN or --admin-token")
    return str(token)


def identity_token(args: argparse.Namespace) -> str:
    """--token (or IBE_PUBSUB_TOKEN), else the token in the --bundle file, if it has one."""
    if args.token:
        return str(args.token)
    if args.bundle is None:
        raise CommandError("--token (or IBE_PUBSUB_TOKEN) is required")
    from ibe_pubsub.keyserver import BundleError
    from ibe_pubsub.peer import file_token

    try:
        token = file_token(args.bundle)
    except BundleError as exc:
        raise CommandError(str(exc)) from exc
    if token is None:
        raise CommandError(f"bundle {args.bundle} carries no token (its identity was not "
                           "created by bulk issuance): give the identity's token with --token "
                           "or IBE_PUBSUB_TOKEN")
    return token


def threshold_access(args: argparse.Namespace) -> ThresholdAccess | None:
    """The threshold deployment of --threshold-file and --threshold-access, or None for
    --server; CommandError for neither, both, or a bundle. --token, --server-key and
    --known-servers (perhaps set in the environment for other commands) go unused: the
    access file holds a token per member, and every share is checked against the
    deployment's public key."""
    from ibe_pubsub.peer import ThresholdAccess

    if (args.server is None) == (args.threshold_file is None):
        raise CommandError("give the key server (--server URL) or a threshold deployment "
                           "(--threshold-file FILE with --threshold-access FILE), not both "
                           "or neither (either may come from the environment, "
                           "IBE_PUBSUB_SERVER or IBE_PUBSUB_THRESHOLD_FILE, or the "
                           "configuration file)")
    if args.threshold_file is None:
        if args.threshold_access is not None:
            raise CommandError("--threshold-access goes with --threshold-file")
        return None
    if args.threshold_access is None:
        raise CommandError("--threshold-file needs --threshold-access (this identity's "
                           "access file: its token at each member)")
    if args.bundle is not None:
        raise CommandError("--bundle takes keys one key server issued (bulk issue): it does "
                           "not go with --threshold-file")
    return ThresholdAccess(args.threshold_file, args.threshold_access)


def server_key(args: argparse.Namespace) -> bytes | None:
    """The signing key --server-key pins, or None."""
    if not args.server_key:
        return None
    try:
        key = base64.b64decode(args.server_key, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise CommandError("--server-key must be base64") from exc
    if len(key) != 32:
        raise CommandError("--server-key must be a raw 32-byte Ed25519 key in base64")
    return key


def known_servers(args: argparse.Namespace) -> KnownServers | None:
    """Where first-use keys are recorded; none is consulted when --server-key pins the key."""
    from ibe_pubsub.peer import KnownServers, default_known_servers_path

    if args.server_key:
        return None
    return KnownServers(Path(args.known_servers) if args.known_servers
                        else default_known_servers_path())


def add_partitions(parser: argparse.ArgumentParser) -> None:
    """``--partitions``, for every command that runs the decomposition on Spark."""
    parser.add_argument("--partitions", type=positive_int, default=8,
                        help="Spark shuffle partitions = parallel decomposition tasks "
                        "(default 8)")


def add_fine_depth(parser: argparse.ArgumentParser) -> None:
    """``--fine-depth`` of a decomposition of many requests."""
    parser.add_argument("--fine-depth", type=int, choices=range(0, 5), default=1,
                        help="split depth of subscribers' fine credentials (0: none; "
                        "default 1)")


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


@contextmanager
def spark_extra() -> Iterator[None]:
    """pyarrow (and pyspark) come with the 'spark' extra: without it, one line says so."""
    try:
        yield
    except ImportError as exc:
        package = (exc.name or "a module").split(".")[0]
        raise CommandError(f"{package} is missing; install the 'spark' extra") from exc


def check_port_free(host: str, port: int) -> None:
    """Bind ``host:port`` as uvicorn will (``SO_REUSEADDR``), before the slow unsealing: a
    port another process listens on is a one-line error here, not uvicorn's log line and
    exit 3 once everything else has started. (A process binding it in between still meets
    uvicorn's.)"""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family) as listener:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((host.strip("[]"), port))
    except OSError as exc:
        reason = exc.strerror or str(exc)
        hint = " (another process serves there: stop it, or choose another --port)" \
            if exc.errno == errno.EADDRINUSE else ""
        raise CommandError(f"cannot listen on {host}:{port}: "
                           f"{reason[:1].lower()}{reason[1:]}{hint}") from exc
