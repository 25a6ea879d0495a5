"""Retrying a periodic call that keeps failing, without hammering the server or the log.

A peer whose key server is down would otherwise retry (and log) every two seconds for as
long as the outage lasts. A :class:`Backoff` doubles the delay between attempts up to a
ceiling, reports the first failure at once and later ones at most once per ``report_every``
seconds with how many there were, and says once when the call works again. Times are
passed in, so the logic runs on any clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Backoff:
    """``what`` names the call in the reports ("directory renewal"); ``say`` prints one."""

    what: str
    say: Callable[[str], None]
    first: float = 2.0
    most: float = 60.0
    report_every: float = 60.0
    failures: int = field(default=0, init=False)
    _unreported: int = field(default=0, init=False)
    _reported_at: float = field(default=0.0, init=False)

    def delay(self) -> float:
        """Seconds to wait before the next attempt after ``failures`` failures in a row."""
        return min(self.most, self.first * 2 ** max(0, self.failures - 1))

    def failed(self, now: float, error: object) -> float:
        """Record a failure at ``now``; the seconds to wait before trying again."""
        self.failures += 1
        self._unreported += 1
        delay = self.delay()
        if self.failures == 1 or now - self._reported_at >= self.report_every:
            count = "" if self._unreported == 1 else f" ({self._unreported} failures since " \
                f"the last report)"
            self.say(f"{self.what} failed{count}: {error}; next attempt in {delay:.0f} s")
            self._unreported, self._reported_at = 0, now
        return delay

    def succeeded(self) -> None:
        """Record a success: the next failure is reported at once and retried soon."""
        if self.failures:
            self.say(f"{self.what} works again after {self.failures} failed attempt(s)")
        self.failures = self._unreported = 0
