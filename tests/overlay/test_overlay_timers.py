"""The timers and the lifecycle of the real machine, checked in simulator runs.

``tick(now)`` and ``deadline()`` are derived from one list of timers; these runs check
the result from outside: at random instants, a tick changes something (sends, logs, or
moves the machine's state) exactly when ``now`` has reached ``deadline()``.
"""

from __future__ import annotations

import random

import pytest

from ibe_pubsub.credentials.schema import default_schema
from ibe_pubsub.evaluation.random_workload import Workload
from ibe_pubsub.overlay.config import OverlayConfig
from ibe_pubsub.overlay.lifecycle import Lifecycle
from ibe_pubsub.overlay.machine import PeerMachine
from ibe_pubsub.overlay.simulator import Simulator

SCHEMA = default_schema()


def state(machine: PeerMachine) -> object:
    """What a tick may change besides its actions."""
    vps = [(vp.vp, sorted(vp.parents), sorted(vp.children), sorted(vp.backups),
            sorted(vp.watchers), sorted(vp.joins), sorted(vp.watch_asks),
            [p.contact for p in vp.joins.values()], vp.next_join_at, vp.next_ping_at,
            vp.recruits_left, vp.next_recruit_at, vp.next_digest_at, vp.link_attempts,
            sorted(vp.keys), [list(link.gaps) for link in vp.parents.values()],
            vp.next_rotate_at, vp.rotating_until)
           for vp in machine.vpeers.values()]
    return (vps, sorted(machine.joining._silent.items()), sorted(machine.kits),
            machine.demotion.pending)


@pytest.mark.parametrize("routing", ["mcr", "ohf"])
def test_a_tick_does_something_exactly_when_the_deadline_has_come(routing):
    config = OverlayConfig(routing=routing, repair=True, max_children=2, grace=4.0)
    sim = Simulator(SCHEMA, config, mode="plaintext", seed=5, droppers=0.2)
    sim.add_roots()
    workload = Workload(SCHEMA, random.Random(5))
    for i in range(24):
        sim.add_subscriber(workload.predicate(), at=i * 0.05)
    publisher = sim.add_publisher()
    for i in range(20):
        sim.publish(publisher, workload.values(), at=3.0 + 0.3 * i)
    rng = random.Random(5)
    outcomes = {True: 0, False: 0}
    now, churned = 0.0, False
    while now < 16.0:
        now += rng.uniform(0.0, 0.15)
        sim.run_until(now)
        if now > 6.0 and not churned:  # parents fail, old keys expire, joins retry
            churned = True
            for address in rng.sample(sim.alive_subscribers(), 4):
                sim.kill(address)
            sim.rollover(2)
        for address in rng.sample(sorted(set(sim.machines) - sim.dead), 6):
            machine = sim.machines[address]
            due, before = machine.deadline(), state(machine)
            actions = machine.tick(now)
            did = bool(actions) or state(machine) != before
            assert did == (now >= due), (address, now, due, actions)
            outcomes[did] += 1
            sim._apply(address, actions, now)  # the run goes on with what the tick did
    # Both sides of the equivalence were met many times, so the check could fail.
    assert min(outcomes.values()) >= 50, outcomes


def test_the_lifecycle_of_a_subscriber_virtual_peer():
    sim = Simulator(SCHEMA, OverlayConfig(push_backup=False), mode="plaintext", seed=2)
    sim.add_roots()
    workload = Workload(SCHEMA, random.Random(2))
    first = sim.add_subscriber(workload.predicate(), at=1.0)
    vpeers = list(sim.machines[first].vpeers.values())
    assert {vp.state for vp in vpeers} == {Lifecycle.DETACHED}  # before join()
    sim.run_until(1.0)
    assert {vp.state for vp in vpeers} == {Lifecycle.JOINING}  # joins sent
    sim.run_until(3.0)
    assert {vp.state for vp in vpeers} == {Lifecycle.ATTACHED}  # accepted
    later = [sim.add_subscriber(workload.predicate(), at=3.0 + 0.05 * i) for i in range(15)]
    sim.run_until(8.0)
    # A subscriber whose parent is another subscriber falls back to JOINING when that
    # parent crashes, and is ATTACHED again after its rejoin.
    below = [(vp, p) for a in later for vp in sim.machines[a].vpeers.values()
             for p in vp.parents if p[0] in later and not vp.relay]
    vp, parent = below[0]
    sim.kill(parent[0])
    while parent in vp.parents and sim.step():
        pass
    assert vp.state is Lifecycle.JOINING  # its only parent fell silent: the join goes out
    sim.run_until(sim.now + 6.0)
    assert vp.state is Lifecycle.ATTACHED and parent not in vp.parents
    sim.leave(first)
    # It serves the children it handed over until they have linked elsewhere.
    sim.run_until(sim.now + sim.config.leave_linger)
    assert first in sim.dead
    assert {v.state for v in vpeers} == {Lifecycle.DETACHED}  # after leave()
