"""Experiments 1-4 on the simulator: connection delay, dissemination delay, OHF vs MCR.

Like the report's section 8, the delay experiments use a single attribute tree
(a 16-bit numeric attribute) and subscribers with one credential each, so one
subscriber is one node of the tree. Each configuration runs twice on the same
seed: ``secure`` charges every crypto operation its cost measured in this run
(:mod:`evaluation.costs`), ``plaintext`` charges nothing. Peers join one
after another (``JOIN_SPACING`` apart, through a random member of the tree,
the report's setting) and publishing starts once the tree has settled.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ibe_pubsub.credentials import Schema, StreamWindow
from ibe_pubsub.evaluation.random_workload import Workload
from ibe_pubsub.overlay import (
    Action,
    Connected,
    CostMeter,
    CostTable,
    LatencyModel,
    Mode,
    OverlayConfig,
    Routing,
    Simulator,
    summary,
)

#: Seconds between two peers starting to join.
JOIN_SPACING = 0.02
#: Seconds of simulated time allowed for the tree to settle after the last join.
SETTLE = 10.0
#: Publishing window of the dissemination experiment, and time allowed to deliver.
PUBLISH_WINDOW = 160.0
DELIVER = 15.0
#: No peer fails in these experiments, so heartbeats only cost simulation time.
HEARTBEAT = 5.0

Progress = Callable[[str], None]


def tree_schema() -> Schema:
    """One numeric attribute: the single attribute tree of the report's experiments."""
    return Schema.from_dict({"name": "eval-tree", "attributes": [
        {"name": "price", "type": "int", "min": 0, "max": 65535, "bits": 16}]})


@dataclass(frozen=True)
class Setting:
    """What every run of one experiment shares."""

    schema: Schema
    costs: CostTable
    latency: LatencyModel
    seed: int

    def config(self, max_children: int, routing: Routing = "ohf") -> OverlayConfig:
        return OverlayConfig(max_children=max_children, routing=routing,
                             heartbeat_interval=HEARTBEAT, failure_timeout=4 * HEARTBEAT)


class JoinRecorder(Simulator):
    """A simulator that also keeps each virtual peer's first connection apart: the
    report's connection delay is the join's, not a reconnection after a swap or handover
    (the simulator's ``connection_delays`` has both). On real cryptography it charges
    CPU time (a :class:`CostMeter` on ``time.thread_time``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.first_connections: dict[tuple[str, str], float] = {}
        if kwargs.get("mode") == "real":
            self.crypto.meter = CostMeter(time.thread_time)

    def _apply(self, address: str, actions: list[Action], at: float) -> None:
        for action in actions:
            if isinstance(action, Connected) and action.link == 1:
                self.first_connections.setdefault((address, action.vp), at - action.started_at)
        super()._apply(address, actions, at)


def build(setting: Setting, peers: int, max_children: int, mode: Mode,
          routing: Routing = "ohf", credentials: int = 1, fine_depth: int = 0,
          stream_window: StreamWindow | None = None) -> JoinRecorder:
    """A tree of ``peers`` subscribers that joined one after another, settled (publishers
    run streams with ``stream_window``, on real cryptography only)."""
    sim = JoinRecorder(setting.schema, setting.config(max_children, routing), mode=mode,
                       costs=setting.costs, latency=setting.latency, seed=setting.seed,
                       stream_window=stream_window)
    sim.add_roots()
    workload = Workload(setting.schema, random.Random(setting.seed))
    names = list(setting.schema.names)
    for i in range(peers):
        sim.add_subscriber(workload.predicate(names), at=i * JOIN_SPACING,
                           max_credentials=credentials, fine_depth=fine_depth)
    sim.run_until(peers * JOIN_SPACING + SETTLE)
    return sim


#: Label of each run in the JSON -> the simulator's crypto mode.
MODES: dict[str, Mode] = {"secure": "modeled", "plaintext": "plaintext"}
Job = tuple[Callable[..., dict[str, Any]], tuple[Any, ...]]
Runner = Callable[[list[Job]], list[dict[str, Any]]]


def serial(jobs: list[Job]) -> list[dict[str, Any]]:
    return [fn(*args) for fn, args in jobs]


def connection_run(setting: Setting, peers: int, max_children: int, mode: Mode
                   ) -> dict[str, Any]:
    sim = build(setting, peers, max_children, mode)
    return {"connection_s": summary(sim.first_connections.values()),
            "all_connections_s": summary(sim.metrics.connection_delays),
            "connected": sum(1 for a in sim.alive_subscribers()
                             if any(vp.parents for vp in sim.machines[a].vpeers.values())),
            "messages": dict(sim.metrics.messages)}


def connection_vs_peers(setting: Setting, sizes: Sequence[int], max_children: int,
                        run: Runner) -> dict[str, Any]:
    """Experiment 1 (report Fig. 8.1)."""
    results = iter(run([(connection_run, (setting, n, max_children, mode))
                        for n in sizes for mode in MODES.values()]))
    rows = [{"peers": n, **{label: next(results) for label in MODES}} for n in sizes]
    return {"experiment": "connection delay vs. peers", "max_children": max_children,
            "rows": rows}


def connection_vs_degree(setting: Setting, peers: int, degrees: Sequence[int], run: Runner
                         ) -> dict[str, Any]:
    """Experiment 2 (report Fig. 8.2)."""
    results = iter(run([(connection_run, (setting, peers, d, mode))
                        for d in degrees for mode in MODES.values()]))
    rows = [{"max_children": d, **{label: next(results) for label in MODES}} for d in degrees]
    return {"experiment": "connection delay vs. maximum out-degree", "peers": peers,
            "rows": rows}


def publish_all(sim: Simulator, setting: Setting, publishers: int, events_each: int,
                window: float = PUBLISH_WINDOW) -> list[tuple[str, dict[str, Any]]]:
    """``publishers`` publishers each publish ``events_each`` events at random times over
    ``window`` seconds."""
    rng = random.Random(setting.seed + 1)
    workload = Workload(setting.schema, random.Random(setting.seed + 2))
    start = sim.now
    published = []
    for _ in range(publishers):
        pub = sim.add_publisher()
        for _ in range(events_each):
            values = workload.values()
            event_id = sim.publish(pub, values, at=start + rng.uniform(0, window))
            published.append((event_id, values))
    sim.run_until(start + window + DELIVER)
    return published


def disseminate(sim: JoinRecorder, setting: Setting, publishers: int, events_each: int,
                window: float = PUBLISH_WINDOW) -> dict[str, Any]:
    """Publish on a built overlay; delays, completeness, false positives, messages."""
    subscribers = sim.alive_subscribers()
    before = {a: sim.machines[a].stats.false_positives for a in subscribers}
    spent = dict(sim.crypto.meter.by_op)
    published = publish_all(sim, setting, publishers, events_each, window)
    per_event = {op: (t - spent.get(op, 0.0)) * 1e3 / max(len(published), 1)
                 for op, t in sim.crypto.meter.by_op.items()}
    expected = sum(len(sim.expected_receivers(v)) for _, v in published)
    delivered = sum(len(sim.metrics.deliveries.get(e, {})) for e, _ in published)
    false_positives = sum(sim.machines[a].stats.false_positives - before[a]
                          for a in subscribers)
    messages = [sim.metrics.event_messages[e] for e, _ in published]
    return {"connection_s": summary(sim.first_connections.values()),
            "dissemination_s": summary(sim.metrics.dissemination_delays()),
            "events": len(published), "expected_deliveries": expected,
            "deliveries": delivered,
            "delivery_ratio": delivered / expected if expected else 1.0,
            "false_positives_per_subscriber": false_positives / max(len(subscribers), 1),
            "false_positives_per_event": false_positives / max(len(published), 1),
            "messages_per_event": statistics.fmean(messages) if messages else 0.0,
            "crypto_ms_per_event": {op: ms for op, ms in sorted(per_event.items()) if ms}}


def dissemination_run(setting: Setting, peers: int, max_children: int, publishers: int,
                      events_each: int, mode: Mode, routing: Routing = "ohf",
                      credentials: int = 1, fine_depth: int = 0) -> dict[str, Any]:
    sim = build(setting, peers, max_children, mode, routing, credentials, fine_depth)
    return disseminate(sim, setting, publishers, events_each)


def dissemination_vs_peers(setting: Setting, sizes: Sequence[int], max_children: int,
                           publishers: int, events_each: int, run: Runner) -> dict[str, Any]:
    """Experiment 3 (report Fig. 8.3)."""
    results = iter(run([(dissemination_run, (setting, n, max_children, publishers,
                                             events_each, mode))
                        for n in sizes for mode in MODES.values()]))
    rows = [{"peers": n, **{label: next(results) for label in MODES}} for n in sizes]
    return {"experiment": "dissemination delay vs. peers", "max_children": max_children,
            "publishers": publishers, "events_per_publisher": events_each, "rows": rows}


def routing_comparison(setting: Setting, sizes: Sequence[int], max_children: int,
                       publishers: int, events_each: int, credentials: int, fine_depth: int,
                       run: Runner) -> dict[str, Any]:
    """Experiment 4: one-hop flooding against multi-credential routing, secure mode.

    Subscribers hold up to ``credentials`` credentials (one virtual peer each) and
    ``fine_depth`` levels of fine credentials, which MCR uses to route more precisely."""
    strategies = ("ohf", "mcr")
    results = iter(run([(dissemination_run, (setting, n, max_children, publishers,
                                             events_each, "modeled", r, credentials,
                                             fine_depth))
                        for n in sizes for r in strategies]))
    rows = [{"peers": n, **{r: next(results) for r in strategies}} for n in sizes]
    return {"experiment": "OHF vs. MCR", "max_children": max_children,
            "credentials_per_subscriber": credentials, "fine_depth": fine_depth,
            "publishers": publishers, "events_per_publisher": events_each, "rows": rows}
