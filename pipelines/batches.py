"""Arrow record batches of requests -> batches of credential and rejection rows.

The Spark job hands these functions to ``DataFrame.mapInArrow`` and the
single-process driver calls them on batches it reads itself. A decomposed batch
has one schema for both outcomes: a rejected request is one row whose ``reason``
is set; an accepted request is its credential rows, contiguous, ``reason`` null.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from pipelines.inputs import REQUEST_COLUMNS
from pipelines.requests import Rejected, Settings, decompose_request

COPIES = "copies"  # how many requests of the whole input name the row's identity
CREDENTIAL_COLUMNS = ("identity", "role", "attribute", "credential", "fine", "position")
REJECTED_COLUMNS = ("identity", "role", "predicate", "reason", "source", "line", "raw")

DECOMPOSED = pa.schema([
    ("identity", pa.string()),
    ("role", pa.string()),
    ("attribute", pa.string()),
    ("credential", pa.string()),
    ("fine", pa.bool_()),
    ("position", pa.int32()),
    ("predicate", pa.string()),
    ("reason", pa.string()),
    ("source", pa.string()),
    ("line", pa.int64()),
    ("raw", pa.string()),
])


def decompose_batch(settings: Settings, batch: pa.RecordBatch) -> pa.RecordBatch:
    """Decompose every request of ``batch`` (``inputs.PARSED`` columns and copies).

    A request whose ``reason`` is already set (it could not be read) stays rejected."""
    columns: dict[str, list] = {name: [] for name in DECOMPOSED.names}
    names = (*REQUEST_COLUMNS, COPIES, "source", "line", "raw", "reason")
    rows = zip(*(batch.column(name).to_pylist() for name in names), strict=True)
    for identity, role, predicate, copies, source, line, raw, problem in rows:
        try:
            if problem is not None:
                raise Rejected(problem)
            creds = decompose_request(settings, identity, role, predicate, copies)
        except Rejected as exc:
            rejection = dict.fromkeys(DECOMPOSED.names) | {
                "identity": identity, "role": role, "predicate": predicate, "reason": str(exc),
                "source": source, "line": line, "raw": raw}
            for name, value in rejection.items():
                columns[name].append(value)
            continue
        n = len(creds)
        columns["identity"] += [identity] * n
        columns["role"] += [role] * n
        columns["attribute"] += [c.attribute for c in creds]
        columns["credential"] += [c.credential for c in creds]
        columns["fine"] += [c.fine for c in creds]
        columns["position"] += [c.position for c in creds]
        for name in ("predicate", "reason", "source", "line", "raw"):
            columns[name] += [None] * n
    return pa.RecordBatch.from_pydict(columns, schema=DECOMPOSED)


def decompose_batches(settings: Settings,
                      batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function: one output batch per input batch."""
    for batch in batches:
        yield decompose_batch(settings, batch)


def split(batch: pa.RecordBatch) -> tuple[pa.Table, pa.Table]:
    """(credential rows, rejected rows) of a decomposed batch, in output column order."""
    table = pa.Table.from_batches([batch])
    accepted = pc.is_null(table.column("reason"))
    return (table.filter(accepted).select(list(CREDENTIAL_COLUMNS)),
            table.filter(pc.invert(accepted)).select(list(REJECTED_COLUMNS)))
