"""Locks shared by every replica of a key server: PostgreSQL advisory locks.

Replicas share nothing but the database, so whatever one process must do alone (run the
migrations, issue one bulk chunk) takes a transaction-level advisory lock there, in a
transaction of its own on a connection of its own, held open for as long as the lock.
PostgreSQL releases it when that transaction ends, also when the connection drops, so a
replica killed while holding it blocks nobody. On SQLite, served by one process, the lock
is a no-op (SQLite's own write lock serializes what it must).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
from collections.abc import AsyncIterator
from types import TracebackType

from sqlalchemy import func, select
from sqlalchemy.engine import Connection, Engine

MIGRATIONS_LOCK = "migrations"


def lock_key(name: str) -> int:
    """The signed 64-bit key of ``name`` (``pg_advisory_lock`` takes a bigint)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


class AdvisoryLock:
    """``with AdvisoryLock(engine, name):`` runs alone among all processes of the database;
    ``acquire`` blocks until the lock is free."""

    def __init__(self, engine: Engine, name: str) -> None:
        self.engine, self.key = engine, lock_key(name)
        self._connection: Connection | None = None

    @property
    def shared(self) -> bool:
        return self.engine.dialect.name == "postgresql"

    def acquire(self) -> None:
        if not self.shared:
            return
        connection = self.engine.connect()
        try:
            connection.execute(select(func.pg_advisory_xact_lock(self.key)))
        except BaseException:
            connection.close()
            raise
        self._connection = connection

    def release(self) -> None:
        """End the lock's transaction (a connection dropped unreleased ends it as well, when
        the pool rolls it back or the server sees it close)."""
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()

    def __enter__(self) -> AdvisoryLock:
        self.acquire()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.release()



@contextlib.asynccontextmanager
async def holding(lock: AdvisoryLock) -> AsyncIterator[None]:
    """``async with holding(lock):`` waits for ``lock`` in a worker thread, keeping the event
    loop free. A task cancelled while it waits cannot leave the lock held: the thread goes
    on waiting, and the lock it then gets is released at once (in another thread), not when
    the garbage collector finds the abandoned connection."""
    acquiring = asyncio.ensure_future(asyncio.to_thread(lock.acquire))
    try:
        await asyncio.shield(acquiring)
    except asyncio.CancelledError:
        acquiring.add_done_callback(functools.partial(_release_if_acquired, lock))
        raise
    try:
        yield
    finally:
        await asyncio.to_thread(lock.release)  # runs to the end even if this task is cancelled


def _release_if_acquired(lock: AdvisoryLock, acquiring: asyncio.Future[None]) -> None:
    if not acquiring.cancelled() and acquiring.exception() is None:
        asyncio.get_running_loop().run_in_executor(None, lock.release)
