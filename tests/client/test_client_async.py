"""The asynchronous client against a real key server and a real root peer process (mutual
TLS on 127.0.0.1): a subscriber receives exactly the events that match it, typed as the
schema says, by iteration and by callback; an event outside the advertisement is refused
with nothing sent; publishing fast waits for room instead of letting the transport drop,
with bounded work in flight; closing leaves the tree and the directory."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import threading
import time
from collections.abc import Callable

import pytest

from ibe_pubsub import peer
from ibe_pubsub.client import (
    ClientError,
    Delivery,
    Publisher,
    PublishRefused,
    ReceiveTimeout,
    Subscriber,
)
from ibe_pubsub.credentials import parse_predicate
from ibe_pubsub.evaluation.demo import quotes
from ibe_pubsub.peer import MAX_BODY

pytestmark = pytest.mark.timeout(120)

#: (values, body, explicit id or None) in publishing order.
EVENTS = [
    ({"symbol": "MSFT", "price": 30.5, "volume": 100}, b"neither", "e-msft"),
    ({"symbol": "IBMX", "price": 50.0, "volume": 200}, b"ib only", None),
    ({"symbol": "AAPL", "price": 150.0, "volume": 300}, b"high only", "e-aapl"),
    ({"symbol": "IBM", "price": 120.25, "volume": 500}, "both \u2713", None),
]


async def _take(subscriber: Subscriber, count: int) -> list[Delivery]:
    """``count`` events, then none more for a while (nothing unexpected straggles in)."""
    got = [await subscriber.next(timeout=30) for _ in range(count)]
    with pytest.raises(ReceiveTimeout):
        await subscriber.next(timeout=1.5)
    return got


def test_a_subscriber_receives_exactly_the_matching_events_typed(overlay):
    cluster = overlay.cluster
    tokens = {name: cluster.identity(name, role) for name, role in (
        ("ib", "subscriber"), ("high", "subscriber"), ("pub", "publisher"))}
    trust = {"known_servers": overlay.known_servers}

    async def run() -> tuple[list[Delivery], list[Delivery], list[str]]:
        called: list[Delivery] = []

        async def callback(delivery: Delivery) -> None:
            called.append(delivery)

        async with await Subscriber.connect(overlay.server, tokens["ib"], 'symbol prefix "IB"',
                                            **trust) as ib, \
                await Subscriber.connect(overlay.server, tokens["high"], "price >= 100",
                                         on_event=callback, **trust) as high, \
                await Publisher.connect(overlay.server, tokens["pub"], "price < 1000",
                                        **trust) as pub:
            ids = [await pub.publish(values, body=body, event_id=event_id)
                   for values, body, event_id in EVENTS]
            got = await _take(ib, 2)
            for _ in range(100):
                if len(called) >= 2:
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.0)
            assert high.dropped == 0
        return got, called, ids

    got, called, ids = asyncio.run(run())
    assert ids[0] == "e-msft" and ids[2] == "e-aapl"
    assert len(set(ids)) == 4 and ids[1].rsplit("-", 1)[0] == ids[3].rsplit("-", 1)[0]
    by_id = {i: (values, body) for i, (values, body, _) in zip(ids, EVENTS, strict=True)}
    assert sorted(d.id for d in got) == sorted([ids[1], ids[3]])
    assert sorted(d.id for d in called) == sorted([ids[2], ids[3]])
    for delivery in got + called:
        values, body = by_id[delivery.id]
        assert dict(delivery.values) == values
        assert [type(delivery.values[a]) for a in ("symbol", "price", "volume")] == \
            [str, float, int]
        assert delivery.body == (body.encode() if isinstance(body, str) else body)
        assert delivery.received_at > 0
        assert delivery.stream is False


def test_a_body_too_large_for_an_overlay_message_is_refused_before_encrypting(overlay):
    token = overlay.cluster.identity("big", "publisher")

    async def run() -> None:
        async with await Publisher.connect(overlay.server, token, "",
                                           known_servers=overlay.known_servers) as pub:
            with pytest.raises(PublishRefused, match=f"event 'big': body of {MAX_BODY + 1} "
                                                     f"bytes exceeds the limit of {MAX_BODY}"):
                await pub.publish(EVENTS[0][0], b"x" * (MAX_BODY + 1), "big")
            assert pub.in_flight == 0 and pub.event_publisher.sent == 0
            await pub.publish(EVENTS[0][0], b"x" * MAX_BODY, "big")  # the limit itself passes

    asyncio.run(run())


def test_a_delivery_says_its_epoch_and_whether_it_came_as_a_stream(overlay):
    cluster = overlay.cluster
    sub_token = cluster.identity("flags", "subscriber")
    trust = {"known_servers": overlay.known_servers}

    async def run() -> tuple[dict[str, Delivery], dict[str, int]]:
        async with await Subscriber.connect(overlay.server, sub_token, 'symbol prefix "FL"',
                                            **trust) as sub:
            epochs = {}
            for name, window in (("v2", None), ("stream", 1.0)):
                token = cluster.identity(f"flags-{name}", "publisher")
                async with await Publisher.connect(overlay.server, token, "", **trust,
                                                   stream_window=window) as pub:
                    await pub.publish({"symbol": "FLAG", "price": 1.0, "volume": 1},
                                      event_id=f"flags-{name}")
                    epochs[name] = pub.event_publisher.keys.epoch
            got = {d.id: d for d in await _take(sub, 2)}
        return got, epochs

    got, epochs = asyncio.run(run())
    assert got["flags-v2"].stream is False and got["flags-stream"].stream is True
    assert got["flags-v2"].epoch == epochs["v2"] and got["flags-stream"].epoch == epochs["stream"]


def test_a_publish_cancelled_before_encrypting_lets_the_next_header_be_prepared(overlay):
    """A stream's next header is prepared between events, only while no event waits for
    the encrypting worker. A publish cancelled while its event still waited for the worker
    must stop counting as waiting; if it did not, no header would ever be prepared again
    and every window's renewal would cost an event tens of milliseconds."""
    token = overlay.cluster.identity("canceller", "publisher")
    values = {"symbol": "CNCL", "price": 1.0, "volume": 1}

    async def run() -> tuple[bool, bool]:
        async with await Publisher.connect(overlay.server, token, "",
                                           known_servers=overlay.known_servers,
                                           stream_window=2.0) as pub:
            await pub.publish(values)  # the window's header
            stream = pub.event_publisher.stream
            gate = threading.Event()
            pub._worker.submit(gate.wait)  # the worker is busy: the next event waits
            waiting = asyncio.create_task(pub.publish(values))
            await asyncio.sleep(0.2)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            gate.set()
            await asyncio.sleep(max(0.0, stream.header.opened_at + 1.1 - stream.clock()))
            await pub.publish(values)  # past half the window: the worker prepares after it
            deadline = time.monotonic() + 5.0
            while (stream.spare is None or stream.spare.entries is None) and (
                    time.monotonic() < deadline):
                await asyncio.sleep(0.05)
            prepared = stream.spare is not None and stream.spare.entries is not None
            # Control: an event that waits (a token nobody takes) stops the preparation.
            stream.spare = None
            pub._waiting.append(None)
            await asyncio.sleep(0.3)
            pub._worker.submit(pub._prepare).result()
            blocked = stream.spare is None or stream.spare.entries is None
            pub._waiting.popleft()
        return prepared, blocked

    prepared, blocked = asyncio.run(run())
    assert prepared and blocked


def test_an_event_outside_the_advertisement_is_refused_and_nothing_is_sent(overlay):
    token = overlay.cluster.identity("low-pub", "publisher")

    async def run() -> None:
        async with await Publisher.connect(overlay.server, token, "price < 100",
                                           known_servers=overlay.known_servers) as pub:
            outside = {"symbol": "IBM", "price": 500.0, "volume": 1}
            with pytest.raises(PublishRefused, match="outside the advertisement") as refused:
                await pub.publish(outside, event_id="too-dear")
            assert isinstance(refused.value, ClientError)
            assert isinstance(refused.value, peer.PublishRefused)
            with pytest.raises(PublishRefused, match="'volume' is missing"):
                await pub.publish({"symbol": "IBM", "price": 5.0})
            transport = pub.event_publisher.transport
            assert (pub.sent, transport.frames_sent, pub.queued) == (0, 0, 0)

    asyncio.run(run())


def test_publishing_fast_waits_for_room_and_never_drops(overlay):
    """The root is stopped (SIGSTOP) while every publish is called at once: the first event
    fills the send queue (``max_queued`` is one event's frame: one root process roots every
    tree, so its copies travel as one) and the others wait, at most
    ``max_in_flight`` of them under way; once the root runs again, all are delivered and
    nothing was dropped. The control: the same events queued without waiting overflow a
    transport queue of that size."""
    cluster = overlay.cluster
    sub_token = cluster.identity("all", "subscriber")
    pub_token = cluster.identity("fast-pub", "publisher")
    events = quotes(24, random.Random(5))
    trust = {"known_servers": overlay.known_servers}
    root = overlay.root.process

    async def run() -> None:
        async with await Subscriber.connect(overlay.server, sub_token, "", **trust) as sub, \
                await Publisher.connect(overlay.server, pub_token, "", max_in_flight=4,
                                        max_queued=1, **trust) as pub:
            os.kill(root.pid, signal.SIGSTOP)
            try:
                publishing = asyncio.gather(*(pub.publish(e.values, e.body) for e in events))
                peak_in_flight = peak_queued = 0
                # 2 s after the first event is queued (it waits in the stopped root's
                # socket): what waits behind it stays waiting.
                stopped_until = time.monotonic() + 30.0
                while time.monotonic() < stopped_until:
                    peak_in_flight = max(peak_in_flight, pub.in_flight)
                    peak_queued = max(peak_queued, pub.queued)
                    if pub.sent and stopped_until - time.monotonic() > 2.0:
                        stopped_until = time.monotonic() + 2.0
                    await asyncio.sleep(0.005)
                assert (peak_in_flight, peak_queued, pub.sent) == (4, 1, 1)
            finally:
                os.kill(root.pid, signal.SIGCONT)
            ids = await publishing
            received = {(await sub.next(timeout=30)).id for _ in ids}
            assert received == set(ids) and len(ids) == pub.sent == len(events)
            assert pub.dropped == 0

    asyncio.run(run())

    async def control() -> int:
        unbounded = peer.EventPublisher(overlay.server, pub_token, "",
                                        known_servers=peer.KnownServers(overlay.known_servers))
        await unbounded.start()
        unbounded.transport.queue_limit = 3
        for event in events[:4]:
            unbounded.publish(event)  # queued at once, as fast as it encrypts
        dropped = unbounded.transport.dropped
        await unbounded.close(5)
        return dropped

    assert asyncio.run(control()) > 0


async def _until(check: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Whether ``check()`` (a blocking call, run in a thread) came true within ``timeout``."""
    for _ in range(int(timeout / 0.1)):
        if await asyncio.to_thread(check):
            return True
        await asyncio.sleep(0.1)
    return False


def test_closing_a_subscriber_leaves_the_tree_and_the_directory(overlay):
    token = overlay.cluster.identity("leaver", "subscriber")

    async def run() -> None:
        sub = await Subscriber.connect(overlay.server, token, 'symbol prefix "Z"',
                                       known_servers=overlay.known_servers)
        address = sub.address
        assert await _until(lambda: address in overlay.members("symbol"))
        assert await _until(lambda: address in overlay.root_children())
        await sub.close()
        assert address not in overlay.members("symbol")  # gone at once, not at lease end
        assert await _until(lambda: address not in overlay.root_children(), timeout=5)

    asyncio.run(run())


def test_the_subscription_predicate_is_the_one_the_test_checks():
    """The events above split across the two subscriptions as the first test expects."""
    from ibe_pubsub.credentials import default_schema

    schema = default_schema()
    ib, high = (parse_predicate(schema, t) for t in ('symbol prefix "IB"', "price >= 100"))
    assert [(ib.matches(v), high.matches(v)) for v, _, _ in EVENTS] == [
        (False, False), (True, False), (False, True), (True, True)]
