"""`bench overlay`: the report's section 8 experiments, and more, in one run.

Order: measure the crypto costs on real cryptography (:mod:`evaluation.costs`),
then run experiments 1-4 on the simulator with those costs, spread over worker
processes, then experiment 5 (encryption operations). Each experiment writes
``DIR/<name>.json`` and ``DIR/<name>.png``; ``DIR/summary.json`` has the settings,
the measured costs and the security overhead next to the report's.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ibe_pubsub.credentials import load_group
from ibe_pubsub.evaluation import droppers, encryption, loopback, plots, streams, trees
from ibe_pubsub.evaluation.cluster import ClusterError
from ibe_pubsub.evaluation.costs import calibrate
from ibe_pubsub.evaluation.delays import (
    Job,
    Runner,
    Setting,
    connection_vs_degree,
    connection_vs_peers,
    dissemination_vs_peers,
    routing_comparison,
    serial,
    tree_schema,
)
from ibe_pubsub.evaluation.sizes import DEFAULT_EXPERIMENTS, Sizes
from ibe_pubsub.overlay import CostTable, LatencyModel

#: Experiments on the simulator, which need the measured crypto costs.
SIMULATED = ("connection", "degree", "dissemination", "routing", "trees")
#: The report's security overheads (ms), read off its Figs. 8.1 and 8.3.
REPORT_OVERHEAD_MS = {"connection": (230, 300), "dissemination": (150, 250)}


@dataclass
class Bench:
    out: Path
    sizes: Sizes = field(default_factory=Sizes)
    latency: LatencyModel = field(default_factory=LatencyModel)
    seed: int = 1
    workers: int = 2
    min_seconds: float = 0.1
    experiments: Sequence[str] = DEFAULT_EXPERIMENTS
    progress: Callable[[str], None] = field(
        default=lambda msg: print(f"[bench overlay] {msg}", file=sys.stderr, flush=True))

    def write(self, name: str, report: dict[str, Any],
              plot: Callable[[dict[str, Any], Path], None]) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        path = self.out / f"{name}.json"
        path.write_text(json.dumps(report, indent=1) + "\n")
        plot(report, path.with_suffix(".png"))
        self.progress(f"wrote {path} and {path.with_suffix('.png')}")

    @contextmanager
    def pool(self) -> Iterator[ProcessPoolExecutor | None]:
        """Worker processes for the simulator runs (none with one worker)."""
        pool = ProcessPoolExecutor(self.workers) if self.workers > 1 else None
        try:
            yield pool
        finally:
            if pool is not None:
                pool.shutdown()

    def runner(self, pool: ProcessPoolExecutor | None) -> Runner:
        """Run jobs in the pool (or here), reporting each as it finishes."""
        if pool is None:
            return serial

        def run(jobs: list[Job]) -> list[dict[str, Any]]:
            start = time.monotonic()
            futures = {pool.submit(fn, *args): (fn.__name__, args[1:]) for fn, args in jobs}
            for done, future in enumerate(as_completed(futures), 1):
                name, args = futures[future]
                self.progress(f"  {done}/{len(jobs)} {name}{args} "
                              f"({time.monotonic() - start:.0f} s)")
            return [f.result() for f in futures]

        return run

    def run(self) -> dict[str, Any]:
        s = self.sizes
        started = time.monotonic()
        summary: dict[str, Any] = {"seed": self.seed, "sizes": asdict(s),
                                   "latency_model": asdict(self.latency), "workers": self.workers,
                                   "cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()}
        if any(e in SIMULATED for e in self.experiments):
            base = Setting(tree_schema(), CostTable.default(), self.latency, self.seed)
            table, check = calibrate(base, s.calibration_peers, s.max_children,
                                     s.calibration_events, self.progress)
            self.write("calibration", check, plots.calibration)
            summary["costs_ms"] = check["costs_ms"]
            setting = Setting(base.schema, table, self.latency, self.seed)
            with self.pool() as pool:
                summary["overhead_ms"] = self._delays(setting, self.runner(pool))
        if "droppers" in self.experiments:
            with self.pool() as pool:
                report = droppers.run(
                    s.droppers, s.dropper_subscribers, s.dropper_events,
                    range(self.seed, self.seed + s.dropper_seeds), self.latency,
                    self.runner(pool), s.dropper_kinds)
            self.write("droppers", report, droppers.plot)
            summary["droppers"] = {f"{r['routing']} {r['fraction']:.0%} {r['kind']}": {
                "undefended": r["undefended"]["delivery_ratio"],
                "before": r["before"]["delivery_ratio"],
                "defended": r["defended"]["delivery_ratio"],
                "event_message_ratio": r["event_message_ratio"],
                "owed_replaced_share": r["defended"]["owed_replaced_share"],
                "owed_replaced_90_s": r["defended"]["owed_replaced_90_s"]}
                for r in report["rows"]}
        if "encryption" in self.experiments:
            report = encryption.run(load_group(), s.subscribers, s.encryption_events,
                                               self.seed, self.min_seconds, self.progress)
            self.write("encryption", report, encryption.plot)
            summary["ours_ops_per_event"] = statistics.fmean(
                r["ops_per_event"]["ours"] for r in report["rows"])
        if "loopback" in self.experiments:
            try:
                report = loopback.run(s.loopback_peers, s.loopback_events,
                                                 s.max_children, self.seed, self.progress)
            except (ClusterError, RuntimeError) as exc:
                summary["loopback_error"] = str(exc)
                self.progress(f"loopback cross-check failed: {exc}")
            else:
                self.write("loopback", report, plots.loopback)
                summary["loopback_ratio"] = report["mean_ratio_processes_to_simulator"]
        if "streams" in self.experiments:
            setting = Setting(tree_schema(), CostTable.default(), self.latency, self.seed)
            pool = ProcessPoolExecutor(self.workers) if self.workers > 1 else None
            try:
                report = streams.run(setting, s.dissemination_peers[0],
                                                s.max_children, s.publishers,
                                                s.events_per_publisher, self.runner(pool))
            finally:
                if pool is not None:
                    pool.shutdown()
            self.write("streams", report, streams.plot)
        summary["report_overhead_ms"] = REPORT_OVERHEAD_MS
        summary["seconds"] = round(time.monotonic() - started, 1)
        summary["load_average_at_end"] = os.getloadavg()
        (self.out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
        self.progress(f"done in {summary['seconds']} s")
        return summary

    def _delays(self, setting: Setting, run: Runner) -> dict[str, Any]:
        s, overhead = self.sizes, {}
        if "connection" in self.experiments:
            report = connection_vs_peers(setting, s.peers, s.max_children, run)
            self.write("connection_vs_peers", report, plots.connection_vs_peers)
            overhead["connection"] = plots.overhead_stats(report, "connection_s")
        if "degree" in self.experiments:
            report = connection_vs_degree(setting, s.degree_peers, s.degrees, run)
            self.write("connection_vs_degree", report, plots.connection_vs_degree)
            overhead["connection_by_degree"] = plots.overhead_stats(
                report, "connection_s")
        if "dissemination" in self.experiments:
            report = dissemination_vs_peers(setting, s.dissemination_peers, s.max_children,
                                            s.publishers, s.events_per_publisher, run)
            self.write("dissemination_vs_peers", report,
                       plots.dissemination_vs_peers)
            overhead["dissemination"] = plots.overhead_stats(report,
                                                                        "dissemination_s")
        if "routing" in self.experiments:
            report = routing_comparison(setting, s.routing_peers, s.max_children, s.publishers,
                                        s.events_per_publisher, s.routing_credentials,
                                        s.routing_fine_depth, run)
            self.write("routing", report, plots.routing)
        if "trees" in self.experiments:
            runs = run([(trees.trees_run, (setting, n, s.max_children))
                        for n in s.tree_subscribers])
            self.write("trees", {"experiment": "tree shape, stock schema",
                                 "arrival_s": trees.ARRIVAL, "runs": runs},
                       trees.plot)
        return overhead
