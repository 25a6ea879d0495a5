"""What a physical peer counts: events, drops by reason, repairs."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass
class Stats:
    """Per physical peer counters (events counted once per distinct ciphertext)."""

    received: int = 0
    delivered: int = 0
    false_positives: int = 0
    duplicates: int = 0
    forwarded: int = 0
    dropped: int = 0
    #: ``dropped`` by reason: ``not_from_parent``, ``undecodable``, ``unverified``,
    #: ``digest_from_non_backup``, ``digest_malformed``, ``digest_too_soon``,
    #: ``pull_from_non_watcher``.
    dropped_by: Counter[str] = field(default_factory=Counter)
    #: Events that decrypted and matched but failed the publisher's signature.
    forged: int = 0
    #: Parents taken for failed after falling silent (a link that broke under a peer).
    parents_lost: int = 0
    #: Events dropped (among the duplicates) because one of the same id was delivered before:
    #: a publisher that re-used ids.
    repeated_ids: int = 0
    #: Event ids pulled from backups, and pulled ids a backup refused (not offered, served
    #: already, or forgotten).
    pulled: int = 0
    pulls_refused: int = 0
    #: Events listed in digests, and digest entries tested against this peer's own tokens.
    listed: int = 0
    entries_tested: int = 0
    #: Parents replaced for missing events they owed, and backups dropped for listing
    #: none of them (see :mod:`overlay.demotion`).
    demoted: int = 0
    backups_demoted: int = 0

    def counts(self) -> dict[str, Any]:
        """Every counter as plain values, ready for JSON. (``dataclasses.asdict`` rebuilds a
        Counter from its items, so it would count ``(reason, n)`` tuples instead.)"""
        return {f.name: getattr(self, f.name) for f in fields(self)} | {
            "dropped_by": dict(self.dropped_by)}

    def drop(self, reason: str) -> None:
        """Count one refused event message (or digest, or pull) under ``reason``."""
        self.dropped += 1
        self.dropped_by[reason] += 1
