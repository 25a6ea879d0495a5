"""Saying what a long wait is for, so a command never sits silent for more than a few seconds.

A :class:`WaitAnnouncer` is told what is awaited; once the wait has lasted
``first`` seconds it says so, and again every ``every`` seconds, on stderr by default.
Polling loops call :meth:`WaitAnnouncer.tick` on each round; a single awaitable is
waited for with :meth:`WaitAnnouncer.wait`. A blocking call awaited with
:func:`in_daemon_thread` can be given up on when a signal ends the wait. It imports nothing
of the project, so any package can use it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from ibe_pubsub.credentials import notice

T = TypeVar("T")


async def in_daemon_thread(call: Callable[[], T]) -> T:
    """``call()`` in a thread of its own, like ``asyncio.to_thread`` except that the thread
    is a daemon: a wait cancelled by a signal abandons a call blocked on the network (which
    cannot be interrupted) instead of keeping the process alive until it times out."""
    outcome: concurrent.futures.Future[T] = concurrent.futures.Future()

    def run() -> None:
        if not outcome.set_running_or_notify_cancel():
            return
        with contextlib.suppress(concurrent.futures.InvalidStateError):  # abandoned
            try:
                outcome.set_result(call())
            except BaseException as exc:  # handed to the awaiting task
                outcome.set_exception(exc)

    threading.Thread(target=run, name="blocking-call", daemon=True).start()
    return await asyncio.wrap_future(outcome)


@dataclass
class WaitAnnouncer:
    """``what`` completes "waiting for ..." and may change as the wait goes on (e.g. which
    trees are still missing); ``limit`` is the time the wait gives up after, if any."""

    what: str
    limit: float | None = None
    first: float = 2.0
    every: float = 10.0
    clock: Callable[[], float] = time.monotonic
    say: Callable[[str], None] = notice
    started: float = field(init=False)
    _due: float = field(init=False)

    def __post_init__(self) -> None:
        self.started = self.clock()
        self._due = self.started + self.first

    @property
    def expired(self) -> bool:
        """Whether the wait has lasted beyond ``limit``."""
        return self.limit is not None and self.clock() - self.started > self.limit

    def tick(self) -> None:
        """Say what is awaited if it is time to (call it on every round of a polling loop)."""
        now = self.clock()
        if now < self._due:
            return
        waited = now - self.started
        until = "" if self.limit is None else f", giving up after {self.limit:g} s"
        self.say(f"waiting for {self.what} ({waited:.0f} s so far{until})")
        self._due = now + self.every

    async def wait(self, awaitable: Awaitable[T]) -> T:
        """``await awaitable``, announcing it while it lasts."""
        task = asyncio.ensure_future(awaitable)
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=max(0.0, self._due - self.clock()))
                if not task.done():
                    self.tick()
            return task.result()
        finally:
            task.cancel()
