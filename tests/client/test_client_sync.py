"""The blocking facade against a real key server and root peer process: the round trip of
the asynchronous client from plain synchronous code, each client on a loop thread of its
own that closing stops."""

from __future__ import annotations

import threading

import pytest

from ibe_pubsub.client import PublishRefused, ReceiveTimeout, SubscriberClosed, sync

pytestmark = pytest.mark.timeout(120)


def _loop_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("ibe-pubsub-")]


def test_a_synchronous_round_trip(overlay):
    cluster = overlay.cluster
    sub_token = cluster.identity("sync-sub", "subscriber")
    pub_token = cluster.identity("sync-pub", "publisher")
    trust = {"known_servers": overlay.known_servers}
    with sync.Subscriber.connect(overlay.server, sub_token, "volume > 1000", **trust) as sub, \
            sync.Publisher.connect(overlay.server, pub_token, "", **trust) as pub:
        assert pub.schema.names == ("symbol", "price", "volume")
        small = pub.publish({"symbol": "A", "price": 1.0, "volume": 10}, body=b"small")
        big = pub.publish({"symbol": "B", "price": 2.5, "volume": 5000}, body=b"big")
        first = sub.next(timeout=30)
        assert (first.id, dict(first.values), first.body) == (
            big, {"symbol": "B", "price": 2.5, "volume": 5000}, b"big")
        with pytest.raises(ReceiveTimeout):
            sub.next(timeout=1.5)
        assert small != big and pub.sent == 2
        again = pub.publish({"symbol": "C", "price": 3.0, "volume": 7000}, event_id="c-1")
        assert sub.next(timeout=30).id == again
        assert list(sub.events(timeout=1.5)) == []
    assert _loop_threads() == []
    with pytest.raises(SubscriberClosed):
        sub.next()
    with pytest.raises(PublishRefused, match="closed"):
        pub.publish({"symbol": "D", "price": 4.0, "volume": 1})


def test_iteration_ends_when_another_thread_closes_the_subscriber(overlay):
    token = overlay.cluster.identity("sync-iter", "subscriber")
    sub = sync.Subscriber.connect(overlay.server, token, 'symbol prefix "Q"',
                                  known_servers=overlay.known_servers)
    closer = threading.Timer(1.0, sub.close)
    closer.start()
    assert list(sub) == []
    closer.join()
    assert _loop_threads() == []
