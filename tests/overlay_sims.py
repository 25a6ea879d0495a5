"""A settled simulated overlay (roots, then subscribers joining at a steady rate), and a
stream of events published into it."""

import random

from ibe_pubsub.credentials.schema import Schema
from ibe_pubsub.evaluation.random_workload import Workload
from ibe_pubsub.overlay.config import OverlayConfig
from ibe_pubsub.overlay.simulator import Simulator


def settled(schema: Schema, config: OverlayConfig, subscribers: int, seed: int,
            arrival: float = 0.05, settle: float = 10.0, **simulator: object
            ) -> tuple[Simulator, Workload]:
    """``subscribers`` with seeded subscriptions join ``arrival`` seconds apart; the
    simulation then runs ``settle`` seconds more."""
    sim = Simulator(schema, config, seed=seed, **simulator)  # type: ignore[arg-type]
    sim.add_roots()
    workload = Workload(schema, random.Random(seed))
    for i in range(subscribers):
        sim.add_subscriber(workload.predicate(), at=i * arrival)
    sim.run_until(subscribers * arrival + settle)
    return sim, workload


def publish(sim: Simulator, workload: Workload, k: int = 15, spacing: float = 0.05,
            drain: float = 8.0) -> dict[str, dict]:
    """``k`` seeded events from a new publisher, ``spacing`` seconds apart, then ``drain``
    seconds for them to arrive; their values by event id."""
    publisher = sim.add_publisher()
    events = {}
    for i in range(k):
        values = workload.values()
        events[sim.publish(publisher, values, at=sim.now + spacing * i)] = values
    sim.run_until(sim.now + drain)
    return events
