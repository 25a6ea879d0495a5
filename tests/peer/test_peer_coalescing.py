"""The copies of an event for one neighbour travel as one frame: real processes (a key
server, a root of every tree, one subscriber in all three trees, the `publish` command), read
from the root's /metrics."""

from __future__ import annotations

import httpx

from ibe_pubsub.credentials.scheme import Event
from ibe_pubsub.evaluation.cluster import Cluster

EVENTS = 30


def _counters(url: str) -> dict[str, float]:
    """The root's forwarded copies, data frames sent and control messages sent (every
    overlay message but the events), from its /metrics."""
    lines = httpx.get(url + "/metrics", timeout=10).text.splitlines()
    value = {line.split()[0]: float(line.split()[-1]) for line in lines
             if line and not line.startswith("#")}
    sent = "ibe_peer_messages_sent_total{type="
    return {"forwarded": value["ibe_peer_events_forwarded_total"],
            "frames": value['ibe_peer_transport_frames_total{direction="sent"}'],
            "control": sum(v for k, v in value.items()
                           if k.startswith(sent) and k != sent + '"Publish"}')}


def test_a_root_sends_a_subscriber_in_three_trees_one_frame_an_event(keyserver_factory,
                                                                      tmp_path):
    """The root forwards at least three copies of each event to the subscriber's process
    (one per tree, and pushes to the subscriber's backups), the control that shows the
    copies are there to merge; the data frames it sends, less one a control message
    (heartbeats, answers), grow by one an event. Every event is delivered once."""
    server = keyserver_factory.start()
    cluster = Cluster(server.base_url, server.admin_token, tmp_path / "peers",
                      peer_args=("--http", "0"))
    try:
        root = cluster.start_root("root", ["symbol", "price", "volume"])
        sub = cluster.start_subscriber(
            "sub", 'symbol prefix "IB" and price <= 100 and volume <= 10')
        cluster.wait_ready([root, sub])
        assert root.http is not None
        before = _counters(root.http)
        events = [Event(f"e{k}", {"symbol": "IBM", "price": 10.0 + k, "volume": 5})
                  for k in range(EVENTS)]
        assert cluster.publish("pub", events).returncode == 0
        cluster.wait_deliveries({"sub": {e.event_id for e in events}}, timeout=60, settle=0.5)
        after = _counters(root.http)
    finally:
        cluster.stop_all()
    assert sorted(d["id"] for d in sub.delivered()) == sorted(e.event_id for e in events)
    assert after["forwarded"] - before["forwarded"] >= 3 * EVENTS  # the control
    grown = {k: after[k] - before[k] for k in after}
    assert grown["frames"] - grown["control"] <= 1.2 * EVENTS
