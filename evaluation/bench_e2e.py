"""`bench e2e`: end-to-end speed as users see it, real processes on loopback.

A key server, one root of every tree and four subscribers (``peer run`` over mutual TLS,
each subscribed to ``bench streams``' subscription, which every event matches), and a
publisher that publishes through the application API (:mod:`evaluation.e2e_publisher`), at
fixed offered rates, in two modes: ``streams`` (a stream whose values stay in their cells,
so its header is reused) and ``v2`` (a fresh version-2 event each time). After each of our
phases the same events at the same rate go through ``nats-server``, AES-GCM encrypted under
one shared key (:mod:`evaluation.e2e_nats`), to four subscriber processes.

Per phase: delivered / expected, the delay from the publisher's call to a subscriber's
delivery (one host clock), and each process's CPU seconds per event. The same run measures
what each role costs in process (``bench streams``' scenarios, CPU time), so that the CPU
of a process can be set against the work it cannot avoid.
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ibe_pubsub.evaluation.bench_streams import SUBSCRIPTION, run_scenario
from ibe_pubsub.evaluation.cluster import Cluster
from ibe_pubsub.evaluation.e2e_sides import (
    SUBSCRIBERS,
    Progress,
    Side,
    finish,
    start_nats,
    start_our_publisher,
    start_ours,
    stop_side,
)
from ibe_pubsub.evaluation.exceptions import BenchRunError
from ibe_pubsub.evaluation.launcher import stop
from ibe_pubsub.evaluation.plots import figure

#: ``bench streams`` scenario that does per event what each mode's publisher and subscribers
#: do (``fresh``: a whole header per event, as a version-2 event).
IN_PROCESS = {"streams": "reused", "v2": "fresh"}
#: The issue's goal for a ticks-like stream's p99 delay, drawn on the plot.
P99_GOAL_MS = 20.0
#: Offered events/s of the unmeasured phase that starts each mode's publishers: a feed's
#: first event pays its session certificate and every cold cache (about 50 ms for a
#: stream's publisher), once in its life, not once per measurement.
WARMUP_RATE = 50.0


def offered(asked: str, rows: Sequence[dict[str, Any]]) -> float:
    """Events/s for ``asked``: a number, or ``P%`` of the capacity measured so far (the
    highest rate our publisher achieved in the mode's earlier phases)."""
    if not asked.endswith("%"):
        return float(asked)
    achieved = [r["ours"]["achieved_rate"] for r in rows if r["ours"].get("achieved_rate")]
    if not achieved:
        raise BenchRunError(f"rate {asked}: no earlier phase measured the capacity")
    return round(max(achieved) * float(asked[:-1]) / 100, 1)


def in_process_costs(modes: Sequence[str], seconds: float, progress: Progress
                     ) -> dict[str, dict[str, float]]:
    """Each mode's publisher and subscriber CPU ms per event in process (``bench streams``)."""
    from ibe_pubsub.credentials import load_group
    from ibe_pubsub.evaluation.bench_crypto import RawOps
    from ibe_pubsub.evaluation.bench_streams import CLOCK, _ed25519_prices

    group = load_group(None)
    raw_ops, ed = RawOps(group, 0.02, clock=CLOCK), _ed25519_prices(CLOCK)
    out = {}
    for mode in modes:
        progress(f"in process: {mode} (bench streams' {IN_PROCESS[mode]})")
        r = run_scenario(group, IN_PROCESS[mode], seconds, raw_ops, ed, random.Random(2026))
        out[mode] = {"scenario": IN_PROCESS[mode],
                     "publisher_ms_per_event": r["publisher_ms_per_event"],
                     "subscriber_ms_per_event": r["subscriber_ms_per_event"],
                     "publisher_events_per_s": r["publisher_events_per_s"]}
    return out


def compare(ours: dict[str, Any], nats: dict[str, Any], costs: dict[str, float] | None
            ) -> dict[str, Any]:
    """Ours against NATS, and our processes' CPU against their roles' in-process cost."""
    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    out: dict[str, Any] = {
        "cpu_all_ours_to_nats": ratio(ours["cpu_ms_all_per_event"],
                                      nats["cpu_ms_all_per_event"]),
        "p99_ours_to_nats": ratio(ours["delay_ms"].get("p99"), nats["delay_ms"].get("p99"))}
    if costs is not None:
        cpu = ours["cpu_ms_per_event"]
        out["cpu_to_in_process"] = {
            "publisher": ratio(cpu["publisher"], costs["publisher_ms_per_event"]),
            "subscriber": ratio(cpu["subscriber_mean"], costs["subscriber_ms_per_event"])}
    return out


def run_mode(ours: Side, nats: Side, cluster: Cluster, mode: str, rates: Sequence[str],
             seconds: float, warmup: float, costs: dict[str, float] | None,
             progress: Progress) -> list[dict[str, Any]]:
    """Our publisher of ``mode``, warmed up for ``warmup`` seconds, then each rate on our
    side and on NATS, one after the other (they share the cores)."""
    start_our_publisher(ours, cluster, mode)
    rows: list[dict[str, Any]] = []
    try:
        if warmup > 0:
            for side in (ours, nats):
                side.phase({"phase": f"{side.name}-{mode}-warmup", "mode": mode,
                            "rate": WARMUP_RATE, "seconds": warmup}, 60 + 10 * warmup)
            progress(f"{mode}: both publishers warmed up ({warmup:g} s at {WARMUP_RATE:g}/s)")
        for asked in rates:
            rate = offered(asked, rows)
            row: dict[str, Any] = {"rate": rate, "asked": asked}
            for side in (ours, nats):
                phase = {"phase": f"{side.name}-{mode}-{rate:g}", "mode": mode, "rate": rate,
                         "seconds": seconds}
                row[side.name] = side.phase(phase, 60 + 10 * seconds)
                progress(summary_line(mode, rate, side.name, row[side.name]))
            row["ratios"] = compare(row["ours"], row["nats"], costs)
            rows.append(row)
    finally:
        finish(ours.processes.pop("publisher"))
    return rows


def run(rates: dict[str, list[str]], seconds: float, warmup: float, in_process_seconds: float,
        progress: Progress) -> dict[str, Any]:
    load = os.getloadavg()[0]
    costs = (in_process_costs(list(rates), in_process_seconds, progress)
             if in_process_seconds > 0 else {})
    rows: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="ibe-pubsub-e2e-") as tmp:
        workdir = Path(tmp)
        ours, cluster, server = start_ours(workdir, progress)
        try:
            nats = start_nats(workdir, progress)
            try:
                for mode, mode_rates in rates.items():
                    rows[mode] = run_mode(ours, nats, cluster, mode, mode_rates, seconds,
                                          warmup, costs.get(mode), progress)
            finally:
                stop_side(nats)
        finally:
            cluster.stop_all()
            stop(server)
    return {"experiment": "end to end on loopback: ours (mutual TLS, real cryptography) "
            "against nats-server with AES-GCM payloads",
            "subscribers": SUBSCRIBERS, "subscription": SUBSCRIPTION,
            "seconds_per_rate": seconds, "warmup_seconds": warmup,
            "warmup_rate": WARMUP_RATE, "cores": os.cpu_count(),
            "load_average": [load, os.getloadavg()[0]],
            "in_process": costs, "modes": rows,
            "note": "CPU per event: publisher, root and nats-server per event published, "
                    "subscribers per event they delivered; delay from the publisher's call "
                    "to the subscriber's delivery line"}


def summary_line(mode: str, rate: float, side: str, r: dict[str, Any]) -> str:
    delay = r["delay_ms"]
    cpu = ", ".join(f"{n} {v:.2f}" for n, v in r["cpu_ms_per_event"].items()
                    if v is not None and (n == "subscriber_mean" or not n.startswith("sub")))
    return (f"{mode} {rate:g}/s {side}: {r['delivered']}/{r['expected']} delivered, "
            f"p50/p95/p99 {delay.get('p50', 0):.1f}/{delay.get('p95', 0):.1f}/"
            f"{delay.get('p99', 0):.1f} ms, CPU ms/event {cpu}")


def plot(report: dict[str, Any], path: Path) -> None:
    panels = [(f"{mode}: {label}", (mode, key)) for mode in report["modes"]
              for label, key in (("delivered / expected", "ratio"), ("p99 delay (ms)", "p99"))]
    with figure(path, "End to end on loopback, 4 subscribers: ours vs NATS + AES-GCM",
                "offered events/s", panels) as axes:
        for ax, (mode, key) in axes:
            rows = report["modes"][mode]
            for side, style in (("ours", "o-"), ("nats", "s--")):
                ys = [r[side]["delivered_ratio"] if key == "ratio"
                      else r[side]["delay_ms"].get("p99") for r in rows]
                ax.plot([r["rate"] for r in rows], ys, style, label=side)
            if key == "ratio":
                ax.set_ylim(0, 1.05)
            else:
                ax.set_yscale("log")
                if mode == "streams":
                    ax.axhline(P99_GOAL_MS, color="tab:red", linestyle=":", label="goal")


def run_e2e_bench(rates: dict[str, list[str]], seconds: float, warmup: float,
                  in_process_seconds: float, plot_path: Path) -> dict[str, Any]:
    report = run(rates, seconds, warmup, in_process_seconds,
                 lambda msg: print(f"[bench e2e] {msg}", file=sys.stderr, flush=True))
    plot_path.parent.mkdir(parents=True, exist_ok=True)
    plot(report, plot_path)
    return report
