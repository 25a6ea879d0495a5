"""Across an epoch rollover (10 s epochs, real key server and root process): the subscriber
keeps delivering and the publisher takes the new epoch's keys on its own; the application
notices nothing."""

from __future__ import annotations

import asyncio
import time

import pytest

from ibe_pubsub.client import Publisher, PublishRefused, Subscriber
from ibe_pubsub.evaluation.cluster import Cluster

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
            assert keys is not None
            first_epoch = keys.epoch
            grace_end = keys.epoch_end + pub.event_publisher.service.grace
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


def test_a_stream_publisher_waits_for_a_key_server_restarting_at_the_rollover(
        keyserver_factory, tmp_path):
    """The key server is stopped just before a rollover and comes back only after the old
    keys' stream and grace window are over: ``publish`` waits for it (``server_wait``) and
    every event reaches the subscriber. The control, the same publisher with
    ``server_wait=0``, is refused at the rollover."""
    epoch, grace = 20, 4
    server = keyserver_factory.start(init_args=("--epoch-seconds", str(epoch),
                                                "--grace-seconds", str(grace)))
    cluster = Cluster(server.base_url, server.admin_token, tmp_path / "peers",
                      peer_args=("--http", "0"))
    trust = {"known_servers": cluster.workdir / "known_servers.json", "stream_window": 1.0}
    quote = {"symbol": "IBM", "price": 1.0, "volume": 5}
    try:
        cluster.wait_ready([cluster.start_root("root", ["symbol", "price", "volume"])])
        tokens = [cluster.identity(name, role) for name, role in (
            ("sub", "subscriber"), ("patient", "publisher"), ("impatient", "publisher"))]

        async def run() -> None:
            async with await Subscriber.connect(server.base_url, tokens[0], "",
                                                known_servers=trust["known_servers"]) as sub, \
                    await Publisher.connect(server.base_url, tokens[1], "", **trust) as patient, \
                    await Publisher.connect(server.base_url, tokens[2], "", server_wait=0,
                                            **trust) as impatient:
                end = patient.event_publisher.keys.epoch_end
                if end - time.time() < grace:  # too close to see the peers renew first
                    end += epoch
                await asyncio.sleep(end - 0.5 - time.time())  # the peers have renewed
                await asyncio.to_thread(keyserver_factory.stop, server)

                async def restart() -> None:
                    await asyncio.sleep(max(end + grace + 1, time.time() + 3) - time.time())
                    await asyncio.to_thread(keyserver_factory.start, data_dir=server.data_dir,
                                            port=int(server.base_url.rsplit(":", 1)[1]))

                with pytest.raises(PublishRefused, match="expired"):
                    while time.time() < end + 30:
                        await impatient.publish(quote)
                        await asyncio.sleep(0.1)
                restarted = asyncio.ensure_future(restart())
                ids, waits = [], []
                while not restarted.done() or time.time() < end + grace + 3:
                    called = time.monotonic()
                    ids.append(await patient.publish(quote))
                    waits.append(time.monotonic() - called)
                    await asyncio.sleep(0.1)
                await restarted
                assert max(waits) > 1.0  # one publish waited for the key server
                assert patient.event_publisher.keys.epoch_end > end
                received: set[str] = set()
                while not set(ids) <= received:
                    received.add((await sub.next(timeout=30)).id)
                assert patient.dropped == 0

        asyncio.run(run())
    finally:
        cluster.stop_all()
