"""A settled simulated overlay: roots, then subscribers joining at a steady rate."""

import random

from credentials.schema import Schema
from overlay.config import OverlayConfig
from overlay.simulator import Simulator
from overlay.workload import Workload


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
