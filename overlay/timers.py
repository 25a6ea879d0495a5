"""A timer: something :meth:`PeerMachine.tick` does once its time has come.

The machine lists its pending timers in one place; ``deadline()`` is the earliest
:func:`due` time of that list and ``tick(now)`` runs those that :func:`fired`, so the
two cannot disagree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ibe_pubsub.overlay.actions import Action

#: ``(since, after, strict, run, args)``: fires once ``after`` seconds have passed since
#: ``since`` (strictly more when ``strict``: a link silent for exactly its timeout still
#: counts as alive); an absolute time ``t`` is ``(t, 0.0, False, ...)``. Then
#: ``run(*args, now)`` does what fell due. A plain tuple, because every tick lists every
#: timer of its peer twice (to run them, then for the next deadline).
Timer = tuple[float, float, bool, Callable[..., list[Action]], tuple[Any, ...]]


def due(timer: Timer) -> float:
    """The earliest time ``timer`` can fire."""
    return timer[0] + timer[1]


def fired(timer: Timer, now: float) -> bool:
    """Has ``timer`` fired by ``now``?"""
    since, after, strict = timer[:3]
    passed = now - since
    return passed > after if strict else passed >= after
