"""``ibe-pubsub bench keyserver``: credential keys per second over HTTP vs. the floor.

Both phases run in the same invocation on the same machine:

1. Floor: the issuer pool alone (one worker process per core, as the server uses),
   kept saturated with the same enrolment work the HTTP clients will ask for.
2. HTTP: a real key server in a child process, ``clients`` threads each enrolling the
   same subscription as its own identity, back to back, for ``seconds``.

A "credential key" is one credential's S1/S2/T with its signed connection request.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from credentials.schema import default_schema
from keyserver.client import KeyServerClient
from keyserver.enrolment import plan_subscriber
from keyserver.issuer import IssuerPool, issue_subscriber
from keyserver.keystore import create_keystore
from keyserver.launcher import free_port, init_keyserver, start_keyserver, stop, wait_ready

PASSPHRASE = "benchmark passphrase (throwaway key store)"


@dataclass(frozen=True)
class BenchSettings:
    clients: int = 32
    seconds: float = 20.0
    subscription: str = 'symbol prefix "IB" and price in [10, 20]'
    max_credentials: int | None = 4
    workers: int | None = None
    fine_depth: int = 1


def _progress(message: str) -> None:
    print(f"[bench keyserver] {message}", file=sys.stderr, flush=True)


def measure_floor(settings: BenchSettings, data_dir: Path) -> dict[str, Any]:
    """Credential keys/s of the issuer pool alone, kept busy with 2 tasks per worker."""
    from credentials.predicates import parse_predicate

    os.environ.setdefault("IBE_PUBSUB_PASSPHRASE", PASSPHRASE)
    store, _ = create_keystore(data_dir, default_schema(), PASSPHRASE)
    creds, fine = plan_subscriber(store.schema, parse_predicate(
        store.schema, settings.subscription), settings.max_credentials, settings.fine_depth)
    pool = IssuerPool(store, settings.workers)
    try:
        pool.warm_up()
        executor = pool._executor
        done_tasks = 0
        pending: set[Future[Any]] = set()
        start = time.perf_counter()
        deadline = start + settings.seconds
        while time.perf_counter() < deadline or pending:
            while time.perf_counter() < deadline and len(pending) < 2 * pool.workers:
                pending.add(executor.submit(issue_subscriber, 1, tuple(creds), tuple(fine),
                                            2**40))
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in finished:
                f.result()
            done_tasks += len(finished)
        elapsed = time.perf_counter() - start
    finally:
        pool.shutdown()
    return {"enrolments": done_tasks, "seconds": elapsed, "workers": pool.workers,
            "credentials_per_enrolment": len(creds), "fine_per_enrolment": len(fine),
            "keys_per_second": done_tasks * len(creds) / elapsed}


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


def measure_http(settings: BenchSettings, data_dir: Path) -> dict[str, Any]:
    init_keyserver(data_dir, PASSPHRASE)
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    extra = ["--workers", str(settings.workers)] if settings.workers else []
    process = start_keyserver(data_dir, port, PASSPHRASE, extra, log=data_dir / "server.log")
    try:
        wait_ready(base_url, process)
        admin = (data_dir / "admin.token").read_text().strip()
        with KeyServerClient(base_url, admin) as client:
            tokens = [client.create_identity(f"bench-{i}", "subscriber")["token"]
                      for i in range(settings.clients)]
        latencies: list[float] = []
        keys: list[int] = []
        lock = threading.Lock()
        start = time.perf_counter()
        threads = [threading.Thread(target=_client_loop, args=(
            base_url, t, settings, start + settings.seconds, latencies, keys, lock))
            for t in tokens]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
    finally:
        stop(process)
    ordered = sorted(latencies)
    return {"enrolments": len(ordered), "seconds": elapsed, "clients": settings.clients,
            "keys_per_second": sum(keys) / elapsed,
            "latency_p50": statistics.median(ordered),
            "latency_p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
            "latencies": ordered}


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    with tempfile.TemporaryDirectory(prefix="ibe-bench-ks-") as tmp:
        _progress(f"floor: issuer pool alone for {settings.seconds:.0f} s")
        floor = measure_floor(settings, Path(tmp) / "floor")
        _progress(f"floor: {floor['keys_per_second']:.1f} credential keys/s")
        _progress(f"http: {settings.clients} clients for {settings.seconds:.0f} s")
        http = measure_http(settings, Path(tmp) / "server")
        _progress(f"http: {http['keys_per_second']:.1f} credential keys/s")
    summary = {"floor_keys_per_second": round(floor["keys_per_second"], 2),
               "http_keys_per_second": round(http["keys_per_second"], 2),
               "ratio": round(http["keys_per_second"] / floor["keys_per_second"], 3),
               "latency_p50_s": round(http["latency_p50"], 4),
               "latency_p99_s": round(http["latency_p99"], 4),
               "clients": settings.clients, "workers": floor["workers"],
               "cores": os.cpu_count(), "enrolments_http": http["enrolments"],
               "credentials_per_enrolment": floor["credentials_per_enrolment"]}
    result = {"benchmark": "keyserver", "settings": asdict(settings), "summary": summary,
              "floor": floor, "http": http}
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=1))
    if plot_path is not None:
        _plot(result, plot_path)
    return result
