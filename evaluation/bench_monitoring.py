"""``bench monitoring``: what serving and scraping /metrics and /status costs a peer.

One overlay of real processes on loopback, in one run: subscribers come in pairs with the
same subscription, one serving ``--http`` and scraped (``/metrics`` and ``/status``) every
``scrape_interval`` seconds, the other without an endpoint. Both halves join the same trees
(the first of a pair to join alternates, since it tends to sit higher and forward more)
and see the same events at the same time, so their difference is the endpoint's cost:
CPU seconds of each process (CPU, not wall time, since other work shares the cores) and
dissemination delay (publisher's send to subscriber's delivery). CPU is taken twice: over
the dissemination window (user + system time from ``/proc/PID/stat`` before the first
event and after the last delivery), the steady cost the goal is about, and over the
whole life of the process (``time.process_time`` at exit, from ``--stats-out``), which
adds loading the web stack once at start-up.
"""

from __future__ import annotations

import os
import random
import secrets
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from ibe_pubsub.evaluation.cluster import Cluster, PeerProcess
from ibe_pubsub.evaluation.demo import ground_truth, quotes, subscriptions
from ibe_pubsub.evaluation.exceptions import BenchRunError
from ibe_pubsub.evaluation.launcher import (
    free_port,
    init_keyserver,
    start_keyserver,
    stop,
    wait_ready,
)


def _scrape(cluster: Cluster, names: list[str], interval: float, stop_at: threading.Event,
            counts: list[int]) -> None:
    while not stop_at.wait(interval):
        for name in names:
            peer = cluster.peers[name]
            for path in ("/metrics", "/status"):
                if peer.get(path).status_code == 200:
                    counts[0] += 1


def process_cpu(pid: int) -> float:
    """User + system CPU seconds of a running process (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _scrape_cost(peer: PeerProcess, scrapes: int = 200) -> float:
    """CPU seconds the peer spends answering one scrape (/metrics and /status), from
    ``scrapes`` in a row once the events are through: the endpoint's own cost, free of
    the noise of where in the trees a peer sits."""
    start = process_cpu(peer.process.pid)
    for _ in range(scrapes):
        peer.get("/metrics")
        peer.get("/status")
    return (process_cpu(peer.process.pid) - start) / scrapes


def _group(cluster: Cluster, names: list[str], sent: dict[str, float],
           window: dict[str, float]) -> dict[str, Any]:
    cpu = [float(cluster.peers[n].stats()["cpu_seconds"]) for n in names]
    busy = [window[n] for n in names]
    delays = [d["delivered_at"] - sent[d["id"]] for n in names
              for d in cluster.peers[n].delivered() if d["id"] in sent]
    return {"window_cpu_seconds_mean": statistics.fmean(busy), "window_cpu_seconds": busy,
            "cpu_seconds_mean": statistics.fmean(cpu), "cpu_seconds": cpu,
            "deliveries": len(delays),
            "delay_ms_mean": 1000 * statistics.fmean(delays) if delays else None,
            "delay_ms_median": 1000 * statistics.median(delays) if delays else None}


def run_monitoring_bench(pairs: int, events: int, interval: float, scrape_interval: float,
                     seed: int = 5) -> dict[str, Any]:
    """Run the experiment; the report has both groups and the ratios on/off."""
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="ibe-pubsub-bench-") as tmp:
        work = Path(tmp)
        passphrase = secrets.token_urlsafe(24)
        init_keyserver(work / "ks", passphrase)
        port = free_port()
        server = start_keyserver(work / "ks", port, passphrase, log=work / "ks.log")
        url = f"http://127.0.0.1:{port}"
        cluster: Cluster | None = None
        try:
            wait_ready(url, server)
            cluster = Cluster(url, (work / "ks" / "admin.token").read_text().strip(),
                              work / "peers")
            roots = [cluster.start_root(f"root-{a}", [a]) for a in ("symbol", "price",
                                                                      "volume")]
            cluster.wait_ready(roots)
            subs = subscriptions(pairs, rng)
            on, off = [], []
            for i, (n, s) in enumerate(subs):  # who joins first of a pair sits higher
                for half in (("on", "off") if i % 2 else ("off", "on")):
                    extra = ("--http", "0") if half == "on" else ()
                    peer = cluster.start_subscriber(f"{n}-{half}", s, extra=extra)
                    (on if half == "on" else off).append(peer)
                    cluster.wait_ready([peer], timeout=60)
            stream = quotes(events, rng)
            scraped = [0]
            done = threading.Event()
            scraper = threading.Thread(target=_scrape, args=(
                cluster, [p.name for p in on], scrape_interval, done, scraped))
            names = [p.name for p in on + off]
            before = {n: process_cpu(cluster.peers[n].process.pid) for n in names}
            scraper.start()
            started = time.monotonic()
            try:
                result = cluster.publish("publisher", stream, interval=interval)
                if result.returncode != 0:
                    raise BenchRunError(f"publisher failed: {result.stderr.strip()}")
                truth = ground_truth(subs, stream)
                cluster.wait_deliveries({f"{n}-{half}": ids for n, ids in truth.items()
                                         for half in ("on", "off")}, timeout=60)
            finally:
                done.set()
                scraper.join()
            seconds = time.monotonic() - started
            window = {n: process_cpu(cluster.peers[n].process.pid) - before[n] for n in names}
            per_scrape = _scrape_cost(cluster.peers[on[0].name])
            cluster.stop_all()
            sent = cluster.sent_times("publisher")
            report = {"on": _group(cluster, [p.name for p in on], sent, window),
                      "off": _group(cluster, [p.name for p in off], sent, window)}
        finally:
            if cluster is not None:
                cluster.stop_all()
            stop(server)
    on_, off_ = report["on"], report["off"]
    return {"experiment": "peer --http endpoint on (scraped) vs off, same run",
            "pairs": pairs, "events": events, "event_interval_s": interval,
            "scrape_interval_s": scrape_interval, "scrapes": scraped[0],
            "dissemination_seconds": round(seconds, 1), **report,
            "window_cpu_ratio_on_off": (on_["window_cpu_seconds_mean"]
                                        / off_["window_cpu_seconds_mean"]),
            "cpu_ratio_on_off": on_["cpu_seconds_mean"] / off_["cpu_seconds_mean"],
            "cpu_seconds_per_scrape": per_scrape,
            "scrape_cpu_share": per_scrape / scrape_interval * seconds
            / on_["window_cpu_seconds_mean"],
            "delay_ratio_on_off": (on_["delay_ms_mean"] / off_["delay_ms_mean"]
                                   if on_["delay_ms_mean"] and off_["delay_ms_mean"] else None),
            "cpu_clock": "user + system CPU of each peer process: over the dissemination "
                         "window (/proc), and over its life (process_time at exit)"}


def plot_monitoring(report: dict[str, Any], path: str | Path) -> None:
    from ibe_pubsub.evaluation.plots import figure

    panels = [("CPU seconds while disseminating", "cpu"), ("mean delay (ms)", "delay")]
    with figure(path, f"--http on (scraped every {report['scrape_interval_s']} s) vs off, "
                f"{report['pairs']} pairs of equal subscriptions", "pair", panels) as axes:
        (cpu, _), (delay, _) = axes
        pairs = range(1, report["pairs"] + 1)
        for shift, half in ((-0.2, "off"), (0.2, "on")):
            cpu.bar([i + shift for i in pairs], report[half]["window_cpu_seconds"], width=0.4,
                    label=half)
            delay.bar([1 + shift * 2.5], [report[half]["delay_ms_mean"] or 0], width=0.4,
                      label=f"{half}, all pairs")
        cpu.set_xticks(list(pairs))
        delay.set_xticks([])
