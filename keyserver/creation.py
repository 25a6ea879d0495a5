"""Creating a key store (``keyserver init``): keys, database and epoch schedule. Apart from
``keyserver.server`` so that ``init`` does not import the web framework it never uses."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic.util import CommandError as MigrationError
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.orm import Session

from ibe_pubsub.credentials import Schema
from ibe_pubsub.keyserver.binding import RECORD_FILE, bind, check_unclaimed, shown_url, write_record
from ibe_pubsub.keyserver.db import check_url
from ibe_pubsub.keyserver.epochs import EpochClock
from ibe_pubsub.keyserver.keystore import (
    ADMIN_TOKEN_FILE,
    DATABASE_FILE,
    PUBLIC_FILE,
    SEALED_FILE,
    KeyStore,
    KeyStoreError,
    create_keystore,
    passphrase_from_env,
)
from ibe_pubsub.keyserver.permissions import make_private_dir, use_private_umask
from ibe_pubsub.keyserver.repository import audit
from ibe_pubsub.keyserver.state import ServerConfig, open_database

SERVE_ADVICE = "restore it from a backup, or check --database-url"
INIT_ADVICE = "check --database-url and that the database server is reachable, then run init again"


@contextmanager
def database_errors(url: str, advice: str = SERVE_ADVICE) -> Iterator[None]:
    """A database that cannot be opened or migrated (damaged file, unreachable server, a
    revision this build does not know) stops start-up with one line, not a traceback."""
    try:
        yield
    except (SQLAlchemyError, MigrationError) as exc:
        reason = exc.orig if isinstance(exc, DBAPIError) else exc
        first_line = (str(reason).strip().splitlines() or [type(reason).__name__])[0]
        raise KeyStoreError(f"cannot use the database {shown_url(url)}: {first_line} "
                            f"({advice})") from exc


def initialise(data_dir: Path, schema: Schema, database_url: str | None,
               epoch_seconds: int, grace_seconds: int) -> str:
    """Create keys, database and epoch schedule; returns the admin token's file. All or
    nothing: if the database refuses, the files written are removed, so a retry works."""
    config = ServerConfig(data_dir=data_dir, database_url=database_url)
    check_url(config.url)
    passphrase = passphrase_from_env()
    use_private_umask()
    make_private_dir(data_dir)
    sqlite_file = data_dir / DATABASE_FILE
    new_sqlite = database_url is None and not sqlite_file.exists()
    store, _ = create_keystore(data_dir, schema, passphrase)
    try:
        with database_errors(config.url, INIT_ADVICE):
            check_unclaimed(config.url)
            _create_database(config.url, store, epoch_seconds, grace_seconds)
        write_record(data_dir, database_url)
    except BaseException:
        written = [SEALED_FILE, PUBLIC_FILE, ADMIN_TOKEN_FILE, RECORD_FILE]
        if new_sqlite:
            written += [sqlite_file.name + suffix for suffix in ("", "-wal", "-shm")]
        for name in written:
            (data_dir / name).unlink(missing_ok=True)
        raise
    return str(data_dir / ADMIN_TOKEN_FILE)


def _create_database(url: str, store: KeyStore, epoch_seconds: int, grace_seconds: int) -> None:
    """Migrate, then start the schedule, bind the key store and audit ``init`` in one
    transaction, so a database is either this key store's or still unclaimed."""
    def claim(session: Session, clock: EpochClock) -> None:
        bind(session, store.fingerprint)
        audit(session, "admin", "init", clock.segments[0].first_epoch,
              {"schema_id": store.schema.id, "server_key": store.public_document()["server_key"],
               "epoch_length": epoch_seconds, "grace": grace_seconds})

    engine, _, _ = open_database(url, epoch_seconds, grace_seconds, claim)
    engine.dispose()
