"""The event ids a publisher sent recently, per key server and publisher, to warn on re-use.

A subscriber delivers each event id once: a later event of an id it delivered is
dropped as a duplicate. So publishing an id again delivers nothing to the subscribers
that saw it, silently. ``publish`` records the ids it sends in a small JSON file
``{"<server URL> <publisher>": {"at": unix time, "ids": [...]}}`` and warns when a
run sends some it sent before. Each entry keeps the last :data:`MAX_IDS` ids (as many
as a subscriber remembers), and the file the :data:`MAX_ENTRIES` latest entries.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ibe_pubsub.overlay import OverlayConfig
from ibe_pubsub.peer.exceptions import PeerError
from ibe_pubsub.peer.known_servers import normalise_url

MAX_IDS = OverlayConfig().dedup_capacity
MAX_ENTRIES = 64


class PublishedIdsError(PeerError):
    """The record cannot be read or written (publishing goes on without it)."""


def default_published_ids_path() -> Path:
    """``$XDG_STATE_HOME/ibe-pubsub/published_ids.json`` (``~/.local/state`` without it)."""
    state_home = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state_home) / "ibe-pubsub" / "published_ids.json"


def token_publisher(token: str) -> str:
    """Names the identity behind a bearer token without storing the token."""
    return "token-sha256:" + hashlib.sha256(token.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class PublishedIds:
    """The record file; safe for concurrent publishers (a lock file)."""

    path: Path

    def repeated(self, server: str, publisher: str, ids: Sequence[str]) -> list[str]:
        """Those of ``ids`` that ``publisher`` sent to ``server`` before, in their order."""
        with self._locked():
            entry = self._read().get(_key(server, publisher))
        earlier = set(entry["ids"]) if entry else set()
        return [i for i in ids if i in earlier]

    def record(self, server: str, publisher: str, ids: Sequence[str]) -> None:
        """Remember ``ids`` as sent by ``publisher`` to ``server`` just now."""
        if not ids:
            return
        key = _key(server, publisher)
        with self._locked():
            entries = self._read()
            now_sent = set(ids)
            kept = [i for i in entries.get(key, {"ids": []})["ids"] if i not in now_sent]
            entries[key] = {"at": time.time(), "ids": (kept + list(ids))[-MAX_IDS:]}
            latest = sorted(entries.items(), key=lambda kv: kv[1]["at"])[-MAX_ENTRIES:]
            self._write(dict(latest))

    @contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            with open(self.path.with_name(self.path.name + ".lock"), "a") as handle:
                fcntl.flock(handle, fcntl.LOCK_EX)
                yield
        except OSError as exc:
            raise PublishedIdsError(f"cannot use {self.path}: {exc.strerror or exc}") from exc

    def _read(self) -> dict[str, Any]:
        try:
            entries = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except ValueError as exc:
            raise PublishedIdsError(f"{self.path} is not valid JSON: {exc}") from exc
        if not isinstance(entries, dict) or not all(
                isinstance(e, dict) and isinstance(e.get("at"), int | float)
                and isinstance(e.get("ids"), list) for e in entries.values()):
            raise PublishedIdsError(f"{self.path} is not a record of published ids")
        return entries

    def _write(self, entries: dict[str, Any]) -> None:
        tmp = self.path.with_name(f"{self.path.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(entries, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, self.path)


def _key(server: str, publisher: str) -> str:
    return f"{normalise_url(server)} {publisher}"
