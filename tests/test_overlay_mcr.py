"""Multi-credential routing at a few hundred subscribers: exactly-once delivery, no link
cycles (a cycle under MCR silently cuts off the fine tokens dealt into it)."""

import random

import pytest

from credentials.schema import default_schema
from overlay.checks import delivery_counts, delivery_errors, link_cycles, tree_violations
from overlay.config import OverlayConfig
from overlay.simulator import Simulator
from overlay.workload import Workload

SCHEMA = default_schema()


@pytest.mark.parametrize("mode", ["plaintext", "modeled"])
def test_mcr_delivers_every_match_exactly_once_at_200_subscribers(mode):
    sim = Simulator(SCHEMA, OverlayConfig(routing="mcr"), mode=mode, seed=1)
    sim.add_roots()
    workload = Workload(SCHEMA, random.Random(1))
    for i in range(200):
        sim.add_subscriber(workload.predicate(), at=i * 0.05)
    sim.run_until(200 * 0.05 + 15)
    assert tree_violations(sim) == []
    assert link_cycles(sim) == []
    before = delivery_counts(sim)
    publisher = sim.add_publisher()
    events = {}
    for i in range(20):
        values = workload.values()
        events[sim.publish(publisher, values, at=sim.now + 0.05 * i)] = values
    sim.run_until(sim.now + 10)
    assert delivery_errors(sim, events) == []
    pairs = sum(len(sim.metrics.deliveries.get(e, {})) for e in events)
    assert pairs > 100
    assert delivery_counts(sim) - before == pairs  # nobody delivered anything twice
