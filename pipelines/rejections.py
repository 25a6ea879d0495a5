"""The rejected requests of a decomposition, for people: in input order, as CSV and as the
first few lines shown after a run. ``DIR/rejected`` (Parquet) stays the complete record."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ibe_pubsub.credentials import escape
from ibe_pubsub.pipelines.inputs import REQUEST_COLUMNS
from ibe_pubsub.pipelines.layout import REJECTED

CSV_COLUMNS = ("file", "line", "identity", "reason", "row")


def read_rejected(out: Path, columns: tuple[str, ...]) -> pa.Table:
    """``columns`` of the rejections under ``out``, sorted by file and line."""
    table = pq.read_table(out / REJECTED, columns=list(dict.fromkeys((*columns, "source",
                                                                       "line"))))
    return table.sort_by([("source", "ascending"), ("line", "ascending")])


def _as_csv(values: list[str | None]) -> str:
    text = io.StringIO()
    csv.writer(text, lineterminator="").writerow(values)
    return text.getvalue()


def write_csv(out: Path, path: Path) -> int:
    """Write every rejection to ``path`` as CSV (CSV_COLUMNS); returns how many.

    ``row`` is the line as read (CSV, JSON lines) or the request's columns as CSV (Parquet)."""
    table = read_rejected(out, ("identity", "role", "predicate", "reason", "raw"))
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(CSV_COLUMNS)
        for row in table.to_pylist():
            raw = row["raw"] if row["raw"] is not None else \
                _as_csv([row[c] for c in REQUEST_COLUMNS])
            writer.writerow([row["source"], row["line"], row["identity"], row["reason"], raw])
    return table.num_rows


def first(out: Path, count: int) -> list[str]:
    """One line for each of the first ``count`` rejections: where, who, why (control
    characters of the input escaped, as they go to a terminal)."""
    table = read_rejected(out, ("identity", "reason")).slice(0, count)
    return [escape(f"{r['source']} line {r['line']}"
                   f"{' (' + r['identity'] + ')' if r['identity'] else ''}: {r['reason']}")
            for r in table.to_pylist()]
