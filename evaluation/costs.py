"""Crypto costs measured in the same run, for the simulator's cost-modelled crypto.

A small overlay runs on real cryptography (the scheme (docs/scheme.md) through
:class:`overlay.crypto_real.RealCrypto`, same schema and protocol as the
experiment); every operation the peers perform is timed by its
:class:`~overlay.crypto.CostMeter`. The mean time per call of each operation
becomes the :class:`CostTable` of the modelled runs, so the simulator charges
what the real peers just paid. The same small run, repeated with the modelled
costs, cross-checks the model against real cryptography.

Times are the calling thread's CPU time (a :class:`~overlay.crypto.CostMeter` on
``time.thread_time``), not wall time: on a shared, loaded machine the wall time of
an operation includes the time the process waited for a core, which a peer with
its own core would not pay.
"""

from __future__ import annotations

from typing import Any

from ibe_pubsub.evaluation.delays import Progress, Setting, build, disseminate, dissemination_run
from ibe_pubsub.overlay import DEFAULT_COSTS, CostTable, Simulator


def measured_costs(sim: Simulator) -> tuple[dict[str, float], list[str]]:
    """Mean seconds per call of every operation the simulation's crypto performed,
    and the operations it never performed (they keep the built-in estimate)."""
    meter = sim.crypto.meter
    measured = {op: meter.by_op[op] / n for op, n in meter.calls.items() if n}
    missing = sorted(set(DEFAULT_COSTS) - set(measured))
    return measured, missing


def calibrate(setting: Setting, peers: int, max_children: int, events: int,
              progress: Progress) -> tuple[CostTable, dict[str, Any]]:
    """Run ``peers`` subscribers and ``events`` events on real cryptography; return the
    measured cost table and a report comparing the real run with the modelled one."""
    progress(f"measuring crypto costs: {peers} peers on real cryptography")
    sim = build(setting, peers, max_children, "real")
    real = disseminate(sim, setting, 1, events)
    measured, missing = measured_costs(sim)
    table = CostTable({**DEFAULT_COSTS, **measured})
    progress("same run with the measured costs modelled")
    modelled = dissemination_run(Setting(setting.schema, table, setting.latency,
                                         setting.seed), peers, max_children, 1, events,
                                 "modeled")
    return table, {"peers": peers, "events": events,
                   "costs_ms": {op: s * 1e3 for op, s in sorted(table.seconds.items())},
                   "calls": dict(sim.crypto.meter.calls),
                   "not_measured": missing, "real": real, "modelled": modelled}
