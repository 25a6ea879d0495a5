"""Token-bucket rate limits keyed by identity or client address."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from ibe_pubsub.keyserver.exceptions import ServerSettingsError


@dataclass
class _Bucket:
    tokens: float
    updated: float


class RateLimiter:
    """``rate`` units per second on average, bursts of up to ``burst`` units (per key).

    A unit is a request or, for issuance, one key. A cost larger than the burst is let
    through once the bucket is full and leaves it in debt, so it is neither refused
    forever nor cheaper than its size in the long run.
    """

    def __init__(self, rate: float, burst: int, max_keys: int = 100_000) -> None:
        if rate <= 0 or burst < 1:
            raise ServerSettingsError("rate must be positive and burst at least 1")
        self.rate, self.burst, self.max_keys = rate, burst, max_keys
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    def acquire(self, key: str, cost: float = 1.0, now: float | None = None) -> float | None:
        """Take ``cost`` units; None if allowed, else the seconds until they are available."""
        now = time.monotonic() if now is None else now
        needed = min(cost, self.burst)
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is None:
                if len(self._buckets) >= self.max_keys:
                    self._buckets.clear()  # bounded memory; forgetting only ever helps callers
                bucket = self._buckets[key] = _Bucket(float(self.burst), now)
            bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.updated) * self.rate)
            bucket.updated = now
            if bucket.tokens >= needed:
                bucket.tokens -= cost
                return None
            return (needed - bucket.tokens) / self.rate
