"""Decomposed credential rows -> bulk items (one per identity) -> deterministic chunks.

Reads ``DIR/credentials`` file by file in name order, streaming, so the same
directory always yields the same chunks: that is what lets a resumed
``bulk issue`` re-send exactly the chunk ids it sent before.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from ibe_pubsub.pipelines.batches import CREDENTIAL_COLUMNS
from ibe_pubsub.pipelines.layout import CREDENTIALS, SUMMARY, LayoutError, data_files
from ibe_pubsub.pipelines.requests import IDENTITY_PATTERN, ROLES

READ_BATCH_ROWS = 65_536


@dataclass(frozen=True)
class Chunk:
    """Consecutive items sent in one bulk request; ``index`` counts from 0."""

    index: int
    items: tuple[dict[str, Any], ...]

    @property
    def identities(self) -> tuple[str, ...]:
        return tuple(item["identity"] for item in self.items)

    def chunk_id(self, run: str) -> str:
        """Unique to this run's chunk, identical whenever the same run re-sends it."""
        digest = hashlib.sha256(f"{run}\n{self.index}\n".encode())
        digest.update("\n".join(self.identities).encode())
        return f"bulk-{self.index}-{digest.hexdigest()[:32]}"


def input_fingerprint(directory: Path) -> str:
    """SHA-256 over the summary and every credentials file (names and bytes)."""
    digest = hashlib.sha256()
    for path in [directory / SUMMARY, *data_files(directory / CREDENTIALS)]:
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as handle:
            while block := handle.read(1 << 20):
                digest.update(block)
    return digest.hexdigest()


def _check_head(identity: Any, role: Any, seen: set[str]) -> None:
    if not isinstance(identity, str) or not IDENTITY_PATTERN.fullmatch(identity):
        raise LayoutError(f"invalid identity {identity!r} in the credentials")
    if role not in ROLES:
        raise LayoutError(f"identity {identity!r} has the invalid role {role!r}")
    if identity in seen:
        raise LayoutError(f"the rows of identity {identity!r} are not contiguous; the input "
                          "was not written by `bulk decompose`")


def read_items(directory: Path) -> Iterator[dict[str, Any]]:
    """One bulk item per identity, in file order; each identity's rows must be contiguous."""
    seen: set[str] = set()
    item: dict[str, Any] | None = None
    try:
        files = data_files(directory / CREDENTIALS)
    except FileNotFoundError as exc:
        raise LayoutError(f"{directory} has no {CREDENTIALS} directory") from exc
    for path in files:
        for batch in pq.ParquetFile(path).iter_batches(READ_BATCH_ROWS,
                                                       columns=list(CREDENTIAL_COLUMNS)):
            columns = [batch.column(name).to_pylist() for name in CREDENTIAL_COLUMNS]
            for identity, role, attribute, credential, fine, position in zip(*columns,
                                                                              strict=True):
                if item is None or identity != item["identity"]:
                    if item is not None:
                        yield item
                    _check_head(identity, role, seen)
                    seen.add(identity)
                    item = {"identity": identity, "role": role, "credentials": []}
                elif role != item["role"]:
                    raise LayoutError(f"identity {identity!r} has rows with two roles")
                item["credentials"].append({"attribute": attribute, "credential": credential,
                                            "fine": bool(fine), "position": int(position)})
    if item is not None:
        yield item


def chunked(items: Iterable[dict[str, Any]], max_identities: int,
            max_rows: int) -> Iterator[Chunk]:
    """Chunks of at most ``max_identities`` items and ``max_rows`` credentials (at least 1)."""
    current: list[dict[str, Any]] = []
    rows = 0
    index = 0
    for item in items:
        n = len(item["credentials"])
        if current and (len(current) == max_identities or rows + n > max_rows):
            yield Chunk(index, tuple(current))
            index += 1
            current, rows = [], 0
        current.append(item)
        rows += n
    if current:
        yield Chunk(index, tuple(current))
