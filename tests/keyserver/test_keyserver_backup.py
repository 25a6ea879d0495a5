"""``keyserver backup`` and ``keyserver restore`` with real processes: a backup taken while
the server runs, restored into a new data directory (SQLite) or a new database
(PostgreSQL), serves keys that decrypt an event encrypted before the backup and refuses an
identity revoked before it; an identity created after the backup is not in it. A damaged
backup, a directory that holds something and a database that belongs to a key store are
refused, and nothing is written."""

from __future__ import annotations

import json
import stat
import subprocess
from pathlib import Path

import pytest
from keyserver_fixtures import PASSPHRASE, KeyServers

from ibe_pubsub.credentials import Event, parse_predicate, scheme
from ibe_pubsub.evaluation.launcher import child_env, cli_command
from ibe_pubsub.evaluation.postgres import fresh_database
from ibe_pubsub.keyserver import decode_subscriber_bundle
from ibe_pubsub.keyserver.client import KeyServerClient, KeyServerRequestError
from ibe_pubsub.peer.enrolment import enrol_publisher, fetch_params, real_crypto

EVENT = Event("before-the-backup", {"symbol": "IBM", "price": 42.5, "volume": 1000})


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cli_command(*args), env=child_env(PASSPHRASE), capture_output=True,
                          text=True, timeout=120, check=False)


def _refused(done: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and all(n in done.stderr for n in needles), done.stderr


def _decrypts(base_url: str, token: str, subscription: str, ciphertext: bytes) -> bool:
    client = KeyServerClient(base_url, token, retries=0)
    params = fetch_params(client)
    doc = client.enrol_subscriber(subscription, fine_depth=0)
    key = scheme.prepare_subscriber_key(
        params.pp, decode_subscriber_bundle(params.pp.group, doc).key)
    crypto = real_crypto(params)
    event = crypto.decrypt(key, crypto.decode_event(ciphertext))
    return event is not None and event.values == EVENT.values


def _back_up_and_restore(servers: KeyServers, tmp_path: Path, old_db: tuple[str, ...] = (),
                         new_db: tuple[str, ...] = ()) -> Path:
    """Back up a running server, restore it, serve the restored copy: the checks the issue
    names, with a control for each. Returns the backup's directory."""
    server = servers.start(init_args=old_db, serve_args=("--workers", "1", *old_db))
    admin = KeyServerClient(server.base_url, server.admin_token, retries=0)
    publisher, kept, revoked = (admin.create_identity(name, role) for name, role in (
        ("pub", "publisher"), ("kept", "subscriber"), ("gone", "subscriber")))
    admin.revoke(revoked["id"])
    params = fetch_params(KeyServerClient(server.base_url))
    keys = enrol_publisher(KeyServerClient(server.base_url, publisher["token"]), params,
                           parse_predicate(params.pp.schema, "price < 500"))
    ciphertext = real_crypto(params).encrypt(keys.keys, EVENT)

    backup = tmp_path / "backup"
    done = _run("keyserver", "backup", "--data", str(server.data_dir), "--out", str(backup),
                *old_db)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(backup.stat().st_mode) == 0o700
    later = admin.create_identity("later", "subscriber")  # after the backup: not in it
    servers.stop(server)

    restored_dir = tmp_path / "restored"
    done = _run("keyserver", "restore", "--from", str(backup), "--data", str(restored_dir),
                *new_db)
    assert done.returncode == 0, done.stderr
    restored = servers.start(data_dir=restored_dir, serve_args=("--workers", "1", *new_db))
    same = fetch_params(KeyServerClient(restored.base_url))
    assert (same.server_key, same.pp.mpk) == (params.server_key, params.pp.mpk)
    assert restored.admin_token == server.admin_token
    # Keys from the restored server open the event encrypted before the backup; a
    # credential the event does not match gets keys that do not (control).
    assert _decrypts(restored.base_url, kept["token"], "price < 100", ciphertext)
    assert not _decrypts(restored.base_url, kept["token"], "price >= 100", ciphertext)
    for identity, status in ((revoked, 403), (later, 401)):
        with pytest.raises(KeyServerRequestError) as refused:
            KeyServerClient(restored.base_url, identity["token"], retries=0).enrol_subscriber(
                "price < 100", fine_depth=0)
        assert refused.value.status == status
    names = {i["name"]: i for i in KeyServerClient(
        restored.base_url, restored.admin_token, retries=0).list_identities()}
    assert set(names) == {"pub", "kept", "gone"}
    servers.stop(restored)
    return backup


def test_a_sqlite_backup_restores_keys_and_revocations_and_refuses_damage(
        keyserver_factory: KeyServers, tmp_path: Path) -> None:
    backup = _back_up_and_restore(keyserver_factory, tmp_path)
    manifest = json.loads((backup / "backup.json").read_text())
    assert manifest["database"] == "sqlite" and "keyserver.db" in manifest["files"]

    # Nothing is ever written over: a directory that holds something is refused.
    _refused(_run("keyserver", "restore", "--from", str(backup), "--data",
                  str(tmp_path / "restored")), "not an empty directory")
    _refused(_run("keyserver", "backup", "--data", str(tmp_path / "restored"), "--out",
                  str(backup)), "not an empty directory")
    # One byte changed anywhere (here in the sealed master secret) and nothing is restored.
    sealed = backup / "master.sealed"
    data = bytearray(sealed.read_bytes())
    data[-1] ^= 1
    sealed.write_bytes(bytes(data))
    target = tmp_path / "from-damaged"
    _refused(_run("keyserver", "restore", "--from", str(backup), "--data", str(target)),
             "master.sealed does not match its SHA-256")
    assert not target.exists()
    _refused(_run("keyserver", "restore", "--from", str(tmp_path), "--data", str(target)),
             "backup.json is missing")


def test_a_postgresql_backup_restores_into_a_new_database(
        keyserver_factory: KeyServers, tmp_path: Path, postgres_url: str) -> None:
    old, new = fresh_database(postgres_url), fresh_database(postgres_url)
    backup = _back_up_and_restore(keyserver_factory, tmp_path, ("--database-url", old),
                                  ("--database-url", new))
    assert json.loads((backup / "backup.json").read_text())["database"] == "postgresql"
    # The old database belongs to a key store: a restore into it is refused.
    _refused(_run("keyserver", "restore", "--from", str(backup), "--data",
                  str(tmp_path / "again"), "--database-url", old), "already belongs")
    assert not (tmp_path / "again").exists()
