"""The bridges' shared parts, without brokers: the JSON mapping (the events files' format
and checks, the id optional), topic templates that no value can escape, the bounded queue
that drops its oldest and counts it, and retries in order."""

from __future__ import annotations

import asyncio
import json

import pytest

from ibe_pubsub.bridges import (
    Backoff,
    BoundedQueue,
    BridgeError,
    Counters,
    MessageRefused,
    TopicTemplate,
    delivery_payload,
    message_event,
)
from ibe_pubsub.client import Delivery
from ibe_pubsub.credentials import resolve_schema
from ibe_pubsub.peer.events_io import MAX_BODY, MAX_LINE

SCHEMA = resolve_schema("stocks")
VALUES = {"symbol": "IBM", "price": 12.5, "volume": 3}


def test_a_message_maps_to_an_event_with_or_without_an_id():
    given = message_event(json.dumps({"id": "e1", "values": VALUES, "body": "hi"}).encode(),
                          SCHEMA, "here")
    assert (given.event_id, given.values, given.body) == ("e1", VALUES, b"hi")
    bare = message_event(json.dumps({"values": VALUES}).encode(), SCHEMA, "here")
    assert (bare.event_id, bare.body) == ("", b"")


@pytest.mark.parametrize(("payload", "reason"), [
    (b"\xff\xfe{", "not UTF-8 text"),
    (b"[" * 200_000, "not JSON: nested too deeply"),
    (json.dumps({"values": VALUES, "body": "x" * (MAX_BODY + 1)}).encode(),
     f"body of {MAX_BODY + 1} bytes exceeds the limit of {MAX_BODY}"),
    (b" " * (MAX_LINE + 1), f"{MAX_LINE + 1} bytes, longer than the limit of {MAX_LINE}"),
    (b"[1, 2]", "expected a JSON object"),
    (json.dumps({"id": "", "values": VALUES}).encode(), "'id' must be"),
    (json.dumps({"values": {**VALUES, "price": "cheap"}}).encode(), "price"),
    (json.dumps({"values": VALUES, "body": 7}).encode(), "'body' must be a string"),
    (json.dumps({"values": VALUES, "body_base64": "aGk="}).encode(), "unknown field"),
])
def test_a_message_that_is_no_event_is_refused_saying_where_and_why(payload, reason):
    with pytest.raises(MessageRefused, match=reason) as refused:
        message_event(payload, SCHEMA, "message from t/1")
    assert str(refused.value).startswith("message from t/1: ")


def test_an_event_goes_out_as_the_events_out_line_on_a_topic_no_value_escapes():
    delivery = Delivery("e/1", {"symbol": "A/+#.b", "price": 1.0, "volume": 2}, b"\xff",
                        123.5, epoch=7, stream=True)
    assert json.loads(delivery_payload(delivery)) == {
        "id": "e/1", "values": {"symbol": "A/+#.b", "price": 1.0, "volume": 2},
        "body_base64": "/w==", "delivered_at": 123.5}
    assert TopicTemplate("q/{symbol}/{id}", "/+#").topic(delivery) == "q/A___.b/e_1"
    assert TopicTemplate("q.{symbol}", ".*> ").topic(delivery) == "q.A/+#_b"
    TopicTemplate("q/{symbol}", "/").check(SCHEMA)
    with pytest.raises(BridgeError, match="no attribute colour"):
        TopicTemplate("q/{colour}", "/").check(SCHEMA)
    with pytest.raises(BridgeError, match="without format specs"):
        TopicTemplate("q/{price:.2f}", "/")


def test_the_queue_drops_its_oldest_counts_it_and_gives_a_failed_item_again():
    async def run() -> tuple[list[tuple[int, int]], Counters]:
        counters = Counters()
        queue: BoundedQueue[int] = BoundedQueue(2, counters, "events")
        for item in (1, 2, 3):
            queue.put(item)
        taken = [await queue.take()]          # 2 (1 was dropped)
        queue.put(4)
        queue.put(5)                           # drops 3; 2 is held, not queued
        taken.append(await queue.take())       # 2 again: not done
        queue.done()
        taken += [await queue.take()]
        queue.done()
        taken += [await queue.take()]
        queue.done()
        assert await queue.drained(0.1)
        return taken, counters

    taken, counters = asyncio.run(run())
    assert taken == [(2, 0), (2, 1), (4, 0), (5, 0)]
    assert counters.dropped == 2


def test_backoff_doubles_up_to_its_bound_and_starts_over():
    backoff = Backoff(0.1, 0.5)
    assert [backoff.next() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    backoff.reset()
    assert backoff.next() == 0.1
