"""End to end with real processes on loopback: a key server, root peers, 10 subscribers and
2 publishers per routing mode; every subscriber gets exactly its ground truth, also after
3 subscribers crash (from publishers running streams then); hostile frames do not bring a
peer down; an event outside the advertisement is refused before anything is sent."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import re
import socket
import time
import typing
from concurrent.futures import ThreadPoolExecutor

import msgpack
import pytest

from ibe_pubsub.credentials.scheme import Event
from ibe_pubsub.evaluation.cluster import Cluster
from ibe_pubsub.evaluation.demo import ground_truth, quotes, subscriptions
from ibe_pubsub.overlay.wire import Join, Message, Publish
from ibe_pubsub.peer import frames
from ibe_pubsub.peer.transport import split_address

pytestmark = [pytest.mark.timeout(420), pytest.mark.slow]

#: Seconds of silence after which a peer gives up a parent or child (the default is 10).
FAILURE_TIMEOUT = 5.0


def _split(events: list[Event]) -> tuple[list[Event], list[Event]]:
    return [e for e in events if e.values["price"] < 500], \
        [e for e in events if e.values["price"] >= 500]


def _publish_both(cluster: Cluster, tokens: dict[str, str], events: list[Event], round_: int,
                  stream_window: str | None = None) -> None:
    """Two publishers at once, each inside its own advertisement."""
    low, high = _split(events)
    with ThreadPoolExecutor(2) as pool:
        runs = [pool.submit(cluster.publish, f"pub-low-{round_}", low, "price < 500",
                            tokens["pub-low"], stream_window=stream_window),
                pool.submit(cluster.publish, f"pub-high-{round_}", high, "price >= 500",
                            tokens["pub-high"], stream_window=stream_window)]
        for run in runs:
            result = run.result()
            assert result.returncode == 0, result.stderr
            assert ("as a stream" in result.stderr) == (stream_window is not None)


def _check(cluster: Cluster, expected: dict[str, set[str]], round_ids: set[str]) -> None:
    cluster.wait_deliveries(expected, timeout=40)
    for name, want in expected.items():
        got = [d["id"] for d in cluster.peers[name].delivered() if d["id"] in round_ids]
        assert len(got) == len(set(got)), f"{name} got duplicates"
        assert set(got) == want, (f"{name} ({cluster.peers[name].subscription}): missed "
                                  f"{sorted(want - set(got))}, unexpected "
                                  f"{sorted(set(got) - want)}\n{cluster.peers[name].log_tail()}")


def _wait_repaired(cluster: Cluster, killed: set[str], since: dict[str, int]) -> None:
    """After the peers at ``killed`` crashed (each survivor's log was ``since[name]`` bytes
    long then): at least the failure timeout and a tick, then until every virtual peer that
    found one of them silent has linked to a parent again (at most 10 s more)."""
    start = time.monotonic()
    silent = re.compile(r"(\S+): parent (\S+) silent, rejoining")
    while time.monotonic() - start < FAILURE_TIMEOUT + 10:
        time.sleep(0.05)
        if time.monotonic() - start < FAILURE_TIMEOUT + 1:
            continue
        waiting = []
        for name, offset in since.items():
            with cluster.peers[name].log_file.open("rb") as log:
                log.seek(offset)
                text = log.read().decode(errors="replace")
            for found in silent.finditer(text):
                if found[2] in killed and f"virtual peer {found[1]} linked to" not in \
                        text[found.end():]:
                    waiting.append(found[1])
        if not waiting:
            return


def _forged(cls: type[Message], **given: object) -> Message:
    """A well-formed message of ``cls`` whose other fields are junk of the right type."""
    junk = {str: "price", bytes: b"\x00forged" * 8, int: 3, bool: False}
    hints = typing.get_type_hints(cls)
    return cls(**{f.name: given.get(f.name, junk.get(hints[f.name], ()))
                  for f in dataclasses.fields(cls)})


def _hostile_frames(address: str) -> None:
    """An oversized frame; garbage, a forged event and a forged join request. The peer
    expects TLS, so it may reset the connection while these are still being sent."""
    host, port = split_address(address)
    forged_event = _forged(Publish, src_vp="", dst_vp="")
    forged_join = _forged(Join, src_vp="", dst_vp="", origin="127.0.0.1:9")
    oversized = [frames.encode(frames.hello("")),
                 (40 * 1024 * 1024).to_bytes(4, "big") + b"\x00" * 1024]
    garbage = [frames.encode(frames.hello("")),
               *(frames.encode(frames.data(payload))
                 for payload in (b"\xc1garbage", msgpack.packb([99, "x"]),
                                 forged_event.to_bytes(), forged_join.to_bytes())),
               (3).to_bytes(4, "big") + b"\xc1\xc1\xc1"]
    for chunks in (oversized, garbage):
        with socket.create_connection((host, port), timeout=5) as sock:
            try:
                for chunk in chunks:
                    sock.sendall(chunk)
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused before the end: what the peer should do


@pytest.mark.parametrize("routing", ["ohf", "mcr"])
def test_overlay_delivers_exactly_the_ground_truth(keyserver_factory, tmp_path, routing):
    server = keyserver_factory.start()
    cluster = Cluster(server.base_url, server.admin_token, tmp_path / "peers", routing=routing,
                      max_children=3, verbose=True,
                      peer_args=("--failure-timeout", str(FAILURE_TIMEOUT), "--http", "0"))
    rng = random.Random(11 if routing == "ohf" else 12)
    try:
        tokens = {name: cluster.identity(name, "publisher", policy)
                          for name, policy in (("pub-low", "price < 500"),
                                               ("pub-high", "price >= 500"))}
        roots = [cluster.start_root(f"root-{a}", [a]) for a in ("symbol", "price", "volume")]
        cluster.wait_ready(roots)
        subs = subscriptions(10, rng)
        cluster.wait_ready([cluster.start_subscriber(n, s) for n, s in subs], timeout=120)

        first = quotes(16, rng)
        _publish_both(cluster, tokens, first, 1)
        _check(cluster, ground_truth(subs, first), {e.event_id for e in first})
        # Each peer's /metrics agrees with what it delivered, and /status with the directory.
        for name, _ in subs:
            peer = cluster.peers[name]
            assert peer.counter("ibe_peer_events_delivered_total") \
                == len(peer.delivered()), name
        assert all(s["ready"] for s in cluster.statuses())
        forwarded = sum(r.counter("ibe_peer_events_forwarded_total")
                        for r in roots)
        assert forwarded >= len(first)

        # Hostile input at a root and a subscriber: dropped, the peers stay up.
        _hostile_frames(cluster.peers["root-price"].address)
        _hostile_frames(cluster.peers["sub01"].address)

        # Three subscribers crash; the others' subtrees repair and miss nothing new. This
        # round's publishers run streams: each quote twice (the second event reuses every
        # entry of the first); subscribers take stream events as they take the others.
        crashed = ("sub01", "sub02", "sub03")
        since = {n: p.log_file.stat().st_size for n, p in cluster.peers.items()
                 if n not in crashed}
        for name in crashed:
            cluster.kill(name)
        _wait_repaired(cluster, {cluster.peers[n].address or "" for n in crashed}, since)
        second = [Event(f"r2-{e.event_id}-{k}", e.values, e.body) for e in quotes(8, rng)
                  for k in "ab"]
        survivors = [(n, s) for n, s in subs if n not in ("sub01", "sub02", "sub03")]
        _publish_both(cluster, tokens, second, 2, stream_window="30s")
        _check(cluster, ground_truth(survivors, second), {e.event_id for e in second})

        # An event outside the advertisement: refused, nothing at all is sent.
        bad = [Event("x1", {"symbol": "IBM", "price": 10.0, "volume": 5}),
               Event("x2", {"symbol": "IBM", "price": 900.0, "volume": 5})]
        result = cluster.publish("pub-low-3", bad, "price < 500", tokens["pub-low"])
        assert result.returncode != 0 and "outside the advertisement" in result.stderr
        asyncio.run(asyncio.sleep(1.0))
        for name, _ in survivors:
            assert not {"x1", "x2"} & {d["id"] for d in cluster.peers[name].delivered()}
        for peer in cluster.peers.values():
            if peer.name not in ("sub01", "sub02", "sub03"):
                assert peer.process.poll() is None, f"{peer.name} died:\n{peer.log_tail()}"
    finally:
        cluster.stop_all()
    # SIGTERM: graceful exit with counters written.
    for peer in cluster.peers.values():
        if peer.name not in ("sub01", "sub02", "sub03"):
            assert peer.process.returncode == 0, peer.log_tail()
            assert peer.stats()["address"] == peer.address
