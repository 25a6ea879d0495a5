"""Delivery despite peers that drop events, with and without the repair.

A fraction of the subscribers (never the publisher or a root) are *droppers*: they join
properly, answer heartbeats and receive events, but forward none (``Simulator(droppers=)``).
Stock schema, plaintext mode (the attack and its repair are about messages, not crypto
costs), subscribers joining one every ``JOIN_SPACING`` seconds, a settling time, then one
publisher sending ``events`` events ``EVENT_SPACING`` apart. Each (routing, fraction) runs
with the repair off and on (``OverlayConfig.repair``) on the same seeds, so the runs share
the workload and the droppers; the figure is the honest subscribers' delivery ratio.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from typing import Any

from ibe_pubsub.credentials import default_schema
from ibe_pubsub.evaluation.delays import Runner
from ibe_pubsub.evaluation.plots import figure
from ibe_pubsub.evaluation.random_workload import Workload
from ibe_pubsub.overlay import LatencyModel, OverlayConfig, Routing, Simulator, summary

JOIN_SPACING = 0.05
SETTLE = 40.0
EVENT_SPACING = 0.2
DRAIN = 15.0
#: Messages of the repair (besides the pulled events, which are ``Publish`` messages).
REPAIR_MESSAGES = ("Watch", "Digest", "Pull")


def dropper_run(latency: LatencyModel, seed: int, subscribers: int, events: int,
                fraction: float, routing: Routing, repair: bool) -> dict[str, Any]:
    """One run; counts cover the publishing phase only (joins are done by then)."""
    started = time.process_time()
    schema = default_schema()
    sim = Simulator(schema, OverlayConfig(routing=routing, repair=repair), mode="plaintext",
                    latency=latency, seed=seed, droppers=fraction)
    sim.add_roots()
    workload = Workload(schema, random.Random(seed))
    for i in range(subscribers):
        sim.add_subscriber(workload.predicate(), at=i * JOIN_SPACING)
    sim.run_until(subscribers * JOIN_SPACING + SETTLE)
    counts, sizes = dict(sim.metrics.messages), dict(sim.metrics.message_bytes)
    routes = sim.crypto.meter.calls["route"]
    listed = sum(m.stats.listed for m in sim.machines.values())
    tested = sum(m.stats.entries_tested for m in sim.machines.values())
    publisher, start = sim.add_publisher(), sim.now
    published = {sim.publish(publisher, v, at=start + EVENT_SPACING * i): v
                 for i, v in enumerate(workload.values() for _ in range(events))}
    sim.run_until(start + EVENT_SPACING * events + DRAIN)
    honest = set(sim.alive_subscribers()) - sim.droppers
    expected = sum(len(sim.expected_receivers(v) & honest) for v in published.values())
    got = {e: {a: t for a, t in sim.metrics.deliveries.get(e, {}).items() if a in honest}
           for e in published}
    delivered = sum(len(subs) for subs in got.values())
    messages = {k: v - counts.get(k, 0) for k, v in sim.metrics.messages.items()}
    nbytes = {k: v - sizes.get(k, 0) for k, v in sim.metrics.message_bytes.items()}
    return {"seed": seed, "droppers": len(sim.droppers), "honest": len(honest),
            "expected": expected, "delivered": delivered,
            "event_messages": messages.get("Publish", 0),
            "event_bytes": nbytes.get("Publish", 0),
            "repair_messages": {k: messages.get(k, 0) for k in REPAIR_MESSAGES},
            "repair_bytes": {k: nbytes.get(k, 0) for k in REPAIR_MESSAGES},
            "heartbeat_messages": messages.get("Ping", 0) + messages.get("Pong", 0),
            "pulled": sum(m.stats.pulled for m in sim.machines.values()),
            "listed": sum(m.stats.listed for m in sim.machines.values()) - listed,
            "entries_tested": sum(m.stats.entries_tested for m in sim.machines.values())
            - tested,
            "route_tests": sim.crypto.meter.calls["route"] - routes,
            "delays": [t - sim.metrics.published[e] for e, subs in got.items()
                       for t in subs.values()],
            "cpu_s": time.process_time() - started}


def _combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Sum the seeds' runs of one setting."""
    out: dict[str, Any] = {"seeds": [r["seed"] for r in runs]}
    for key in ("droppers", "honest", "expected", "delivered", "event_messages",
                "event_bytes", "heartbeat_messages", "pulled", "listed", "entries_tested",
                "route_tests", "cpu_s"):
        out[key] = sum(r[key] for r in runs)
    for key in ("repair_messages", "repair_bytes"):
        out[key] = {k: sum(r[key][k] for r in runs) for k in REPAIR_MESSAGES}
    out["delivery_ratio"] = out["delivered"] / out["expected"] if out["expected"] else 1.0
    out["dissemination_s"] = summary(d for r in runs for d in r["delays"])
    out["cpu_s"] = round(out["cpu_s"], 1)
    return out


def run(fractions: Sequence[float], subscribers: int, events: int, seeds: Sequence[int],
        latency: LatencyModel, runner: Runner) -> dict[str, Any]:
    """Every (routing, fraction, repair) on every seed; one row per (routing, fraction)."""
    settings = [(r, f, rep) for r in ("ohf", "mcr") for f in fractions for rep in (False, True)]
    results = iter(runner([(dropper_run, (latency, s, subscribers, events, f, r, rep))
                           for r, f, rep in settings for s in seeds]))
    combined = {key: _combine([next(results) for _ in seeds]) for key in settings}
    rows = []
    for routing in ("ohf", "mcr"):
        for f in fractions:
            off, on = combined[(routing, f, False)], combined[(routing, f, True)]
            repair_msgs = sum(on["repair_messages"].values())
            rows.append({
                "routing": routing, "fraction": f, "undefended": off, "defended": on,
                "event_message_ratio": on["event_messages"] / max(1, off["event_messages"]),
                "event_and_repair_message_ratio": (on["event_messages"] + repair_msgs)
                / max(1, off["event_messages"]),
                "event_and_repair_byte_ratio": (on["event_bytes"]
                                                + sum(on["repair_bytes"].values()))
                / max(1, off["event_bytes"])})
    return {"experiment": "delivery despite peers that drop events",
            "schema": "stock", "mode": "plaintext", "subscribers": subscribers,
            "events": events, "seeds": list(seeds), "join_spacing_s": JOIN_SPACING,
            "settle_s": SETTLE, "event_spacing_s": EVENT_SPACING, "drain_s": DRAIN,
            "cpu_note": "cpu_s is process CPU time summed over the seeds' runs",
            "rows": rows}


def plot(report: dict[str, Any], path: Any) -> None:
    panels = [("honest subscribers' delivery ratio", "ratio"),
              ("event messages / undefended", "messages"), ("delay p95 (s)", "p95")]
    with figure(path, f"Droppers: {report['subscribers']} subscribers, {report['events']} "
                f"events, seeds {report['seeds']}", "fraction of subscribers dropping",
                panels) as axes:
        (ratio, _), (messages, _), (p95, _) = axes
        for routing in ("ohf", "mcr"):
            rows = [r for r in report["rows"] if r["routing"] == routing]
            xs = [r["fraction"] for r in rows]
            for label, style in (("undefended", "--"), ("defended", "-")):
                ratio.plot(xs, [r[label]["delivery_ratio"] for r in rows], style, marker="o",
                           label=f"{routing.upper()} {label}")
                p95.plot(xs, [r[label]["dissemination_s"].get("p95", 0.0) for r in rows],
                         style, marker="o", label=f"{routing.upper()} {label}")
            messages.plot(xs, [r["event_message_ratio"] for r in rows], "-", marker="o",
                          label=f"{routing.upper()} events")
            messages.plot(xs, [r["event_and_repair_message_ratio"] for r in rows], ":",
                          marker="s", label=f"{routing.upper()} events + repair messages")
        messages.axhline(2.0, color="grey", linewidth=0.8, label="budget (2x)")
