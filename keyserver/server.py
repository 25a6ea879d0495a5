"""Serving a key store with uvicorn (``keyserver serve``); ``keyserver.initialise`` creates it."""

from __future__ import annotations

import ipaddress
import logging
import ssl
import sys
from collections.abc import Callable
from pathlib import Path

from ibe_pubsub.keyserver.binding import check_owner, check_record, write_record
from ibe_pubsub.keyserver.connections import ConnectionGate, ConnectionLimits
from ibe_pubsub.keyserver.creation import database_errors
from ibe_pubsub.keyserver.db import check_url
from ibe_pubsub.keyserver.exceptions import ServerSettingsError
from ibe_pubsub.keyserver.keystore import load_keystore, passphrase_from_env
from ibe_pubsub.keyserver.permissions import require_private, unsafe_entries, use_private_umask
from ibe_pubsub.keyserver.state import ServerConfig, build_state
from ibe_pubsub.keyserver.threshold_store import load_member

log = logging.getLogger(__name__)
ALLOW_UNSAFE_PERMISSIONS = "--allow-unsafe-permissions"
MAX_HEADER_BYTES = 32 * 1024  # request line and headers together


def check_data_dir(config: ServerConfig) -> None:
    """Refuse a data directory group or others can reach, unless told to accept it."""
    if not config.allow_unsafe_permissions:
        require_private(config.data_dir, ALLOW_UNSAFE_PERMISSIONS)
    for path, mode in unsafe_entries(config.data_dir):
        log.warning("%s is open to group/other users (mode %04o); accepted because of %s",
                    path, mode, ALLOW_UNSAFE_PERMISSIONS)


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 (also IPv4-mapped) or ``localhost``: reachable from this machine only."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def check_listen_address(host: str, tls: bool, insecure: bool) -> None:
    """Refuse plain HTTP beyond loopback (ValueError), where bearer tokens and issued keys
    would cross the network in the clear; ``insecure`` allows it with a warning."""
    if tls or is_loopback(host):
        return
    if not insecure:
        raise ServerSettingsError(
            f"refusing to serve plain HTTP on {host}, which is not a loopback address: give "
            "--tls-cert and --tls-key, or --insecure to accept it")
    log.warning("serving plain HTTP on %s (--insecure): tokens and keys cross the network "
                "unencrypted", host)


def check_tls_files(cert: str, key: str) -> ssl.SSLContext:
    """The server's TLS context (Python's defaults for servers: TLS 1.2 at least), loaded
    before unsealing (ValueError), so a missing, unreadable, malformed, mismatched or
    passphrase-protected file stops start-up in one line naming it, not after unsealing
    with a message naming no file (or a prompt)."""
    for flag, path in (("--tls-cert", cert), ("--tls-key", key)):
        if not Path(path).is_file():
            raise ServerSettingsError(f"{flag} {path}: no such file (or not a regular file)")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key, password=lambda: b"")
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        reason = getattr(exc, "reason", None) or exc.strerror or str(exc)
        raise ServerSettingsError(f"cannot use --tls-cert {cert} with --tls-key {key}: {reason} "
                                  "(a PEM certificate chain and its unencrypted PEM key)") from exc
    return context


def serve(config: ServerConfig, host: str, port: int, tls_cert: str | None,
          tls_key: str | None, log_level: str = "info",
          on_ready: Callable[[str], None] = lambda url: None,
          limits: ConnectionLimits | None = None) -> None:
    """Check the connection ``limits`` against the open-file limit, the TLS files (both or
    neither) and the data directory, unseal (failing fast with a clear message), migrate,
    start the workers, then serve; files created from here on (SQLite's -wal/-shm) are 0600.
    uvicorn's loggers go to the handler the command installed (``--log-format``, control
    characters escaped: its access log quotes the decoded request path), not to uvicorn's
    own formatters."""
    gate = ConnectionGate((limits or ConnectionLimits()).resolved())
    tls = check_tls_files(tls_cert or "", tls_key or "") if tls_cert or tls_key else None
    use_private_umask()
    check_data_dir(config)
    check_url(config.url)
    check_record(config.data_dir, config.database_url)
    passphrase = passphrase_from_env()
    store = load_keystore(config.data_dir, passphrase)
    member = load_member(config.data_dir, passphrase, store.group)
    with database_errors(config.url):
        check_owner(config.url, store.fingerprint, config.data_dir)
        # The web stack loads only now, so a start-up refused above ends sooner.
        import uvicorn
        from uvicorn.config import STARTUP_FAILURE

        from ibe_pubsub.keyserver.announcing import AnnouncingServer, gated_protocol
        from ibe_pubsub.keyserver.app import create_app

        state = build_state(config, store, member)
    write_record(config.data_dir, config.database_url)
    app = create_app(state)
    # h11 bounds the request line and headers (httptools buffers them without limit, so a
    # client that never ends its headers could grow the server's memory before the gate);
    # the gate's protocol bounds the time to send them and the connections, and does the
    # TLS handshake itself, so that it counts and times connections from their opening
    # (uvicorn, given TLS, would hand it only the connections done with their handshakes).
    # No websocket upgrades: a connection handed to another protocol would leave the count.
    server = AnnouncingServer(uvicorn.Config(
        app, host=host, port=port, log_level=log_level, proxy_headers=False,
        server_header=False, timeout_graceful_shutdown=10, http=gated_protocol(gate, tls),
        ws="none", log_config=None,
        h11_max_incomplete_event_size=MAX_HEADER_BYTES), on_ready, tls=tls is not None)
    server.run()
    if not server.started:  # as uvicorn.run: a failed start-up is not a clean exit
        sys.exit(STARTUP_FAILURE)
