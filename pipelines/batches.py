"""Arrow record batches of requests -> batches of credential and rejection rows.

Both drivers call them through ``parts``, which writes the outputs: the Spark job in
its Python workers, on each partition's batches, the single-process driver on batches
it reads itself. A decomposed batch
has one schema for both outcomes: a rejected request is one row whose ``reason``
is set; an accepted request is its credential rows, contiguous, ``reason`` null.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ibe_pubsub.credentials import Attribute, Credential, Schema, strings
from ibe_pubsub.pipelines import numeric_batch
from ibe_pubsub.pipelines.inputs import REQUEST_COLUMNS
from ibe_pubsub.pipelines.predicate_columns import EQUALS, Cells, Column, parse_column
from ibe_pubsub.pipelines.requests import (
    IDENTITY_PATTERN,
    MAX_ROWS_PER_IDENTITY,
    ROLES,
    Rejected,
    Settings,
    check_request,
    check_row_count,
    predicate_credentials,
)

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

    Row for row what ``requests.decompose_request`` gives each request, rejections and
    their reasons included, computed column-wise: each distinct predicate is decomposed
    once (``segments``), and the requests' rows are taken from those. A request whose
    ``reason`` is already set (it could not be read) stays rejected."""
    identity, role, predicate = (batch.column(c) for c in REQUEST_COLUMNS)
    reasons: list[str | None] = batch.column("reason").to_pylist()
    passes = _passes_checks(batch)
    for i in np.flatnonzero(~passes).tolist():
        if reasons[i] is None:
            reasons[i] = _rejection(check_request, identity[i].as_py(), role[i].as_py(),
                                    predicate[i].as_py(), batch.column(COPIES)[i].as_py())
    encoded = pc.dictionary_encode(pc.if_else(pa.array(passes), predicate, None))
    table = segments(settings, encoded.dictionary)
    owner = encoded.indices.fill_null(0).to_numpy().astype(np.int64)
    subscriber = pc.equal(role, "subscriber").fill_null(False).to_numpy(zero_copy_only=False)
    counts = np.zeros(len(owner), np.int64)
    read = np.flatnonzero(passes)
    counts[read] = table.coarse[owner[read]] + np.where(subscriber[read],
                                                        table.fine[owner[read]], 0)
    for i in read.tolist():
        problem = table.reasons[owner[i]]
        if problem is None and counts[i] > MAX_ROWS_PER_IDENTITY:
            problem = _rejection(check_row_count, int(counts[i]))
        if problem is not None:
            passes[i], reasons[i] = False, problem
    return _assemble(batch, table, owner, np.where(passes, counts, 0), reasons)


def _passes_checks(batch: pa.RecordBatch) -> np.ndarray:
    """Where ``requests.check_request`` accepts the request and it was read fine."""
    checks = [pc.match_substring_regex(batch.column("identity"),
                                       f"^{IDENTITY_PATTERN.pattern}$"),
              pc.is_in(batch.column("role"), pa.array(ROLES)),
              pc.less_equal(batch.column(COPIES), 1),
              pc.is_valid(batch.column("predicate")),
              pc.is_null(batch.column("reason"))]
    passes = checks[0]
    for check in checks[1:]:
        passes = pc.and_kleene(passes, check)
    return pc.fill_null(passes, False).to_numpy(zero_copy_only=False).copy()


def _rejection(check: Callable[..., object], *args: object) -> str:
    """The reason a reference check gives (it must reject)."""
    try:
        check(*args)
    except Rejected as exc:
        return str(exc)
    raise AssertionError(f"{check.__name__} accepts {args!r}")


@dataclass
class Segments:
    """The credential rows of each distinct predicate: predicate u's rows are
    ``start[u]`` .. ``start[u] + coarse[u] + fine[u] - 1`` of the columns, coarse ones
    first; ``reasons[u]`` is set instead if it is rejected."""

    attribute: pa.Array
    credential: pa.Array
    fine_flag: pa.Array
    position: pa.Array
    start: np.ndarray
    coarse: np.ndarray
    fine: np.ndarray
    reasons: list[str | None]


@dataclass
class _Parts:
    """Credential rows in the making, in any order: owner (predicate), section (0 coarse,
    1 fine) and attribute index say where each goes; rows of one place keep their order."""

    owner: list[np.ndarray] = field(default_factory=list)
    section: list[np.ndarray] = field(default_factory=list)
    attribute: list[np.ndarray] = field(default_factory=list)
    label: list[pa.Array] = field(default_factory=list)
    position: list[np.ndarray] = field(default_factory=list)

    def add(self, owner: np.ndarray, section: int, attribute: int | np.ndarray,
            label: pa.Array, position: np.ndarray) -> None:
        self.owner.append(owner)
        self.section.append(np.full(len(owner), section, np.int64))
        self.attribute.append(np.broadcast_to(np.asarray(attribute, np.int64), len(owner)))
        self.label.append(label)
        self.position.append(position)

    def add_credentials(self, schema_index: dict[str, int], owner: int, section: int,
                        credentials: list[Credential]) -> None:
        self.add(np.full(len(credentials), owner, np.int64), section,
                 np.array([schema_index[c.attribute] for c in credentials], np.int64),
                 pa.array([c.label() for c in credentials], pa.string()),
                 np.array([c.position for c in credentials], np.int64))


def segments(settings: Settings, predicates: pa.Array) -> Segments:
    """Decompose each of ``predicates`` (distinct texts): the common form column-wise
    (``predicate_columns``, ``numeric_batch``), any other through the reference."""
    schema, depth = settings.schema, settings.fine_depth
    count = len(predicates)
    column = parse_column(schema, predicates)
    settled = column.settled
    covers = {a.name: _covers(a, column.cells[a.name], settled)
              for a in schema.attributes if a.is_numeric}
    if settings.max_credentials is not None:  # over the cap: the reference coarsens
        for owner, _, _ in covers.values():
            settled[np.bincount(owner, minlength=count) > settings.max_credentials] = False
    parts = _Parts()
    schema_index = {name: j for j, name in enumerate(schema.names)}
    for j, attr in enumerate(schema.attributes):
        if attr.is_numeric:
            owner, starts, levels = covers[attr.name]
            keep = settled[owner]
            owner, starts, levels = owner[keep], starts[keep], levels[keep]
            parts.add(owner, 0, j, *_block_labels(attr, starts, levels))
            if depth > 0:
                parent, starts, levels = numeric_batch.fine_blocks(starts, levels, depth)
                parts.add(owner[parent], 1, j, *_block_labels(attr, starts, levels))
        else:
            _string_parts(parts, attr, j, column, settled, depth)
    reasons: list[str | None] = [None] * count
    texts = predicates.to_pylist()
    for u in np.flatnonzero(~settled).tolist():
        if texts[u] is None:
            continue
        try:
            coarse, fine = predicate_credentials(settings, texts[u])
        except Rejected as exc:
            reasons[u] = str(exc)
            continue
        parts.add_credentials(schema_index, u, 0, coarse)
        parts.add_credentials(schema_index, u, 1, fine)
    return _ordered(parts, schema, count, reasons)


def _covers(attr: Attribute, cells: Cells, settled: np.ndarray
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(owner, start, level) of the cover of each settled predicate's range on ``attr``."""
    rows = np.flatnonzero(settled)
    owner, starts, levels = numeric_batch.dyadic_covers(
        cells.first[rows], cells.last[rows], cells.free_first[rows], cells.free_last[rows],
        attr.bits)  # type: ignore[arg-type]
    return rows[owner], starts, levels


def _string_parts(parts: _Parts, attr: Attribute, j: int, column: Column, settled: np.ndarray,
                  depth: int) -> None:
    """The credential (and fine split) of each settled predicate's constraint on ``attr``."""
    owners = np.flatnonzero(settled)
    kinds = column.kinds[attr.name][owners]
    texts = pa.array(column.texts[attr.name], pa.string()).take(owners)
    texts = pc.if_else(pa.array(kinds == 0), "", texts)
    if attr.alphabet is None:  # credentials truncate, and ``strings.fine_split`` keeps them
        text = pc.utf8_slice_codeunits(texts, 0, attr.max_length)
        terminal = kinds == EQUALS
        label = pc.binary_join_element_wise(
            f'{attr.name}:"', text, pa.array(np.where(terminal, '"$', '"')), "")
        position = pc.utf8_length(text).to_numpy().astype(np.int64) + terminal
        parts.add(owners, 0, j, label, position)
        if depth:
            parts.add(owners, 1, j, label, position)
        return
    splits: dict[tuple[int, str], tuple[Credential, tuple[Credential, ...]]] = {}
    coarse: list[Credential] = []
    fine: list[Credential] = []
    fine_owner: list[int] = []
    for u, kind, text in zip(owners.tolist(), kinds.tolist(), texts.to_pylist(), strict=True):
        if (kind, text) not in splits:
            cred = strings.equality_credential(attr, text) if kind == EQUALS else \
                strings.prefix_credential(attr, text)
            splits[kind, text] = (cred, strings.fine_split(attr, cred, depth) if depth else ())
        cred, children = splits[kind, text]
        coarse.append(cred)
        fine += children
        fine_owner += [u] * len(children)
    parts.add(owners, 0, j, pa.array([c.label() for c in coarse], pa.string()),
              np.array([c.position for c in coarse], np.int64))
    parts.add(np.array(fine_owner, np.int64), 1, j,
              pa.array([c.label() for c in fine], pa.string()),
              np.array([c.position for c in fine], np.int64))


def _block_labels(attr: Attribute, starts: np.ndarray,
                  levels: np.ndarray) -> tuple[pa.Array, np.ndarray]:
    """Labels (``Credential.label``: ``price:0110``, ``price:*``) and positions of blocks,
    written straight into an Arrow string array's buffers: a block's path is the first
    ``bits - level`` bits of its first cell's ``bits``-bit number."""
    head = np.frombuffer(f"{attr.name}:".encode(), np.uint8)
    lengths = attr.bits - levels  # type: ignore[operator]
    aligned = (starts << (32 - attr.bits)).astype(">u4")  # type: ignore[operator]
    rows = np.empty((len(starts), len(head) + 32), np.uint8)
    rows[:, :len(head)] = head
    rows[:, len(head):] = np.unpackbits(aligned.view(np.uint8).reshape(-1, 4), axis=1)
    rows[:, len(head):] += ord("0")
    rows[lengths == 0, len(head)] = ord("*")
    sizes = len(head) + np.maximum(lengths, 1)
    offsets = np.zeros(len(starts) + 1, np.int32)
    np.cumsum(sizes, out=offsets[1:])
    data = rows[np.arange(rows.shape[1]) < sizes[:, None]]
    return (pa.StringArray.from_buffers(len(starts), pa.py_buffer(offsets), pa.py_buffer(data)),
            lengths)


def _ordered(parts: _Parts, schema: Schema, count: int, reasons: list[str | None]) -> Segments:
    """Segments from parts: by predicate, coarse then fine, each in schema order."""
    owner = np.concatenate(parts.owner)
    section = np.concatenate(parts.section)
    attribute = np.concatenate(parts.attribute)
    order = np.argsort((owner * 2 + section) * len(schema.names) + attribute, kind="stable")
    coarse = np.bincount(owner[section == 0], minlength=count)
    fine = np.bincount(owner[section == 1], minlength=count)
    start = np.cumsum(coarse + fine) - coarse - fine
    labels = pa.concat_arrays(parts.label).take(order)
    return Segments(pa.array(schema.names).take(attribute[order]), labels,
                    pa.array(section[order] == 1), pa.array(np.concatenate(parts.position)[
                        order].astype(np.int32)), start, coarse, fine, reasons)


def _assemble(batch: pa.RecordBatch, table: Segments, owner: np.ndarray, counts: np.ndarray,
              reasons: list[str | None]) -> pa.RecordBatch:
    """The output batch: each request's rows in input order, one row per rejection."""
    rejected = np.array([r is not None for r in reasons], bool)
    sizes = np.where(rejected, 1, counts)
    request = np.repeat(np.arange(len(sizes)), sizes)
    first = np.cumsum(sizes) - sizes
    start = np.zeros(len(sizes), np.int64)
    start[~rejected] = table.start[owner[~rejected]]
    segment = start[request] + np.arange(len(request)) - first[request]
    is_rejection = rejected[request]
    credential_index = pa.array(segment, mask=is_rejection)
    request_index = pa.array(request)
    rejection_index = pa.array(request, mask=~is_rejection)
    columns = {
        "identity": batch.column("identity").take(request_index),
        "role": batch.column("role").take(request_index),
        "attribute": table.attribute.take(credential_index),
        "credential": table.credential.take(credential_index),
        "fine": table.fine_flag.take(credential_index),
        "position": table.position.take(credential_index),
        "reason": pa.array(reasons, pa.string()).take(rejection_index),
    }
    for name in ("predicate", "source", "line", "raw"):
        columns[name] = batch.column(name).take(rejection_index)
    return pa.RecordBatch.from_arrays([columns[name] for name in DECOMPOSED.names],
                                      schema=DECOMPOSED)


def split(batch: pa.RecordBatch) -> tuple[pa.Table, pa.Table]:
    """(credential rows, rejected rows) of a decomposed batch, in output column order."""
    table = pa.Table.from_batches([batch])
    if batch.column("reason").null_count == batch.num_rows:  # nothing rejected: no copies
        return (table.select(list(CREDENTIAL_COLUMNS)),
                table.slice(0, 0).select(list(REJECTED_COLUMNS)))
    accepted = pc.is_null(table.column("reason"))
    return (table.filter(accepted).select(list(CREDENTIAL_COLUMNS)),
            table.filter(pc.invert(accepted)).select(list(REJECTED_COLUMNS)))
