"""End-to-end protocol behaviour in the simulator (cost-modelled crypto, seeded)."""

import random

import pytest
from overlay_sims import publish

from ibe_pubsub.credentials.schema import default_schema
from ibe_pubsub.evaluation.random_workload import Workload
from ibe_pubsub.overlay.checks import delivery_counts, delivery_errors, tree_violations
from ibe_pubsub.overlay.config import OverlayConfig
from ibe_pubsub.overlay.simulator import Simulator

SCHEMA = default_schema()


def build(routing: str, n: int = 40, seed: int = 3, **options: object
          ) -> tuple[Simulator, Workload]:
    sim = Simulator(SCHEMA, OverlayConfig(routing=routing, max_children=3, **options),
                    seed=seed)
    sim.add_roots()
    workload = Workload(SCHEMA, random.Random(seed))
    for i in range(n):
        sim.add_subscriber(workload.predicate(), at=i * 0.05)
    sim.run_until(n * 0.05 + 15)
    return sim, workload


def assert_exactly_once(sim: Simulator, events: dict[str, dict]) -> None:
    assert delivery_errors(sim, events) == []
    assert sum(len(sim.metrics.deliveries.get(e, {})) for e in events) > 0


@pytest.mark.parametrize("routing", ["ohf", "mcr"])
def test_exactly_once_delivery_and_repair_after_killing_a_fifth(routing):
    sim, workload = build(routing)
    assert tree_violations(sim) == []
    before = delivery_counts(sim)
    events = publish(sim, workload)
    assert_exactly_once(sim, events)
    assert delivery_counts(sim) - before == sum(len(sim.metrics.deliveries[e]) for e in events)

    rng = random.Random(11)
    for address in rng.sample(sim.alive_subscribers(), k=len(sim.alive_subscribers()) // 5):
        sim.kill(address)
    sim.run_until(sim.now + 20)
    assert tree_violations(sim) == []
    assert_exactly_once(sim, publish(sim, workload))


@pytest.mark.parametrize("copies", [2, 1])
def test_mcr_deals_each_token_to_parents_on_distinct_peers_and_cuts_false_positives(copies):
    # With push backups (the default) every fine token goes to two parents on different
    # physical peers, one token each once there are enough parents; without, to one.
    results = {}
    for routing in ("ohf", "mcr"):
        sim, workload = build(routing, push_backup=copies == 2)
        publish(sim, workload, k=25)
        results[routing] = sum(m.stats.false_positives for m in sim.machines.values())
        if routing == "mcr":
            spread = 0
            for machine in sim.machines.values():
                for vp in machine.vpeers.values():
                    if vp.relay or vp.is_root or not vp.assignment:
                        continue
                    wanted = [t for t, _ in vp.keys[sim.epoch].dealt]
                    dealt = min(copies, len(vp.parents))
                    for token in wanted:
                        holders = [p for p, tokens in vp.assignment.items() if token in tokens]
                        assert len({p[0] for p in holders}) == len(holders) == dealt
                    if len(vp.parents) == copies * len(wanted):  # one token each
                        assert all(len(t) == 1 for t in vp.assignment.values())
                        spread += len(wanted) > 1
            assert spread > 0
    assert results["mcr"] <= results["ohf"]
    assert results["ohf"] > 0


def test_graceful_leave_hands_children_over():
    sim, workload = build("ohf", n=25)
    parents = [a for a in sim.alive_subscribers()
               if any(vp.children for vp in sim.machines[a].vpeers.values())]
    for address in parents[:3]:
        sim.leave(address)
    sim.run_until(sim.now + 10)
    assert tree_violations(sim) == []
    assert_exactly_once(sim, publish(sim, workload))


def test_epoch_rollover_keeps_delivering_inside_the_grace_window():
    sim, workload = build("mcr", n=20)
    old = sim.epoch
    sim.rollover(old + 1)
    assert_exactly_once(sim, publish(sim, workload))        # new-epoch events
    sim.epoch = old
    assert_exactly_once(sim, publish(sim, workload))        # old epoch, inside grace
