"""Across an epoch rollover (10 s epochs, real key server and root process): the subscriber
keeps delivering and the publisher takes the new epoch's keys on its own; the application
notices nothing."""

from __future__ import annotations

import asyncio
import time

import pytest

from ibe_pubsub.client import Publisher, Subscriber

pytestmark = pytest.mark.timeout(120)


def test_publishing_goes_on_across_a_rollover(short_epochs):
    cluster = short_epochs.cluster
    sub_token = cluster.identity("steady", "subscriber")
    pub_token = cluster.identity("steady-pub", "publisher")
    trust = {"known_servers": short_epochs.known_servers}

    async def run() -> None:
        async with await Subscriber.connect(short_epochs.server, sub_token, "", **trust) as sub, \
                await Publisher.connect(short_epochs.server, pub_token, "", **trust) as pub:
            keys = pub.event_publisher.keys
            params = pub.event_publisher.params
            assert keys is not None and params is not None
            first_epoch, grace_end = keys.epoch, keys.epoch_end + params.grace
            ids = []
            while time.time() < grace_end + 1.0:  # past the old keys' expiry
                ids.append(await pub.publish({"symbol": "IBM", "price": 1.0,
                                              "volume": len(ids)}))
                await asyncio.sleep(0.5)
            received = [(await sub.next(timeout=30)).id for _ in ids]
            assert sorted(received) == sorted(ids)
            assert pub.event_publisher.keys.epoch == first_epoch + 1
            assert pub.dropped == 0

    asyncio.run(run())
