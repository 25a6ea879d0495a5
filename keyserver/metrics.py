"""Prometheus text-format metrics: requests, keys issued, request latency."""

from __future__ import annotations

import threading
from collections import defaultdict

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def _labels(**pairs: str) -> str:
    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in pairs.items()) + "}"


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, str, str], int] = defaultdict(int)
        self.keys: dict[str, int] = defaultdict(int)
        self.latency_counts: dict[str, list[int]] = {}
        self.latency_sum: dict[str, float] = defaultdict(float)

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        with self._lock:
            self.requests[(method, route, str(status))] += 1
            counts = self.latency_counts.setdefault(route, [0] * (len(LATENCY_BUCKETS) + 1))
            for i, bound in enumerate(LATENCY_BUCKETS):
                if seconds <= bound:
                    counts[i] += 1
            counts[-1] += 1
            self.latency_sum[route] += seconds

    def keys_issued(self, kind: str, count: int) -> None:
        with self._lock:
            self.keys[kind] += count

    def render(self) -> str:
        with self._lock:
            out = ["# HELP ibe_keyserver_requests_total HTTP requests by method, route, status.",
                   "# TYPE ibe_keyserver_requests_total counter"]
            for (method, route, status), n in sorted(self.requests.items()):
                out.append("ibe_keyserver_requests_total"
                           f"{_labels(method=method, route=route, status=status)} {n}")
            out += ["# HELP ibe_keyserver_keys_issued_total Keys issued, by kind.",
                    "# TYPE ibe_keyserver_keys_issued_total counter"]
            for kind, n in sorted(self.keys.items()):
                out.append(f"ibe_keyserver_keys_issued_total{_labels(kind=kind)} {n}")
            out += ["# HELP ibe_keyserver_request_seconds Request latency by route.",
                    "# TYPE ibe_keyserver_request_seconds histogram"]
            for route, counts in sorted(self.latency_counts.items()):
                for bound, n in zip((*map(str, LATENCY_BUCKETS), "+Inf"), counts, strict=True):
                    out.append("ibe_keyserver_request_seconds_bucket"
                               f"{_labels(route=route, le=bound)} {n}")
                out.append(f"ibe_keyserver_request_seconds_sum{_labels(route=route)} "
                           f"{self.latency_sum[route]:.6f}")
                out.append(f"ibe_keyserver_request_seconds_count{_labels(route=route)} "
                           f"{counts[-1]}")
            return "\n".join(out) + "\n"
