"""The epoch schedule as the database holds it, shared by every replica of a key server.

Epoch numbers and bounds are a function of the stored schedule and the time alone, so
replicas on synchronised clocks agree on them. The schedule changes only when a replica
starts with ``--epoch-seconds``/``--grace-seconds``, so each process re-reads it in the
background every ``REFRESH_SECONDS``; a change takes effect at an epoch boundary at least
``epochs.RESCHEDULE_LEAD`` seconds away, by when every replica has read it.
"""

from __future__ import annotations

import logging
import threading

from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import sessionmaker

from ibe_pubsub.keyserver.epochs import EpochClock
from ibe_pubsub.keyserver.repository import EPOCH_SETTING, get_setting

log = logging.getLogger(__name__)

REFRESH_SECONDS = 1.0


class SharedClock:
    """The latest schedule read from the database; ``current`` never waits for it."""

    def __init__(self, sessions: sessionmaker, clock: EpochClock,
                 refresh: float = REFRESH_SECONDS) -> None:
        self._sessions, self._refresh, self.current = sessions, refresh, clock
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="epoch-schedule", daemon=True)
        self._thread.start()

    def read(self) -> EpochClock:
        """Read the stored schedule now (and keep it)."""
        with self._sessions() as session:
            stored = get_setting(session, EPOCH_SETTING)
        if stored is not None:
            self.current = EpochClock.from_json(stored)
        return self.current

    def _run(self) -> None:
        while not self._stop.wait(self._refresh):
            try:
                self.read()
            except SQLAlchemyError as exc:  # keep the last schedule; the next read may work
                log.warning("could not re-read the epoch schedule: %s", exc)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
