"""MQTT through aiomqtt (asyncio, on paho-mqtt): QoS 1 both ways, so the broker
acknowledges what the bridge sends and redelivers what it did not see acknowledged.

Each session is a new client: paho keeps unacknowledged messages of a dead connection to
send them again itself, which would repeat what the bridge already retries. With a fixed
``client_id`` the session is persistent (clean session off): a broker that stays up keeps
the QoS 1 messages of the in-bridge's subscription while the bridge is away.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from ibe_pubsub.bridges.exceptions import BrokerLost, library_missing

try:
    import aiomqtt
except ImportError as exc:
    raise library_missing("the MQTT client aiomqtt") from exc

#: Topic characters an event's value must not bring into a topic: level separator and
#: wildcards.
RESERVED = "/+#"
#: Seconds a broker may take to acknowledge, and between keep-alive pings.
ACK_TIMEOUT, KEEPALIVE = 5.0, 10


class MqttBroker:
    """An MQTT broker at ``host:port``."""

    reserved = RESERVED

    def __init__(self, host: str, port: int = 1883, client_id: str | None = None,
                 ack_timeout: float = ACK_TIMEOUT) -> None:
        self.host, self.port = host, port
        self.client_id = client_id
        self.ack_timeout = ack_timeout
        self.name = f"the MQTT broker at {host}:{port}"
        self.errors: tuple[type[Exception], ...] = (aiomqtt.MqttError,)

    @asynccontextmanager
    async def session(self) -> AsyncIterator[_MqttSession]:
        client = aiomqtt.Client(self.host, self.port, identifier=self.client_id,
                                clean_session=self.client_id is None,
                                timeout=self.ack_timeout, keepalive=KEEPALIVE)
        async with client:
            yield _MqttSession(client, self.ack_timeout)


class _MqttSession:
    def __init__(self, client: aiomqtt.Client, ack_timeout: float) -> None:
        self.client = client
        self.ack_timeout = ack_timeout

    async def send(self, topic: str, payload: bytes) -> None:
        await self.client.publish(topic, payload, qos=1, timeout=self.ack_timeout)

    async def receive(self, topic: str, deliver: Callable[[str, bytes], None],
                      subscribed: Callable[[], None]) -> None:
        await self.client.subscribe(topic, qos=1)
        subscribed()
        async for message in self.client.messages:
            payload = message.payload
            deliver(str(message.topic), payload if isinstance(payload, bytes)
                    else b"" if payload is None else str(payload).encode())
        raise BrokerLost("the subscription ended")
