"""``ibe-pubsub keyserver``: create, serve and administer the key server's store
(``init``, ``serve``, ``rotate-admin-token``, ``backup``, ``restore``; a threshold
deployment's ``member-key`` and ``threshold-setup`` are in :mod:`cli.threshold_setup`)."""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ibe_pubsub.cli import threshold_setup
from ibe_pubsub.cli.arguments import (
    CommandError,
    add_log_format,
    add_schema,
    check_port_free,
    non_negative_float,
    non_negative_int,
    positive_int,
    write_json_atomically,
)
from ibe_pubsub.credentials import notice
from ibe_pubsub.keyserver import KeyStoreError, check_lengths, default_grace


@contextmanager
def _one_line_errors() -> Iterator[None]:
    """A key store, value or file error ends the command with its one-line message."""
    try:
        yield
    except (KeyStoreError, ValueError, OSError) as exc:
        raise CommandError(str(exc)) from exc


def cmd_init(args: argparse.Namespace) -> int:
    from ibe_pubsub.keyserver import initialise

    with _one_line_errors():
        if args.grace_seconds is None:
            args.grace_seconds = default_grace(args.epoch_seconds)
        check_lengths(args.epoch_seconds, args.grace_seconds)
        schema = args.schema  # loaded and checked by the argument type
        token_file = initialise(Path(args.data), schema, args.database_url, args.epoch_seconds,
                                args.grace_seconds)
    print(f"key store created in {args.data}; schema {schema.name!r} ({schema.id[:16]}...); "
          f"admin token in {token_file}", file=sys.stderr)
    _print_server_key(Path(args.data))
    return 0


def _print_server_key(data_dir: Path) -> None:
    """What peers trusting on first use will show (stderr), and the key alone on stdout, so
    a script can capture it to pin it (--server-key)."""
    from ibe_pubsub.credentials import fingerprint
    from ibe_pubsub.keyserver import PUBLIC_FILE

    key = json.loads((data_dir / PUBLIC_FILE).read_text())["server_key"]
    print(f"signing key {fingerprint(base64.b64decode(key))}; peers pin it with "
          "--server-key KEY, the base64 key printed on stdout:", file=sys.stderr)
    print(key)


def cmd_rotate_admin_token(args: argparse.Namespace) -> int:
    from ibe_pubsub.keyserver import rotate_admin_token

    try:
        path = rotate_admin_token(Path(args.data))
    except KeyStoreError as exc:
        raise CommandError(str(exc)) from exc
    print(f"new admin token in {path}; restart `keyserver serve` to use it (until then the "
          "running server accepts only the old one)", file=sys.stderr)
    return 0


def cmd_backup(args: argparse.Namespace) -> int:
    from ibe_pubsub.keyserver import back_up

    with _one_line_errors():
        manifest = back_up(Path(args.data), Path(args.out), args.database_url)
    size = sum((Path(args.out) / name).stat().st_size for name in manifest["files"])
    print(f"backup of {args.data} in {args.out}: {len(manifest['files'])} files "
          f"({size / 2**20:.1f} MiB), {manifest['database']} database, signing key "
          f"{manifest['server_key']}; it is as secret as the data directory", file=sys.stderr)
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    from ibe_pubsub.keyserver import restore

    with _one_line_errors():
        manifest = restore(Path(args.source), Path(args.data), args.database_url)
    print(f"restored the key store of {args.source} (signing key {manifest['server_key']}) "
          f"into {args.data}; serve it with the same passphrase"
          + (" and --database-url" if args.database_url else ""), file=sys.stderr)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from ibe_pubsub.keyserver import (
        ConnectionLimits,
        ServerConfig,
        check_listen_address,
        check_tls_files,
        serve,
    )

    if bool(args.tls_cert) != bool(args.tls_key):
        raise CommandError("--tls-cert and --tls-key go together")
    try:
        if args.tls_cert:
            check_tls_files(args.tls_cert, args.tls_key)
        check_listen_address(args.host, bool(args.tls_cert), args.insecure)
        check_port_free(args.host, args.port)
        limits = ConnectionLimits(args.header_timeout, args.max_connections,
                                  args.max_connections_per_address)
    except ValueError as exc:
        raise CommandError(str(exc)) from exc
    config = ServerConfig(
        data_dir=Path(args.data), database_url=args.database_url,
        epoch_seconds=args.epoch_seconds, grace_seconds=args.grace_seconds,
        workers=args.workers, identity_rate=args.rate, identity_burst=args.burst,
        key_rate=args.key_rate, key_burst=args.key_burst,
        address_rate=args.address_rate, address_burst=args.address_burst,
        bulk_max_body=args.bulk_max_body, jobs_per_identity=args.jobs_per_identity,
        credentials_per_job=args.credentials_per_job,
        max_peer_addresses=args.max_peer_addresses,
        allow_unsafe_permissions=args.allow_unsafe_permissions)

    def announce(url: str) -> None:
        notice(f"key server ready on {url}")
        if args.ready_file:
            write_json_atomically(args.ready_file, {"url": url, "pid": os.getpid()})

    with _one_line_errors():
        serve(config, args.host, args.port, args.tls_cert, args.tls_key,
              "debug" if args.verbose > 1 else "info" if args.verbose else "warning", announce,
              limits)
    return 0


def register(subparsers: Any) -> None:
    ks = subparsers.add_parser("keyserver", help="run the key server (the trusted party)",
                               description="Create and serve the key server.")
    sub = ks.add_subparsers(dest="keyserver_command", metavar="COMMAND")
    init = sub.add_parser(
        "init", help="create master keys, database, signed schema and admin token",
        description="Create the key store in --data: master keys (sealed under "
        "$IBE_PUBSUB_PASSPHRASE), the database (Alembic migrations), the signed schema and "
        "DIR/admin.token. Refuses to overwrite an existing key store. Prints the server's "
        "signing key (base64, for --server-key) alone on stdout, everything else on stderr.")
    init.add_argument("--data", required=True, help="data directory of the key server")
    add_schema(init)
    init.add_argument("--database-url", help="SQLAlchemy URL (default: SQLite in --data)")
    init.add_argument("--epoch-seconds", type=positive_int, default=3600, help="epoch length")
    init.add_argument("--grace-seconds", type=non_negative_int,
                      help="seconds before an epoch ends from which next-epoch keys are issued "
                      "(default: 300 or a quarter of the epoch if less; at most half the "
                      "epoch)")
    init.set_defaults(handler=cmd_init)

    serve = sub.add_parser(
        "serve", help="serve the key server's HTTP API (uvicorn)",
        description="Unseal the key store (passphrase from $IBE_PUBSUB_PASSPHRASE), migrate "
        "the database and serve the API; OpenAPI at /openapi.json.")
    serve.add_argument("--data", required=True, help="data directory made by keyserver init")
    serve.add_argument("--host", default="127.0.0.1", help="listen address")
    serve.add_argument("--port", type=int, default=8700, help="listen port")
    serve.add_argument("--ready-file", metavar="FILE",
                       help="write {url, pid} as JSON here once the server accepts requests")
    add_log_format(serve)
    serve.add_argument("--tls-cert", help="TLS certificate (PEM)")
    serve.add_argument("--tls-key", help="TLS private key (PEM)")
    serve.add_argument("--insecure", action="store_true",
                       help="allow plain HTTP on an address other than loopback (tokens and "
                       "keys then cross the network in the clear)")
    serve.add_argument("--database-url", help="SQLAlchemy URL (default: SQLite in --data)")
    serve.add_argument("--epoch-seconds", type=positive_int,
                       help="change the epoch length from the next epoch on (one at least 5 s "
                       "away), for every replica")
    serve.add_argument("--grace-seconds", type=non_negative_int,
                       help="change the grace window from the next epoch on (at most half "
                       "the epoch)")
    serve.add_argument("--workers", type=positive_int, help="issuer processes (default: cores)")
    serve.add_argument("--rate", type=float, default=100.0,
                       help="requests/s per identity and for the admin on token routes")
    serve.add_argument("--burst", type=positive_int, default=400, help="burst per identity")
    serve.add_argument("--key-rate", type=float, default=500.0,
                       help="keys/s issued per identity (an enrolment costs its credentials "
                       "plus fine credentials)")
    serve.add_argument("--key-burst", type=positive_int, default=5000,
                       help="keys per identity in a burst")
    serve.add_argument("--address-rate", type=float, default=100.0,
                       help="requests/s per client address, on every route")
    serve.add_argument("--address-burst", type=positive_int, default=1000,
                       help="burst per client address")
    serve.add_argument("--bulk-max-body", type=positive_int, default=16 * 1024 * 1024,
                       help="largest body of POST /v1/admin/bulk in bytes (413 beyond; other "
                       "routes have fixed limits of a few KiB)")
    serve.add_argument("--jobs-per-identity", type=positive_int,
                       help="issuer jobs one identity may run at once (default: workers - 1, "
                       "at least 1)")
    serve.add_argument("--credentials-per-job", type=positive_int, default=8,
                       help="credentials per issuer job: smaller keeps the wait of other "
                       "identities shorter, larger costs less overhead")
    serve.add_argument("--max-peer-addresses", type=positive_int, default=8,
                       help="listening addresses one identity may hold certified at once; "
                       "certifying another is refused (409) until one of its certificates "
                       "expires, re-certifying one it holds always works")
    serve.add_argument("--header-timeout", type=non_negative_float, default=10.0,
                       metavar="SECONDS",
                       help="close a connection that has not sent a complete request line "
                       "and headers this long after it opened or after its previous answer, "
                       "however slowly it sends them (0: never)")
    serve.add_argument("--max-connections", type=non_negative_int, metavar="N",
                       help="connections open at once; more get a 503 and are closed "
                       "(default: the open-file limit less a quarter, at least 128 spare, "
                       "at most 4096; 0: no cap)")
    serve.add_argument("--max-connections-per-address", type=non_negative_int, default=64,
                       metavar="N",
                       help="connections open at once from one client address (IPv6: one "
                       "/64); more get a 503 and are closed (0: no cap, e.g. behind a "
                       "proxy, whose address every client then has)")
    serve.add_argument("--allow-unsafe-permissions", action="store_true",
                       help="start even if group/other users can reach the data directory or "
                       "its files (refused by default; the fix is chmod -R go= DIR)")
    serve.set_defaults(handler=cmd_serve)

    rotate = sub.add_parser(
        "rotate-admin-token", help="replace DIR/admin.token with a new random token",
        description="Write a new admin token to DIR/admin.token (mode 0600, atomically). A "
        "running server keeps accepting the old token until it is restarted, and only the "
        "new one after. Needs no passphrase.")
    rotate.add_argument("--data", required=True, help="data directory made by keyserver init")
    rotate.set_defaults(handler=cmd_rotate_admin_token)

    backup = sub.add_parser(
        "backup", help="copy the key store and its database, while the server runs",
        description="Copy the key store in --data (sealed master secret, public "
        "parameters, admin token, TLS files if any) and its database into the new directory "
        "--out (mode 0700), with backup.json listing every file's SHA-256. SQLite is copied "
        "with its online backup API, PostgreSQL with pg_dump; the server may keep running. "
        "A backup is as secret as the data directory. Needs no passphrase.")
    backup.add_argument("--data", required=True, help="data directory of the key server")
    backup.add_argument("--out", required=True, metavar="DIR",
                        help="where the backup goes: a new or empty directory")
    backup.add_argument("--database-url",
                        help="the database URL `keyserver serve` is given (default: SQLite in "
                        "--data)")
    backup.set_defaults(handler=cmd_backup)

    restore = sub.add_parser(
        "restore", help="make a new data directory from a backup",
        description="Check every file of the backup in --from against its backup.json, then "
        "write the key store into --data (a new or empty directory) and its database: "
        "SQLite into --data, PostgreSQL (with pg_restore) into the new, empty database "
        "--database-url. Then `keyserver serve --data DIR` with the same passphrase serves "
        "the same keys, identities, revocations and epochs as at the backup.")
    restore.add_argument("--from", dest="source", required=True, metavar="DIR",
                         help="the backup's directory (made by keyserver backup)")
    restore.add_argument("--data", required=True,
                         help="the new data directory: new or empty")
    restore.add_argument("--database-url",
                         help="PostgreSQL backups only: the new, empty database to restore "
                         "into")
    restore.set_defaults(handler=cmd_restore)

    threshold_setup.register(sub)
