"""The tests' side of each broker, through the client libraries directly (not the bridge's
code): send raw messages in, and capture what a bridge publishes out in a store that
outlives a broker restart (an MQTT persistent session; a NATS JetStream stream), so the
capture cannot miss a message while it reconnects."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from ibe_pubsub.bridges import Broker

aiomqtt = pytest.importorskip("aiomqtt", reason="the bridges extra is not installed")
nats = pytest.importorskip("nats", reason="the bridges extra is not installed")

#: The topic filter an in-bridge consumes and a concrete topic inside it, and the template
#: an out-bridge publishes to and the filter that captures it.
TOPICS = {
    "mqtt": ("sensors/#", "sensors/quotes", "quotes/{symbol}", "quotes/#"),
    "nats": ("sensors.>", "sensors.quotes", "quotes.{symbol}", "quotes.>"),
}


async def until(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """Poll ``condition()`` until it holds (AssertionError naming ``what`` after
    ``timeout`` s): the tests wait for conditions, not for fixed times."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.02)


def bridge_broker(kind: str, port: int) -> Broker:
    """The bridge's side, with short acknowledgement timeouts for the tests."""
    from ibe_pubsub.bridges import MqttBroker, NatsBroker  # after the skips above

    return MqttBroker("127.0.0.1", port, ack_timeout=2) if kind == "mqtt" else \
        NatsBroker("127.0.0.1", port, ack_timeout=2)


def message(obj: Any) -> bytes:
    return obj if isinstance(obj, bytes) else json.dumps(obj).encode()


async def send(kind: str, port: int, topic: str, payloads: list[bytes]) -> None:
    """Publish ``payloads`` to ``topic``, acknowledged by the broker (QoS 1 / a flush)."""
    if kind == "mqtt":
        async with aiomqtt.Client("127.0.0.1", port) as client:
            for payload in payloads:
                await client.publish(topic, payload, qos=1)
        return
    client = await nats.connect(f"nats://127.0.0.1:{port}", allow_reconnect=False)
    try:
        for payload in payloads:
            await client.publish(topic, payload)
        await client.flush()
    finally:
        await client.close()


class Capture:
    """Everything published to ``topic_filter`` from :meth:`register` on, kept by the
    broker across its restarts."""

    CLIENT_ID = "bridges-test-capture"

    def __init__(self, kind: str, port: int, topic_filter: str) -> None:
        self.kind, self.port, self.filter = kind, port, topic_filter

    def _mqtt(self) -> aiomqtt.Client:
        return aiomqtt.Client("127.0.0.1", self.port, identifier=self.CLIENT_ID,
                              clean_session=False)

    async def register(self) -> None:
        if self.kind == "mqtt":
            async with self._mqtt() as client:
                await client.subscribe(self.filter, qos=1)
            return
        client = await nats.connect(f"nats://127.0.0.1:{self.port}")
        try:
            await client.jetstream().add_stream(name="CAPTURE", subjects=[self.filter])
        finally:
            await client.close()

    async def messages(self, count: int, timeout: float = 20.0) -> list[tuple[str, dict]]:
        """The (topic, decoded payload) captured, once there are ``count`` and a moment
        passed for any duplicate to show."""
        if self.kind == "mqtt":
            got: list[tuple[str, dict]] = []
            async with self._mqtt() as client:
                async def read() -> None:
                    async for msg in client.messages:
                        assert isinstance(msg.payload, bytes)
                        got.append((str(msg.topic), json.loads(msg.payload)))

                reader = asyncio.ensure_future(read())
                try:
                    await until(lambda: len(got) >= count, f"{count} captured messages",
                                timeout)
                    await asyncio.sleep(0.5)
                finally:
                    reader.cancel()
                    await asyncio.gather(reader, return_exceptions=True)
            return got
        client = await nats.connect(f"nats://127.0.0.1:{self.port}")
        try:
            stream = client.jetstream()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout
            while (await stream.stream_info("CAPTURE")).state.messages < count:
                assert loop.time() < deadline, f"fewer than {count} captured messages"
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            state = (await stream.stream_info("CAPTURE")).state
            stored = [await stream.get_msg("CAPTURE", seq)
                      for seq in range(state.first_seq, state.last_seq + 1)]
            return [(m.subject, json.loads(m.data or b"")) for m in stored]
        finally:
            await client.close()
