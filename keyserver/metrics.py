"""The key server's Prometheus metrics: requests, keys issued, request latency.

They live in a :class:`~prometheus_client.CollectorRegistry` of the server's own (several
servers run in one test process; the library's global registry would mix them). One
registry is right although issuance runs in worker processes: everything is counted in
the serving process, by the request middleware and by the routes once a worker returned
the keys, so the library's multiprocess mode is not needed.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
#: The method label's values; any other method a client invents counts as ``other``, so
#: nobody can add series (and grow every scrape) by making methods up.
METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"})


def method_label(method: str) -> str:
    """``method`` if it is a standard one, else ``other``."""
    return method if method in METHODS else "other"


class Metrics:
    """``ibe_keyserver_requests_total``, ``ibe_keyserver_keys_issued_total`` and the
    ``ibe_keyserver_request_seconds`` histogram."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("ibe_keyserver_requests", "HTTP requests by method, route, "
                                "status.", ["method", "route", "status"],
                                registry=self.registry)
        self.keys = Counter("ibe_keyserver_keys_issued", "Keys issued, by kind.", ["kind"],
                            registry=self.registry)
        self.latency = Histogram("ibe_keyserver_request_seconds", "Request latency by route.",
                                 ["route"], buckets=LATENCY_BUCKETS, registry=self.registry)

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        """Count a request; ``route`` is a route template or ``unmatched``, never a raw path."""
        self.requests.labels(method_label(method), route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def keys_issued(self, kind: str, count: int) -> None:
        self.keys.labels(kind).inc(count)

    def render(self) -> str:
        """The Prometheus text format."""
        return generate_latest(self.registry).decode()
