"""Reading enrolment requests: one parser for CSV, JSON lines and Parquet, used by both engines.

The Spark job runs ``parse_file`` on each input file's bytes (``binaryFile`` read,
``mapInArrow``) and the single-process driver runs it on the same bytes read from
disk, so both see the same requests, line numbers and per-row problems. A row that
cannot be read (wrong number of fields, a broken quote, bytes that are not UTF-8,
a line that is not a JSON object...) becomes a request rejected with its reason;
only a file that is not the expected kind at all (a CSV header without the columns,
a Parquet file without them, a file that is not Parquet) fails the whole job, and
``request_files`` checks that on the driver before any work starts.

CSV: a header line naming at least identity, role and predicate (any order, more
columns allowed), then one request per line. Fields are separated by commas and may
be quoted with ``"`` (``""`` inside is one quote); a quoted field ends on its line.
An unquoted empty field is missing (null); a quoted empty field is the empty
string. Blank lines are skipped.
"""

from __future__ import annotations

import codecs
import io
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ibe_pubsub.pipelines.layout import LayoutError, data_files, input_format

REQUEST_COLUMNS = ("identity", "role", "predicate")
# A parsed request: where it comes from, its raw text (CSV and JSON lines), and the reason
# it is rejected already (null if it was read fine).
PARSED = pa.schema([
    ("identity", pa.string()),
    ("role", pa.string()),
    ("predicate", pa.string()),
    ("source", pa.string()),
    ("line", pa.int64()),
    ("raw", pa.string()),
    ("reason", pa.string()),
])
BATCH_ROWS = 10_000
MAX_RAW = 1000  # characters of a row kept for the rejection report


@dataclass(frozen=True)
class RequestFiles:
    """The files of one input and their format: "csv", "json" or "parquet"."""

    fmt: str
    files: tuple[Path, ...]


def request_files(path: Path) -> RequestFiles:
    """The input's files, each checked to be of the expected kind (else LayoutError)."""
    fmt = input_format(path)
    files = tuple(data_files(path)) if path.is_dir() else (path,)
    for file in files:
        try:
            with file.open("rb") as handle:
                if fmt == "csv":
                    _csv_header(file.name, _lines(handle))
                elif fmt == "parquet":
                    _check_parquet(file.name, pq.read_schema(handle))
        except (pa.ArrowInvalid, OSError) as exc:
            raise LayoutError(f"cannot read {file}: {exc}") from exc
    return RequestFiles(fmt, files)


def parse_file(fmt: str, name: str, data: bytes) -> Iterator[pa.RecordBatch]:
    """The requests of one file's bytes, as ``PARSED`` batches of at most BATCH_ROWS rows."""
    if fmt == "parquet":
        yield from _parquet_batches(name, data)
        return
    rows = _csv_rows(name, data) if fmt == "csv" else _json_rows(name, data)
    batch: list[dict] = []
    for row in rows:
        batch.append(row)
        if len(batch) == BATCH_ROWS:
            yield pa.RecordBatch.from_pylist(batch, schema=PARSED)
            batch = []
    if batch:
        yield pa.RecordBatch.from_pylist(batch, schema=PARSED)


def parse_files(fmt: str, batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function over a ``binaryFile`` read (columns path, content)."""
    for batch in batches:
        for path, content in zip(batch.column("path").to_pylist(),
                                 batch.column("content").to_pylist(), strict=True):
            yield from parse_file(fmt, path.rsplit("/", 1)[-1], content)


def _lines(data: Iterable[bytes]) -> Iterator[tuple[int, bytes]]:
    """(line number, line without its end) of non-blank lines; a UTF-8 BOM is dropped."""
    for number, line in enumerate(data, start=1):
        if number == 1 and line.startswith(codecs.BOM_UTF8):
            line = line[len(codecs.BOM_UTF8):]
        line = line.rstrip(b"\n").rstrip(b"\r")
        if line.strip():
            yield number, line


def _decode(line: bytes) -> tuple[str, str | None]:
    """The line's text and, if it is not UTF-8, why (the text then shows the bad bytes)."""
    try:
        return line.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        return (line.decode("utf-8", "backslashreplace"),
                f"not UTF-8: byte 0x{line[exc.start]:02x} at column {exc.start + 1}")


def _fields(text: str) -> tuple[list[str | None], str | None]:
    """The fields of one CSV line (an unquoted empty field is None, a quoted one ""), and
    what is wrong with the line, if anything: then the fields are those before the fault."""
    fields: list[str | None] = []
    i, n = 0, len(text)
    while True:
        if text.startswith('"', i):
            parts = []
            i += 1
            while True:
                close = text.find('"', i)
                if close < 0:
                    return fields, f"field {len(fields) + 1}: a quote is not closed on its line"
                parts.append(text[i:close])
                i = close + 1
                if not text.startswith('"', i):
                    break
                parts.append('"')
                i += 1
            if i < n and text[i] != ",":
                return fields, f"field {len(fields) + 1}: text after its closing quote"
            fields.append("".join(parts))
        else:
            comma = text.find(",", i)
            end = n if comma < 0 else comma
            fields.append(text[i:end] or None)
            i = end
        if i >= n:
            return fields, None
        i += 1


def _csv_header(name: str, lines: Iterator[tuple[int, bytes]]) -> tuple[dict[str, int], int]:
    """Positions of identity, role and predicate, and the number of columns, from the header."""
    expected = ",".join(REQUEST_COLUMNS)
    first = next(lines, None)
    if first is None:
        raise LayoutError(f"{name} is empty; a CSV input starts with a header such as "
                          f"{expected}")
    number, line = first
    text, problem = _decode(line)
    fields, fault = _fields(text)
    if problem or fault:
        raise LayoutError(f"{name} line {number}: the header is not CSV ({problem or fault})")
    names = [(field or "").strip() for field in fields]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    missing = [c for c in REQUEST_COLUMNS if c not in names]
    if duplicates or missing:
        found = f"duplicate column(s) {', '.join(duplicates)}" if duplicates else \
            f"no column(s) {', '.join(missing)}"
        raise LayoutError(f"{name} line {number}: the header has {found}; a CSV input starts "
                          f"with a header such as {expected}")
    return {c: names.index(c) for c in REQUEST_COLUMNS}, len(names)


def _row(name: str, number: int, text: str, values: dict[str, str | None],
         reason: str | None) -> dict:
    raw = text if len(text) <= MAX_RAW else text[:MAX_RAW] + "..."
    return {**dict.fromkeys(REQUEST_COLUMNS), **values, "source": name, "line": number,
            "raw": raw, "reason": reason}


def _csv_rows(name: str, data: bytes) -> Iterator[dict]:
    lines = _lines(io.BytesIO(data))
    columns, width = _csv_header(name, lines)
    for number, line in lines:
        text, reason = _decode(line)
        fields, fault = _fields(text)
        reason = reason or fault
        if reason is None and len(fields) != width:
            hint = "; quote a field that contains a comma" if len(fields) > width else ""
            reason = f"{len(fields)} field(s), but the header has {width} column(s){hint}"
        values = {c: fields[i] for c, i in columns.items() if i < len(fields)}
        yield _row(name, number, text, values, reason)


def _json_request(text: str) -> tuple[dict[str, str | None], str | None]:
    """The request columns of one JSON line, and why it is not a request (None if it is)."""
    try:
        request = json.loads(text)
    except ValueError as exc:
        return {}, f"not JSON: {getattr(exc, 'msg', exc)}"
    except RecursionError:
        return {}, "not JSON: nested too deeply"
    if not isinstance(request, dict):
        return {}, "not a JSON object"
    values = {c: request.get(c) for c in REQUEST_COLUMNS}
    wrong = [c for c, v in values.items() if not isinstance(v, str | None)]
    if wrong:
        return ({c: v for c, v in values.items() if c not in wrong},
                f"{wrong[0]} must be a string or null")
    return values, None


def _json_rows(name: str, data: bytes) -> Iterator[dict]:
    for number, line in _lines(io.BytesIO(data)):
        text, reason = _decode(line)
        values, problem = _json_request(text) if reason is None else ({}, reason)
        yield _row(name, number, text, values, problem)


def _check_parquet(name: str, schema: pa.Schema) -> None:
    missing = [c for c in REQUEST_COLUMNS if c not in schema.names]
    if missing:
        raise LayoutError(f"{name} has no column(s) {', '.join(missing)}")
    for column in REQUEST_COLUMNS:
        kind = schema.field(column).type
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)
                or pa.types.is_integer(kind)):
            raise LayoutError(f"{name}: column {column} is {kind}, not text")


def _parquet_batches(name: str, data: bytes) -> Iterator[pa.RecordBatch]:
    """Parquet rows as requests: ``line`` is the row's number in the file, from 1."""
    parquet = pq.ParquetFile(pa.BufferReader(data))
    _check_parquet(name, parquet.schema_arrow)
    first = 1
    for batch in parquet.iter_batches(BATCH_ROWS, columns=list(REQUEST_COLUMNS)):
        n = batch.num_rows
        yield pa.RecordBatch.from_arrays(
            [*(batch.column(c).cast(pa.string()) for c in REQUEST_COLUMNS),
             pa.array([name] * n, pa.string()), pa.array(range(first, first + n), pa.int64()),
             pa.nulls(n, pa.string()), pa.nulls(n, pa.string())], schema=PARSED)
        first += n
