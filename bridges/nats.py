"""NATS through nats-py. Core NATS keeps no messages: what is published while the bridge
is disconnected never reaches it (in), and a message counts as sent once the server
answered a flush after it (out).

The client's own reconnection is off: it would replay its buffer of a dead connection
behind the bridge's back; the shared loop of :mod:`link` connects again instead, with a
new client each time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from ibe_pubsub.bridges.exceptions import BrokerLost, library_missing

try:
    import nats
    import nats.errors
    from nats.aio.client import Client
    from nats.aio.msg import Msg
except ImportError as exc:
    raise library_missing("the NATS client nats-py") from exc

log = logging.getLogger(__name__)

#: Subject characters an event's value must not bring into a subject: token separator,
#: wildcards and white space.
RESERVED = ".*> \t\r\n"
#: Seconds to connect, and for the server to answer a flush.
CONNECT_TIMEOUT, ACK_TIMEOUT = 2.0, 5.0
#: Seconds between pings, so a server that stops answering is noticed.
PING_INTERVAL = 5


class NatsBroker:
    """A NATS server at ``host:port``."""

    reserved = RESERVED

    def __init__(self, host: str, port: int = 4222, ack_timeout: float = ACK_TIMEOUT) -> None:
        self.url = f"nats://{host}:{port}"
        self.ack_timeout = ack_timeout
        self.name = f"the NATS server at {host}:{port}"
        self.errors: tuple[type[Exception], ...] = (nats.errors.Error,)

    @asynccontextmanager
    async def session(self) -> AsyncIterator[_NatsSession]:
        closed = asyncio.Event()

        async def on_closed() -> None:
            closed.set()

        async def on_error(exc: Exception) -> None:
            log.debug("%s: %s", self.name, exc)  # the loop of link reports the outage

        client = await nats.connect(self.url, allow_reconnect=False,
                                    connect_timeout=CONNECT_TIMEOUT,
                                    ping_interval=PING_INTERVAL, max_outstanding_pings=2,
                                    closed_cb=on_closed, error_cb=on_error)
        try:
            yield _NatsSession(client, closed, self.ack_timeout)
        finally:
            if not client.is_closed:
                await client.close()


class _NatsSession:
    def __init__(self, client: Client, closed: asyncio.Event, ack_timeout: float) -> None:
        self.client = client
        self.closed = closed
        self.ack_timeout = ack_timeout

    async def send(self, topic: str, payload: bytes) -> None:
        if self.client.is_closed:
            raise BrokerLost("the connection closed")
        await self.client.publish(topic, payload)
        await self.client.flush(self.ack_timeout)  # type: ignore[arg-type]

    async def receive(self, topic: str, deliver: Callable[[str, bytes], None],
                      subscribed: Callable[[], None]) -> None:
        async def each(message: Msg) -> None:
            deliver(message.subject, message.data)

        await self.client.subscribe(topic, cb=each)
        await self.client.flush(self.ack_timeout)  # type: ignore[arg-type]
        subscribed()
        await self.closed.wait()
        raise BrokerLost("the connection closed")
