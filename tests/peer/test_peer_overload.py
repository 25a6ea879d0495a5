"""Overload with real processes: a key server, a root process holding the three trees of the
stock schema and two subscriber processes (mutual TLS on 127.0.0.1), and a publisher (the
client API) offering events faster than the overlay takes them.

Back-pressure slows the publisher rather than letting queues grow, so every event arrives
and none waits long; a subscriber that stops reading (SIGSTOP) stalls the tree once, for
about two seconds, and what the root drops for it is counted by reason and told to it, so its
own counters show that it missed events. Without back-pressure the first test lost
thousands of events in the full event backlogs of the root and the subscribers, and the
second found no count of what the stopped subscriber missed (nothing told it)."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from keyserver_fixtures import rooted_cluster

from ibe_pubsub.client import Publisher
from ibe_pubsub.evaluation.cluster import Cluster, PeerProcess
from ibe_pubsub.peer.transport import HOLD_LIMIT, MAX_QUEUE_DELAY, SOCKET_BUFFER

pytestmark = [pytest.mark.timeout(240), pytest.mark.serial]

SUBSCRIPTION = 'symbol prefix "OV" and price < 100 and volume < 100'
BODY = b"x" * 8192
#: Seconds of slack on top of a bound, for a shared 2-core machine.
SLACK = 1.5


@dataclass(frozen=True)
class Tree:
    server: str
    cluster: Cluster
    root: PeerProcess
    steady: PeerProcess
    stalled: PeerProcess


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tree]:
    with rooted_cluster(tmp_path_factory.mktemp("overload"), peer_args=("--http", "0")
                        ) as (server, cluster, root):
        steady = cluster.start_subscriber("steady", SUBSCRIPTION)
        stalled = cluster.start_subscriber("stalled", SUBSCRIPTION)
        cluster.wait_ready([steady, stalled])
        yield Tree(server.base_url, cluster, root, steady, stalled)


def _publish(tree: Tree, name: str, count: int, rate: float | None, body: bytes = b""
             ) -> dict[str, float]:
    """Publish ``count`` stream events (cheap to encrypt: the overlay is the bottleneck), at
    ``rate`` per second or as fast as ``publish`` returns; event id -> time of the call."""
    token = tree.cluster.identity(name, "publisher")
    known = tree.cluster.workdir / "known_servers.json"

    async def run() -> dict[str, float]:
        sent: dict[str, float] = {}
        async with await Publisher.connect(tree.server, token, "", known_servers=known,
                                           stream_window=1.0) as pub:
            start = time.monotonic()
            for k in range(count):
                if rate is not None and (wait := start + k / rate - time.monotonic()) > 0:
                    await asyncio.sleep(wait)
                sent[f"{name}-{k}"] = time.time()
                await pub.publish({"symbol": "OVL", "price": 10.0, "volume": 1}, body=body,
                                  event_id=f"{name}-{k}")
            assert pub.dropped == 0
        return sent

    return asyncio.run(run())


def _delays(peer: PeerProcess, sent: dict[str, float]) -> list[float]:
    return sorted(d["delivered_at"] - sent[d["id"]] for d in peer.delivered()
                  if d["id"] in sent)


def _wait_for(peer: PeerProcess, ids: set[str], timeout: float = 30.0) -> set[str]:
    """The ids of ``ids`` that ``peer`` delivered, once it has all or ``timeout`` passed."""
    deadline = time.monotonic() + timeout
    while True:
        got = {d["id"] for d in peer.delivered()} & ids
        if got == ids or time.monotonic() > deadline:
            return got
        time.sleep(0.1)


def _stats_now(peer: PeerProcess) -> dict:
    """Its stats, written at a graceful stop."""
    peer.process.send_signal(signal.SIGTERM)
    peer.process.wait(timeout=20)
    return peer.stats()


def test_a_publisher_faster_than_the_tree_is_slowed_and_nothing_waits_long(tree):
    """Each subscriber is in all three trees, so it takes three copies of every event: the
    overlay, not the publisher, is the bottleneck. Without back-pressure the root and the
    subscribers filled their event backlogs and dropped thousands of events there."""
    sent = _publish(tree, "flood", 6000, rate=None, body=BODY)
    for peer in (tree.steady, tree.stalled):
        assert _wait_for(peer, set(sent)) == set(sent), peer.log_tail()
        delays = _delays(peer, sent)
        # Back-pressure bounds the queueing: the publisher waits, the queues stay short, so
        # an event waits for the queues' worth of events ahead of it, not for the flood.
        # Unbounded, the publisher is done early and the last events wait for nearly the
        # whole flood. As a share of the flood (first call to last delivery), the bound
        # holds on a loaded machine too: alone 0.18-0.24 (p99 1.7-2.5 s of a 10 s flood),
        # where a fixed 4 s failed once under a full suite and a review's load (4.1 s). With
        # the peers' reading never paused (BACKLOG_DELAY 1e9) the share was 0.51.
        p99 = delays[int(0.99 * len(delays))]
        last = max(d["delivered_at"] for d in peer.delivered() if d["id"] in sent)
        flood = last - min(sent.values())
        assert p99 < 0.4 * flood, (peer.name, p99, flood)


def _socket_buffers() -> int:
    """At most what a stopped reader's link can absorb (one connection carries every tree):
    each peer sets its sockets' send and receive buffers to SOCKET_BUFFER, which Linux
    doubles (or caps lower), at both ends. (Sizing from the kernel's autotuning limits
    instead, 37.7 MB here, made 42 KB bodies that kept this 2-core machine near saturation
    before the stall, and the steady subscriber's median delay failed its bound in one full
    run of 6.)"""
    return 2 * 2 * SOCKET_BUFFER


def test_a_stalled_subscriber_does_not_stall_the_tree_and_learns_what_it_missed(tree):
    # 10 s at 300 events/s, with bodies large enough that the socket buffers are full
    # within 3 s: the frames after them wait in the root's queue for MAX_QUEUE_DELAY and more.
    rate, seconds, fill = 300.0, 10.0, 3.0
    assert seconds - fill > MAX_QUEUE_DELAY + 2.0
    body = b"x" * max(len(BODY), _socket_buffers() // int(rate * fill))
    # The same feed with nobody stalled first: on a machine too slow for 300 events/s the
    # queues alone delay events, stall or not (medians of 1.2 to 1.5 s were seen in full
    # runs on one 4 times slower than the machine the fixed bounds were set on).
    unstalled = _publish(tree, "unstalled", int(rate * seconds), rate=rate, body=body)
    assert _wait_for(tree.steady, set(unstalled)) == set(unstalled)
    assert _wait_for(tree.stalled, set(unstalled)) == set(unstalled)
    base = _delays(tree.steady, unstalled)
    tree.stalled.process.send_signal(signal.SIGSTOP)
    try:
        sent = _publish(tree, "paced", int(rate * seconds), rate=rate, body=body)
    finally:
        tree.stalled.process.send_signal(signal.SIGCONT)
    # The steady subscriber got everything; the tree waited for the stalled one once, for
    # HOLD_LIMIT, then went on without it.
    assert _wait_for(tree.steady, set(sent)) == set(sent), tree.steady.log_tail()
    delays = _delays(tree.steady, sent)
    print(f"bodies of {len(body)} bytes; the steady subscriber's median and largest delay "
          f"{base[len(base) // 2]:.3f} / {base[-1]:.3f} s unstalled, "
          f"{delays[len(delays) // 2]:.3f} / {delays[-1]:.3f} s beside the stalled one")
    assert delays[-1] < max(HOLD_LIMIT + SLACK, base[-1] + 0.5), (delays[-20:], base[-20:])
    assert delays[len(delays) // 2] < max(1.0, base[len(base) // 2] + 0.5), (
        delays[-20:], base[len(base) // 2])

    # The stalled subscriber reads what is left for it, until it has been told of every
    # frame the root dropped for it and neither count moved for 1 s, or 30 s passed.
    # (Waiting for its own counts to stay still for 3 s was not enough: once, it was still
    # reading what its socket held, all of it from a parent that had detached it.)
    def told() -> tuple[float, float]:
        """(frames it was told it missed, frames the root dropped for a slow reader)"""
        return (tree.stalled.counter("ibe_peer_transport_missed_total"),
                sum(tree.root.counter(f'ibe_peer_transport_dropped_total{{reason="{reason}"}}')
                    for reason in ("queue_delay", "queue_full")))

    deadline, previous = time.monotonic() + 30.0, told()
    while time.monotonic() < deadline:
        time.sleep(0.5)
        counts = told()
        if counts == previous and counts[0] == counts[1]:
            break
        previous = counts
    got = {d["id"] for d in tree.stalled.delivered()} & set(sent)
    stalled = _stats_now(tree.stalled)
    root = _stats_now(tree.root)
    assert root["drops"]["node"].get("backlog_full", 0) == 0, root["drops"]
    dropped = root["transport"]["dropped_by"]  # queue_delay, or queue_full if that comes first
    print(f"the root dropped {dropped}; the stalled subscriber got {len(got)} of {len(sent)}")
    assert dropped["queue_delay"] + dropped["queue_full"] > 0, dropped
    assert root["transport"]["dropped"] == sum(dropped.values())
    # Nothing vanished silently: the root told the stalled subscriber every frame it dropped
    # for it, the last ones in a gap alone (they were all its queue held), and the events
    # published after the root detached it as silent (after the failure timeout) are
    # accounted for by the parents it lost. Without the gap told alone: 0 of 4,600 told.
    missed = stalled["transport"]["missed"]
    assert len(got) < len(sent) and missed == dropped["queue_delay"] + dropped["queue_full"], (
        len(got), missed)
    assert stalled["parents_lost"] >= 1
