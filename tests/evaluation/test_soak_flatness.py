"""The soak's leak check: descriptors are split into established TCP connections, whose
number follows the trees' shape, and the rest, where a leak shows (a file never closed, a
socket whose other end closed but this process did not)."""

from __future__ import annotations

import os
import socket

from ibe_pubsub.evaluation.memory import descriptors
from ibe_pubsub.evaluation.soak_oracle import flatness


def test_descriptors_tell_established_connections_from_the_rest():
    pid = os.getpid()
    before_total, before_established = descriptors(pid)
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    try:
        total, established = descriptors(pid)
        assert (total - before_total, established - before_established) == (3, 2)
        # The other end closes and this process keeps its socket (CLOSE_WAIT): no longer a
        # connection, still a descriptor, so it counts as held.
        client.close()
        total, established = descriptors(pid)
        assert (total - before_total, established - before_established) == (2, 0)
    finally:
        for sock in (server, listener, client):
            sock.close()
    assert descriptors(pid) == (before_total, before_established)


def _record(fds: list[int], connections: list[int], rss: float = 80.0) -> dict:
    """A minimal soak record: one subscriber sampled every 5 s through a 10-minute run."""
    pairs = enumerate(zip(fds, connections, strict=True))
    samples = [{"t": 5.0 * k, "rss_mib": {"sub-00": rss}, "fds": {"sub-00": f},
                "connections": {"sub-00": c}} for k, (f, c) in pairs]
    return {"started": 0.0, "settings": {"minutes": 10.0}, "samples": samples,
            "incarnations": [{"name": "sub-00", "role": "subscriber", "started": 0.0,
                              "ended": None}]}


def test_more_connections_are_flat_and_a_descriptor_leak_is_not():
    n = 121
    steady = [20] * n
    more_children = [20 + 6 * k // n for k in range(n)]  # 20 -> 25: five more links
    row = flatness(_record(more_children, [c - 12 for c in more_children]))[0]
    assert row["flat"] and row["fds_growth"] > 0.1 and row["held_fds_growth"] == 0
    # Control: the same growth without the connections to explain it is a leak.
    row = flatness(_record(more_children, [8] * n))[0]
    assert not row["flat"] and row["held_fds_growth"] > 0.1
    # A record from before connections were sampled counts every descriptor as held.
    old = _record(more_children, steady)
    for sample in old["samples"]:
        del sample["connections"]
    assert not flatness(old)[0]["flat"]
