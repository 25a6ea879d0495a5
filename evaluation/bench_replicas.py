"""``ibe-pubsub bench keyserver --replicas N``: credential keys per second with 1 replica and
with N replicas of one key store on one PostgreSQL database, each replica pinned to one
core (``taskset``) with one issuer worker.

For each replica count in turn: a fresh database on the cluster, ``keyserver init``, the
replicas (``keyserver serve --workers 1`` under ``taskset -c CORE``), ``clients`` threads
enrolling back to back, spread round robin over the replicas, for ``seconds``. Reported
per run: wall-clock credential keys/s and the CPU seconds of the replicas' process trees,
so ``keys_per_cpu_second`` is the throughput of one busy core whatever else runs on the
machine. ``ratio`` compares wall-clock rates (the goal: N replicas at N x 0.9 of one); on
a shared machine it moves with the background load, ``cpu_ratio`` (N x keys per CPU
second with N replicas, over the same with one) does not.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ibe_pubsub.evaluation.bench_keyserver import (
    PASSPHRASE,
    BenchSettings,
    create_clients,
    drive_clients,
    progress,
    tree_cpu_seconds,
)
from ibe_pubsub.evaluation.exceptions import BenchSettingsError
from ibe_pubsub.evaluation.launcher import (
    free_port,
    init_keyserver,
    start_keyserver,
    stop,
    wait_ready,
)
from ibe_pubsub.evaluation.postgres import fresh_database, postgres_cluster

UNLIMITED = ("--rate", "1e9", "--burst", "1000000000", "--address-rate", "1e9",
             "--address-burst", "1000000000", "--key-rate", "1e9", "--key-burst", "1000000000")
"""Every client runs from 127.0.0.1, and limits are per replica: lifted, so that they do
not shape the comparison."""


def _start_replicas(data_dir: Path, url: str, cores: Sequence[int], stack: ExitStack
                    ) -> list[tuple[str, int]]:
    """The replicas' URLs and pids, started together and stopped with ``stack``."""
    started = []
    for index, core in enumerate(cores):
        port = free_port()
        process = start_keyserver(data_dir, port, PASSPHRASE,
                                  ["--database-url", url, "--workers", "1", *UNLIMITED],
                                  log=data_dir / f"replica{index}.log",
                                  prefix=("taskset", "-c", str(core)))
        stack.callback(stop, process)
        started.append((f"http://127.0.0.1:{port}", process))
    for base_url, process in started:
        wait_ready(base_url, process)
    return [(base_url, process.pid) for base_url, process in started]


def measure_replicas(settings: BenchSettings, cluster_url: str, cores: Sequence[int],
                     work: Path) -> dict[str, Any]:
    """One run with a replica on each of ``cores``."""
    url = fresh_database(cluster_url)
    data_dir = work / f"replicas-{len(cores)}"
    init_keyserver(data_dir, PASSPHRASE, ("--database-url", url))
    with ExitStack() as stack:
        replicas = _start_replicas(data_dir, url, cores, stack)
        urls = [u for u, _ in replicas]
        tokens = create_clients(urls[0], (data_dir / "admin.token").read_text().strip(),
                                settings.clients, "bench-")
        cpu_start = [tree_cpu_seconds(pid) for _, pid in replicas]
        result = drive_clients(urls, tokens, settings)
        cpu = [tree_cpu_seconds(pid) - c for (_, pid), c in zip(replicas, cpu_start,
                                                                strict=True)]
    return result | {"replicas": len(cores), "cores": list(cores), "cpu_seconds": cpu,
                     "keys_per_cpu_second": result["keys"] / sum(cpu)}


def run_replica_bench(settings: BenchSettings, replicas: int, cores: Sequence[int],
                      postgres_url: str | None, json_path: Path) -> dict[str, Any]:
    """1 replica, then ``replicas``, on ``cores``; writes and returns the JSON."""
    if shutil.which("taskset") is None:
        raise BenchSettingsError(
            "bench keyserver --replicas needs taskset (util-linux) to pin replicas")
    runs = []
    with tempfile.TemporaryDirectory(prefix="ibe-bench-replicas-") as tmp, \
            postgres_cluster(postgres_url) as cluster:
        for count in sorted({1, replicas}):
            progress(f"{count} replica(s) on cores {list(cores[:count])}, "
                      f"{settings.clients} clients for {settings.seconds:.0f} s")
            runs.append(measure_replicas(settings, cluster, cores[:count], Path(tmp)))
            progress(f"{runs[-1]['keys_per_second']:.1f} credential keys/s, "
                      f"{runs[-1]['keys_per_cpu_second']:.1f} per CPU second")
    one, many = runs[0], runs[-1]
    summary = {"replicas": replicas, "cores": list(cores[:replicas]),
               "keys_per_second_1": round(one["keys_per_second"], 2),
               f"keys_per_second_{replicas}": round(many["keys_per_second"], 2),
               "ratio": round(many["keys_per_second"] / one["keys_per_second"], 3),
               "cpu_ratio": round(replicas * many["keys_per_cpu_second"]
                                  / one["keys_per_cpu_second"], 3),
               "goal_ratio": round(0.9 * replicas, 2), "clients": settings.clients,
               "machine_cores": os.cpu_count()}
    result = {"benchmark": "keyserver-replicas", "settings": asdict(settings),
              "summary": summary, "runs": [{k: v for k, v in r.items() if k != "latencies"}
                                           for r in runs]}
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=1))
    return result
