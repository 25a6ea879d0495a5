"""Dissemination at ten times the report's event rate, without and with streams.

The dissemination experiment's setting (one 16-bit attribute tree, one credential per
subscriber, OHF, the publishers and events of experiment 3) with the events packed into a
tenth of the publishing window, run twice on the simulator with *real* cryptography (CPU
time of each operation charged as processing delay): once with version-2 events, once
with every publisher running a stream (scheme.md section 15). Modelled costs cannot stand
in here: what a stream event costs depends on what each peer has cached.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ibe_pubsub.credentials import StreamWindow
from ibe_pubsub.evaluation.delays import (
    PUBLISH_WINDOW,
    Runner,
    Setting,
    build,
    disseminate,
)
from ibe_pubsub.evaluation.plotting import pyplot

RATE_FACTOR = 10
#: The publishers' reuse window, seconds (``publish --stream-window 1s``).
STREAM_WINDOW = 1.0
MODES = {"version 2": None, "streams": STREAM_WINDOW}


def streams_run(setting: Setting, peers: int, max_children: int, publishers: int,
                events_each: int, window: float | None) -> dict[str, Any]:
    sim = build(setting, peers, max_children, "real",
                stream_window=None if window is None else StreamWindow(window))
    return disseminate(sim, setting, publishers, events_each, PUBLISH_WINDOW / RATE_FACTOR)


def run(setting: Setting, peers: int, max_children: int, publishers: int, events_each: int,
        runner: Runner) -> dict[str, Any]:
    results = runner([(streams_run, (setting, peers, max_children, publishers, events_each,
                                     window)) for window in MODES.values()])
    return {"experiment": f"dissemination at {RATE_FACTOR}x the report's event rate, real "
            "cryptography, without and with streams", "peers": peers,
            "max_children": max_children, "publishers": publishers,
            "events_per_publisher": events_each,
            "events_per_s": publishers * events_each * RATE_FACTOR / PUBLISH_WINDOW,
            "stream_window_s": STREAM_WINDOW,
            "rows": [{"mode": mode, **r} for mode, r in zip(MODES, results, strict=True)]}


def plot(report: dict[str, Any], path: Path) -> None:
    plt = pyplot()

    rows = report["rows"]
    fig, (delay, cpu) = plt.subplots(1, 2, figsize=(11, 4))
    for k, stat in enumerate(("median", "mean", "p95")):
        delay.bar([i + (k - 1) * 0.25 for i in range(len(rows))],
                  [r["dissemination_s"].get(stat, 0) * 1e3 for r in rows], 0.25, label=stat)
    delay.set_xticks(range(len(rows)), [f"{r['mode']}\n{r['delivery_ratio']:.1%} delivered"
                                        for r in rows])
    delay.set(ylabel="dissemination delay (ms)",
              title=f"{report['events_per_s']:.0f} events/s, {report['peers']} peers")
    delay.legend(fontsize=8)
    ops = sorted({op for r in rows for op in r["crypto_ms_per_event"]})
    bottom = [0.0] * len(rows)
    for op in ops:
        values = [r["crypto_ms_per_event"].get(op, 0.0) for r in rows]
        cpu.bar(range(len(rows)), values, 0.5, bottom=bottom, label=op)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    cpu.set_xticks(range(len(rows)), [r["mode"] for r in rows])
    cpu.set(ylabel="CPU ms per event, all peers", title="Crypto work per event")
    cpu.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
