"""Global checks over a simulation: the tree invariants and exactly-once delivery."""

from __future__ import annotations

from typing import Any

from overlay.simulator import Simulator


def tree_violations(sim: Simulator) -> list[str]:
    """Every parent's credential covers each child's; no out-degree above the maximum.
    Links to crashed peers are ignored (they are being repaired)."""
    out = []
    limit = sim.config.max_children
    for address, machine in sim.machines.items():
        if address in sim.dead:
            continue
        for vp in machine.vpeers.values():
            if len(vp.children) > limit:
                out.append(f"{address}/{vp.vp} has {len(vp.children)} children")
            for child_addr, child_vp in vp.children:
                if child_addr in sim.dead:
                    continue
                child = sim.machines[child_addr].vpeers.get(child_vp)
                if child is not None and not vp.credential.covers(child.credential):
                    out.append(f"{address}/{vp.credential} does not cover "
                               f"{child_addr}/{child.credential}")
    return out


def delivery_errors(sim: Simulator, events: dict[str, dict[str, Any]]) -> list[str]:
    """For each event: the live subscribers whose predicate matches delivered it, nobody else
    did (delivery is once per subscriber by construction of the record)."""
    out = []
    for event_id, values in events.items():
        expected = sim.expected_receivers(values)
        got = set(sim.metrics.deliveries.get(event_id, {})) - sim.dead
        if missing := expected - got:
            out.append(f"{event_id}: {len(missing)} matching subscribers missed it")
        if extra := got - expected:
            out.append(f"{event_id}: delivered to {len(extra)} non-matching subscribers")
    return out


def delivery_counts(sim: Simulator) -> int:
    """Total Deliver actions (to compare with the distinct (event, subscriber) pairs)."""
    return sum(m.stats.delivered for m in sim.machines.values())


def link_cycles(sim: Simulator) -> list[str]:
    """Live virtual peers on (or below) a cycle of links (both ends agreeing): what is left
    after peeling off, again and again, every node that has no such parent left."""
    live = {(a, vp.vp): vp for a, m in sim.machines.items() if a not in sim.dead
            for vp in m.vpeers.values()}
    parents = {n: {p for p in vp.parents if p in live and n in live[p].children}
               for n, vp in live.items()}
    free = [n for n, ps in parents.items() if not ps]
    while free:
        node = free.pop()
        for child in live[node].children:
            if child in parents and node in parents[child]:
                parents[child].discard(node)
                if not parents[child]:
                    free.append(child)
        del parents[node]
    return sorted(f"{a}/{vp}" for a, vp in parents)


def late_timers(sim: Simulator) -> list[str]:
    """Live machines whose ``next_tick_at`` is later than a timer their state holds: the
    simulator would tick them too late (a missed heartbeat, failure check or join retry)."""
    return [f"{a}: next tick {m.next_tick_at} after deadline {m.deadline()}"
            for a, m in sim.machines.items()
            if a not in sim.dead and not m.stopped and m.next_tick_at > m.deadline()]
