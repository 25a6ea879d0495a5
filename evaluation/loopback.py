"""Cross-check of the simulator against real peer processes on loopback (N <= 50).

The same subscriptions and events run twice: as real ``ibe-pubsub`` processes
(a key server, one root per attribute, the subscribers, one publisher; see
:mod:`evaluation.cluster`), and in the simulator with real cryptography and a
loopback latency model. Dissemination delay is measured the same way in both:
from the publisher handing the sealed event to the network to the subscriber
delivering it. The real processes share this machine's cores, the simulated
peers each have one of their own, so the comparison bounds the simulator's
optimism rather than matching it exactly.
"""

from __future__ import annotations

import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from ibe_pubsub.credentials import Event, default_schema, parse_predicate
from ibe_pubsub.evaluation.cluster import cluster_with_keyserver
from ibe_pubsub.evaluation.delays import JOIN_SPACING, JoinRecorder, Progress
from ibe_pubsub.evaluation.exceptions import BenchRunError, BenchSettingsError
from ibe_pubsub.evaluation.launcher import (
    stop,
)
from ibe_pubsub.evaluation.sizes import MAX_LOOPBACK_PEERS as MAX_PEERS
from ibe_pubsub.evaluation.stock_workload import event_values, subscription_text
from ibe_pubsub.overlay import LatencyModel, OverlayConfig, summary

#: One-way delay of a loopback hop with asyncio framing, seconds.
LOOPBACK = LatencyModel(median=0.0003, sigma=0.0, jitter=0.5)
#: Seconds between events: the processes share two cores, so events must not queue up.
INTERVAL = 1.0


def scenario(peers: int, events: int, seed: int) -> tuple[list[tuple[str, str]], list[Event]]:
    rng = random.Random(seed)
    subs = [(f"sub{i + 1:02d}", subscription_text(rng)) for i in range(peers)]
    stream = [Event(f"q{i + 1:04d}", event_values(rng), b"quote") for i in range(events)]
    return subs, stream


def expected(subs: list[tuple[str, str]], stream: list[Event]) -> dict[str, set[str]]:
    schema = default_schema()
    return {name: {e.event_id for e in stream
                   if parse_predicate(schema, text).matches(e.values)} for name, text in subs}


def run_processes(subs: list[tuple[str, str]], stream: list[Event], max_children: int,
                  workdir: Path, progress: Progress) -> dict[str, Any]:
    """The scenario as real processes; delays from the publisher's and subscribers' logs."""
    cluster, server = cluster_with_keyserver(workdir, max_children)
    try:
        roots = [cluster.start_root(f"root-{a}", [a]) for a in default_schema().names]
        cluster.wait_ready(roots)
        started = time.monotonic()
        procs = [cluster.start_subscriber(name, text) for name, text in subs]
        cluster.wait_ready(procs, timeout=180)
        joined = time.monotonic() - started
        progress(f"loopback: {len(procs)} subscriber processes joined in {joined:.1f} s")
        done = cluster.publish("publisher", stream, interval=INTERVAL)
        if done.returncode != 0:
            raise BenchRunError(f"publisher failed: {done.stderr.strip()}")
        want = expected(subs, stream)
        cluster.wait_deliveries(want, timeout=60)
        cluster.stop_all()
        sent = cluster.sent_times("publisher")
        delays, delivered, false_positives = [], 0, 0
        for name, ids in want.items():
            peer = cluster.peers[name]
            got = {d["id"]: d["delivered_at"] for d in peer.delivered()}
            delivered += len(ids & set(got))
            delays += [t - sent[i] for i, t in got.items() if i in sent]
            false_positives += int(peer.stats().get("false_positives") or 0)
        total = sum(len(ids) for ids in want.values())
        return {"all_joined_s": joined, "dissemination_s": summary(delays),
                "delivery_ratio": delivered / total if total else 1.0,
                "false_positives_per_subscriber": false_positives / len(subs)}
    finally:
        cluster.stop_all()
        stop(server)


def run_simulated(subs: list[tuple[str, str]], stream: list[Event], max_children: int,
                  seed: int) -> dict[str, Any]:
    """The same scenario in the simulator, on real cryptography."""
    schema = default_schema()
    sim = JoinRecorder(schema, OverlayConfig(max_children=max_children), mode="real",
                       latency=LOOPBACK, seed=seed)
    sim.add_roots()
    for i, (_, text) in enumerate(subs):
        sim.add_subscriber(parse_predicate(schema, text), at=i * JOIN_SPACING)
    sim.run_until(len(subs) * JOIN_SPACING + 10)
    publisher, start = sim.add_publisher(), sim.now
    ids = [sim.publish(publisher, e.values, at=start + i * INTERVAL)
           for i, e in enumerate(stream)]
    sim.run_until(start + len(stream) * INTERVAL + 10)
    total = sum(len(sim.expected_receivers(e.values)) for e in stream)
    delivered = sum(len(sim.metrics.deliveries.get(i, {})) for i in ids)
    false_positives = sum(sim.machines[a].stats.false_positives for a in sim.predicates)
    return {"dissemination_s": summary(sim.metrics.dissemination_delays()),
            "delivery_ratio": delivered / total if total else 1.0,
            "false_positives_per_subscriber": false_positives / len(subs)}


def run(peers: int, events: int, max_children: int, seed: int, progress: Progress
        ) -> dict[str, Any]:
    if not 1 <= peers <= MAX_PEERS:
        raise BenchSettingsError(f"loopback peers must be between 1 and {MAX_PEERS}, got {peers}")
    subs, stream = scenario(peers, events, seed)
    progress(f"loopback: {peers} subscriber processes, {events} events")
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="ibe-pubsub-bench-") as tmp:
        real = run_processes(subs, stream, max_children, Path(tmp), progress)
    real["load_average"] = (load, os.getloadavg()[0])
    progress("loopback: the same scenario in the simulator (real cryptography)")
    simulated = run_simulated(subs, stream, max_children, seed)
    means = [r["dissemination_s"].get("mean") for r in (real, simulated)]
    return {"experiment": "simulator vs. real processes on loopback", "peers": peers,
            "events": events, "max_children": max_children,
            "latency_model": {"median_s": LOOPBACK.median, "jitter": LOOPBACK.jitter},
            "processes": real, "simulator": simulated,
            "mean_ratio_processes_to_simulator": (means[0] / means[1]
                                                  if None not in means and means[1] else None),
            "note": "processes share the machine's cores; simulated peers do not"}
