"""One part of the output: a run of request batches decomposed into one Parquet file in each
of ``DIR/credentials`` and ``DIR/rejected``, and the counts the summary adds up.

The single-process driver writes all its requests as part 0; each Spark task writes its
partition as the part of that number, in the Python worker that decomposes it, and hands
back only the counts. A part is written under a hidden temporary name (readers skip
names starting with ".") and renamed into place once complete, so a retried or
speculative attempt of a task replaces that task's files whole, and a killed one leaves
no half-written part.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ibe_pubsub.pipelines.batches import (
    CREDENTIAL_COLUMNS,
    DECOMPOSED,
    REJECTED_COLUMNS,
    decompose_batch,
    split,
)
from ibe_pubsub.pipelines.layout import CREDENTIALS, REJECTED, Summary
from ibe_pubsub.pipelines.requests import Settings

OUTPUTS = {name: pa.schema([DECOMPOSED.field(c) for c in columns])
           for name, columns in ((CREDENTIALS, CREDENTIAL_COLUMNS), (REJECTED, REJECTED_COLUMNS))}


@dataclass
class Counts:
    """What a part holds: requests read, of them rejected, and accepted credential rows
    (``fine``: the fine ones among them). No other request names an accepted request's
    identity (every copy of a duplicate is rejected), so accepted identities are
    requests - rejected in each part, and the parts' counts add up however the requests
    were split into parts."""

    requests: int = 0
    rejected: int = 0
    rows: int = 0
    fine: int = 0

    def __add__(self, other: Counts) -> Counts:
        return Counts(*(a + b for a, b in zip(asdict(self).values(), asdict(other).values(),
                                              strict=True)))

    def batch(self) -> pa.RecordBatch:
        return pa.RecordBatch.from_pylist([asdict(self)], schema=COUNTS)

    def summary(self, engine: str, settings: Settings, seconds: float) -> Summary:
        return Summary(engine, settings.schema.id, self.requests, self.requests - self.rejected,
                       self.rejected, self.rows, self.fine, seconds)


COUNTS = pa.schema([(f.name, pa.int64()) for f in fields(Counts)])


def part_name(index: int) -> str:
    """``part-00007.parquet``: parts sort by number, as ``bulk issue`` reads them."""
    return f"part-{index:05d}.parquet"


def write_part(settings: Settings, batches: Iterable[pa.RecordBatch], out: Path, index: int,
               advance: Callable[[int], None] | None = None) -> Counts:
    """Decompose ``batches`` (``inputs.PARSED`` columns and copies) into part ``index`` of
    both outputs under ``out``, creating their directories if need be; ``advance`` is told
    each batch's request count once it is written."""
    counts = Counts()
    final = {name: out / name / part_name(index) for name in OUTPUTS}
    temporary = {name: path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
                 for name, path in final.items()}
    try:
        with ExitStack() as stack:
            writers = {}
            for name, schema in OUTPUTS.items():
                (out / name).mkdir(exist_ok=True)
                writers[name] = stack.enter_context(pq.ParquetWriter(temporary[name], schema))
            for batch in batches:
                accepted, rejected = split(decompose_batch(settings, batch))
                writers[CREDENTIALS].write_table(accepted)
                writers[REJECTED].write_table(rejected)
                counts += Counts(batch.num_rows, rejected.num_rows, accepted.num_rows,
                                 pc.sum(accepted.column("fine")).as_py() or 0)
                if advance:
                    advance(batch.num_rows)
        for name, path in final.items():
            os.replace(temporary[name], path)
    finally:
        for path in temporary.values():
            path.unlink(missing_ok=True)
    return counts
