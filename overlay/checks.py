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
