"""Log lines a stranger can cause, rate-limited so that they cannot fill the disk.

Every garbage request to ``--http`` would make uvicorn log a warning, and a process out of
file descriptors makes asyncio log an error with a traceback at each accept it retries:
both at the pace of the network. :class:`RateLimit` lets through one record per message
(its template, so ``bad request from %s`` is one message whatever the address) per
interval and says, in the next one it lets through, how many it held back.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from typing import Any

#: Seconds between two records of the same message.
INTERVAL = 10.0
#: Messages remembered at most (templates are few; a flood of distinct ones resets it).
MAX_KEYS = 256
#: What asyncio reports each time ``accept`` fails for want of file descriptors.
ACCEPT_ERROR = "socket.accept() out of system resource"


class RateLimit(logging.Filter):
    """A filter passing one record per message template every ``interval`` seconds."""

    def __init__(self, interval: float = INTERVAL) -> None:
        super().__init__()
        self.interval = interval
        self._last: dict[str, float] = {}
        self._held: Counter[str] = Counter()

    def allow(self, key: str) -> int | None:
        """None to drop a message under ``key``; else how many were dropped before it."""
        now = time.monotonic()
        if now - self._last.get(key, -math.inf) < self.interval:
            self._held[key] += 1
            return None
        if len(self._last) >= MAX_KEYS:
            self._last.clear()
            self._held.clear()
        self._last[key] = now
        return self._held.pop(key, 0)

    def filter(self, record: logging.LogRecord) -> bool:
        held = self.allow(f"{record.name}:{record.msg}")
        if held is None:
            return False
        if held:
            record.msg = f"{record.msg} ({held} more like it not logged)"
        return True


def limit_accept_errors(loop: asyncio.AbstractEventLoop, limit: RateLimit) -> None:
    """Have ``loop`` report failed accepts once per interval; other errors as before."""

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        message = str(context.get("message", ""))
        if message.startswith(ACCEPT_ERROR):
            held = limit.allow(ACCEPT_ERROR)
            if held is None:
                return
            if held:
                context = context | {"message": f"{message} ({held} more not logged)"}
        loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
