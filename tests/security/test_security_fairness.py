"""Fair issuance against real servers: one identity saturating the issuer with the largest
enrolments must not slow another identity's small enrolment by more than 3x (p95 of 60).

The attacker runs 20 concurrent enrolments of about 950 keys each (about 0.8 s of issuer
CPU apiece); its key quota is lifted so that all of them are admitted, which leaves only
the scheduler between them and the victim. The control is a server configured as before
the fair scheduler: one identity may fill both workers, with whole enrolments as jobs.

Why the 95th percentile of 60 samples: the claim is a bound on the delay the server's
scheduling adds, and the machine that runs the test is shared. With 20 samples a p99 is the
largest one, so a single pre-emption of the victim's client by another process (one
100 ms hiccup) failed a fair server. Such hiccups are rare and independent of the server;
the nearest-rank p95 of 60 (the 57th smallest) tolerates three of them, while a scheduler
that lets the attacker delay the victim delays most of its enrolments: the control asserts
that its median, which is at most its p95, is beyond the bound.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
from keyserver_fixtures import bearer_client

from ibe_pubsub.keyserver.client import KeyServerClient

pytestmark = pytest.mark.serial
WORKERS = "2"
ATTACKERS = 20
BIG = 'price in [0.02, 999.97] and volume in [3, 999997] and symbol prefix "A"'
SMALL = 'symbol prefix "IB"'
SAMPLES = 60
PERCENTILE = 95
CONTROL_SAMPLES = 5
NO_QUOTA = ("--key-rate", "1e6", "--key-burst", "100000000")
SLACK = 0.1  # seconds on top of 3x, for a shared machine


def _percentile(samples: list[float]) -> float:
    """The nearest-rank PERCENTILE: the smallest sample that many percent are not above."""
    ordered = sorted(samples)
    return ordered[math.ceil(PERCENTILE / 100 * len(ordered)) - 1]


def _enrol(client: httpx.Client, subscription: str, fine_depth: int) -> float:
    start = time.perf_counter()
    answer = client.post("/v1/enrol/subscriber",
                         json={"subscription": subscription, "fine_depth": fine_depth})
    assert answer.status_code == 200, answer.text
    return time.perf_counter() - start


@contextmanager
def _attack(base_url: str, token: str) -> Iterator[list[float]]:
    """20 threads enrolling BIG back to back until the block ends; yields their latencies."""
    stop, done = threading.Event(), []

    def attacker() -> None:
        with bearer_client(base_url, token, timeout=300) as client:
            while not stop.is_set():
                try:
                    done.append(_enrol(client, BIG, 4))
                except httpx.TransportError:
                    return  # the server is being stopped

    threads = [threading.Thread(target=attacker, daemon=True) for _ in range(ATTACKERS)]
    for t in threads:
        t.start()
    time.sleep(1.5)  # every attacker's enrolment is queued or running
    try:
        yield done
    finally:
        stop.set()


def _measure(keyserver_factory, serve_args: tuple[str, ...], loaded_samples: int
             ) -> tuple[float, float, float]:
    """Unloaded percentile of the victim's small enrolment, then loaded percentile and
    median."""
    server = keyserver_factory.start(serve_args=("--workers", WORKERS, *NO_QUOTA, *serve_args))
    admin = KeyServerClient(server.base_url, server.admin_token, retries=0)
    attacker, victim = (admin.create_identity(n, "subscriber")["token"]
                        for n in ("attacker", "victim"))
    try:
        with bearer_client(server.base_url, victim, timeout=300) as client:
            for _ in range(3):
                _enrol(client, SMALL, 1)  # warm up
            unloaded = [_enrol(client, SMALL, 1) for _ in range(SAMPLES)]
            with _attack(server.base_url, attacker) as big:
                loaded = [_enrol(client, SMALL, 1) for _ in range(loaded_samples)]
        print(f"{serve_args or 'fair (defaults)'}: unloaded p{PERCENTILE} "
              f"{_percentile(unloaded) * 1000:.0f} ms (median "
              f"{statistics.median(unloaded) * 1000:.0f}, max {max(unloaded) * 1000:.0f}); "
              f"loaded p{PERCENTILE} {_percentile(loaded) * 1000:.0f} ms (median "
              f"{statistics.median(loaded) * 1000:.0f}, max {max(loaded) * 1000:.0f}); "
              f"attacker enrolments done {len(big)}")
        return _percentile(unloaded), _percentile(loaded), statistics.median(loaded)
    finally:
        # SIGKILL: the attacker's queued enrolments would hold a graceful stop for 10 s
        # (the issuer workers exit with their parent)
        keyserver_factory.processes[server.base_url].kill()


def test_one_identity_cannot_delay_another_more_than_3x(keyserver_factory):
    unloaded, loaded, _ = _measure(keyserver_factory, (), SAMPLES)
    assert loaded <= 3 * unloaded + SLACK
    # control: whole enrolments as jobs and no per-identity cap, as before the scheduler;
    # the victim waits for the attacker's enrolments, and the same measurement shows it
    control_unloaded, _, control_median = _measure(
        keyserver_factory, ("--jobs-per-identity", WORKERS, "--credentials-per-job", "256"),
        CONTROL_SAMPLES)
    assert control_median > 3 * control_unloaded + SLACK
