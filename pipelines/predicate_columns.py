"""Reading a column of predicates at once: the common written form, column-wise.

Bulk requests are nearly always written the way ``Predicate.__str__`` writes them:
clauses such as ``price in [10, 20.5]``, ``volume >= 1000`` or ``symbol prefix "IB"``
joined by `` and ``, one clause per attribute. This module reads that form for a whole
column with Arrow's regex kernels and numpy, and turns each numeric constraint into its
cell intervals as ``predicates.canonical_range`` and ``numeric.cell_interval`` /
``numeric.free_interval`` would. It settles only what it can settle exactly; every
other text (other spacing, exponents, escapes in strings, repeated attributes, empty
ranges, type mismatches, syntax errors...) is marked unsettled and goes to the
reference parser, which also words every error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ibe_pubsub.credentials import Attribute, Schema
from ibe_pubsub.pipelines import numeric_batch

_NUMBER = r"-?[0-9]{1,15}(?:\.[0-9]{1,15})?"  # int64 and float64 hold these exactly
_STRING = r'"([^"\\]*)"'  # no escapes: the text between the quotes is the value
_OPS = ("<", "<=", ">", ">=", "=")
EQUALS, PREFIX = 1, 2  # string constraint kinds (0: none)


def _clause_pattern(schema: Schema) -> str:
    names = "|".join(re.escape(n) for n in sorted(schema.names, key=len, reverse=True))
    return (rf"^(?P<name>{names})(?: (?P<op><=|>=|<|>|=) (?:(?P<num>{_NUMBER})|"
            rf"{_STRING.replace('(', '(?P<text>', 1)})| in \[(?P<lo>{_NUMBER}), "
            rf"(?P<hi>{_NUMBER})\]| prefix {_STRING.replace('(', '(?P<prefix>', 1)})$")


@dataclass
class Bounds:
    """One numeric attribute's clause per predicate, before clipping (``has_*``: bounded)."""

    lo: np.ndarray
    hi: np.ndarray
    lo_open: np.ndarray
    hi_open: np.ndarray
    has_lo: np.ndarray
    has_hi: np.ndarray


@dataclass
class Cells:
    """Cell intervals of one numeric attribute per predicate (``numeric.range_cover``'s
    [first, last] and free interval); ``ok`` is false where this module cannot settle it."""

    ok: np.ndarray
    first: np.ndarray
    last: np.ndarray
    free_first: np.ndarray
    free_last: np.ndarray


@dataclass
class Column:
    """A parsed column: ``settled`` per text; per numeric attribute its cells, per string
    attribute the constraint's kind (0 none, EQUALS, PREFIX) and text."""

    settled: np.ndarray
    cells: dict[str, Cells]
    kinds: dict[str, np.ndarray]
    texts: dict[str, list[str | None]]


def parse_column(schema: Schema, predicates: pa.Array) -> Column:
    """Read every non-null predicate of ``predicates`` (strings) that has the common form."""
    n = len(predicates)
    settled = pc.fill_null(pc.not_equal(predicates, ""), False).to_numpy(zero_copy_only=False)
    if not all(numeric_batch.supported(a) for a in schema.attributes if a.is_numeric):
        settled[:] = False
    lists = pc.split_pattern(predicates, " and ")
    parents = pc.list_parent_indices(lists).to_numpy()
    fields = pc.extract_regex(lists.flatten(), _clause_pattern(schema))
    matched = fields.is_valid().to_numpy(zero_copy_only=False)
    column = {name: fields.field(name) for name in ("name", "op", "num", "text", "lo", "hi",
                                                    "prefix")}
    attr_index = pc.index_in(column["name"], pa.array(schema.names)).fill_null(-1).to_numpy()
    op = pc.index_in(column["op"], pa.array(("in", *_OPS))).fill_null(0).to_numpy()
    numeric_literal = pc.not_equal(column["num"], "").fill_null(False).to_numpy(
        zero_copy_only=False)
    is_prefix = (op == 0) & pc.equal(column["lo"], "").fill_null(True).to_numpy(
        zero_copy_only=False)
    ok = matched.copy()
    out = Column(settled, {}, {}, {})
    for j, attr in enumerate(schema.attributes):
        mine = matched & (attr_index == j)
        if attr.is_numeric:
            ok[mine & (is_prefix | ((op > 0) & ~numeric_literal))] = False
        else:
            ok[mine & ~(is_prefix | ((op == 5) & ~numeric_literal))] = False
    # every clause must be readable, and name an attribute at most once
    np.logical_and.at(settled, parents, ok)
    keys = parents * len(schema.attributes) + attr_index
    unique_keys, counts = np.unique(keys[matched], return_counts=True)
    settled[unique_keys[counts > 1] // len(schema.attributes)] = False
    for j, attr in enumerate(schema.attributes):
        rows = np.flatnonzero(ok & (attr_index == j))
        owners = parents[rows]
        if attr.is_numeric:
            bounds = _bounds(attr, n, owners, op[rows], column, rows, settled)
            out.cells[attr.name] = _cells(attr, bounds)
            settled &= out.cells[attr.name].ok
        else:
            kinds = np.zeros(n, dtype=np.int8)
            texts: list[str | None] = [None] * n
            prefix = is_prefix[rows]
            kinds[owners] = np.where(prefix, PREFIX, EQUALS)
            values = pc.if_else(pa.array(prefix), pc.take(column["prefix"], rows),
                                pc.take(column["text"], rows)).to_pylist()
            for owner, value in zip(owners.tolist(), values, strict=True):
                texts[owner] = value
            out.kinds[attr.name], out.texts[attr.name] = kinds, texts
    return out


def _bounds(attr: Attribute, n: int, owners: np.ndarray, ops: np.ndarray,
            column: dict[str, pa.Array], rows: np.ndarray, settled: np.ndarray) -> Bounds:
    """The raw range of each predicate's clause on ``attr`` (``predicates._raw_range``)."""
    is_int = attr.type == "int"
    dtype = np.int64 if is_int else np.float64
    bounds = Bounds(np.zeros(n, dtype), np.zeros(n, dtype), np.zeros(n, bool),
                    np.zeros(n, bool), np.zeros(n, bool), np.zeros(n, bool))
    if not len(rows):
        return bounds
    inside = ops == 0
    lo_text = pc.if_else(pa.array(inside), pc.take(column["lo"], rows),
                         pc.take(column["num"], rows))
    hi_text = pc.if_else(pa.array(inside), pc.take(column["hi"], rows),
                         pc.take(column["num"], rows))
    if is_int:  # a decimal bound on an int attribute is rounded by the reference
        decimal = (pc.match_substring(lo_text, ".").to_numpy(zero_copy_only=False)
                   | pc.match_substring(hi_text, ".").to_numpy(zero_copy_only=False))
        settled[owners[decimal]] = False
        lo_text = pc.if_else(pa.array(decimal), "0", lo_text)
        hi_text = pc.if_else(pa.array(decimal), "0", hi_text)
        lo_values = pc.cast(lo_text, pa.int64()).to_numpy()
        hi_values = pc.cast(hi_text, pa.int64()).to_numpy()
    else:  # Python's float(), as the reference, rounds every text the same way
        lo_values = np.array(list(map(float, lo_text.to_pylist())), np.float64)
        hi_values = np.array(list(map(float, hi_text.to_pylist())), np.float64)
    op = np.array(("in", *_OPS))[ops]
    bounds.lo[owners], bounds.hi[owners] = lo_values, hi_values
    bounds.has_lo[owners] = np.isin(op, ("in", "=", ">", ">="))
    bounds.has_hi[owners] = np.isin(op, ("in", "=", "<", "<="))
    bounds.lo_open[owners] = op == ">"
    bounds.hi_open[owners] = op == "<"
    return bounds


def _cells(attr: Attribute, b: Bounds) -> Cells:
    """``canonical_range`` then ``cell_interval`` / ``free_interval``; not ok where the range
    selects nothing (the reference words that error)."""
    dmin, dmax = attr.min, attr.max
    empty = (b.has_lo & ((b.lo > dmax) | ((b.lo == dmax) & b.lo_open))) | \
        (b.has_hi & ((b.hi < dmin) | ((b.hi == dmin) & b.hi_open)))  # type: ignore[operator]
    lo_none = ~b.has_lo | (b.lo < dmin) | ((b.lo == dmin) & ~b.lo_open)  # type: ignore[operator]
    hi_none = ~b.has_hi | (b.hi > dmax) | ((b.hi == dmax) & ~b.hi_open)  # type: ignore[operator]
    lo_open, hi_open = b.lo_open & ~lo_none, b.hi_open & ~hi_none
    if attr.type == "int":
        lo = np.where(lo_none, dmin, np.where(empty, dmin, b.lo) + lo_open)  # type: ignore[call-overload]
        hi = np.where(hi_none, dmax, np.where(empty, dmax, b.hi) - hi_open)  # type: ignore[call-overload]
        lo, hi = np.maximum(lo, dmin), np.minimum(hi, dmax)  # type: ignore[call-overload]
        ok = ~empty & (lo <= hi)
        lo, hi = np.where(ok, lo, dmin), np.where(ok, hi, dmin)  # type: ignore[call-overload]
        return Cells(ok, *numeric_batch.int_free_intervals(attr, lo, hi))
    lo = np.where(lo_none, dmin, b.lo)  # type: ignore[call-overload]
    hi = np.where(hi_none, dmax, b.hi)  # type: ignore[call-overload]
    ok = ~empty & ((lo < hi) | ((lo == hi) & ~lo_open & ~hi_open))
    lo, hi = np.where(ok, lo, dmin), np.where(ok, hi, dmax)  # type: ignore[call-overload]
    first, last = numeric_batch.float_cell_intervals(attr, lo, hi, hi_open & ok)
    ok &= first <= last
    return Cells(ok, first, last, first, last)
