"""Alembic migrations: upgrade from empty, downgrade, upgrade again, on SQLite and PostgreSQL;
the migrated schema matches the models; the audit log refuses UPDATE and DELETE; a database
of an older revision keeps its rows on upgrade."""

from __future__ import annotations

import time

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.exc import DBAPIError

from ibe_pubsub.evaluation.postgres import fresh_database
from ibe_pubsub.keyserver.client import KeyServerClient
from ibe_pubsub.keyserver.db import Base
from ibe_pubsub.keyserver.migrate import downgrade, upgrade

TABLES = {"settings", "identities", "audit_log", "directory", "bulk_chunks", "peer_addresses",
          "tree_grants"}
FIRST_REVISION_TABLES = TABLES - {"peer_addresses", "tree_grants"}


def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def _check_migrated(url: str) -> None:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO audit_log (at, actor, action, epoch, detail) "
                              "VALUES (1.0, 'admin', 'test', 1, '{}')"))
        for statement in ("UPDATE audit_log SET actor = 'mallory'", "DELETE FROM audit_log"):
            with pytest.raises(DBAPIError, match="append-only"), engine.begin() as conn:
                conn.execute(text(statement))
    finally:
        engine.dispose()


def _up_down_up(url: str) -> None:
    upgrade(url)
    assert _tables(url) == TABLES
    _check_migrated(url)
    downgrade(url)
    assert _tables(url) == set()
    upgrade(url)
    assert _tables(url) == TABLES


def _upgrade_keeps_rows(url: str) -> None:
    """A database made by the first release (directory without vouches, no owned addresses,
    no bulk-only mark) upgrades in place: its directory entry stays, unvouched; the identity
    that bulk issuance created (its audit entry says so) becomes bulk-only, the other not."""
    upgrade(url, "0001")
    assert _tables(url) == FIRST_REVISION_TABLES
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            for number, name in ((1, "old"), (2, "old-bulk")):
                conn.execute(text("INSERT INTO identities (id, name, role, token_hash, "
                                  "created_at) VALUES (:id, :name, 'subscriber', :name, 1.0)"),
                             {"id": number, "name": name})
            for detail in ('{"identity": "old", "role": "subscriber"}',
                           '{"identity": "old-bulk", "role": "subscriber", "via": "bulk"}'):
                conn.execute(text("INSERT INTO audit_log (at, actor, action, epoch, detail) "
                                  "VALUES (1.0, 'admin', 'create_identity', 1, :detail)"),
                             {"detail": detail})
            conn.execute(text("INSERT INTO directory (attribute, address, role, identity_id, "
                              "expires_at) VALUES ('symbol', 'h.test:1', 'subscriber', 1, 9.0)"))
        upgrade(url)
        assert _tables(url) == TABLES
        with engine.connect() as conn:
            assert conn.execute(text("SELECT address, vouched_at FROM directory")).all() == [
                ("h.test:1", None)]
            assert conn.execute(text("SELECT name, bulk_only FROM identities ORDER BY id")
                                ).all() == [("old", False), ("old-bulk", True)]
    finally:
        engine.dispose()
    _check_migrated(url)


def test_migrations_on_sqlite(tmp_path):
    _up_down_up(f"sqlite:///{tmp_path / 'ks.db'}")
    _upgrade_keeps_rows(f"sqlite:///{tmp_path / 'old.db'}")


def test_migrations_on_postgresql(postgres_url):
    _up_down_up(fresh_database(postgres_url))
    _upgrade_keeps_rows(fresh_database(postgres_url))


def test_key_server_runs_on_postgresql_across_restarts(postgres_url, keyserver_factory):
    url = fresh_database(postgres_url)
    server = keyserver_factory.start(init_args=("--database-url", url),
                                     serve_args=("--database-url", url, "--workers", "1"))
    admin = KeyServerClient(server.base_url, server.admin_token, retries=0)
    token = admin.create_identity("pg-user", "publisher")["token"]
    KeyServerClient(server.base_url, token).enrol_publisher("price < 10")
    server = keyserver_factory.restart(server, ("--database-url", url, "--workers", "1"))
    admin = KeyServerClient(server.base_url, server.admin_token, retries=0)
    assert [i["name"] for i in admin.list_identities()] == ["pg-user"]
    assert [e["action"] for e in admin.audit()] == ["init", "create_identity", "issue_publisher"]
    assert admin.audit()[0]["at"] <= time.time()
