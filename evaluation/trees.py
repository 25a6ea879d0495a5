"""Tree shape in the stock schema: how much of each attribute tree hangs off the root.

The report's experiments use one attribute tree with one credential per subscriber.
Here subscribers constrain one or two of the stock schema's attributes with up to four
credentials each (the default enrolment), so each joins several trees with several
virtual peers. For each tree the run counts the subscriber virtual peers whose parent
is the root (or one of its relays), and how many of those another subscriber's virtual
peer could have taken (it covers them and precedes them in the link order): the room a
better placement would have. It also times the joins and counts what 30 events cost.
:func:`draw_run` draws the trees of such a run (``bench overlay --graph``).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from ibe_pubsub.credentials import default_schema
from ibe_pubsub.evaluation.delays import JoinRecorder, Setting
from ibe_pubsub.evaluation.plots import figure
from ibe_pubsub.evaluation.random_workload import Workload
from ibe_pubsub.evaluation.tree_plot import draw_trees
from ibe_pubsub.overlay import delivery_errors, summary, tree_status

#: One subscriber joins every this many seconds (a burst: 100 per second).
ARRIVAL = 0.01
SETTLE = 30.0
EVENTS = 30


def tree_shape(sim: JoinRecorder) -> dict[str, dict[str, int]]:
    shapes = {}
    for attribute, root in sim.roots.items():
        vps = [(address, vp) for address, m in sim.machines.items() if address != root
               for vp in m.vpeers.values() if vp.attribute == attribute and not vp.relay]
        under = [(a, vp) for a, vp in vps if any(p[0] == root for p in vp.parents)]
        coverable = sum(1 for a, vp in under
                        if any(b != a and other.credential.covers(vp.credential)
                                and other.precedes(vp.credential.position, vp.vp)
                                for b, other in vps))
        shapes[attribute] = {"virtual_peers": len(vps), "under_root": len(under),
                             "under_root_coverable": coverable,
                             "root_relays": len(sim.machines[root].vpeers) - 1}
    return shapes


def settled_run(setting: Setting, subscribers: int, max_children: int
            ) -> tuple[JoinRecorder, Workload]:
    """The roots and a burst of subscribers of the stock schema, settled."""
    schema = default_schema()
    sim = JoinRecorder(schema, setting.config(max_children), mode="modeled",
                       costs=setting.costs, latency=setting.latency, seed=setting.seed)
    sim.add_roots()
    workload = Workload(schema, random.Random(setting.seed))
    for i in range(subscribers):
        sim.add_subscriber(workload.predicate(), at=i * ARRIVAL)
    sim.run_until(subscribers * ARRIVAL + SETTLE)
    return sim, workload


def draw_run(setting: Setting, subscribers: int, max_children: int, path: str | Path) -> None:
    """Draw the trees of a settled run from its machines' state (as ``/status`` shows it)."""
    sim, _ = settled_run(setting, subscribers, max_children)
    statuses = [{"address": address, "trees": tree_status(machine)}
                for address, machine in sim.machines.items()]
    draw_trees(statuses, path, f"Simulated trees: {subscribers} subscribers of the stock "
               f"schema, out-degree {max_children}")


def trees_run(setting: Setting, subscribers: int, max_children: int) -> dict[str, Any]:
    sim, workload = settled_run(setting, subscribers, max_children)
    shape = tree_shape(sim)
    joins = dict(sim.metrics.messages)
    publisher, start = sim.add_publisher(), sim.now
    events = {sim.publish(publisher, v, at=start + 0.1 * i): v
              for i, v in enumerate(workload.values() for _ in range(EVENTS))}
    sim.run_until(start + 0.1 * EVENTS + SETTLE)
    return {"subscribers": subscribers, "trees": shape,
            "connection_s": summary(sim.first_connections.values()),
            "join_messages": joins,
            "event_messages": sum(sim.metrics.event_messages.values()),
            "root_forwarded": sum(sim.machines[r].stats.forwarded for r in sim.roots.values()),
            "dissemination_s": summary(sim.metrics.dissemination_delays()),
            "delivery_errors": len(delivery_errors(sim, events))}


def plot(report: dict[str, Any], path: Any) -> None:
    runs = report["runs"]
    xs = [r["subscribers"] for r in runs]
    panels = [("share of a tree's virtual peers under the root", "share"),
              ("connection delay (s)", "delay")]
    with figure(path, "Stock schema, up to 4 credentials per subscriber", "subscribers",
                panels) as axes:
        (share, _), (delay, _) = axes
        for attribute in runs[0]["trees"]:
            trees = [r["trees"][attribute] for r in runs]
            share.plot(xs, [t["under_root"] / max(1, t["virtual_peers"]) for t in trees],
                       marker="o", label=f"{attribute}: under the root")
            share.plot(xs, [t["under_root_coverable"] / max(1, t["virtual_peers"])
                            for t in trees], linestyle="--",
                       label=f"{attribute}: of which another peer covers")
        for stat in ("median", "mean", "p95"):
            delay.plot(xs, [r["connection_s"][stat] for r in runs], marker="o", label=stat)
