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

import math
import random
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ibe_pubsub.credentials import Credential, Schema, default_schema, enclosing_path
from ibe_pubsub.evaluation.delays import Runner
from ibe_pubsub.evaluation.plots import figure
from ibe_pubsub.evaluation.random_workload import Workload
from ibe_pubsub.evaluation.sizes import DROPPER_KINDS
from ibe_pubsub.overlay import (
    DropperKind,
    LatencyModel,
    OverlayConfig,
    Routing,
    Simulator,
    summary,
)

JOIN_SPACING = 0.05
#: How often the experiment looks at which links to droppers are left (seconds).
REPLACEMENT_STEP = 0.5
SETTLE = 40.0
EVENT_SPACING = 0.2
DRAIN = 15.0
#: Messages of the repair (besides the pulled events, which are ``Publish`` messages).
REPAIR_MESSAGES = ("Watch", "Digest", "Pull")
#: Messages that make and change links (second parents, rotations, demotions and
#: backup searches add to them).
LINK_MESSAGES = ("Join", "JoinMiss", "JoinSplit", "Accept", "Detach", "Handover", "Recruit",
                 "SwapOffer", "SwapAccept", "SwapHandover", "Tokens")


def dropper_run(latency: LatencyModel, seed: int, subscribers: int, events: int,
                fraction: float, routing: Routing, defence: Mapping[str, Any],
                kind: DropperKind = "plain") -> dict[str, Any]:
    """One run with the ``OverlayConfig`` options ``defence``; counts cover the publishing
    phase only (joins are done by then)."""
    started = time.process_time()
    schema = default_schema()
    sim = Simulator(schema, OverlayConfig(routing=routing, **defence), mode="plaintext",
                    latency=latency, seed=seed, droppers=fraction, dropper_kind=kind)
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
    # Dropping starts to matter with the first event: from then on, when does each link
    # from an honest virtual peer to a dropping parent go?
    dropping = set(_dropper_links(sim))
    credentials = {link: sim.machines[link[0]].vpeers[link[1]].credential for link in dropping}
    gone_at: dict[Link, float] = {}
    end = start + EVENT_SPACING * events + DRAIN
    while sim.now < end:
        sim.run_until(min(end, sim.now + REPLACEMENT_STEP))
        gone = dropping - set(_dropper_links(sim))
        gone_at.update(dict.fromkeys(gone, sim.now - start))
        dropping -= gone
    replaced = sorted(gone_at.values())
    owed = first_owed(schema, credentials, list(published.values()), gone_at)
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
            "link_messages": sum(n for k, n in messages.items() if k in LINK_MESSAGES),
            "pulled": sum(m.stats.pulled for m in sim.machines.values()),
            "listed": sum(m.stats.listed for m in sim.machines.values()) - listed,
            "entries_tested": sum(m.stats.entries_tested for m in sim.machines.values())
            - tested,
            "route_tests": sim.crypto.meter.calls["route"] - routes,
            "delays": [t - sim.metrics.published[e] for e, subs in got.items()
                       for t in subs.values()],
            "dropping_links": len(credentials), "replaced_s": replaced,
            "owing_links": len(owed),
            "replaced_after_owed_s": sorted(gone_at[link] - t for link, t in owed.items()
                                            if link in gone_at),
            "demoted": sum(m.stats.demoted for m in sim.machines.values()),
            "cpu_s": time.process_time() - started}


#: (peer, virtual peer, parent's peer, parent's virtual peer)
Link = tuple[str, str, str, str]


def _dropper_links(sim: Simulator) -> list[Link]:
    """(peer, virtual peer, parent's peer, parent's virtual peer) of every link from an
    honest subscriber's virtual peer to a dropper."""
    return [(address, vp.vp, *parent)
            for address in set(sim.alive_subscribers()) - sim.droppers
            for vp in sim.machines[address].vpeers.values() for parent in vp.parents
            if parent[0] in sim.droppers]


def first_owed(schema: Schema, credentials: Mapping[Link, Credential],
               values: Sequence[Mapping[str, Any]], gone_at: Mapping[Link, float]
               ) -> dict[Link, float]:
    """For each link that was owed an event while it lasted (one whose value the child's
    credential encloses, sent before the link went), when the first such event was sent
    (seconds after the first event). A link never owed anything drops nothing its child
    can miss, and nothing local can tell its parent from an honest one. Under MCR this
    is an upper bound: a parent owed only what the fine tokens dealt to it route."""
    leaves = [{a: enclosing_path(schema, a, x)[-1] for a, x in v.items() if a in schema.names}
              for v in values]  # each event's leaf per attribute, once for every link
    out: dict[Link, float] = {}
    for link, credential in credentials.items():
        for i, leaf in enumerate(leaves):
            t = EVENT_SPACING * i
            if t >= gone_at.get(link, math.inf):
                break
            if credential.attribute in leaf and credential.covers(leaf[credential.attribute]):
                out[link] = t
                break
    return out


def _combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Sum the seeds' runs of one setting."""
    out: dict[str, Any] = {"seeds": [r["seed"] for r in runs]}
    for key in ("droppers", "honest", "expected", "delivered", "event_messages",
                "event_bytes", "heartbeat_messages", "link_messages", "pulled", "listed",
                "entries_tested", "route_tests", "cpu_s"):
        out[key] = sum(r[key] for r in runs)
    for key in ("repair_messages", "repair_bytes"):
        out[key] = {k: sum(r[key][k] for r in runs) for k in REPAIR_MESSAGES}
    out["delivery_ratio"] = out["delivered"] / out["expected"] if out["expected"] else 1.0
    out["dissemination_s"] = summary(d for r in runs for d in r["delays"])
    out["cpu_s"] = round(out["cpu_s"], 1)
    return out


#: The defences compared: none at all; the defaults before push backups, demotion and
#: backup searches (the pull repair under MCR only); the defaults now.
DEFENCES: dict[str, dict[Routing, dict[str, Any]]] = {
    "undefended": {r: {"repair": False, "push_backup": False, "demote_after": 0}
                   for r in ("ohf", "mcr")},
    "before": {"ohf": {"repair": False, "push_backup": False, "demote_after": 0},
               "mcr": {"push_backup": False, "demote_after": 0, "backup_searches": False}},
    "defended": {"ohf": {}, "mcr": {}},
}


def replaced_within(runs: list[dict[str, Any]], share: float = 0.9, owed: bool = False
                    ) -> float | None:
    """Seconds from the first event until ``share`` of the links from honest virtual peers
    to dropping parents were gone (None: never within the run); with ``owed``, of the
    links that were owed an event, from the first one each was owed."""
    total = sum(r["owing_links" if owed else "dropping_links"] for r in runs)
    times = sorted(t for r in runs for t in r["replaced_after_owed_s" if owed else "replaced_s"])
    need = math.ceil(share * total)
    return None if not total or len(times) < need else times[need - 1] if need else 0.0


def run(fractions: Sequence[float], subscribers: int, events: int, seeds: Sequence[int],
        latency: LatencyModel, runner: Runner,
        kinds: Sequence[str] = DROPPER_KINDS) -> dict[str, Any]:
    """Every (routing, fraction, dropper kind) on every seed, undefended (once: the kind
    changes nothing there), with the defaults before and with today's; one row each."""
    settings = [(r, f, "undefended", "plain") for r in ("ohf", "mcr") for f in fractions]
    settings += [(r, f, d, k) for r in ("ohf", "mcr") for f in fractions for k in kinds
                 for d in ("before", "defended")
                 if not (r == "ohf" and d == "before")]  # under OHF "before" was undefended
    results = iter(runner([(dropper_run, (latency, s, subscribers, events, f, r,
                                          DEFENCES[d][r], k))
                           for r, f, d, k in settings for s in seeds]))
    runs = {key: [next(results) for _ in seeds] for key in settings}
    rows = []
    for routing in ("ohf", "mcr"):
        for f in fractions:
            off = _combine(runs[(routing, f, "undefended", "plain")])
            for kind in kinds:
                before = off if routing == "ohf" else _combine(
                    runs[(routing, f, "before", kind)])
                on_runs = runs[(routing, f, "defended", kind)]
                on = _combine(on_runs)
                on["replaced_50_s"] = replaced_within(on_runs, 0.5)
                on["replaced_90_s"] = replaced_within(on_runs)
                on["dropping_links"] = sum(r["dropping_links"] for r in on_runs)
                on["replaced_share"] = (sum(len(r["replaced_s"]) for r in on_runs)
                                        / max(1, on["dropping_links"]))
                on["owing_links"] = sum(r["owing_links"] for r in on_runs)
                on["owed_replaced_50_s"] = replaced_within(on_runs, 0.5, owed=True)
                on["owed_replaced_90_s"] = replaced_within(on_runs, owed=True)
                on["owed_replaced_share"] = (
                    sum(len(r["replaced_after_owed_s"]) for r in on_runs)
                    / max(1, on["owing_links"]))
                on["demoted"] = sum(r["demoted"] for r in on_runs)
                repair_msgs = sum(on["repair_messages"].values())
                rows.append({
                    "routing": routing, "fraction": f, "kind": kind, "undefended": off,
                    "before": before, "defended": on,
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
            "defences": DEFENCES,
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
            for kind in dict.fromkeys(r["kind"] for r in report["rows"]):
                rows = [r for r in report["rows"]
                        if r["routing"] == routing and r["kind"] == kind]
                xs = [r["fraction"] for r in rows]
                shown = ["undefended", "defended"] if kind == "plain" else ["defended"]
                if routing == "mcr":
                    shown.insert(-1, "before")
                for label in shown:
                    style = {"undefended": ":", "before": "--", "defended": "-"}[label]
                    name = f"{routing.upper()} {label}" + (
                        "" if label == "undefended" else f", {kind}")
                    ratio.plot(xs, [r[label]["delivery_ratio"] for r in rows], style,
                               marker="o", label=name)
                    p95.plot(xs, [r[label]["dissemination_s"].get("p95", 0.0) for r in rows],
                             style, marker="o", label=name)
                messages.plot(xs, [r["event_message_ratio"] for r in rows], "-", marker="o",
                              label=f"{routing.upper()} events, {kind}")
        messages.axhline(2.5, color="grey", linewidth=0.8, label="OHF budget (2.5x)")
