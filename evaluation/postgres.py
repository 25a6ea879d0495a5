"""A throwaway PostgreSQL cluster on a free port of 127.0.0.1 (tests, ``bench keyserver``).

PostgreSQL's ``initdb`` and ``pg_ctl`` are found on PATH or under
``/usr/lib/postgresql/*/bin``; as root the cluster runs as the ``postgres`` account, since
PostgreSQL refuses to run as root. Trust authentication, no fsync: for measurements and
tests only, never for data that matters.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, text

from ibe_pubsub.evaluation.exceptions import EvaluationError
from ibe_pubsub.evaluation.launcher import free_port
from ibe_pubsub.keyserver import postgres_program


class PostgresUnavailable(EvaluationError):
    """No cluster can be started here; the message says why."""


def _as_postgres_user(cmd: list[str]) -> list[str]:
    return cmd if os.geteuid() != 0 else ["runuser", "-u", "postgres", "--", *cmd]


@contextmanager
def throwaway_postgres() -> Iterator[str]:
    """A running cluster for the duration; yields the URL of its ``postgres`` database.
    Raises :class:`PostgresUnavailable` where PostgreSQL is missing or cannot start."""
    try:
        import psycopg  # noqa: F401
    except ImportError as exc:
        raise PostgresUnavailable("psycopg (the PostgreSQL driver) is not installed: "
                                  "pip install '.[postgres]'") from exc
    initdb, pg_ctl = postgres_program("initdb"), postgres_program("pg_ctl")
    if not initdb or not pg_ctl:
        raise PostgresUnavailable("PostgreSQL is not installed (no initdb/pg_ctl; "
                                  "apt-get install postgresql)")
    root = Path(tempfile.mkdtemp(prefix="ibe-pg-", dir="/tmp"))
    try:
        if os.geteuid() == 0:
            try:
                account = pwd.getpwnam("postgres")
            except KeyError as exc:
                raise PostgresUnavailable("running as root and there is no 'postgres' account "
                                          "to run PostgreSQL") from exc
            os.chown(root, account.pw_uid, account.pw_gid)
        data, port = root / "data", free_port()
        for step in ([initdb, "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync"],
                     [pg_ctl, "-D", str(data), "-l", str(root / "log"), "-w", "-t", "60", "-o",
                      f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off",
                      "start"]):
            done = subprocess.run(_as_postgres_user(step), capture_output=True, text=True,
                                  timeout=120, check=False)
            if done.returncode != 0:
                raise PostgresUnavailable("PostgreSQL could not start: "
                                          f"{done.stderr.strip() or done.stdout}")
        try:
            yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
        finally:
            subprocess.run(_as_postgres_user([pg_ctl, "-D", str(data), "-m", "immediate",
                                              "stop"]), capture_output=True, timeout=60,
                           check=False)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def fresh_database(cluster_url: str) -> str:
    """A new, empty database on the cluster of ``cluster_url``; its URL."""
    name = "ks_" + uuid.uuid4().hex[:12]
    engine = create_engine(cluster_url, isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {name}"))
    finally:
        engine.dispose()
    return cluster_url.rsplit("/", 1)[0] + "/" + name


@contextmanager
def postgres_cluster(url: str | None) -> Iterator[str]:
    """The given cluster URL, or a throwaway cluster for the duration."""
    if url is not None:
        yield url
        return
    with throwaway_postgres() as started:
        yield started
