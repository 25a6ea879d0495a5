"""``publish``'s input and pacing: events read line by line as they arrive (a live feed on
stdin or a FIFO), and the schedule that spaces them.

The lines are read in a daemon thread, since a read from a pipe blocks and cannot be
cancelled: a signal then ends the run without waiting for the next line. The thread
hands events over through a bounded queue, so a publisher slower than its input stops
reading and the writer of the pipe waits, instead of lines piling up in memory.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import stat
import sys
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from ibe_pubsub.credentials import Event, EventFilter, Schema
    from ibe_pubsub.peer import EventFileError

#: Events read ahead of the publisher at most.
BACKLOG = 256
#: Bytes of event bodies read ahead at most (bodies may be megabytes each).
BACKLOG_BYTES = 16 << 20
#: Seconds behind its schedule the publisher makes up by sending without pause; a longer
#: lag (a stall, or a pause of the input) is forgiven instead of released as a burst.
MAX_LAG = 1.0


def is_stream(path: str) -> bool:
    """Whether ``path`` (``-``: stdin) is a stream (a pipe, FIFO, terminal or socket) rather
    than a regular file, which can be checked whole before anything is sent."""
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode if path == "-" else os.stat(path).st_mode
    except (OSError, ValueError):  # missing: reading it says so
        return False
    return not stat.S_ISREG(mode)


@dataclass(frozen=True)
class BadLine:
    """A line that was skipped, with the error naming it."""

    error: EventFileError


class EventSource(Protocol):
    async def next(self, stop: asyncio.Event) -> Event | BadLine | None:
        """The next event or skipped line; None at the end of the input or once ``stop``
        is set; EventFileError if reading ends on an error."""

    @property
    def unsent(self) -> int:
        """Events read but not handed out by :meth:`next` (left when the run stopped)."""


@dataclass
class CheckedEvents:
    """The events of a file checked whole beforehand."""

    events: list[Event]
    _next: int = 0

    async def next(self, stop: asyncio.Event) -> Event | None:
        if stop.is_set() or self._next == len(self.events):
            return None
        self._next += 1
        return self.events[self._next - 1]

    @property
    def unsent(self) -> int:
        return len(self.events) - self._next


_END = object()


class _LoopGone(Exception):
    """The event loop ended (the run stopped): nobody takes what the reader reads any more."""


@dataclass
class EventFeed:
    """The events of a file or stream, each checked on its own as its line arrives; a bad
    line is skipped (handed over as :class:`BadLine`) with ``skip_bad``, else it ends the
    feed with its EventFileError, after the events before it."""

    path: str
    schema: Schema
    advertisement: EventFilter
    skip_bad: bool
    _queue: asyncio.Queue[object] = field(default_factory=lambda: asyncio.Queue(BACKLOG))
    #: Events the reader read, and those :meth:`next` handed out.
    _read_count: int = 0
    _taken: int = 0
    #: Body bytes of the events read and not yet handed out, under BACKLOG_BYTES.
    _queued_bytes: int = 0
    _room: threading.Condition = field(default_factory=threading.Condition)

    def __post_init__(self) -> None:
        """Start reading (on the running event loop's behalf)."""
        loop = asyncio.get_running_loop()
        self.reader = threading.Thread(target=self._read, args=(loop,), name="event-feed",
                                       daemon=True)
        self.reader.start()

    @property
    def unsent(self) -> int:
        return self._read_count - self._taken

    def _read(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read to the end, then queue the end marker or the error that ended the reading,
        whatever it is: :meth:`next` must never wait for ever on a reader that died."""
        from ibe_pubsub.peer import EventFileError, read_events

        def put(item: object) -> None:  # waits while the queue is full: back-pressure
            putting = self._queue.put(item)
            try:
                future = asyncio.run_coroutine_threadsafe(putting, loop)
            except RuntimeError as exc:  # the loop is closed
                putting.close()
                raise _LoopGone from exc
            try:
                future.result()
            except concurrent.futures.CancelledError as exc:  # by the loop, on its way out
                raise _LoopGone from exc

        def each(event: Event) -> None:
            with self._room:  # waits while the bodies read ahead fill BACKLOG_BYTES
                while self._queued_bytes and \
                        self._queued_bytes + len(event.body) > BACKLOG_BYTES:
                    if not self._room.wait(timeout=0.5) and loop.is_closed():
                        raise _LoopGone
                self._queued_bytes += len(event.body)
            self._read_count += 1
            put(event)

        def bad(error: EventFileError) -> None:
            put(BadLine(error))

        try:
            try:
                read_events(self.path, self.schema, self.advertisement, each=each,
                            bad=bad if self.skip_bad else None)
            except _LoopGone:
                raise
            except EventFileError as exc:
                put(exc)
            except Exception as exc:  # a bug: end the feed with one line, not a hang
                put(EventFileError(f"cannot read {self.path}: {type(exc).__name__}: {exc}"))
            else:
                put(_END)
        except _LoopGone:
            pass  # the run is over: what was read and not sent is counted in ``unsent``

    async def next(self, stop: asyncio.Event) -> Event | BadLine | None:
        from ibe_pubsub.peer import EventFileError

        if stop.is_set():
            return None
        getting = asyncio.ensure_future(self._queue.get())
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({getting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not getting.done():
            getting.cancel()
            return None
        item = getting.result()
        if isinstance(item, EventFileError):
            raise item
        if item is _END:
            return None
        if not isinstance(item, BadLine):
            self._taken += 1
            with self._room:
                self._queued_bytes -= len(item.body)  # type: ignore[attr-defined]
                self._room.notify()
        return item  # type: ignore[return-value]


@dataclass
class Schedule:
    """Paces events ``period`` seconds apart: the k-th is due at start + k * period, so the
    time spent publishing one does not add to the gap before the next. An event that is
    late by less than ``max_lag`` lets the ones after it go at once until the schedule is
    met again; beyond that the schedule starts over from the late event, so a pause of the
    input or a stall is not followed by a burst."""

    period: float
    max_lag: float = MAX_LAG
    _due: float | None = None

    def delay(self, now: float) -> float:
        """Seconds to wait before the next event (0: send it now); counts it as sent."""
        if self._due is None or now - self._due > self.max_lag:
            self._due = now
        due = self._due
        self._due += self.period
        return max(0.0, due - now)

    async def wait(self, stop: asyncio.Event) -> None:
        """Until the next event is due, or ``stop`` is set."""
        delay = self.delay(asyncio.get_running_loop().time())
        if delay > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
