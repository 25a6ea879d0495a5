"""The output directory of ``bulk issue``: key bundles, and the state that makes it resumable.

``KEYDIR/<identity>.json`` holds one identity's bundle (secret keys: mode 0600,
written to a temporary file and renamed, so a bundle is either whole or absent).
``KEYDIR/.bulk-issue/manifest.json`` fixes the run: a random run id that seeds
the chunk ids plus the parameters that decide the chunks; a second run in the
same directory must agree with it. ``chunks.jsonl`` gets one line, flushed to
disk, per chunk whose bundles are all written, with the identities the key
server refused.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ibe_pubsub.pipelines.exceptions import PipelinesError

STATE_DIR = ".bulk-issue"
MANIFEST = "manifest.json"
CHUNK_LOG = "chunks.jsonl"
ERRORS = "errors.jsonl"


class KeyDirError(PipelinesError, ValueError):
    """KEYDIR belongs to a different run, or its state files are damaged."""


@dataclass(frozen=True)
class ChunkRecord:
    """A finished chunk: its id and the items the key server answered with an error."""

    index: int
    chunk_id: str
    epoch: int
    errors: tuple[dict[str, Any], ...]


def _write_private(path: Path, data: bytes) -> None:
    """Whole-or-nothing write of a file only the owner can read."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class KeyDir:
    """Bundles and run state under one directory."""

    def __init__(self, root: Path, run: str) -> None:
        self.root = root
        self.run = run

    @classmethod
    def open(cls, root: Path, parameters: dict[str, Any]) -> KeyDir:
        """Start a run in ``root``, or resume the one there if ``parameters`` are the same."""
        state = root / STATE_DIR
        manifest = state / MANIFEST
        if manifest.exists():
            try:
                stored = json.loads(manifest.read_text())
                run = stored.pop("run")
            except (ValueError, KeyError) as exc:
                raise KeyDirError(f"{manifest} is damaged") from exc
            changed = sorted(k for k in parameters.keys() | stored.keys()
                             if parameters.get(k) != stored.get(k))
            if changed:
                raise KeyDirError(f"{root} holds a run with different {', '.join(changed)}; "
                                  "resume with the same input and options, or use another "
                                  "output directory")
            return cls(root, run)
        state.mkdir(parents=True, exist_ok=True, mode=0o700)
        root.chmod(0o700)
        run = secrets.token_hex(16)
        _write_private(manifest, json.dumps({"run": run, **parameters}, indent=2).encode())
        return cls(root, run)

    def bundle_path(self, identity: str) -> Path:
        return self.root / f"{identity}.json"

    def write_bundle(self, bundle: dict[str, Any]) -> None:
        _write_private(self.bundle_path(bundle["identity"]),
                       json.dumps(bundle, indent=1).encode())

    def finished(self) -> dict[int, ChunkRecord]:
        """Records of finished chunks; drops a last line torn by a kill while appending."""
        path = self.root / STATE_DIR / CHUNK_LOG
        if not path.exists():
            return {}
        data = path.read_bytes()
        complete = data[:data.rfind(b"\n") + 1]
        if len(complete) != len(data):
            with path.open("r+b") as handle:
                handle.truncate(len(complete))
        records = {}
        for number, line in enumerate(complete.decode().splitlines(), 1):
            try:
                raw = json.loads(line)
                record = ChunkRecord(raw["index"], raw["chunk_id"], raw["epoch"],
                                     tuple(raw["errors"]))
            except (ValueError, KeyError, TypeError) as exc:
                raise KeyDirError(f"{path} line {number} is damaged") from exc
            records[record.index] = record
        return records

    def record(self, record: ChunkRecord) -> None:
        """Append a finished chunk to the log, durably (after its bundles are written)."""
        line = json.dumps({"index": record.index, "chunk_id": record.chunk_id,
                           "epoch": record.epoch, "errors": list(record.errors)})
        fd = os.open(self.root / STATE_DIR / CHUNK_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                     0o600)
        with os.fdopen(fd, "a") as handle:
            handle.write(line + "\n")
            handle.flush()
            os.fsync(handle.fileno())

    def write_errors(self, errors: list[dict[str, Any]]) -> Path:
        """All refused identities of the run, one JSON object per line."""
        path = self.root / ERRORS
        _write_private(path, "".join(json.dumps(e) + "\n" for e in errors).encode())
        return path
