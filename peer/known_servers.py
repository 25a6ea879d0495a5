"""Trust on first use of the key server's Ed25519 signing key (like SSH's known hosts).

Everything a peer accepts (the schema, connection requests, root certificates) is
checked against that key, so a peer that believed whichever key a server presents
would follow an impostor at the same URL. Without a pinned key (``--server-key``) the
first key seen for a URL is recorded in a JSON file ``{url: base64 key}``; later, a
different key for the URL is refused until its entry is removed.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ibe_pubsub.credentials import fingerprint
from ibe_pubsub.keyserver import BundleError
from ibe_pubsub.peer.exceptions import PeerError


def default_known_servers_path() -> Path:
    """``$XDG_CONFIG_HOME/ibe-pubsub/known_servers.json`` (``~/.config`` without it)."""
    config_home = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config_home) / "ibe-pubsub" / "known_servers.json"


def normalise_url(url: str) -> str:
    """One entry per server, however the URL is spelled (case of scheme/host, trailing /)."""
    scheme, sep, rest = url.strip().partition("://")
    host, slash, path = rest.partition("/")
    return f"{scheme.lower()}{sep}{host.lower()}{slash}{path}".rstrip("/")


class ServerKeyChanged(PeerError, BundleError):
    """The key server presents another key than the one recorded for its URL (a BundleError,
    so every caller that refuses a bad answer of the key server refuses this too)."""


@dataclass(frozen=True)
class KnownServers:
    """The file of trusted key-server keys; safe for concurrent peers (a lock file)."""

    path: Path

    def check(self, url: str, key: bytes) -> bool:
        """True if ``key`` was recorded just now (first use); raises ServerKeyChanged if the
        URL is known with another key; False if it is the recorded key."""
        name = normalise_url(url)
        try:
            with self._locked():
                entries = self._read()
                recorded = entries.get(name)
                if recorded is None:
                    entries[name] = base64.b64encode(key).decode()
                    self._write(entries)
                    return True
        except OSError as exc:
            raise BundleError(f"cannot use the known key servers in {self.path}: {exc}"
                              ) from exc
        try:
            known = base64.b64decode(recorded, validate=True)
        except ValueError as exc:
            raise BundleError(f"{self.path}: the entry of {name} is not base64") from exc
        if known != key:
            raise ServerKeyChanged(
                f"the key server at {name} presents signing key {fingerprint(key)}, but "
                f"{self.path} records {fingerprint(known)} for it; if the server's key was "
                "replaced on purpose, delete its entry from that file or pin the new key with "
                "--server-key, otherwise this may be an impostor")
        return False

    @contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        lock = self.path.with_name(self.path.name + ".lock")
        with open(lock, "a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield

    def _read(self) -> dict[str, str]:
        try:
            entries = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except ValueError as exc:
            raise BundleError(f"cannot read the known key servers in {self.path}: {exc}"
                              ) from exc
        if not isinstance(entries, dict) or not all(
                isinstance(v, str) for v in entries.values()):
            raise BundleError(f"{self.path} is not a JSON object of URL -> base64 key")
        return entries

    def _write(self, entries: dict[str, str]) -> None:
        tmp = self.path.with_name(f"{self.path.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(entries, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, self.path)
