"""A running peer's Prometheus metrics, in a registry of its own.

Counters are read at scrape time from where the peer keeps count of what it did: the state
machine's :class:`~overlay.machine.Stats`, its crypto suite's cost meter, the transport's
frame and refusal counters; the rest is counted here as the node performs the machine's
actions (messages sent and received by type, links made, deliveries). So a scrape agrees
with ``--stats-out`` and with the events the subscriber delivered, and the hot path pays a
dictionary increment per message. Each node has its own :class:`CollectorRegistry`, never
the process-wide default: tests run several nodes in one process.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ibe_pubsub.overlay import Connected, Handover, Message, SwapHandover

if TYPE_CHECKING:
    from ibe_pubsub.peer.node import PeerNode

#: Machine counters exposed as ``ibe_peer_events_<name>_total``, with their help text.
EVENT_COUNTERS = {
    "received": "Distinct event ciphertexts this peer decrypted.",
    "delivered": "Events delivered to the application.",
    "forwarded": "Event messages forwarded to children.",
    "false_positives": "Events that reached this peer but do not match its subscription.",
    "duplicates": "Event copies that arrived again (another tree or parent, a re-used id).",
    "forged": "Events that decrypted and matched but failed the publisher's signature.",
}
#: Seconds; joins wait for the key server and pairings, deliveries for the event queue.
JOIN_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
DELAY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


def _labelled(name: str, help_text: str, label: str, values: dict[str, float],
              gauge: bool = False) -> Metric:
    family = (GaugeMetricFamily(name, help_text, labels=[label]) if gauge
              else CounterMetricFamily(name, help_text, labels=[label]))
    for key, value in sorted(values.items()):
        family.add_metric([key], value)
    return family


class PeerMetrics:
    """The metrics of one node; the node calls :meth:`sent`, :meth:`received`,
    :meth:`connected` and :meth:`delivered` as it acts."""

    def __init__(self, node: PeerNode) -> None:
        self.node = node
        self.registry = CollectorRegistry()
        self.messages_sent: Counter[str] = Counter()
        self.messages_received: Counter[str] = Counter()
        self.parent_links = 0
        self.join_seconds = Histogram(
            "ibe_peer_join_seconds", "From a virtual peer's (re)join to its first parent link.",
            buckets=JOIN_BUCKETS, registry=self.registry)
        self.delivery_delay = Histogram(
            "ibe_peer_delivery_delay_seconds",
            "From an event's arrival at this peer to its delivery (queueing and crypto).",
            buckets=DELAY_BUCKETS, registry=self.registry)
        self.registry.register(_NodeCollector(self))

    def sent(self, message: Message) -> None:
        self.messages_sent[type(message).__name__] += 1

    def received(self, message: Message) -> None:
        self.messages_received[type(message).__name__] += 1

    def connected(self, action: Connected) -> None:
        self.parent_links += 1
        if action.link == 1:
            self.join_seconds.observe(max(0.0, action.at - action.started_at))

    def delivered(self, seconds: float) -> None:
        self.delivery_delay.observe(max(0.0, seconds))

    def exposition(self) -> bytes:
        """The Prometheus text format of every metric."""
        return generate_latest(self.registry)


class _NodeCollector(Collector):
    """What the node, its machine, crypto suite and transport counted, read at scrape."""

    def __init__(self, metrics: PeerMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        node, metrics = self.metrics.node, self.metrics
        machine, transport = node.machine, node.transport
        yield GaugeMetricFamily("ibe_peer_ready", "1 once every virtual peer has a parent.",
                                value=float(node.ready.is_set()))
        yield GaugeMetricFamily("ibe_peer_key_expiry_timestamp_seconds",
                                "End of the current epoch's keys (Unix time).",
                                value=node.epoch_end)
        stats = machine.stats if machine is not None else None
        for name, help_text in EVENT_COUNTERS.items():
            yield CounterMetricFamily(f"ibe_peer_events_{name}", help_text,
                                      value=getattr(stats, name, 0))
        dropped = dict(stats.dropped_by) if stats is not None else {}
        yield _labelled("ibe_peer_events_dropped", "Event messages (and digests, pulls) "
                        "refused, by reason.", "reason", dropped | dict(node.dropped_by))
        yield CounterMetricFamily("ibe_peer_parents_lost", "Parents taken for failed after "
                                  "falling silent.", value=getattr(stats, "parents_lost", 0))
        yield CounterMetricFamily("ibe_peer_parents_demoted", "Parents replaced for missing "
                                  "events they owed (seen by another path).",
                                  value=getattr(stats, "demoted", 0))
        yield CounterMetricFamily("ibe_peer_parent_links", "Links to a parent made (after a "
                                  "virtual peer's first, each is a parent change).",
                                  value=metrics.parent_links)
        yield CounterMetricFamily("ibe_peer_swaps", "Swaps: a virtual peer moved under a "
                                  "newcomer that covers it.",
                                  value=metrics.messages_sent[SwapHandover.__name__])
        yield CounterMetricFamily("ibe_peer_handovers", "Handovers sent: children passed to "
                                  "another parent (leaving, or a split).",
                                  value=metrics.messages_sent[Handover.__name__])
        yield _labelled("ibe_peer_messages_sent", "Overlay messages sent, by type.", "type",
                        dict(metrics.messages_sent))
        yield _labelled("ibe_peer_messages_received", "Overlay messages received, by type.",
                        "type", dict(metrics.messages_received))
        links = {}
        if machine is not None:
            for vp in machine.vpeers.values():
                remote = sum(1 for n in (*vp.parents, *vp.children) if n[0] != machine.address)
                links[vp.attribute] = links.get(vp.attribute, 0) + remote
            meter = machine.crypto.meter
            yield _labelled("ibe_peer_crypto_cpu_seconds", "CPU seconds of the cryptography, "
                            "by operation.", "operation", dict(meter.by_op))
            yield _labelled("ibe_peer_crypto_operations", "Cryptographic operations, by "
                            "operation.", "operation", dict(meter.calls))
        yield _labelled("ibe_peer_links", "Links to other peers (parents and children), by "
                        "tree.", "tree", links, gauge=True)
        yield _labelled("ibe_peer_transport_frames", "Data frames through sockets.",
                        "direction", {"sent": transport.frames_sent,
                                      "received": transport.frames_received})
        yield _labelled("ibe_peer_transport_bytes", "Bytes of data frames through sockets.",
                        "direction", {"sent": transport.bytes_sent,
                                      "received": transport.bytes_received})
        yield _labelled("ibe_peer_transport_refused", "Connections refused, by reason "
                        "(held_full: reading one paused, its held frames at a cap).",
                        "reason", dict(transport.refused))
        yield _labelled("ibe_peer_transport_dropped", "Frames dropped unsent, by reason "
                        "(queue_full, queue_delay: waited too long for a slow reader, gave_up: "
                        "a neighbour that could not be reached).", "reason",
                        dict(transport.dropped_by))
        yield CounterMetricFamily("ibe_peer_transport_missed", "Frames neighbours said they "
                                  "dropped for this peer (it missed them).",
                                  value=transport.missed)
        yield _labelled("ibe_peer_queue_depth", "Events waiting for processing, and frames "
                        "waiting to be sent.", "queue",
                        {"events": node.event_backlog, "send": transport.queued()}, gauge=True)
