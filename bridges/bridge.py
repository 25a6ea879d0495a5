"""The two directions, over any :class:`link.Broker`.

In: a receiver keeps a subscription to the broker topic and queues each message; a
forwarder maps it to an event and publishes it through the client API's Publisher, which
waits while the overlay is slow, so the bounded queue is where a burst waits (and, past
its bound, where the oldest is dropped and counted).

Out: the client API's Subscriber hands each delivered event to the queue; a sender
publishes the oldest and takes it off the queue only once the broker acknowledged it, so
while the broker is down events wait (up to the bound) and go out, in order, once it
is back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from ibe_pubsub.bridges.exceptions import MessageRefused
from ibe_pubsub.bridges.link import (
    Backoff,
    BoundedQueue,
    Broker,
    Counters,
    Session,
    keep_connected,
)
from ibe_pubsub.bridges.mapping import TopicTemplate, delivery_payload, message_event
from ibe_pubsub.client import Delivery, Publisher, PublishRefused, Subscriber

log = logging.getLogger(__name__)

#: Messages (in) or events (out) held while the other side is slow or down.
QUEUE_SIZE = 10_000


class _Bridge:
    """The counters, queue, tasks and closing both directions share."""

    direction = ""

    def __init__(self, broker: Broker, topic: str, queue_size: int,
                 max_backoff: float) -> None:
        self.broker = broker
        self.topic = topic
        self.counters = Counters()
        self.queue: BoundedQueue[tuple[str, bytes]] = BoundedQueue(
            queue_size, self.counters, "messages" if self.direction == "in" else "events")
        self.backoff = Backoff(most=max_backoff)
        #: Set once connected (and, in, subscribed) the first time.
        self.ready = asyncio.Event()
        #: Set when a task of the bridge failed unexpectedly (``failure`` says how): it
        #: forwards nothing any more, so whoever runs it must stop it rather than let it
        #: run on as a zombie.
        self.failed = asyncio.Event()
        self.failure: str | None = None
        self._tasks: list[asyncio.Task[Any]] = []

    def _spawn(self, work: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        task.add_done_callback(self._task_done)
        self._tasks.append(task)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        """A task ends only when cancelled (on close); anything else fails the bridge."""
        if task.cancelled():
            return
        exc = task.exception()
        if self.failure is None:
            reason = "returned" if exc is None else f"{type(exc).__name__}: {exc}"
            self.failure = (f"bridge {self.direction}: {task.get_coro().__qualname__} stopped "
                            f"unexpectedly ({reason})")
            log.error("%s", self.failure)
            log.debug("the failed task's traceback", exc_info=exc)
            self.failed.set()

    async def close(self, flush_timeout: float = 10.0) -> None:
        """Hand on what is queued (within ``flush_timeout`` s), stop, and count what was
        left in ``counters.unsent``."""
        await self._stop_taking()
        if not self.failed.is_set():  # else nothing takes from the queue any more
            await self.queue.drained(flush_timeout)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self.counters.unsent = len(self.queue)

    async def _stop_taking(self) -> None:
        """Take nothing more (the receiver's subscription, in)."""

    def summary(self) -> str:
        return f"bridge {self.direction} ({self.broker.name}, {self.topic}): " \
               f"{self.counters.summary()}"


class InBridge(_Bridge):
    """Publishes each message of a broker topic (filter) into the overlay as an event."""

    direction = "in"

    def __init__(self, broker: Broker, topic: str, publisher: Publisher, *,
                 queue_size: int = QUEUE_SIZE, max_backoff: float = 5.0) -> None:
        super().__init__(broker, topic, queue_size, max_backoff)
        self.publisher = publisher
        self._receiver: asyncio.Task[Any] | None = None

    def start(self) -> None:
        self._spawn(keep_connected(self.broker, self._receive, self.counters, self.backoff))
        self._receiver = self._tasks[-1]
        self._spawn(self._forward())

    async def _receive(self, session: Session) -> None:
        await session.receive(self.topic, self._take, self.ready.set)

    def _take(self, topic: str, payload: bytes) -> None:
        self.counters.received += 1
        self.queue.put((topic, payload))

    async def _forward(self) -> None:
        schema = self.publisher.schema
        while True:
            (topic, payload), _ = await self.queue.take()
            where = f"message from {topic}"
            try:
                event = message_event(payload, schema, where)
                await self.publisher.publish(event.values, event.body, event.event_id or None)
            except MessageRefused as exc:
                self._refused(str(exc))
            except PublishRefused as exc:
                self._refused(f"{where}: {exc}")
            else:
                self.counters.forwarded += 1
            finally:
                self.queue.done()

    def _refused(self, reason: str) -> None:
        self.counters.refused += 1
        log.warning("refused %s", reason)

    async def _stop_taking(self) -> None:
        if self._receiver is not None:
            self._receiver.cancel()
            await asyncio.gather(self._receiver, return_exceptions=True)  # failed: said so

    async def __aenter__(self) -> InBridge:
        self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()


class OutBridge(_Bridge):
    """Publishes each event a subscriber delivers to the broker, on a topic made from
    ``template``; close the subscriber before the bridge so its last events go out too."""

    direction = "out"

    def __init__(self, broker: Broker, template: TopicTemplate, subscriber: Subscriber, *,
                 queue_size: int = QUEUE_SIZE, max_backoff: float = 5.0) -> None:
        super().__init__(broker, template.template, queue_size, max_backoff)
        self.template = template
        self.subscriber = subscriber

    def start(self) -> None:
        # a connected subscriber has the key service's parameters
        self.template.check(self.subscriber.node.service.pp.schema)
        self.subscriber.on_event(self._take)
        self._spawn(keep_connected(self.broker, self._send, self.counters, self.backoff))

    def _take(self, delivery: Delivery) -> None:
        self.counters.received += 1
        self.queue.put((self.template.topic(delivery), delivery_payload(delivery)))

    async def _send(self, session: Session) -> None:
        self.ready.set()
        while True:
            (topic, payload), earlier = await self.queue.take()
            if earlier:
                self.counters.resent += 1
            await session.send(topic, payload)
            self.queue.done()
            self.counters.forwarded += 1

    async def __aenter__(self) -> OutBridge:
        self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()
