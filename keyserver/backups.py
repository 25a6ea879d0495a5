"""Back up a key server while it runs, and restore the backup into a new data directory
(``keyserver backup`` and ``keyserver restore``).

A backup is a directory of mode 0700 holding the key store's files (the sealed master
secret, the public parameters, the database record, the admin token, and the TLS files of
the container image when present), the database, and ``backup.json``: the SHA-256 of every
file and the fingerprint of the key store's signing key. The database is copied
consistently while the server writes to it: SQLite through its online backup API,
PostgreSQL with ``pg_dump``. A restore checks every file against ``backup.json`` first, so
a damaged or altered backup is refused before anything is written, and it never writes
into a directory or a database that holds anything already.

The passphrase is not needed for either: the master secret stays sealed throughout.
"""

from __future__ import annotations

import base64
import glob
import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sqlalchemy.engine import make_url

from ibe_pubsub.credentials import fingerprint
from ibe_pubsub.keyserver.binding import (
    RECORD_FILE,
    check_owner,
    check_record,
    check_unclaimed,
    shown_url,
    write_record,
)
from ibe_pubsub.keyserver.creation import database_errors
from ibe_pubsub.keyserver.db import check_url, sqlite_url
from ibe_pubsub.keyserver.keystore import (
    ADMIN_TOKEN_FILE,
    DATABASE_FILE,
    PUBLIC_FILE,
    SEALED_FILE,
    KeyStoreError,
)
from ibe_pubsub.keyserver.permissions import make_private_dir, use_private_umask

MANIFEST_FILE = "backup.json"
#: The format of ``backup.json``; a restore refuses formats it does not know.
FORMAT = 1
PG_DUMP_FILE = "database.pgdump"
#: Key store files a backup always has, then those it has when the data directory does.
REQUIRED_FILES = (SEALED_FILE, PUBLIC_FILE)
OPTIONAL_FILES = (RECORD_FILE, ADMIN_TOKEN_FILE, "tls/cert.pem", "tls/key.pem")
#: How long a PostgreSQL client program may take before the command gives up.
PG_TIMEOUT = 3600.0


class BackupError(KeyStoreError):
    """A backup or restore that cannot be done; the message says why and what to do."""


def postgres_program(name: str) -> str | None:
    """A PostgreSQL program (``pg_dump``, ``initdb``...): on PATH, else the newest under
    ``/usr/lib/postgresql/*/bin`` where Debian puts them."""
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
                        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit()
                        else 0)
    return candidates[-1] if candidates else None


def back_up(data_dir: Path, target: Path, database_url: str | None = None) -> dict[str, Any]:
    """Copy the key store in ``data_dir`` and its database into the new directory
    ``target``; returns the manifest written there. ``database_url`` is the one ``serve``
    is given (None: SQLite in ``data_dir``)."""
    server_key = _server_key(data_dir)
    check_record(data_dir, database_url)
    url = database_url or sqlite_url(str(data_dir / DATABASE_FILE))
    check_url(url)
    with database_errors(url, "give the database URL `keyserver serve` is given"):
        check_owner(url, server_key, data_dir)
    use_private_umask()
    _new_directory(target, "backup")
    try:
        files = [name for name in REQUIRED_FILES + OPTIONAL_FILES
                 if (data_dir / name).is_file()]
        for name in files:
            _copy(data_dir / name, target / name)
        if _is_sqlite(url):
            _sqlite_backup(Path(make_url(url).database or ""), target / DATABASE_FILE)
            files.append(DATABASE_FILE)
            kind = "sqlite"
        else:
            _pg_run("pg_dump", url, ["--format=custom", "--no-owner", "--no-privileges",
                                     f"--file={target / PG_DUMP_FILE}"])
            files.append(PG_DUMP_FILE)
            kind = "postgresql"
        manifest = {"format": FORMAT, "created": time.time(), "server_key": server_key,
                    "database": kind, "files": {n: _sha256(target / n) for n in files}}
        (target / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1) + "\n")
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise
    return manifest


def restore(source: Path, data_dir: Path, database_url: str | None = None
            ) -> dict[str, Any]:
    """Make ``data_dir`` (new or empty) a copy of the key store backed up in ``source``;
    a PostgreSQL backup goes into the empty database ``database_url``. Returns the
    backup's manifest."""
    manifest = check_backup(source)
    if manifest["database"] == "sqlite" and database_url is not None:
        raise BackupError("this backup holds a SQLite database, which is restored into the "
                          "data directory: leave out --database-url")
    if manifest["database"] == "postgresql" and database_url is None:
        raise BackupError("this backup holds a PostgreSQL database: give the new, empty "
                          "database to restore it into with --database-url")
    if database_url is not None:
        check_url(database_url)
        with database_errors(database_url, "give a new, empty database"):
            check_unclaimed(database_url)
    use_private_umask()
    _new_directory(data_dir, "restore")
    try:
        for name in manifest["files"]:
            if name not in (DATABASE_FILE, PG_DUMP_FILE, RECORD_FILE):
                _copy(source / name, data_dir / name)
        if database_url is None:
            _sqlite_backup(source / DATABASE_FILE, data_dir / DATABASE_FILE)
            url = sqlite_url(str(data_dir / DATABASE_FILE))
        else:
            _pg_run("pg_restore", database_url, ["--no-owner", "--no-privileges",
                                                 "--exit-on-error", "--single-transaction",
                                                 str(source / PG_DUMP_FILE)])
            url = database_url
        write_record(data_dir, database_url)
        with database_errors(url, "the backup's database did not restore"):
            check_owner(url, manifest["server_key"], data_dir)
    except BaseException:
        _empty(data_dir)
        raise
    return manifest


def check_backup(source: Path) -> dict[str, Any]:
    """The manifest of the backup in ``source``, once every file it names is there with its
    recorded SHA-256 (BackupError otherwise)."""
    path = source / MANIFEST_FILE
    try:
        manifest = json.loads(path.read_text())
        files: Mapping[str, str] = manifest["files"]
        kind, recorded_format = manifest["database"], manifest["format"]
        str(manifest["server_key"])
    except FileNotFoundError as exc:
        raise BackupError(f"no backup in {source}: {MANIFEST_FILE} is missing") from exc
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BackupError(f"{path} is damaged: {exc!r}") from exc
    if recorded_format != FORMAT:
        raise BackupError(f"{path} has format {recorded_format!r}; this version restores "
                          f"format {FORMAT}")
    wanted = {"sqlite": DATABASE_FILE, "postgresql": PG_DUMP_FILE}.get(kind)
    if wanted is None or wanted not in files or not set(REQUIRED_FILES) <= set(files):
        raise BackupError(f"{path} is damaged: it lacks the database or the key store")
    for name, digest in files.items():
        if name not in REQUIRED_FILES + OPTIONAL_FILES + (wanted,):
            raise BackupError(f"{path} names an unexpected file {name!r}")
        if not (source / name).is_file():
            raise BackupError(f"the backup in {source} is incomplete: {name} is missing")
        if _sha256(source / name) != digest:
            raise BackupError(f"the backup in {source} is damaged: {name} does not match "
                              f"its SHA-256 in {MANIFEST_FILE}")
    return manifest


def _server_key(data_dir: Path) -> str:
    path = data_dir / PUBLIC_FILE
    if not path.is_file() or not (data_dir / SEALED_FILE).is_file():
        raise BackupError(f"no key store in {data_dir}: run `keyserver init` first, or give "
                          "the --data directory it made")
    try:
        return fingerprint(base64.b64decode(json.loads(path.read_text())["server_key"]))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BackupError(f"{path} is damaged: {exc!r}") from exc


def _new_directory(path: Path, command: str) -> None:
    """``path`` made private, refused if it holds anything (nothing is ever overwritten)."""
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise BackupError(f"{path} exists and is not an empty directory: `keyserver "
                          f"{command}` writes only into a new or empty one")
    make_private_dir(path)


def _empty(directory: Path) -> None:
    """Remove what a failed restore wrote (the directory was empty before)."""
    for entry in sorted(directory.rglob("*"), reverse=True):
        if entry.is_dir():
            entry.rmdir()
        else:
            entry.unlink()


def _copy(source: Path, target: Path) -> None:
    target.parent.mkdir(mode=0o700, exist_ok=True)
    shutil.copyfile(source, target)
    os.chmod(target, 0o600)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


def _sqlite_backup(source: Path, target: Path) -> None:
    """A consistent copy of a SQLite database that may be in use (with its write-ahead log):
    the source is opened read-only, so a mistyped path fails rather than copy an empty
    database."""
    if not source.is_file():
        raise BackupError(f"no database at {source}")
    reader = sqlite3.connect(source.resolve().as_uri() + "?mode=ro", uri=True)
    writer = sqlite3.connect(target)
    try:
        reader.backup(writer)
    except sqlite3.Error as exc:
        raise BackupError(f"cannot copy the database {source}: {exc}") from exc
    finally:
        writer.close()
        reader.close()
    os.chmod(target, 0o600)


def _pg_run(program: str, url: str, arguments: list[str]) -> None:
    """Run ``pg_dump``/``pg_restore`` on ``url``, the password in the environment (never on
    a command line, which other users of the machine can read)."""
    found = postgres_program(program)
    if found is None:
        raise BackupError(f"{program} is not installed (PostgreSQL's client programs: "
                          "apt-get install postgresql-client)")
    parsed = make_url(url)
    env = dict(os.environ)
    if parsed.password is not None:
        env["PGPASSWORD"] = str(parsed.password)
    dsn = parsed.set(drivername="postgresql", password=None).render_as_string(
        hide_password=False)
    try:
        done = subprocess.run([found, f"--dbname={dsn}", *arguments], env=env,
                              capture_output=True, text=True, timeout=PG_TIMEOUT, check=False)
    except subprocess.TimeoutExpired as exc:
        raise BackupError(f"{program} took longer than {PG_TIMEOUT:.0f} s") from exc
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"exit status {done.returncode}"]
        raise BackupError(f"{program} failed on {shown_url(url)}: {lines[0]}")

