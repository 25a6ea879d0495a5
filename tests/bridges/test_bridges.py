"""Both bridges, both directions, end to end against real brokers (mosquitto, nats-server)
and a real overlay (key server, root peer over mutual TLS): broker messages in are
delivered by a subscriber, and a subscriber's events appear on the broker with the
documented payload; messages that are not events are refused, logged and counted; a
broker outage loses nothing within the queue bound and duplicates nothing going out, and
an in-bridge reports it and resumes."""

from __future__ import annotations

import asyncio
import itertools
import logging
import signal

import pytest
from bridge_helpers import TOPICS, Capture, bridge_broker, message, send, until

from ibe_pubsub.bridges import InBridge, OutBridge, TopicTemplate
from ibe_pubsub.client import Publisher, ReceiveTimeout, Subscriber

pytestmark = pytest.mark.timeout(90)

_names = itertools.count()


def _tokens(overlay, kind: str) -> tuple[str, str]:
    """A new subscriber's and publisher's tokens."""
    n = next(_names)
    return (overlay.cluster.identity(f"bridge-sub-{kind}-{n}", "subscriber"),
            overlay.cluster.identity(f"bridge-pub-{kind}-{n}", "publisher"))


def quote(symbol: str, price: float = 10.0, volume: int = 1) -> dict[str, object]:
    return {"symbol": symbol, "price": price, "volume": volume}


def test_in_bridge_publishes_messages_and_refuses_what_is_no_event(overlay, broker, caplog):
    caplog.set_level(logging.WARNING, "ibe_pubsub.bridges")
    sub_token, pub_token = _tokens(overlay, broker.kind)
    source, topic, _, _ = TOPICS[broker.kind]
    payloads = [message(m) for m in (
        {"id": f"in-{broker.kind}-1", "values": quote("IBM", 120.5, 7), "body": "first"},
        {"values": quote("IBMX")},                                       # no id: one made up
        {"values": quote("MSFT"), "body": "not subscribed"},
        b"{not json",
        b"[" * 200_000,                            # nested too deeply: refused, and on it goes
        {"id": "bad-1", "body": "no values"},
        {"id": "bad-2", "values": quote("IBM"), "colour": "red"},        # unknown field
        {"id": "bad-3", "values": quote("IBM", price=700.0)},            # outside the ad
    )]

    async def run() -> tuple[list, InBridge]:
        async with await Subscriber.connect(overlay.server, sub_token, 'symbol prefix "IB"',
                                            **overlay.trust()) as subscriber, \
                await Publisher.connect(overlay.server, pub_token, "price < 500",
                                        **overlay.trust()) as publisher, \
                InBridge(bridge_broker(broker.kind, broker.port), source, publisher) as bridge:
            await asyncio.wait_for(bridge.ready.wait(), 10)
            await send(broker.kind, broker.port, topic, payloads)
            got = [await subscriber.next(timeout=20) for _ in range(2)]
            await until(lambda: bridge.counters.received == 8 and not len(bridge.queue),
                        "every message handled")
            with pytest.raises(ReceiveTimeout):
                await subscriber.next(timeout=0.5)
        return got, bridge

    got, bridge = asyncio.run(run())
    first, second = got
    assert (first.id, dict(first.values), first.body) == (
        f"in-{broker.kind}-1", {"symbol": "IBM", "price": 120.5, "volume": 7}, b"first")
    assert second.values["symbol"] == "IBMX" and second.body == b"" and second.id
    c = bridge.counters
    assert (c.received, c.forwarded, c.refused, c.dropped, c.unsent) == (8, 3, 5, 0, 0)
    assert not bridge.failed.is_set()
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 5
    assert any("not JSON: nested too deeply" in r for r in refusals)
    assert any("not JSON: Expecting property name" in r for r in refusals)
    assert any("'values' must be an object" in r for r in refusals)
    assert any("unknown field(s) colour" in r for r in refusals)
    assert any("advertisement" in r for r in refusals)
    assert all(topic in r for r in refusals)


def test_out_bridge_delivers_and_keeps_events_through_an_outage(overlay, broker):
    sub_token, pub_token = _tokens(overlay, broker.kind)
    _, _, template, capture_filter = TOPICS[broker.kind]
    capture = Capture(broker.kind, broker.port, capture_filter)
    symbols = ["IB.M/X", "IBM", "IBMY", "IBMZ"]

    async def run() -> tuple[list[str], OutBridge]:
        await capture.register()
        async with await Subscriber.connect(overlay.server, sub_token, 'symbol prefix "IB"',
                                            **overlay.trust()) as subscriber, \
                await Publisher.connect(overlay.server, pub_token, "",
                                        **overlay.trust()) as publisher:
            bridge = OutBridge(bridge_broker(broker.kind, broker.port),
                               TopicTemplate(template, bridge_broker(broker.kind, 1).reserved),
                               subscriber, max_backoff=0.3)
            bridge.start()
            ids = [await publisher.publish(quote(symbols[0], 42.5, 3), "before")]
            await until(lambda: bridge.counters.forwarded == 1, "the first event sent")
            # mosquitto saves its persistent sessions when stopped; a NATS crash keeps the
            # JetStream store on disk
            broker.kill(signal.SIGTERM if broker.kind == "mqtt" else signal.SIGKILL)
            for symbol in symbols[1:]:
                ids.append(await publisher.publish(quote(symbol), f"during {symbol}"))
            await publisher.publish(quote("MSFT"), "not subscribed")
            await until(lambda: bridge.counters.received == 4, "the events of the outage")
            assert bridge.counters.forwarded == 1
            broker.start()
            await until(lambda: bridge.counters.forwarded == 4, "the queued events sent")
            await subscriber.close()
            await bridge.close(5)
        return ids, bridge

    ids, bridge = asyncio.run(run())
    captured = asyncio.run(capture.messages(4))
    assert [payload["id"] for _, payload in captured] == ids  # all, in order, once each
    topic, first = captured[0]
    assert topic == template.replace("{symbol}", "IB.M_X" if broker.kind == "mqtt"
                                     else "IB_M/X")
    assert set(first) == {"id", "values", "body", "delivered_at"}
    assert first["values"] == {"symbol": "IB.M/X", "price": 42.5, "volume": 3}
    assert first["body"] == "before"
    assert [t for t, _ in captured[1:]] == [template.replace("{symbol}", s)
                                           for s in symbols[1:]]
    c = bridge.counters
    assert (c.received, c.forwarded, c.dropped, c.unsent) == (4, 4, 0, 0)
    assert c.outages >= 1


def test_in_bridge_reports_an_outage_and_resumes(overlay, broker, caplog):
    caplog.set_level(logging.WARNING, "ibe_pubsub.bridges")
    sub_token, pub_token = _tokens(overlay, broker.kind)
    source, topic, _, _ = TOPICS[broker.kind]

    async def run() -> InBridge:
        async with await Subscriber.connect(overlay.server, sub_token, 'symbol prefix "IB"',
                                            **overlay.trust()) as subscriber, \
                await Publisher.connect(overlay.server, pub_token, "",
                                        **overlay.trust()) as publisher, \
                InBridge(bridge_broker(broker.kind, broker.port), source, publisher,
                         max_backoff=0.3) as bridge:
            await asyncio.wait_for(bridge.ready.wait(), 10)
            broker.kill()
            await until(lambda: bridge.counters.outages == 1, "the outage noticed")
            broker.start()
            # Until the bridge has subscribed again, a message goes nowhere; one id
            # throughout, since subscribers deliver an id once.
            probe = message({"id": f"probe-{broker.kind}", "values": quote("IBP")})
            while True:
                await send(broker.kind, broker.port, topic, [probe])
                try:
                    delivered = await subscriber.next(timeout=0.3)
                    break
                except ReceiveTimeout:
                    continue
            assert delivered.id == f"probe-{broker.kind}"
            await send(broker.kind, broker.port, topic,
                       [message({"id": f"after-{broker.kind}", "values": quote("IBA")})])
            assert (await subscriber.next(timeout=20)).id == f"after-{broker.kind}"
        return bridge

    bridge = asyncio.run(asyncio.wait_for(run(), 60))
    assert bridge.counters.outages == 1 and bridge.counters.refused == 0
    lines = [r.getMessage() for r in caplog.records]
    assert any("unreachable" in line for line in lines)
    assert any("connected to" in line and "again" in line for line in lines)
