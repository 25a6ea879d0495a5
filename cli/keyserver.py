"""Commands: ``keyserver init|serve|rotate-admin-token``, ``identity add|list|revoke``,
``bench keyserver``."""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ibe_pubsub.cli.arguments import (
    CommandError,
    add_admin_token,
    add_ca_file,
    add_log_format,
    add_schema,
    admin_token,
    bench_group,
    non_negative_int,
    positive_int,
    write_json_atomically,
)
from ibe_pubsub.credentials.logsafe import notice
from ibe_pubsub.keyserver.epochs import check_lengths, default_grace

if TYPE_CHECKING:
    from ibe_pubsub.evaluation.bench_keyserver import BenchSettings
    from ibe_pubsub.keyserver.client import KeyServerClient


# -- keyserver init / serve ------------------------------------------------------------------

def cmd_init(args: argparse.Namespace) -> int:
    from ibe_pubsub.keyserver.initialise import initialise
    from ibe_pubsub.keyserver.keystore import KeyStoreError

    try:
        if args.grace_seconds is None:
            args.grace_seconds = default_grace(args.epoch_seconds)
        check_lengths(args.epoch_seconds, args.grace_seconds)
        schema = args.schema  # loaded and checked by the argument type
        token_file = initialise(Path(args.data), schema, args.database_url, args.epoch_seconds,
                                args.grace_seconds)
    except (KeyStoreError, ValueError, OSError) as exc:
        raise CommandError(str(exc)) from exc
    print(f"key store created in {args.data}; schema {schema.name!r} ({schema.id[:16]}...); "
          f"admin token in {token_file}", file=sys.stderr)
    _print_server_key(Path(args.data))
    return 0


def _print_server_key(data_dir: Path) -> None:
    """What peers trusting on first use will show (stderr), and the key alone on stdout, so
    a script can capture it to pin it (--server-key)."""
    from ibe_pubsub.credentials.certificates import fingerprint
    from ibe_pubsub.keyserver.keystore import PUBLIC_FILE

    key = json.loads((data_dir / PUBLIC_FILE).read_text())["server_key"]
    print(f"signing key {fingerprint(base64.b64decode(key))}; peers pin it with "
          "--server-key KEY, the base64 key printed on stdout:", file=sys.stderr)
    print(key)


def cmd_rotate_admin_token(args: argparse.Namespace) -> int:
    from ibe_pubsub.keyserver.keystore import KeyStoreError, rotate_admin_token

    try:
        path = rotate_admin_token(Path(args.data))
    except KeyStoreError as exc:
        raise CommandError(str(exc)) from exc
    print(f"new admin token in {path}; restart `keyserver serve` to use it (until then the "
          "running server accepts only the old one)", file=sys.stderr)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from ibe_pubsub.keyserver.keystore import KeyStoreError
    from ibe_pubsub.keyserver.server import check_listen_address, check_tls_files, serve
    from ibe_pubsub.keyserver.state import ServerConfig

    if bool(args.tls_cert) != bool(args.tls_key):
        raise CommandError("--tls-cert and --tls-key go together")
    try:
        if args.tls_cert:
            check_tls_files(args.tls_cert, args.tls_key)
        check_listen_address(args.host, bool(args.tls_cert), args.insecure)
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

    try:
        serve(config, args.host, args.port, args.tls_cert, args.tls_key,
              "debug" if args.verbose > 1 else "info" if args.verbose else "warning", announce)
    except (KeyStoreError, ValueError, OSError) as exc:
        raise CommandError(str(exc)) from exc
    return 0


def _register_keyserver(subparsers: Any) -> None:
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


# -- identity add / list / revoke --------------------------------------------------------------

def _admin_client(args: argparse.Namespace) -> KeyServerClient:
    from ibe_pubsub.keyserver.client import KeyServerClient

    return KeyServerClient(args.server, admin_token(args), verify=args.ca_file or True)


def _call(args: argparse.Namespace, action: Any) -> Any:
    from ibe_pubsub.keyserver.client import KeyServerError

    try:
        with _admin_client(args) as client:
            return action(client)
    except KeyServerError as exc:
        raise CommandError(str(exc)) from exc


def cmd_identity_add(args: argparse.Namespace) -> int:
    created = _call(args, lambda c: c.create_identity(args.name, args.role, args.allow))
    print(f"identity {created['name']!r} (id {created['id']}, {created['role']}) created; "
          "its token (shown once):", file=sys.stderr)
    print(created["token"])
    return 0


def cmd_identity_list(args: argparse.Namespace) -> int:
    rows = _call(args, lambda c: c.list_identities())
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{'id':>5}  {'name':<24} {'role':<10} {'state':<20} policy")
    for r in rows:
        state = f"revoked in epoch {r['revoked_epoch']}" if r["revoked_at"] else "active"
        print(f"{r['id']:>5}  {r['name']:<24} {r['role']:<10} {state:<20} {r['policy'] or '*'}")
    return 0


def cmd_identity_revoke(args: argparse.Namespace) -> int:
    def revoke(client: KeyServerClient) -> dict[str, Any]:
        identity_id = args.id
        if identity_id is None:
            match = [r for r in client.list_identities() if r["name"] == args.name]
            if not match:
                raise CommandError(f"no identity named {args.name!r}")
            identity_id = match[0]["id"]
        return client.revoke(identity_id)

    if (args.id is None) == (args.name is None):
        raise CommandError("give exactly one of --id and --name")
    done = _call(args, revoke)
    print(f"identity {done['name']!r} revoked in epoch {done['revoked_epoch']}", file=sys.stderr)
    return 0


def _register_identity(subparsers: Any) -> None:
    identity = subparsers.add_parser("identity", help="manage identities on a key server",
                                     description="Admin commands against a running key server.")
    sub = identity.add_subparsers(dest="identity_command", metavar="COMMAND")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--server", required=True, help="key server URL, e.g. http://127.0.0.1:8700")
        add_admin_token(p)
        add_ca_file(p)

    add = sub.add_parser("add", help="create an identity and print its token",
                         description="Create an identity; prints its bearer token (once).")
    common(add)
    add.add_argument("--name", required=True, help="unique identity name")
    add.add_argument("--role", required=True, choices=("subscriber", "publisher", "root"),
                     help="what the token lets it do: subscriber (`peer run --subscribe`), "
                     "publisher (`publish`) or root (`peer run --root ATTRIBUTE`, the root of "
                     "an attribute's tree, for every attribute its --allow leaves whole)")
    add.add_argument("--allow", help="policy predicate bounding what it may subscribe to or "
                     "advertise (default: anything)")
    add.set_defaults(handler=cmd_identity_add)
    lst = sub.add_parser("list", help="list identities", description="List identities.")
    common(lst)
    lst.add_argument("--json", action="store_true", help="print JSON")
    lst.set_defaults(handler=cmd_identity_list)
    rev = sub.add_parser("revoke", help="revoke an identity",
                         description="Revoke an identity: no more keys for it.")
    common(rev)
    rev.add_argument("--id", type=int, help="identity id")
    rev.add_argument("--name", help="identity name")
    rev.set_defaults(handler=cmd_identity_revoke)


# -- bench keyserver -----------------------------------------------------------------------------

def cmd_bench(args: argparse.Namespace) -> int:
    from ibe_pubsub.evaluation.bench_keyserver import BenchSettings, run_bench

    settings = BenchSettings(clients=args.clients, seconds=args.seconds,
                             subscription=args.subscription, max_credentials=args.max_credentials,
                             workers=args.workers)
    if args.replicas is not None:
        return _bench_replicas(args, settings)
    plot = None if args.no_plot else Path(args.plot or Path(args.json).with_suffix(".png"))
    result = run_bench(settings, Path(args.json), plot)
    print(json.dumps(result["summary"], indent=1))
    print(f"wrote {args.json}" + (f" and {plot}" if plot else ""))
    return 0


def _bench_replicas(args: argparse.Namespace, settings: BenchSettings) -> int:
    from ibe_pubsub.evaluation.bench_replicas import run_replica_bench
    from ibe_pubsub.evaluation.throwaway_postgres import PostgresUnavailable

    cores = args.cores or list(range(args.replicas))
    if len(cores) < args.replicas:
        raise CommandError(f"--cores lists {len(cores)} cores for {args.replicas} replicas")
    try:
        result = run_replica_bench(settings, args.replicas, cores, args.postgres_url,
                                   Path(args.json))
    except (PostgresUnavailable, ValueError) as exc:
        raise CommandError(str(exc)) from exc
    print(json.dumps(result["summary"], indent=1))
    print(f"wrote {args.json}")
    return 0


def _cores(text: str) -> list[int]:
    try:
        cores = [int(c) for c in text.split(",")]
    except ValueError:
        cores = []
    if not cores or min(cores) < 0:
        raise argparse.ArgumentTypeError(f"expected core numbers like 0,1, got {text!r}")
    return cores


def _register_bench(subparsers: Any) -> None:
    p = bench_group(subparsers).add_parser(
        "keyserver", help="credential keys per second over HTTP vs. key generation alone",
        description="Starts a key server, measures credential keys issued per second by "
        "key generation alone (the floor, all cores) and over HTTP with concurrent "
        "clients, and p50/p99 enrolment latency.")
    p.add_argument("--json", default="bench/keyserver.json", metavar="FILE",
                   help="output JSON file")
    p.add_argument("--plot", help="output PNG (default: next to --json)")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.add_argument("--clients", type=positive_int, default=32, help="concurrent HTTP clients")
    p.add_argument("--seconds", type=float, default=20.0, help="duration of each phase")
    p.add_argument("--workers", type=positive_int, help="issuer processes (default: cores)")
    p.add_argument("--subscription", default='symbol prefix "IB" and price in [10, 20]',
                   help="the subscription every client enrols")
    p.add_argument("--max-credentials", type=positive_int, default=4,
                   help="credentials per numeric attribute")
    p.add_argument("--replicas", type=positive_int, metavar="N",
                   help="instead: 1 replica, then N replicas of one key store on one "
                   "PostgreSQL database, each pinned to one core (taskset) with one issuer "
                   "worker; writes keys/s of both and their ratio (no plot)")
    p.add_argument("--cores", type=_cores, metavar="LIST",
                   help="with --replicas: the cores to pin them to, e.g. 2,3 (default 0..N-1)")
    p.add_argument("--postgres-url", metavar="URL",
                   help="with --replicas: a PostgreSQL server where the benchmark may create "
                   "databases (default: a throwaway cluster from the local initdb/pg_ctl)")
    p.set_defaults(handler=cmd_bench)


def register(subparsers: Any) -> None:
    _register_keyserver(subparsers)
    _register_identity(subparsers)
    _register_bench(subparsers)
