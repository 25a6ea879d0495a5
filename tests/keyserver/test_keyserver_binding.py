"""A key store and its database belong to each other (real CLI processes, real SQLite and
PostgreSQL): ``serve`` refuses a database of another key store, an empty one, or one of
another kind than ``init`` was given; ``init`` refuses a database already in use, an
unsupported URL, and leaves nothing behind when the database fails."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

from keyserver_fixtures import PASSPHRASE, KeyServers

from ibe_pubsub.evaluation.launcher import child_env, cli_command, free_port, serve_expecting_exit
from ibe_pubsub.evaluation.postgres import fresh_database
from ibe_pubsub.keyserver.client import KeyServerClient

URL_FORMS = "sqlite:///PATH or postgresql+psycopg://USER@HOST/DB"


def _init(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli_command("keyserver", "init", "--data", str(data), *args),
                          env=child_env(PASSPHRASE), capture_output=True, text=True,
                          timeout=120, check=False)


def _serve(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return serve_expecting_exit(data, PASSPHRASE, ("--workers", "1", *args), timeout=90)


def _refused(done: subprocess.CompletedProcess[str], *phrases: str) -> str:
    """Exit 2 with one line naming ``phrases``."""
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("ibe-pubsub: error: ") and done.stderr.count("\n") == 1, \
        done.stderr
    for phrase in phrases:
        assert phrase in done.stderr
    return done.stderr


def _sqlite(path: Path) -> str:
    return f"sqlite:///{path}"


def test_init_refuses_unsupported_urls_and_a_failed_init_leaves_nothing(tmp_path: Path) -> None:
    data = tmp_path / "ks"
    for url in ("mysql://u@db.test/ibe", "postgres://u@db.test/ibe"):
        _refused(_init(data, "--database-url", url), URL_FORMS, url.split("//")[0])
    unreachable = f"postgresql+psycopg://ibe:s3cret@127.0.0.1:{free_port()}/ibe"
    failed = _refused(_init(data, "--database-url", unreachable), "ibe:***@127.0.0.1",
                      "then run init again")
    assert "backup" not in failed and "s3cret" not in failed
    assert list(data.iterdir()) == []  # no key store without its database
    retry = _init(data)
    assert retry.returncode == 0, retry.stderr
    assert json.loads((data / "database.json").read_text()) == {"database_url": None}


def test_serve_and_init_keep_a_key_store_and_its_database_together(
        tmp_path: Path, keyserver_factory: KeyServers) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a_db, b_db = _sqlite(a / "keyserver.db"), _sqlite(tmp_path / "b.db")
    assert _init(a).returncode == 0
    _refused(_init(b, "--database-url", a_db), "already belongs to a key store")
    assert list(b.iterdir()) == []
    assert _init(b, "--database-url", b_db).returncode == 0  # control: a database of its own
    _refused(_serve(b, "--database-url", a_db), "belongs to another key store")
    _refused(_serve(b), f"initialised with the database {b_db}", "--database-url")
    _refused(_serve(a, "--database-url", b_db), "initialised with SQLite in",
             "leave out --database-url")
    empty = tmp_path / "empty.db"
    _refused(_serve(b, "--database-url", _sqlite(empty)), "holds no key server data")
    assert not empty.exists()
    server = keyserver_factory.start(data_dir=b, serve_args=("--database-url", b_db))
    admin = KeyServerClient(server.base_url, server.admin_token, retries=0)
    admin.create_identity("kept", "subscriber")
    keyserver_factory.stop(server)
    # A database and a data directory from before the binding: the serve that accepts
    # them records it; the init entry of the audit log still names the key store.
    for data, db in ((a, a / "keyserver.db"), (b, tmp_path / "b.db")):
        with sqlite3.connect(db) as conn:
            conn.execute("DELETE FROM settings WHERE key = 'keystore'")
        (data / "database.json").unlink()
    _refused(_serve(a, "--database-url", b_db), "belongs to another key store")
    server = keyserver_factory.start(data_dir=b, serve_args=("--database-url", b_db))
    admin = KeyServerClient(server.base_url, server.admin_token, retries=0)
    assert [row["name"] for row in admin.list_identities()] == ["kept"]
    with sqlite3.connect(tmp_path / "b.db") as conn:
        assert conn.execute("SELECT value FROM settings WHERE key = 'keystore'").fetchone()
    assert json.loads((b / "database.json").read_text()) == {"database_url": b_db}


def test_a_postgresql_key_store_is_not_served_from_sqlite(
        tmp_path: Path, postgres_url: str, keyserver_factory: KeyServers) -> None:
    url = fresh_database(postgres_url)
    a, b = tmp_path / "a", tmp_path / "b"
    assert _init(a, "--database-url", url).returncode == 0
    _refused(_serve(a), "initialised with the database postgresql+psycopg://",
             "--database-url (or $IBE_PUBSUB_DATABASE_URL)")
    assert not (a / "keyserver.db").exists()
    _refused(_init(b, "--database-url", url), "already belongs to a key store")
    assert list(b.iterdir()) == []
    server = keyserver_factory.start(data_dir=a, serve_args=("--database-url", url))
    assert KeyServerClient(server.base_url).epoch()["epoch"] == 1


def test_two_inits_racing_for_one_database_have_one_winner(tmp_path, monkeypatch):
    """Both pass the check before either claims: the claim transaction itself refuses the
    second, which leaves nothing behind (the control is the winner, which serves)."""
    import threading

    import ibe_pubsub.keyserver.creation as creation
    from ibe_pubsub.credentials.schema import builtin_schema
    from ibe_pubsub.keyserver.keystore import KeyStoreError

    monkeypatch.setenv("IBE_PUBSUB_PASSPHRASE", PASSPHRASE)
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    checked, first_done = threading.Barrier(2), threading.Event()
    check = creation.check_unclaimed

    def check_then_wait(u: str) -> None:
        check(u)
        checked.wait(timeout=30)
        if threading.current_thread().name == "second":
            first_done.wait(timeout=60)

    monkeypatch.setattr(creation, "check_unclaimed", check_then_wait)
    results: dict[str, object] = {}

    def init(name: str) -> None:
        try:
            results[name] = creation.initialise(tmp_path / name, builtin_schema("stocks"), url,
                                              600, 60)
        except KeyStoreError as exc:
            results[name] = exc
        finally:
            if name == "first":
                first_done.set()

    threads = [threading.Thread(target=init, args=(n,), name=n) for n in ("first", "second")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not isinstance(results["first"], Exception), results
    assert isinstance(results["second"], KeyStoreError)
    assert "claimed meanwhile by another key store" in str(results["second"])
    assert not (tmp_path / "second").exists() or not any((tmp_path / "second").iterdir())
    with sqlite3.connect(tmp_path / "shared.db") as db:
        assert db.execute("SELECT count(*) FROM audit_log WHERE action = 'init'").fetchone()[0] == 1
    # the control: the database is the winner's
    from ibe_pubsub.keyserver.binding import check_owner
    from ibe_pubsub.keyserver.keystore import load_keystore
    winner = load_keystore(tmp_path / "first", PASSPHRASE)
    check_owner(url, winner.fingerprint, tmp_path / "first")
