"""``ibe-pubsub bench keyserver``: credential keys per second over HTTP vs. the floor.

Both phases run in the same invocation on the same machine:

* Floor: the issuer pool alone (one worker process per core, as the server uses),
  kept saturated with the same enrolment work the HTTP clients will ask for; measured
  before and after the HTTP phase (half the time each) and averaged.
* HTTP: a real key server in a child process, ``clients`` threads each enrolling the
  same subscription as its own identity, back to back, for ``seconds``.

A "credential key" is one credential's S1/S2/T with its signed connection request.
``ratio`` compares wall-clock rates; on a machine shared with other work it moves with the
background load, so ``cpu_efficiency`` also compares CPU seconds per key (issuer workers
alone vs. the whole server process tree plus the HTTP clients), which does not.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

from ibe_pubsub.credentials import default_schema
from ibe_pubsub.evaluation.launcher import (
    free_port,
    init_keyserver,
    start_keyserver,
    stop,
    wait_ready,
)
from ibe_pubsub.evaluation.plotting import pyplot
from ibe_pubsub.keyserver import (
    IssuerPool,
    KeyServerClient,
    create_keystore,
    issue_subscriber,
    plan_subscriber,
)

PASSPHRASE = "benchmark passphrase (throwaway key store)"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of a process and all its live descendants."""
    total = process_cpu_seconds(pid)
    for task in Path(f"/proc/{pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            total += tree_cpu_seconds(int(child))
    return total


@dataclass(frozen=True)
class BenchSettings:
    clients: int = 32
    seconds: float = 20.0
    subscription: str = 'symbol prefix "IB" and price in [10, 20]'
    max_credentials: int | None = 4
    workers: int | None = None
    fine_depth: int = 1


def progress(message: str) -> None:
    print(f"[bench keyserver] {message}", file=sys.stderr, flush=True)


def open_floor_pool(settings: BenchSettings, data_dir: Path) -> tuple[IssuerPool, tuple, tuple]:
    """An issuer pool over a throwaway key store, and the credentials of one enrolment."""
    from ibe_pubsub.credentials import parse_predicate

    store, _ = create_keystore(data_dir, default_schema(), PASSPHRASE)
    creds, fine = plan_subscriber(store.schema, parse_predicate(
        store.schema, settings.subscription), settings.max_credentials, settings.fine_depth)
    pool = IssuerPool(store, settings.workers)
    pool.warm_up()
    return pool, tuple(creds), tuple(fine)


#: A subscriber's whole issuance (keys and connection requests), as the server's pool runs it.
WHOLE_ENROLMENT = partial(issue_subscriber, expires_at=2**40)


def measure_floor(pool: IssuerPool, creds: tuple, fine: tuple, seconds: float,
                  job: Callable[..., Any] = WHOLE_ENROLMENT) -> dict[str, Any]:
    """Credential keys/s of the issuer pool alone, kept busy with 2 tasks per worker of
    ``job`` (a whole enrolment, or ``issue_subscriber_key``: the keys without connection
    requests)."""
    executor = pool._executor
    workers = list(executor._processes)  # type: ignore[attr-defined]
    cpu_start = sum(process_cpu_seconds(pid) for pid in workers)
    done_tasks = 0
    pending: set[Future[Any]] = set()
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline or pending:
        while time.perf_counter() < deadline and len(pending) < 2 * pool.workers:
            pending.add(executor.submit(job, 1, creds, fine))
        finished, pending = wait(pending, return_when=FIRST_COMPLETED)
        for f in finished:
            f.result()
        done_tasks += len(finished)
    elapsed = time.perf_counter() - start
    cpu = sum(process_cpu_seconds(pid) for pid in workers) - cpu_start
    return {"enrolments": done_tasks, "seconds": elapsed, "cpu_seconds": cpu,
            "keys_per_second": done_tasks * len(creds) / elapsed,
            "cpu_seconds_per_key": cpu / (done_tasks * len(creds))}


def _client_loop(base_url: str, token: str, settings: BenchSettings, deadline: float,
                 latencies: list[float], keys: list[int], lock: threading.Lock) -> None:
    with KeyServerClient(base_url, token, timeout=300, retries=0) as client:
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            bundle = client.enrol_subscriber(settings.subscription, settings.fine_depth,
                                             settings.max_credentials)
            elapsed = time.perf_counter() - t0
            with lock:
                latencies.append(elapsed)
                keys.append(sum(len(v) for v in bundle["credentials"].values()))


def drive_clients(urls: list[str], tokens: list[str], settings: BenchSettings
                  ) -> dict[str, Any]:
    """One thread per token enrolling back to back for ``settings.seconds``, spread round
    robin over ``urls``: enrolments, credential keys/s and latencies."""
    latencies: list[float] = []
    keys: list[int] = []
    lock = threading.Lock()
    start = time.perf_counter()
    threads = [threading.Thread(target=_client_loop, args=(
        urls[i % len(urls)], t, settings, start + settings.seconds, latencies, keys, lock))
        for i, t in enumerate(tokens)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    ordered = sorted(latencies)
    return {"enrolments": len(ordered), "seconds": elapsed, "clients": len(tokens),
            "keys": sum(keys), "keys_per_second": sum(keys) / elapsed,
            "latency_p50": statistics.median(ordered),
            "latency_p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
            "latencies": ordered}


def create_clients(base_url: str, admin_token: str, count: int, prefix: str) -> list[str]:
    """Tokens of ``count`` new subscriber identities."""
    with KeyServerClient(base_url, admin_token) as client:
        return [client.create_identity(f"{prefix}{i}", "subscriber")["token"]
                for i in range(count)]


def measure_http(settings: BenchSettings, data_dir: Path) -> dict[str, Any]:
    init_keyserver(data_dir, PASSPHRASE)
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    extra = ["--workers", str(settings.workers)] if settings.workers else []
    process = start_keyserver(data_dir, port, PASSPHRASE, extra, log=data_dir / "server.log")
    try:
        wait_ready(base_url, process)
        tokens = create_clients(base_url, (data_dir / "admin.token").read_text().strip(),
                                settings.clients, "bench-")
        cpu_start = tree_cpu_seconds(process.pid) + time.process_time()
        result = drive_clients([base_url], tokens, settings)
        cpu = tree_cpu_seconds(process.pid) + time.process_time() - cpu_start
    finally:
        stop(process)
    return result | {"cpu_seconds": cpu, "cpu_seconds_per_key": cpu / result["keys"]}


def _plot(result: dict[str, Any], path: Path) -> None:
    plt = pyplot()

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.bar(["key generation alone", f"HTTP, {result['http']['clients']} clients"],
             [result["floor"]["keys_per_second"], result["http"]["keys_per_second"]])
    left.set_ylabel("credential keys / s")
    left.set_title(f"ratio {result['summary']['ratio']:.2f}")
    lat = result["http"]["latencies"]
    right.plot(lat, [(i + 1) / len(lat) for i in range(len(lat))])
    right.set_xlabel("enrolment latency (s)")
    right.set_ylabel("fraction of enrolments")
    right.set_title("latency CDF")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def run_bench(settings: BenchSettings, json_path: Path, plot_path: Path | None
              ) -> dict[str, Any]:
    """Floor for half the time, HTTP, floor again for half the time: the floor is the mean
    of the two, so a change in background load during the run shows up in both phases."""
    with tempfile.TemporaryDirectory(prefix="ibe-bench-ks-") as tmp:
        pool, creds, fine = open_floor_pool(settings, Path(tmp) / "floor")
        try:
            progress(f"floor: issuer pool alone ({pool.workers} workers), "
                      f"{settings.seconds / 2:.0f} s")
            before = measure_floor(pool, creds, fine, settings.seconds / 2)
            progress(f"http: {settings.clients} clients for {settings.seconds:.0f} s")
            http = measure_http(settings, Path(tmp) / "server")
            progress(f"floor again, {settings.seconds / 2:.0f} s")
            after = measure_floor(pool, creds, fine, settings.seconds / 2)
        finally:
            pool.shutdown()
    floor = {"keys_per_second": (before["keys_per_second"] + after["keys_per_second"]) / 2,
             "cpu_seconds_per_key": (before["cpu_seconds"] + after["cpu_seconds"]) / (
                 (before["enrolments"] + after["enrolments"]) * len(creds)),
             "before": before, "after": after, "workers": pool.workers,
             "credentials_per_enrolment": len(creds), "fine_per_enrolment": len(fine)}
    progress(f"floor {floor['keys_per_second']:.1f}, http {http['keys_per_second']:.1f} "
              "credential keys/s")
    summary = {"floor_keys_per_second": round(floor["keys_per_second"], 2),
               "http_keys_per_second": round(http["keys_per_second"], 2),
               "ratio": round(http["keys_per_second"] / floor["keys_per_second"], 3),
               "cpu_efficiency": round(floor["cpu_seconds_per_key"]
                                       / http["cpu_seconds_per_key"], 3),
               "latency_p50_s": round(http["latency_p50"], 4),
               "latency_p99_s": round(http["latency_p99"], 4),
               "clients": settings.clients, "workers": pool.workers,
               "cores": os.cpu_count(), "enrolments_http": http["enrolments"],
               "credentials_per_enrolment": len(creds)}
    result = {"benchmark": "keyserver", "settings": asdict(settings), "summary": summary,
              "floor": floor, "http": http}
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=1))
    if plot_path is not None:
        _plot(result, plot_path)
    return result
