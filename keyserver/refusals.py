"""The audit of refusals: every answer that refuses a request (400, 401, 403, 409, 413, 415,
422, 429) becomes an audit entry with action ``refuse``.

An entry holds the status, code and message of the answer, the method and path, the
client address and, as its actor, the caller's name (``anonymous`` while the caller is
unknown). It never holds a token or a token's hash: those are secrets.

A flood of refusals must not stall the event loop or the database, so entries are queued
(bounded) and written by one background thread, many per transaction. A refusal that
finds the queue full is counted instead; the count is written with the next batch as an
entry with action ``refuse_dropped`` and actor ``keyserver``.

Rate-limit refusals (429) are what a flood produces once the limits bite, and the limits
do not bound them, so they are coalesced: the first 429 of a caller and client address
is written at once; those that follow within ``window`` seconds are counted and written
as one entry (``count``, ``first_at``, ``last_at``) when the window closes.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import sessionmaker
from starlette.types import Scope

from ibe_pubsub.keyserver.actors import ANONYMOUS, SERVER
from ibe_pubsub.keyserver.repository import audit

log = logging.getLogger(__name__)

REFUSALS = frozenset({400, 401, 403, 409, 413, 415, 422, 429})
MAX_TEXT = 300


@dataclass(frozen=True)
class _Entry:
    at: float
    actor: str
    epoch: int | None
    detail: dict[str, Any]


@dataclass
class _Limited:
    """The 429s of one caller and address after the first, in the current window."""

    first: _Entry
    count: int = 0
    last_at: float = 0.0


class RefusalLog:
    """Writes refusal entries from a queue of at most ``capacity``, ``batch`` per transaction;
    429s coalesced per caller and address over ``window`` seconds."""

    def __init__(self, sessions: sessionmaker, capacity: int = 4096, batch: int = 256,
                 window: float = 60.0) -> None:
        self._sessions, self._batch, self._window = sessions, batch, window
        self._queue: queue.Queue[_Entry] = queue.Queue(capacity)
        self._dropped = 0
        self._limited: dict[tuple[str, str | None], _Limited] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="refusal-audit", daemon=True)
        self._thread.start()

    def record(self, actor: str, epoch: int | None, detail: dict[str, Any]) -> None:
        """Queue an entry (or count a repeated 429); never blocks."""
        entry = _Entry(time.time(), actor, epoch, detail)
        if detail.get("status") == 429:
            key = (actor, detail.get("client"))
            with self._lock:
                limited = self._limited.get(key)
                if limited is not None:
                    limited.count += 1
                    limited.last_at = entry.at
                    return
                if len(self._limited) < self._queue.maxsize:
                    self._limited[key] = _Limited(entry)
        self._queue_entry(entry)

    def _queue_entry(self, entry: _Entry) -> None:
        try:
            self._queue.put_nowait(entry)
        except queue.Full:
            with self._lock:
                self._dropped += 1

    def _close_windows(self, everything: bool = False) -> None:
        """Queue one entry per caller and address whose 429 window has closed."""
        now = time.time()
        with self._lock:
            closed = [k for k, v in self._limited.items()
                      if everything or now - v.first.at >= self._window]
            done = [self._limited.pop(k) for k in closed]
        for limited in done:
            if limited.count:
                first = limited.first
                self._queue_entry(_Entry(limited.last_at, first.actor, first.epoch, first.detail | {
                    "message": f"{limited.count} more rate-limited requests",
                    "count": limited.count, "first_at": first.at, "last_at": limited.last_at}))

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued and counted, then stop the thread."""
        self._close_windows(everything=True)
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        while not (self._stop.is_set() and self._queue.empty()):
            self._close_windows()
            entries = self._take()
            if entries or self._dropped:
                self._write(entries)

    def _take(self) -> list[_Entry]:
        try:
            entries = [self._queue.get(timeout=0.2)]
        except queue.Empty:
            return []
        while len(entries) < self._batch:
            try:
                entries.append(self._queue.get_nowait())
            except queue.Empty:
                break
        return entries

    def _write(self, entries: list[_Entry]) -> None:
        with self._lock:
            dropped, self._dropped = self._dropped, 0
        try:
            with self._sessions.begin() as session:
                for e in entries:
                    audit(session, e.actor, "refuse", e.epoch, e.detail, e.at)
                if dropped:
                    audit(session, SERVER, "refuse_dropped", None, {"dropped": dropped})
        except SQLAlchemyError:
            log.exception("could not write %d refusal audit entries", len(entries))
            with self._lock:
                self._dropped += dropped + len(entries)


def audit_refusal(scope: Scope, status: int, code: str, message: str) -> None:
    """Queue the audit entry of a refusal answer (a no-op for other statuses): the one
    function the error handlers and the middleware both call."""
    if status not in REFUSALS:
        return
    state = getattr(scope["app"].state, "keyserver", None)
    if state is None:  # the error handlers installed on an app that is no key server
        return
    caller = scope.get("state", {}).get("caller")
    client = scope.get("client")
    state.refusals.record(
        ANONYMOUS if caller is None else caller.name, state.epoch().number,
        {"status": status, "code": code, "message": message[:MAX_TEXT],
         "method": scope.get("method"), "route": scope.get("path", "")[:MAX_TEXT],
         "client": client[0] if client else None})
