"""A graceful leave makes before it breaks: the leaving peer serves the children it
handed over until they have linked elsewhere, so nothing published meanwhile is lost.
Control: the same leave with no linger (break before make) loses events."""

from __future__ import annotations

import random

from ibe_pubsub.credentials.schema import default_schema
from ibe_pubsub.evaluation.random_workload import Workload
from ibe_pubsub.overlay import LatencyModel, OverlayConfig, Simulator
from ibe_pubsub.overlay.wire import Detach, Handover, Join, JoinSplit, SwapHandover

SCHEMA = default_schema()
#: Uneven links, as in ``bench exactness``: a rejoin takes a while.
LATENCY = LatencyModel(median=0.04, sigma=1.5, cap=1.0)


def _leave_under_a_stream(linger: float) -> tuple[Simulator, str, int, int]:
    """Settle 60 subscribers with one parent per virtual peer; pick a subscriber with a
    single virtual peer whose parent is another subscriber; have that parent leave while
    events matching the child arrive every 20 ms. Returns the run, the leaver, and the
    child's events owed and delivered."""
    config = OverlayConfig(push_backup=False, leave_linger=linger)
    sim = Simulator(SCHEMA, config, mode="plaintext", seed=4, latency=LATENCY)
    sim.add_roots()
    workload = Workload(SCHEMA, random.Random(4))
    for i in range(60):
        sim.add_subscriber(workload.predicate(), at=i * 0.02)
    sim.run_until(15.0)
    child, parent = next(
        (a, p[0]) for a in sorted(sim.alive_subscribers())
        for vps in [[v for v in sim.machines[a].vpeers.values() if not v.relay]]
        if len(vps) == 1 for p in vps[0].parents if p[0] in sim.predicates)
    predicate = sim.predicates[child]
    values = [v for v in (workload.values() for _ in range(20000)) if predicate.matches(v)]
    assert len(values) >= 100
    publisher, start = sim.add_publisher(), sim.now
    events = [sim.publish(publisher, v, at=start + 0.02 * i) for i, v in enumerate(values[:100])]
    sim.run_until(start + 0.5)
    sim.leave(parent)
    sim.run_until(start + 2.0 + 2 * linger + 5.0)
    got = sum(child in sim.metrics.deliveries.get(e, {}) for e in events)
    return sim, parent, len(events), got


def test_a_leaving_parent_serves_its_children_until_they_linked_elsewhere():
    sim, parent, owed, got = _leave_under_a_stream(OverlayConfig().leave_linger)
    assert got == owed
    assert parent in sim.dead and not sim.leaving  # and then it did leave
    assert sim.metrics.messages[Handover.__name__] >= 1
    assert sim.metrics.messages[Detach.__name__] >= 1


def test_control_a_leave_that_breaks_before_it_makes_loses_events():
    _, _, owed, got = _leave_under_a_stream(0.0)
    assert got < owed


def test_a_leaving_peer_takes_no_newcomer_and_stops_once_its_children_are_served():
    sim = Simulator(SCHEMA, OverlayConfig(), mode="plaintext", seed=1, latency=LATENCY)
    sim.add_roots()
    workload = Workload(SCHEMA, random.Random(1))
    for i in range(40):
        sim.add_subscriber(workload.predicate(), at=i * 0.02)
    sim.run_until(10.0)
    address, vp = next((a, v) for a in sorted(sim.alive_subscribers())
                       for v in sim.machines[a].vpeers.values()
                       if any(c[0] != a for c in v.children))
    machine, request = sim.machines[address], next(iter(vp.keys.values())).request
    sim.leave(address)
    assert machine.leaving and address in sim.leaving and address not in sim.dead
    join = Join("", "", vp.attribute, bytes(16), "127.0.0.9:1", "v", 8, request, False, -1)
    assert [a.text for a in machine.receive("127.0.0.9:1", join, sim.now)] == [
        "Join from 127.0.0.9:1 ignored: leaving"]
    sim.run_until(sim.now + machine.config.leave_linger + 0.5)  # (ticks come 0.2 s apart)
    assert machine.stopped and address in sim.dead
    assert machine.deadline() == float("inf")


def test_a_leaving_peer_cannot_be_kept_alive_by_a_newcomer():
    """A peer that opened someone's join before it left is asked, again and again, to
    split and to take a swap: it takes nothing, and stops at the end of its linger."""
    sim = Simulator(SCHEMA, OverlayConfig(), mode="plaintext", seed=1)
    sim.add_roots()
    workload = Workload(SCHEMA, random.Random(1))
    for i in range(40):
        sim.add_subscriber(workload.predicate(), at=i * 0.02)
    sim.run_until(10.0)
    address, join_id, opened = next(
        (a, j, o) for a in sorted(sim.alive_subscribers())
        for j in list(sim.machines[a].joining._opened)
        if (o := sim.machines[a].joining._opened.get(j)) is not None
        and not sim.machines[a].vpeers[o.vp].relay and o.newcomer[0] != a)
    machine = sim.machines[address]
    sim.leave(address)
    attacker, t = opened.newcomer, sim.now
    end = t + machine.config.leave_linger + 5.0
    while t < end:
        t += 0.5
        sim.run_until(t)
        for message in (JoinSplit(attacker[1], opened.vp, join_id),
                        SwapHandover(attacker[1], opened.vp, join_id)):
            sim._apply(address, machine.receive(attacker[0], message, t), t)
    assert machine.stopped and address in sim.dead
    assert not any(v.children for v in machine.vpeers.values())
