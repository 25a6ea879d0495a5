"""Epochs: numbered, fixed-length periods; keys name their epoch.

The schedule is a list of segments, each starting at an epoch boundary with its own
length and grace window, so the length can change without renumbering past epochs:
a change takes effect at the next boundary. The schedule is stored in the
database (setting ``epoch_schedule``) so restarts keep the numbering.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ibe_pubsub.keyserver.exceptions import ServerSettingsError

FIRST_EPOCH = 1
RESCHEDULE_LEAD = 5.0
"""Seconds between a schedule change and the boundary it takes effect at, at least: every
replica re-reads the stored schedule well within that (``keyserver.schedule``)."""


@dataclass(frozen=True)
class Segment:
    first_epoch: int
    start: float
    length: int
    grace: int


@dataclass(frozen=True)
class Epoch:
    """One epoch: keys issued for it are valid from ``start`` to ``end`` (+ ``grace``)."""

    number: int
    start: float
    end: float
    length: int
    grace: int

    def in_grace(self, now: float) -> bool:
        """True once next-epoch keys may be fetched (the last ``grace`` seconds)."""
        return now >= self.end - self.grace


#: ``keyserver init``'s epoch length, and a threshold set-up's.
DEFAULT_EPOCH_SECONDS = 3600


def default_grace(length: int) -> int:
    """Five minutes, but at most a quarter of the epoch."""
    return min(300, length // 4)


def max_grace(length: int) -> int:
    """Half the epoch: next-epoch keys fetched in the grace window let a revoked identity
    keep receiving until that epoch ends, so the window must stay a part of the epoch."""
    return length // 2


def check_lengths(length: int, grace: int) -> None:
    if length < 1:
        raise ServerSettingsError(f"epoch length must be at least 1 second, got {length}")
    if not 0 <= grace <= max_grace(length):
        raise ServerSettingsError(f"the grace window must be between 0 and half the epoch length "
                                  f"({max_grace(length)} s for {length} s epochs), got {grace} s")


@dataclass(frozen=True)
class EpochClock:
    segments: tuple[Segment, ...]

    @classmethod
    def start(cls, now: float, length: int, grace: int) -> EpochClock:
        check_lengths(length, grace)
        return cls((Segment(FIRST_EPOCH, now, length, grace),))

    def _segment_for_time(self, now: float) -> Segment:
        chosen = self.segments[0]
        for seg in self.segments:
            if seg.start <= now:
                chosen = seg
        return chosen

    def _segment_for_epoch(self, number: int) -> Segment:
        chosen = self.segments[0]
        for seg in self.segments:
            if seg.first_epoch <= number:
                chosen = seg
        return chosen

    def epoch(self, number: int) -> Epoch:
        seg = self._segment_for_epoch(number)
        start = seg.start + (number - seg.first_epoch) * seg.length
        return Epoch(number, start, start + seg.length, seg.length, seg.grace)

    def current(self, now: float) -> Epoch:
        seg = self._segment_for_time(now)
        offset = max(0, math.floor((now - seg.start) / seg.length))
        return self.epoch(seg.first_epoch + offset)

    @property
    def initial(self) -> tuple[int, int]:
        """The length and grace ``keyserver init`` set (a threshold member's, for good)."""
        return self.segments[0].length, self.segments[0].grace

    def aligned(self, now: float) -> EpochClock:
        """The first segment's length and grace (``keyserver init``'s), with epoch ``k``
        running from ``k * length`` (Unix time): members of a threshold deployment, each
        with its own database and started whenever, number epochs alike if they were
        initialised with the same length; a number never comes back."""
        seg = self.segments[0]
        number = math.floor(now / seg.length)
        return EpochClock((Segment(number, number * seg.length, seg.length, seg.grace),))

    def rescheduled(self, now: float, length: int, grace: int, lead: float = 0.0
                    ) -> EpochClock:
        """The same past, with ``length``/``grace`` from the first epoch boundary at least
        ``lead`` seconds after ``now`` on."""
        check_lengths(length, grace)
        last = self.segments[-1]
        if (last.length, last.grace) == (length, grace):
            return self
        nxt = self.epoch(self.current(now + lead).number + 1)
        kept = tuple(s for s in self.segments if s.first_epoch < nxt.number)
        return EpochClock((*kept, Segment(nxt.number, nxt.start, length, grace)))

    def to_json(self) -> list[dict[str, Any]]:
        return [vars(s).copy() for s in self.segments]

    @classmethod
    def from_json(cls, data: list[dict[str, Any]]) -> EpochClock:
        return cls(tuple(Segment(int(d["first_epoch"]), float(d["start"]), int(d["length"]),
                                 int(d["grace"])) for d in data))
