"""What ``bench e2e`` reads off its processes: CPU time from /proc, deliveries from the
subscribers' JSON lines as they grow, and the figures of one phase.

CPU time comes from ``/proc/PID/stat`` (user + system), so a process is charged for its own
work only, not for the waits of a machine whose cores it shares. Delivery files are read
from where the last look stopped, so watching them costs the parent little while the
processes it measures run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of a running process (Linux)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / _TICKS


class DeliveryTail:
    """Event id -> delivery time of one subscriber's ``--events-out`` file, read as it grows."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.delivered: dict[str, float] = {}
        self._offset = 0

    def poll(self) -> int:
        """Read the complete lines written since the last poll; returns how many."""
        if not self.path.exists():
            return 0
        with self.path.open("rb") as handle:
            handle.seek(self._offset)
            chunk = handle.read()
        complete = chunk[:chunk.rfind(b"\n") + 1]
        self._offset += len(complete)
        lines = complete.splitlines()
        for line in lines:
            d = json.loads(line)
            self.delivered[d["id"]] = d["delivered_at"]
        return len(lines)


def percentiles(values: Iterable[float]) -> dict[str, float]:
    """p50, p95, p99 and max, in milliseconds (empty -> {})."""
    xs = sorted(values)
    if not xs:
        return {}
    at = {f"p{q}": xs[min(len(xs) - 1, int(q / 100 * len(xs)))] * 1e3 for q in (50, 95, 99)}
    return at | {"max": xs[-1] * 1e3}


def phase_figures(sent: Mapping[str, float], send_seconds: float,
                  tails: Mapping[str, DeliveryTail], cpu: Mapping[str, float],
                  per_delivery: Iterable[str]) -> dict[str, Any]:
    """Delivered ratio, delays and CPU ms per event of one phase. ``cpu`` is each process's
    CPU seconds in the phase; the processes in ``per_delivery`` (the subscribers) are charged
    per event they delivered, the others per event published."""
    got = {name: {i: t for i, t in tail.delivered.items() if i in sent}
           for name, tail in tails.items()}
    delivered = sum(map(len, got.values()))
    expected = len(sent) * len(tails)
    subscribers = set(per_delivery)
    handled = {name: len(got[name]) if name in subscribers else len(sent) for name in cpu}
    per_event = {name: seconds * 1e3 / handled[name] if handled[name] else None
                 for name, seconds in cpu.items()}
    subs = [per_event[n] for n in subscribers if per_event[n] is not None]
    return {"events": len(sent), "send_seconds": send_seconds,
            "achieved_rate": len(sent) / send_seconds if send_seconds else None,
            "expected": expected, "delivered": delivered,
            "delivered_ratio": delivered / expected if expected else 1.0,
            "delay_ms": percentiles(t - sent[i] for ds in got.values() for i, t in ds.items()),
            "cpu_s": dict(cpu),
            "cpu_ms_per_event": per_event | {"subscriber_mean": sum(subs) / len(subs)
                                             if subs else None},
            "cpu_ms_all_per_event": sum(cpu.values()) * 1e3 / len(sent) if sent else None}
