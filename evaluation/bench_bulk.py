"""``bench bulk``: requests per second of the Spark decomposition vs one plain Python process.

Both drivers run the same batch function on the same synthetic Parquet input and
write the same outputs; the Spark session's start-up is timed separately because it
is paid once per job, not per row. The plain process is also measured in CPU time
(all its threads), which a machine shared with other work does not distort; Spark's
rate is wall time, as it is its parallelism that is measured. Peak memory is sampled
from /proc (``memory``).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from ibe_pubsub.credentials import Schema
from ibe_pubsub.evaluation.exceptions import BenchRunError
from ibe_pubsub.evaluation.memory import PeakMemory
from ibe_pubsub.evaluation.plotting import pyplot
from ibe_pubsub.evaluation.synthetic_requests import random_requests
from ibe_pubsub.pipelines import BATCH_ROWS, Settings, Summary, run_local

ARROW_BATCH_ROWS = "spark.sql.execution.arrow.maxRecordsPerBatch"


def _say(text: str) -> None:
    print(f"bench bulk: {text}", file=sys.stderr, flush=True)


def _side(summary: Summary, memory: PeakMemory) -> dict[str, Any]:
    return {"seconds": summary.seconds, "rows_per_s": summary.requests / summary.seconds,
            "requests": summary.requests, "accepted": summary.accepted,
            "rejected": summary.rejected, "credential_rows": summary.credential_rows,
            "peak_rss_mb": memory.megabytes()}


def _load() -> list[float]:
    """The 1, 5 and 15 minute load averages: how busy the machine was."""
    return [round(x, 2) for x in os.getloadavg()]


def _plot(report: dict[str, Any], path: Path) -> None:
    plt = pyplot()

    labels = ["one Python process", f"Spark {report['spark']['master']}"]
    rates = [report["python"]["rows_per_s"], report["spark"]["rows_per_s"]]
    fig, ax = plt.subplots(figsize=(6, 4))
    bars = ax.bar(labels, rates, color=["#888888", "#e25a1c"])
    ax.bar_label(bars, fmt="%.0f")
    ax.set_ylabel("requests decomposed per second")
    ax.set_title(f"bulk decomposition of {report['requests']:,} requests "
                 f"(ratio {report['ratio']:.2f})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_bulk_bench(json_path: Path, schema: Schema, requests: int, master: str, partitions: int,
         fine_depth: int, seed: int = 0, spark_log: Path | None = None,
         batch_rows: int = BATCH_ROWS) -> dict[str, Any]:
    """Run both drivers once on ``requests`` synthetic requests; write JSON and a PNG.

    Spark's own console output goes to ``spark_log`` (None: to this process's)."""
    from ibe_pubsub.pipelines import StageProgress, run_spark, spark_session

    settings = Settings(schema, fine_depth)
    with tempfile.TemporaryDirectory(prefix="ibe-bench-bulk-") as tmp:
        work = Path(tmp)
        _say(f"generating {requests} requests")
        pq.write_table(random_requests(schema, requests, seed), work / "requests.parquet")
        _say("one Python process")
        load_before = _load()
        cpu = time.process_time()
        with PeakMemory() as python_memory:
            python = run_local(settings, work / "requests.parquet", work / "python")
        python_cpu = time.process_time() - cpu
        _say(f"python: {python.line()}; {requests / python_cpu:.0f} requests per CPU second")
        _say(f"Spark {master}: starting the session"
             f"{f'; its logs go to {spark_log}' if spark_log else ''}")
        begun = time.perf_counter()
        with PeakMemory() as spark_memory:
            spark = spark_session(master, partitions, log=spark_log)
            spark.conf.set(ARROW_BATCH_ROWS, str(batch_rows))
            startup = time.perf_counter() - begun
            try:
                with StageProgress(spark):
                    spark_summary = run_spark(spark, settings, work / "requests.parquet",
                                              work / "spark")
            finally:
                spark.stop()
        _say(f"spark: {spark_summary.line()}")
    if (python.accepted, python.credential_rows) != (spark_summary.accepted,
                                                     spark_summary.credential_rows):
        raise BenchRunError("the two drivers disagree; see the summaries above")
    report: dict[str, Any] = {
        "requests": requests, "schema": schema.to_dict(), "fine_depth": fine_depth,
        "cpus": os.cpu_count(), "load_average_before": load_before,
        "load_average_after": _load(),
        "python": {**_side(python, python_memory), "cpu_seconds": python_cpu,
                   "rows_per_cpu_s": requests / python_cpu},
        "spark": {**_side(spark_summary, spark_memory), "master": master,
                  "shuffle_partitions": partitions, "arrow_batch_rows": batch_rows,
                  "cpu_seconds": spark_memory.child_cpu_seconds(),
                  "startup_seconds": startup,
                  "rows_per_s_with_startup": requests / (spark_summary.seconds + startup)},
    }
    report["ratio"] = report["spark"]["rows_per_s"] / report["python"]["rows_per_s"]
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report, indent=2) + "\n")
    _plot(report, json_path.with_suffix(".png"))
    return report
