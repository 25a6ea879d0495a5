"""A key store and its database, bound to each other.

The database records the key store it belongs to: the fingerprint of the server's signing
key, in the setting ``keystore`` (a database from before that setting is recognised by the
``init`` entry of its audit log, and gets the setting at its next ``serve``). The data
directory records the database it was initialised with, in ``DIR/database.json``: the URL
without its password, or null for SQLite in the directory. So ``serve`` never starts on an
empty or foreign database (which would serve no identities and count epochs from 1 again),
and ``init`` never puts a new master key next to another key store's identities.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import inspect, select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from ibe_pubsub.credentials import fingerprint
from ibe_pubsub.keyserver.db import AuditEntry, make_engine, make_sessions
from ibe_pubsub.keyserver.keystore import DATABASE_FILE, KeyStoreError
from ibe_pubsub.keyserver.repository import EPOCH_SETTING, get_setting, put_setting

OWNER_SETTING = "keystore"
RECORD_FILE = "database.json"
URL_FLAGS = "--database-url (or $IBE_PUBSUB_DATABASE_URL)"


@dataclass(frozen=True)
class Owner:
    """What a database says about the key store it belongs to."""

    in_use: bool
    """It holds a key server's data (an epoch schedule)."""
    server_key: str | None
    """The fingerprint of its key store's signing key, when it records one."""


def shown_url(url: str) -> str:
    """The URL without its password, fit for messages and ``database.json``."""
    return make_url(url).render_as_string(hide_password=True)


def _recorded_key(session: Session) -> str | None:
    owner = get_setting(session, OWNER_SETTING)
    if owner is not None:
        return str(owner)
    init = session.scalars(select(AuditEntry).where(AuditEntry.action == "init")
                           .order_by(AuditEntry.id).limit(1)).first()
    key = init.detail.get("server_key") if init is not None else None
    return fingerprint(base64.b64decode(key)) if isinstance(key, str) else None


def read_owner(url: str) -> Owner:
    """Read the database as it is: nothing is migrated or created (a SQLite file that does
    not exist is an empty database)."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and not Path(parsed.database or "").is_file():
        return Owner(False, None)
    engine = make_engine(url)
    try:
        if not inspect(engine).has_table("settings"):
            return Owner(False, None)
        with make_sessions(engine).begin() as session:
            return Owner(get_setting(session, EPOCH_SETTING) is not None, _recorded_key(session))
    finally:
        engine.dispose()


def bind(session: Session, server_key: str) -> None:
    """Record the owner, in the transaction that claims the database: a key store that
    claimed it since the check before (a concurrent ``init``) is refused, not overwritten."""
    recorded = _recorded_key(session)
    if recorded is not None and recorded != server_key:
        raise KeyStoreError(f"the database was claimed meanwhile by another key store "
                            f"(signing key {recorded}): give `keyserver init` a new, empty "
                            "database")
    put_setting(session, OWNER_SETTING, server_key)


def check_unclaimed(url: str) -> None:
    """``init``: the database must not belong to a key store yet."""
    owner = read_owner(url)
    if owner.in_use or owner.server_key:
        whose = f" (signing key {owner.server_key})" if owner.server_key else ""
        raise KeyStoreError(f"the database {shown_url(url)} already belongs to a key "
                            f"store{whose}: give `keyserver init` a new, empty database")


def check_owner(url: str, server_key: str, data_dir: Path) -> None:
    """``serve``: the database must hold this key store's data."""
    owner = read_owner(url)
    if owner.server_key is not None and owner.server_key != server_key:
        raise KeyStoreError(
            f"the database {shown_url(url)} belongs to another key store (signing key "
            f"{owner.server_key}, not {server_key} of {data_dir}): give the {URL_FLAGS} "
            "this data directory was initialised with")
    if not owner.in_use:
        raise KeyStoreError(
            f"the database {shown_url(url)} holds no key server data, so it is not the one "
            f"`keyserver init` made for {data_dir}: give the {URL_FLAGS} it was initialised "
            "with, or restore the database from a backup")


def check_record(data_dir: Path, database_url: str | None) -> None:
    """``serve``: the kind of database given must be the one ``init`` was given (a data
    directory from before ``database.json`` is checked by its database alone)."""
    path = data_dir / RECORD_FILE
    if not path.is_file():
        return
    try:
        recorded = json.loads(path.read_text())["database_url"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise KeyStoreError(f"{path} is damaged ({exc!r}): write "
                            '{"database_url": null} for SQLite in the data directory, or '
                            '{"database_url": "URL"} with the URL without its password') from exc
    if recorded is not None and database_url is None:
        raise KeyStoreError(f"{data_dir} was initialised with the database {recorded}: give "
                            f"its URL with {URL_FLAGS}")
    if recorded is None and database_url is not None:
        raise KeyStoreError(f"{data_dir} was initialised with SQLite in "
                            f"{data_dir / DATABASE_FILE}, not {shown_url(database_url)}: "
                            f"leave out {URL_FLAGS}")


def write_record(data_dir: Path, database_url: str | None) -> None:
    """Write ``database.json`` (0600, atomically) unless it already says this."""
    path = data_dir / RECORD_FILE
    text = json.dumps({"database_url": database_url and shown_url(database_url)}) + "\n"
    if path.is_file() and path.read_text() == text:
        return
    staging = data_dir / f".{RECORD_FILE}.{secrets.token_hex(4)}"
    try:
        fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.replace(staging, path)
    finally:
        staging.unlink(missing_ok=True)
