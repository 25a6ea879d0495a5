"""``bulk issue``: send decomposed credentials to the key server in chunks, write bundles.

Resumable and exactly-once: chunk ids are derived from the run id kept in KEYDIR
and the chunk's identities, and the key server answers a repeated chunk id with
its stored result instead of issuing again. A chunk is logged as finished only
after all its bundles are on disk, so a run killed at any point and started
again re-sends at most the chunks it had not logged, and issues nothing twice. A run
belongs to one epoch: resuming it once the key server has moved on is refused, as every
epoch needs a new run (into a new KEYDIR) for the holders' next bundles.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from ibe_pubsub.keyserver import KeyServerClient, KeyServerRequestError
from ibe_pubsub.pipelines.chunks import Chunk, chunked, input_fingerprint, read_items
from ibe_pubsub.pipelines.exceptions import PipelinesError
from ibe_pubsub.pipelines.keydir import ChunkRecord, KeyDir, KeyDirError
from ibe_pubsub.pipelines.layout import Summary
from ibe_pubsub.pipelines.progress import Progress


class IssueError(PipelinesError, RuntimeError):
    """The key server refused a chunk, or answered something that does not fit it."""


@dataclass(frozen=True)
class IssueOptions:
    """What decides the chunks (and so their ids): fixed for a run, checked on resume."""

    max_identities: int = 50
    max_rows: int = 4000
    epoch: str | None = None  # None: the current epoch; "next": the next (in the grace window)


@dataclass
class IssueReport:
    identities: int = 0
    written: int = 0
    resumed: int = 0
    chunks_sent: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)
    epochs: set[int] = field(default_factory=set)
    seconds: float = 0.0


def _already_done(keydir: KeyDir, chunk: Chunk, record: ChunkRecord, chunk_id: str) -> bool:
    """True if an earlier run finished this chunk and its bundles are still there."""
    if record.chunk_id != chunk_id:
        raise KeyDirError(f"chunk {chunk.index} in {keydir.root} has another id; the input "
                          "changed since the run started")
    refused = {e["identity"] for e in record.errors}
    return all(keydir.bundle_path(name).exists() for name in chunk.identities
               if name not in refused)


def _send(client: KeyServerClient, chunk: Chunk, chunk_id: str,
          epoch: str | None) -> dict[str, Any]:
    try:
        answer = client.bulk(chunk_id, list(chunk.items), epoch)
    except KeyServerRequestError as exc:
        raise IssueError(f"chunk {chunk.index} ({chunk_id}): {exc}; chunks before it are "
                         "saved, run the same command again to resume") from exc
    names = [b.get("identity") for b in answer.get("bundles", [])]
    if answer.get("chunk_id") != chunk_id or names != list(chunk.identities):
        raise IssueError(f"the key server's answer to chunk {chunk.index} does not match it")
    return answer


def _issue_chunk(client: KeyServerClient, keydir: KeyDir, chunk: Chunk, chunk_id: str,
                 epoch: str | None) -> ChunkRecord:
    """Send one chunk, write its bundles, then log it as finished."""
    answer = _send(client, chunk, chunk_id, epoch)
    errors = tuple({**b, "chunk": chunk.index} for b in answer["bundles"] if "error" in b)
    for bundle in answer["bundles"]:
        if "error" not in bundle:
            keydir.write_bundle(bundle)
    record = ChunkRecord(chunk.index, chunk_id, int(answer["epoch"]), errors)
    keydir.record(record)
    return record


def issue_bulk(client: KeyServerClient, directory: Path, output: Path,
               options: IssueOptions, stream: TextIO | None = None) -> IssueReport:
    """Issue every identity of the decomposition in ``directory`` into ``output``."""
    started = time.perf_counter()
    summary = Summary.read(directory)
    try:
        params = client.params()
    except KeyServerRequestError as exc:
        raise IssueError(str(exc)) from exc
    server_schema = params["schema_id"]
    if server_schema != summary.schema_id:
        raise IssueError(f"{directory} was decomposed with schema {summary.schema_id[:16]}…, "
                         f"the key server uses {server_schema[:16]}…")
    keydir = KeyDir.open(output, {
        "input": input_fingerprint(directory), "schema_id": summary.schema_id,
        "max_identities": options.max_identities, "max_rows": options.max_rows,
        "epoch": options.epoch})
    finished = keydir.finished()
    target = int(params["epoch"]) + (1 if options.epoch == "next" else 0)
    stale = sorted({r.epoch for r in finished.values() if r.epoch != target})
    if stale:
        raise IssueError(f"{output} holds bundles of epoch {stale[0]}, but the key server "
                         f"now issues epoch {target}: issue into a new output directory")
    report = IssueReport()
    progress = Progress(summary.accepted, "identities", stream)
    try:
        for chunk in chunked(read_items(directory), options.max_identities, options.max_rows):
            chunk_id = chunk.chunk_id(keydir.run)
            record = finished.get(chunk.index)
            report.identities += len(chunk.items)
            if record is not None and _already_done(keydir, chunk, record, chunk_id):
                report.resumed += len(chunk.items)
            else:
                record = _issue_chunk(client, keydir, chunk, chunk_id, options.epoch)
                report.written += len(chunk.items) - len(record.errors)
                report.chunks_sent += 1
            report.errors.extend(record.errors)
            report.epochs.add(record.epoch)
            progress.advance(len(chunk.items), f"chunk {chunk.index}")
    finally:
        progress.close()
    keydir.write_errors(report.errors)
    report.seconds = time.perf_counter() - started
    return report
