"""Ready-made simulator experiments (report section 8) for ``ibe-pubsub bench overlay``.

- :func:`connection_experiment`: subscribers of one attribute tree arrive one by one;
  connection delay (request sent -> first link established), vs N and vs out-degree.
- :func:`dissemination_experiment`: a built overlay, then many publishers each publish
  events; dissemination delay (publish -> delivered), messages per event, false
  positives and exactly-once errors. Run it with ``routing="ohf"`` and ``"mcr"`` on
  the same seed to compare the two strategies on one workload.

``mode`` is ``"modeled"`` (security costs from ``costs``), ``"plaintext"`` (no
security) or ``"real"`` (SCHEME.md; small N only). Results are plain dicts (JSON).
"""

from __future__ import annotations

import random
from typing import Any

from credentials.schema import Schema, default_schema
from overlay.checks import delivery_errors
from overlay.config import OverlayConfig, Routing
from overlay.crypto_model import CostTable
from overlay.simulator import LatencyModel, Mode, Simulator, summary
from overlay.workload import Workload


def _build(n: int, config: OverlayConfig, mode: Mode, costs: CostTable | None, seed: int,
           schema: Schema, attributes: list[str] | None, arrival: float,
           latency: LatencyModel | None) -> tuple[Simulator, Workload]:
    sim = Simulator(schema, config, mode=mode, costs=costs, seed=seed, latency=latency)
    sim.add_roots()
    workload = Workload(schema, random.Random(seed))
    for i in range(n):
        sim.add_subscriber(workload.predicate(attributes), at=i * arrival)
    sim.run_until(n * arrival + 4 * config.join_timeout + config.failure_timeout)
    return sim, workload


def connection_experiment(n: int, max_children: int = 4, mode: Mode = "modeled",
                          costs: CostTable | None = None, seed: int = 0,
                          attribute: str = "price", arrival: float = 0.05,
                          schema: Schema | None = None,
                          latency: LatencyModel | None = None) -> dict[str, Any]:
    """Connection delays of ``n`` subscribers joining the tree of ``attribute``."""
    config = OverlayConfig(max_children=max_children)
    sim, _ = _build(n, config, mode, costs, seed, schema or default_schema(), [attribute],
                    arrival, latency)
    return {"n": n, "max_children": max_children, "mode": mode,
            "connection_delay_s": summary(sim.metrics.connection_delays),
            "messages": dict(sim.metrics.messages)}


def dissemination_experiment(n: int, publishers: int = 160, events_per_publisher: int = 10,
                             routing: Routing = "ohf", max_children: int = 4,
                             mode: Mode = "modeled", costs: CostTable | None = None,
                             seed: int = 0, arrival: float = 0.02, publish_window: float = 10.0,
                             schema: Schema | None = None,
                             latency: LatencyModel | None = None) -> dict[str, Any]:
    """Build an overlay of ``n`` subscribers, then ``publishers`` x ``events_per_publisher``
    events spread over ``publish_window`` seconds."""
    config = OverlayConfig(max_children=max_children, routing=routing)
    sim, workload = _build(n, config, mode, costs, seed, schema or default_schema(), None,
                           arrival, latency)
    start = sim.now
    events: dict[str, dict[str, Any]] = {}
    for _ in range(publishers):
        publisher = sim.add_publisher()
        for _ in range(events_per_publisher):
            values = workload.values()
            at = start + sim.rng.uniform(0, publish_window)
            events[sim.publish(publisher, values, at=at)] = values
    sim.run_until(start + publish_window + 10.0)
    stats = [m.stats for m in sim.machines.values()]
    counts = [sim.metrics.event_messages[e] for e in events]
    return {"n": n, "routing": routing, "max_children": max_children, "mode": mode,
            "events": len(events),
            "dissemination_delay_s": summary(sim.metrics.dissemination_delays()),
            "messages_per_event": sum(counts) / max(1, len(counts)),
            "false_positives": sum(s.false_positives for s in stats),
            "deliveries": sum(s.delivered for s in stats),
            "delivery_errors": len(delivery_errors(sim, events))}
