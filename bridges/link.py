"""What both bridges share over either broker: the counters they report, the bounded queue
that holds messages while one side is slow or down, and the loop that keeps a broker
connection up, connecting again with back-off after an outage.

A broker is reached through a :class:`Broker`, whose sessions are one connection each: a
session is never revived, so a broker client's own buffers of a dead connection cannot
send a message a second time behind the bridge's back.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict, dataclass
from typing import Generic, NoReturn, Protocol, TypeVar

from ibe_pubsub.bridges.exceptions import BrokerLost

log = logging.getLogger(__name__)

T = TypeVar("T")
#: Seconds between polls while waiting for a queue to drain.
DRAIN_POLL = 0.02


class Session(Protocol):
    """One connection to a broker."""

    async def send(self, topic: str, payload: bytes) -> None:
        """Returns once the broker acknowledged the message (raises otherwise)."""

    async def receive(self, topic: str, deliver: Callable[[str, bytes], None],
                      subscribed: Callable[[], None]) -> None:
        """Subscribe, call ``subscribed()``, then ``deliver(topic, payload)`` for every
        message until the connection is lost (raises then)."""


class Broker(Protocol):
    #: For log lines: "the MQTT broker at HOST:PORT".
    name: str
    #: Topic characters an event's value must not bring into a topic (separators, wildcards).
    reserved: str
    #: The client library's errors that mean the connection failed or ended.
    errors: tuple[type[Exception], ...]

    def session(self) -> AbstractAsyncContextManager[Session]: ...


@dataclass
class Counters:
    """What a bridge did, for its log lines, ``--stats-out`` and the final summary."""

    #: Messages taken from the broker (in), events taken from the subscriber (out).
    received: int = 0
    #: Events published into the overlay (in), messages the broker acknowledged (out).
    forwarded: int = 0
    #: Messages that are not events of the schema or lie outside the advertisement (in).
    refused: int = 0
    #: Taken but dropped because the queue was full (the oldest made room).
    dropped: int = 0
    #: Still queued when the bridge stopped.
    unsent: int = 0
    #: Messages sent again after an attempt the broker did not acknowledge (out): the
    #: broker may have had the first one, so these may be duplicates.
    resent: int = 0
    #: Times the broker connection was lost, or could not be made.
    outages: int = 0

    def summary(self) -> str:
        return ", ".join(f"{value} {name}" for name, value in asdict(self).items())


class BoundedQueue(Generic[T]):
    """A FIFO of at most ``limit`` items that never blocks its producer: a full queue drops
    its oldest item, counted in ``counters.dropped``. The item taken stays the consumer's
    until :meth:`done`: :meth:`take` gives it again, so a failed send is retried in order."""

    def __init__(self, limit: int, counters: Counters, what: str) -> None:
        self.limit = limit
        self.counters = counters
        self.what = what
        self._items: deque[T] = deque()
        self._held: list[T] = []
        self._attempts = 0
        self._arrived = asyncio.Event()

    def put(self, item: T) -> None:
        if len(self._items) >= self.limit:
            self._items.popleft()
            self.counters.dropped += 1
            if self.counters.dropped % 1000 == 1:  # a line now and then, not one per drop
                log.warning("queue of %d %s full: dropped the oldest (%d dropped so far)",
                            self.limit, self.what, self.counters.dropped)
        self._items.append(item)
        self._arrived.set()

    async def take(self) -> tuple[T, int]:
        """The oldest item, and how many times it was taken before without :meth:`done`."""
        if not self._held:
            while not self._items:
                self._arrived.clear()
                await self._arrived.wait()
            self._held.append(self._items.popleft())
            self._attempts = 0
        self._attempts += 1
        return self._held[0], self._attempts - 1

    def done(self) -> None:
        """The item taken is dealt with: the next :meth:`take` gives the next one."""
        self._held.clear()

    def __len__(self) -> int:
        """Items queued or held."""
        return len(self._items) + len(self._held)

    async def drained(self, timeout: float) -> bool:
        """Whether every item was dealt with within ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(self) and loop.time() < deadline:
            await asyncio.sleep(DRAIN_POLL)
        return not len(self)


class Backoff:
    """Delays between connection attempts: doubling from ``first`` up to ``most`` seconds,
    so a broker that restarts is found again quickly and one that stays down is not
    hammered."""

    def __init__(self, first: float = 0.1, most: float = 5.0) -> None:
        self.first = first
        self.most = most
        self._next = first

    def next(self) -> float:
        delay, self._next = self._next, min(self._next * 2, self.most)
        return delay

    def reset(self) -> None:
        self._next = self.first


async def keep_connected(broker: Broker, use: Callable[[Session], Awaitable[None]],
                         counters: Counters, backoff: Backoff) -> NoReturn:
    """Run ``use(session)`` on a connection to ``broker`` for ever: when the connection
    fails or ends, log it (once per outage), count it, wait and connect again."""
    down = False
    while True:
        try:
            async with broker.session() as session:
                if down:
                    log.warning("connected to %s again", broker.name)
                else:
                    log.info("connected to %s", broker.name)
                down = False
                backoff.reset()
                await use(session)
            reason = "the connection ended"
        except (*broker.errors, BrokerLost, OSError, TimeoutError) as exc:
            reason = str(exc) or type(exc).__name__
        delay = backoff.next()
        if not down:
            down = True
            counters.outages += 1
            log.warning("%s unreachable (%s): connecting again, every %g s at most until "
                        "it answers", broker.name, reason, backoff.most)
        else:
            log.debug("%s still unreachable (%s); next attempt in %g s", broker.name,
                      reason, delay)
        await asyncio.sleep(delay)
