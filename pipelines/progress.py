"""A one-line progress bar on stderr: redrawn in place on a terminal, a line every few seconds
otherwise (so logs of unattended runs stay readable)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

WIDTH = 30


class Progress:
    """Counts units of work out of ``total`` and shows rate and time left.

    ``done``: units finished before counting began (not part of the rate)."""

    def __init__(self, total: int, what: str, stream: TextIO | None = None,
                 log_every: float = 5.0, done: int = 0) -> None:
        self.total = max(total, 0)
        self.what = what
        self.done = self._before = done
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.log_every = log_every
        self.started = self._last = time.monotonic()

    def advance(self, n: int, note: str = "") -> None:
        self.done += n
        now = time.monotonic()
        if self.tty or now - self._last >= self.log_every or self.done >= self.total:
            self._last = now
            self._draw(now, note)

    def _draw(self, now: float, note: str) -> None:
        elapsed = max(now - self.started, 1e-9)
        rate = (self.done - self._before) / elapsed
        fraction = min(self.done / self.total, 1.0) if self.total else 1.0
        bar = "#" * int(fraction * WIDTH)
        left = (self.total - self.done) / rate if rate > 0 else float("inf")
        eta = f"{left:.0f} s left" if left != float("inf") else "-"
        line = (f"[{bar:<{WIDTH}}] {self.done}/{self.total} {self.what} "
                f"({fraction:.0%}), {rate:.1f}/s, {eta}{' ' + note if note else ''}")
        self.stream.write(("\r" + line + "\x1b[K") if self.tty else line + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
