"""Global checks over a simulation: the tree invariants and exactly-once delivery."""

from __future__ import annotations

from typing import Any

from ibe_pubsub.overlay.simulator import Simulator


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


def rooted_subscribers(sim: Simulator) -> set[str]:
    """Live subscribers every virtual peer of which is linked to its tree's root: each of its
    parents is live, holds the link too (itself or the relay a split moved it to) and is
    rooted the same way. Under MCR every parent counts, as each routes some of the tokens.
    A subscriber outside this set (joining, rejoining, or below a crashed or leaving peer)
    cannot be expected to get what is published meanwhile."""
    known: dict[tuple[str, str], bool] = {}

    def rooted(address: str, vp_id: str) -> bool:
        node = (address, vp_id)
        if node not in known:
            known[node] = False  # a link cycle is not rooted
            vp = sim.machines[address].vpeers.get(vp_id)
            known[node] = vp is not None and (vp.is_top or (bool(vp.parents) and all(
                p[0] not in sim.dead and _holds(sim, p, node) and rooted(*p)
                for p in vp.parents)))
        return known[node]

    return {a for a in sim.alive_subscribers()
            if all(rooted(a, vp) for vp in sim.machines[a].vpeers)}


def subscribers_below(sim: Simulator, address: str) -> set[str]:
    """Live subscribers with a virtual peer below one of ``address``'s, in any tree: those a
    leave or crash of ``address`` cuts off until they have rejoined."""
    seen: set[tuple[str, str]] = set()
    todo = [(address, vp) for vp in sim.machines[address].vpeers]
    while todo:
        node = todo.pop()
        vp = sim.machines[node[0]].vpeers.get(node[1])
        if node in seen or vp is None:
            continue
        seen.add(node)
        todo += [c for c in vp.children if c[0] not in sim.dead]
    return {a for a, _ in seen} & set(sim.alive_subscribers()) - {address}


def _holds(sim: Simulator, parent: tuple[str, str], child: tuple[str, str]) -> bool:
    machine = sim.machines[parent[0]]
    vp = machine.vpeers.get(parent[1])
    return vp is not None and machine.family.link_holder(vp, child) is not None


def late_timers(sim: Simulator) -> list[str]:
    """Live machines whose ``next_tick_at`` is later than a timer their state holds: the
    simulator would tick them too late (a missed heartbeat, failure check or join retry)."""
    return [f"{a}: next tick {m.next_tick_at} after deadline {m.deadline()}"
            for a, m in sim.machines.items()
            if a not in sim.dead and not m.stopped and m.next_tick_at > m.deadline()]
