"""``ibe-pubsub bench keyserver --threshold T-of-N``: a threshold deployment against the
single key server, in one run on one machine.

* Floor: a single server's issuer pool generating subscriber keys alone (no connection
  requests), for CPU seconds per credential key: ``t`` times this is what combining must
  be compared with.
* Single: the single key server over HTTP, as ``bench keyserver`` measures it (its
  enrolments also sign a connection request per credential, which a member does not yet).
* Threshold: ``n`` member processes on 127.0.0.1 (one issuer worker each) after a set-up
  run in this process, and the same number of clients enrolling the same subscription
  back to back through :class:`ThresholdKeyClient` (each asks ``t`` members, checks every
  share and combines). Client-observed credential keys/s and latency, and CPU seconds per
  combined credential key: every member's process tree (the members' part) plus this
  process's (the clients' part: their checks and combining), each also stated alone.

On one machine the members share its cores, where a real deployment gives each its own:
the CPU figures do not depend on that, the throughput and latency figures do.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ibe_pubsub.credentials import PublicParams, default_schema, load_group
from ibe_pubsub.evaluation.bench_keyserver import (
    PASSPHRASE,
    BenchSettings,
    measure_floor,
    measure_http,
    open_floor_pool,
    progress,
    tree_cpu_seconds,
)
from ibe_pubsub.evaluation.launcher import (
    child_env,
    cli_command,
    free_port,
    start_keyserver,
    stop,
    wait_ready,
)
from ibe_pubsub.evaluation.threshold_lab import write_local_setup
from ibe_pubsub.keyserver import (
    THRESHOLD_PUBLIC_FILE,
    KeyServerError,
    MemberAccess,
    SetupPlan,
    ThresholdKeyClient,
    issue_subscriber_key,
    read_public_document,
    register_at_members,
)


def start_members(root: Path, t: int, n: int) -> list[subprocess.Popen[bytes]]:
    """``n`` members ready to serve: ``keyserver init`` each, the set-up, ``serve``."""
    dirs = [root / f"member-{i}" for i in range(1, n + 1)]
    inits = [subprocess.Popen(cli_command("keyserver", "init", "--data", str(d)),
                              env=child_env(PASSPHRASE), stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE) for d in dirs]
    for init in inits:
        init.wait(timeout=120)
    urls = [f"http://127.0.0.1:{free_port()}" for _ in dirs]
    write_local_setup(load_group(), dirs, urls, PASSPHRASE, "bench", t)
    processes = [start_keyserver(d, int(url.rsplit(":", 1)[1]), PASSPHRASE, ["--workers", "1"],
                                 log=d / "server.log") for d, url in zip(dirs, urls, strict=True)]
    try:
        for url, process in zip(urls, processes, strict=True):
            wait_ready(url, process)
    except BaseException:
        for process in processes:
            stop(process)
        raise
    return processes


def register(plan: SetupPlan, roots: list[Path], count: int) -> list[list[MemberAccess]]:
    """``count`` subscriber identities, each registered at every member: what each asks."""
    admin = {i: (root / "admin.token").read_text().strip()
             for i, root in enumerate(roots, start=1)}
    accesses = []
    for k in range(count):
        outcomes = register_at_members(plan, admin, f"bench-{k}", "subscriber", timeout=60)
        failed = [o.error for o in outcomes if o.error]
        if failed:
            raise KeyServerError(f"registering bench-{k} failed: {failed}")
        accesses.append([MemberAccess(o.index, o.url, str(o.token)) for o in outcomes])
    return accesses


async def _drive(pp: PublicParams, tpk: Any, accesses: list[list[MemberAccess]],
                 settings: BenchSettings) -> dict[str, Any]:
    latencies: list[float] = []
    keys: list[int] = []
    failures = 0
    start = time.perf_counter()
    deadline = start + settings.seconds

    async def client_loop(members: list[MemberAccess]) -> None:
        nonlocal failures
        async with ThresholdKeyClient(tpk, members, schema=pp.schema, group=pp.group,
                                      timeout=300) as client:
            while time.perf_counter() < deadline:
                t0 = time.perf_counter()
                combined = await client.enrol_subscriber(
                    settings.subscription, settings.fine_depth, settings.max_credentials)
                latencies.append(time.perf_counter() - t0)
                keys.append(len(combined.key.credentials))
                failures += len(combined.failures)

    await asyncio.gather(*(client_loop(members) for members in accesses))
    elapsed = time.perf_counter() - start
    ordered = sorted(latencies)
    return {"enrolments": len(ordered), "seconds": elapsed, "clients": len(accesses),
            "keys": sum(keys), "keys_per_second": sum(keys) / elapsed,
            "members_skipped": failures, "latency_p50": statistics.median(ordered),
            "latency_p99": ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
            "latencies": ordered}


def measure_threshold(settings: BenchSettings, t: int, n: int, root: Path) -> dict[str, Any]:
    root.mkdir()
    processes = start_members(root, t, n)
    try:
        roots = [root / f"member-{i}" for i in range(1, n + 1)]
        group = load_group()
        plan, tpk = read_public_document(roots[0] / THRESHOLD_PUBLIC_FILE, group)
        pp = PublicParams(group, tpk.mpk, default_schema())
        accesses = register(plan, roots, settings.clients)
        members_start = sum(tree_cpu_seconds(p.pid) for p in processes)
        client_start = time.process_time()
        result = asyncio.run(_drive(pp, tpk, accesses, settings))
        client = time.process_time() - client_start
        members = sum(tree_cpu_seconds(p.pid) for p in processes) - members_start
    finally:
        for process in processes:
            stop(process)
    keys = result["keys"]
    return result | {"t": t, "n": n, "cpu_seconds": members + client,
                     "cpu_seconds_per_key": (members + client) / keys,
                     "members_cpu_seconds_per_key": members / keys,
                     "client_cpu_seconds_per_key": client / keys}


def _plot(result: dict[str, Any], path: Path) -> None:
    from ibe_pubsub.evaluation.plotting import pyplot

    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    t, n = result["threshold"]["t"], result["threshold"]["n"]
    left.bar(["single server", f"{t} of {n}"],
             [result["single"]["keys_per_second"], result["threshold"]["keys_per_second"]])
    left.set_ylabel("credential keys / s (client-observed)")
    for name in ("single", "threshold"):
        lat = result[name]["latencies"]
        right.plot(lat, [(i + 1) / len(lat) for i in range(len(lat))],
                   label="single server" if name == "single" else f"{t} of {n}")
    right.set_xlabel("enrolment latency (s)")
    right.set_ylabel("fraction of enrolments")
    right.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def run_threshold_bench(settings: BenchSettings, t: int, n: int, json_path: Path,
                        plot_path: Path | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ibe-bench-threshold-") as tmp:
        pool, creds, fine = open_floor_pool(settings, Path(tmp) / "floor")
        try:
            progress(f"floor: subscriber keys alone ({pool.workers} workers), "
                     f"{settings.seconds / 2:.0f} s")
            floor = measure_floor(pool, creds, fine, settings.seconds / 2,
                                  job=issue_subscriber_key)
        finally:
            pool.shutdown()
        progress(f"single key server: {settings.clients} clients for {settings.seconds:.0f} s")
        single = measure_http(settings, Path(tmp) / "single")
        progress(f"{t} of {n} members: {settings.clients} clients for {settings.seconds:.0f} s")
        threshold = measure_threshold(settings, t, n, Path(tmp) / "threshold")
    summary = {
        "t": t, "n": n, "clients": settings.clients,
        "credentials_per_enrolment": len(creds),
        "single_keys_per_second": round(single["keys_per_second"], 2),
        "threshold_keys_per_second": round(threshold["keys_per_second"], 2),
        "single_latency_p50_s": round(single["latency_p50"], 4),
        "threshold_latency_p50_s": round(threshold["latency_p50"], 4),
        "single_latency_p99_s": round(single["latency_p99"], 4),
        "threshold_latency_p99_s": round(threshold["latency_p99"], 4),
        "latency_p50_ratio": round(threshold["latency_p50"] / single["latency_p50"], 3),
        "floor_cpu_seconds_per_key": round(floor["cpu_seconds_per_key"], 6),
        "threshold_cpu_seconds_per_key": round(threshold["cpu_seconds_per_key"], 6),
        "members_cpu_seconds_per_key": round(threshold["members_cpu_seconds_per_key"], 6),
        "client_cpu_seconds_per_key": round(threshold["client_cpu_seconds_per_key"], 6),
        "cpu_per_key_vs_t_floor_keys": round(
            threshold["cpu_seconds_per_key"] / (t * floor["cpu_seconds_per_key"]), 3),
        "members_cpu_per_key_vs_t_floor_keys": round(
            threshold["members_cpu_seconds_per_key"] / (t * floor["cpu_seconds_per_key"]), 3),
        "single_http_cpu_seconds_per_key": round(single["cpu_seconds_per_key"], 6),
        "cpu_per_key_vs_t_single_http_keys": round(
            threshold["cpu_seconds_per_key"] / (t * single["cpu_seconds_per_key"]), 3),
        "members_skipped": threshold["members_skipped"]}
    progress(f"single {summary['single_keys_per_second']}, {t} of {n} "
             f"{summary['threshold_keys_per_second']} credential keys/s")
    result = {"benchmark": "keyserver-threshold", "settings": asdict(settings),
              "summary": summary, "floor": floor, "single": single, "threshold": threshold}
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=1))
    if plot_path is not None:
        _plot(result, plot_path)
    return result
