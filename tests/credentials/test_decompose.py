"""Numeric and string credentials: brute-force checks of the decomposition on small domains."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ibe_pubsub.credentials import numeric, strings
from ibe_pubsub.credentials.credential import Credential
from ibe_pubsub.credentials.decomposition import (
    covering_credential,
    decompose,
    enclosing_path,
    event_paths,
    fine_credentials,
    fine_split,
)
from ibe_pubsub.credentials.predicates import parse_predicate
from ibe_pubsub.credentials.schema import Attribute, Schema, default_schema

SETTINGS = settings(derandomize=True, deadline=None, max_examples=150)


# --------------------------------------------------------------------------- helpers


def cells_of(path: str, bits: int) -> set[int]:
    s, e = numeric.path_cells(path, bits)
    return set(range(s, e + 1))


def in_range(v: Fraction | int | float, lo, hi, lo_open: bool, hi_open: bool) -> bool:
    if lo is not None and (v <= lo if lo_open else v < lo):
        return False
    return not (hi is not None and (v >= hi if hi_open else v > hi))


def float_matching_cells(attr: Attribute, lo, hi, lo_open, hi_open) -> set[int]:
    """Cells whose real interval [b_k, b_k+1) (last one closed) meets the range."""
    dmin, dmax, n = Fraction(attr.min), Fraction(attr.max), attr.cells
    # the range clipped to the domain, as (value, open) pairs
    lower = (dmin, False) if lo is None or lo < dmin else (Fraction(lo), lo_open)
    upper = (dmax, False) if hi is None or hi > dmax else (Fraction(hi), hi_open)
    out = set()
    for k in range(n):
        a = dmin + (dmax - dmin) * k / n
        b = dmin + (dmax - dmin) * (k + 1) / n
        cl = max((a, False), lower, key=lambda t: (t[0], t[1]))
        cu = min((b, k < n - 1), upper, key=lambda t: (t[0], not t[1]))
        if cl[0] < cu[0] or (cl[0] == cu[0] and not cl[1] and not cu[1]):
            out.add(k)
    return out


@st.composite
def int_case(draw):
    bits = draw(st.integers(3, 6))
    dmin = draw(st.integers(-20, 20))
    width = draw(st.integers(1, 200))  # fewer and more values than cells
    attr = Attribute("x", "int", min=dmin, max=dmin + width, bits=bits)
    bound = st.one_of(st.none(), st.integers(dmin - 3, dmin + width + 3),
                      st.floats(dmin - 3, dmin + width + 3).map(lambda f: round(f, 1)))
    return attr, draw(bound), draw(bound), draw(st.booleans()), draw(st.booleans())


@st.composite
def float_case(draw):
    bits = draw(st.integers(3, 6))
    dmin = float(draw(st.integers(-8, 8)))
    width = float(draw(st.sampled_from([1, 2, 3, 5, 1000])))
    attr = Attribute("x", "float", min=dmin, max=dmin + width, bits=bits)
    step = width / 2 ** (bits + 1)  # cell boundaries and cell middles are exact
    grid = st.integers(-4, 2 ** (bits + 1) + 4).map(lambda k: dmin + k * step)
    bound = st.one_of(st.none(), grid, st.floats(dmin - 1, dmin + width + 1))
    return attr, draw(bound), draw(bound), draw(st.booleans()), draw(st.booleans())


def values_of(attr: Attribute, lo, hi) -> list:
    """Every int of the domain; for floats, grid points plus the bounds and their neighbours."""
    if attr.type == "int":
        return list(range(attr.min, attr.max + 1))
    n = attr.cells * 4
    vals = {attr.min + (attr.max - attr.min) * k / n for k in range(n + 1)}
    for b in (lo, hi):
        if b is not None:
            vals |= {b, math.nextafter(b, -math.inf), math.nextafter(b, math.inf)}
    return sorted(v for v in vals if attr.min <= v <= attr.max)


def check_cover(attr: Attribute, lo, hi, lo_open: bool, hi_open: bool) -> None:
    bits = attr.bits
    try:
        cover = numeric.range_cover(attr, lo, hi, lo_open, hi_open)
    except ValueError:
        # empty: no value of the domain may match
        assert not any(in_range(v, lo, hi, lo_open, hi_open) for v in values_of(attr, lo, hi))
        if attr.type == "float":
            assert not float_matching_cells(attr, lo, hi, lo_open, hi_open)
        return
    blocks = [cells_of(p, bits) for p in cover]
    union = set().union(*blocks)
    assert sum(map(len, blocks)) == len(union), "subspaces overlap"
    assert len(set(cover)) == len(cover)
    if attr.type == "float":
        matching = float_matching_cells(attr, lo, hi, lo_open, hi_open)
        assert union == matching
        forbidden = set(range(attr.cells)) - matching
    else:
        reachable = {numeric.value_cell(attr, v) for v in values_of(attr, lo, hi)}
        matching = {numeric.value_cell(attr, v) for v in values_of(attr, lo, hi)
                    if in_range(v, lo, hi, lo_open, hi_open)}
        assert union & reachable == matching
        forbidden = reachable - matching
    # minimal: no two siblings, and no block could grow into its parent
    for p in cover:
        if p:
            sibling = p[:-1] + ("1" if p[-1] == "0" else "0")
            assert sibling not in cover
            assert cells_of(p[:-1], bits) & forbidden, f"{p} could be merged upward"
    # every value in a covered cell has exactly one credential of the cover on its path
    creds = numeric.range_credentials(attr, lo, hi, lo_open, hi_open)
    for v in values_of(attr, lo, hi):
        path = numeric.enclosing_path(attr, v)
        hits = [c for c in path if c in creds]
        cell = numeric.value_cell(attr, v)
        assert len(hits) == (1 if cell in union else 0)
        if in_range(v, lo, hi, lo_open, hi_open):
            assert hits, f"matching value {v} not covered"
        assert covering_credential(creds, path) == (hits[0] if hits else None)
        leaf = path[-1]
        for c in creds:
            assert c.covers(leaf) == (cell in cells_of(c.path, bits))
    # a cap gives a disjoint superset of at most cap credentials
    for cap in (1, 2, 3):
        capped = numeric.range_cover(attr, lo, hi, lo_open, hi_open, max_credentials=cap)
        cblocks = [cells_of(p, bits) for p in capped]
        cunion = set().union(*cblocks)
        assert len(capped) <= min(cap, len(cover))
        assert sum(map(len, cblocks)) == len(cunion)
        assert union <= cunion
        if len(cover) <= cap:
            assert capped == tuple(sorted(cover, key=lambda p: numeric.path_cells(p, bits)))


# --------------------------------------------------------------------------- numeric


@SETTINGS
@given(int_case())
def test_int_cover_brute_force(case) -> None:
    check_cover(*case)


@SETTINGS
@given(float_case())
def test_float_cover_brute_force(case) -> None:
    check_cover(*case)


def test_quantization_examples() -> None:
    a = Attribute("p", "float", min=0.0, max=8.0, bits=3)
    assert [numeric.value_cell(a, v) for v in (0, 0.99, 1.0, 7.5, 8.0)] == [0, 0, 1, 7, 7]
    assert numeric.value_bits(a, 5.5) == "101"
    assert numeric.enclosing_paths(a, 5.5) == ("", "1", "10", "101")
    # strict upper bound on a boundary excludes the cell starting there
    assert numeric.cell_interval(a, 2.0, 4.0, False, True) == (2, 3)
    assert numeric.cell_interval(a, 2.0, 4.0, False, False) == (2, 4)
    # strict lower bound on a boundary keeps the cell above it
    assert numeric.cell_interval(a, 2.0, 4.0, True, False) == (2, 4)
    assert numeric.range_cover(a, 2.0, 4.0, False, True) == ("01",)
    assert numeric.range_cover(a, None, None) == ("",)
    with pytest.raises(ValueError, match="no value"):
        numeric.cell_interval(a, 8.0, None, True, False)
    with pytest.raises(ValueError, match="outside"):
        numeric.value_cell(a, 8.5)


def test_sparse_int_domain_uses_free_cells() -> None:
    # 4 values on 8 cells: 0->0, 1->2, 2->5, 3->7 (max clamps into the last cell)
    a = Attribute("v", "int", min=0, max=3, bits=3)
    assert [numeric.value_cell(a, v) for v in range(4)] == [0, 2, 5, 7]
    assert numeric.range_cover(a, 0, 1) == ("0",)  # the empty cells 1 and 3 come for free
    assert numeric.range_cover(a, 2, 3) == ("1",)
    assert numeric.range_cover(a, 1, 1) == ("01",)


def test_cap_merges_cheapest_first() -> None:
    a = Attribute("p", "float", min=0.0, max=16.0, bits=4)
    cover = numeric.range_cover(a, 1.0, 14.0, False, True)  # cells 1..13
    assert cover == ("0001", "001", "01", "10", "110")
    # cell 0 is the cheapest addition; of the two merges adding only it, take the larger
    assert numeric.range_cover(a, 1.0, 14.0, False, True, max_credentials=4) == (
        "0", "10", "110")
    # then cells 14, 15: merging into "1" or into the root adds the same cells
    assert numeric.range_cover(a, 1.0, 14.0, False, True, max_credentials=2) == ("",)
    b = Attribute("p", "float", min=0.0, max=16.0, bits=4)
    assert numeric.range_cover(b, 2.0, 14.0, False, True) == ("001", "01", "10", "110")
    # "1" adds cells 14, 15; "0" adds 0, 1: tie, leftmost wins
    assert numeric.range_cover(b, 2.0, 14.0, False, True, max_credentials=3) == (
        "0", "10", "110")
    assert numeric.range_cover(b, 3.0, 14.0, False, True, max_credentials=3) == (
        "0011", "01", "1")
    assert numeric.range_cover(a, 1.0, 14.0, False, True, max_credentials=1) == ("",)
    with pytest.raises(ValueError):
        numeric.range_cover(a, 1.0, 2.0, max_credentials=0)


@SETTINGS
@given(bits=st.integers(1, 8), data=st.data())
def test_numeric_fine_split_partitions(bits: int, data) -> None:
    a = Attribute("p", "float", min=0.0, max=1.0, bits=bits)
    path = data.draw(st.text("01", max_size=bits))
    depth = data.draw(st.integers(0, 4))
    cred = Credential("p", "num", path)
    kids = numeric.fine_split(a, cred, depth)
    d = min(depth, bits - len(path))
    assert len(kids) == 2 ** d
    assert all(cred.covers(k) and len(k.path) == len(path) + d for k in kids)
    assert set().union(*(cells_of(k.path, bits) for k in kids)) == cells_of(path, bits)
    assert sum(len(cells_of(k.path, bits)) for k in kids) == len(cells_of(path, bits))


# --------------------------------------------------------------------------- strings

SYM = Attribute("s", "string", max_length=4)
SYM_AB = Attribute("s", "string", max_length=3, alphabet="AB")


def test_string_credentials() -> None:
    assert strings.prefix_credential(SYM, "IB") == Credential("s", "str", "IB")
    assert strings.equality_credential(SYM, "IBM") == Credential("s", "str", "IBM", True)
    # truncation, for credentials only
    assert strings.prefix_credential(SYM, "ABCDEF") == Credential("s", "str", "ABCD")
    assert strings.equality_credential(SYM, "ABCDEF") == Credential("s", "str", "ABCD", True)
    assert strings.enclosing_path(SYM, "IBM") == (
        Credential("s", "str", ""), Credential("s", "str", "I"), Credential("s", "str", "IB"),
        Credential("s", "str", "IBM"), Credential("s", "str", "IBM", True))
    long_path = strings.enclosing_path(SYM, "ABCDEFG")
    assert [c.position for c in long_path] == list(range(6))
    assert long_path[-1] == Credential("s", "str", "ABCD", True)
    assert strings.enclosing_path(SYM, "") == (Credential("s", "str", ""),
                                               Credential("s", "str", "", True))


def test_string_alphabet_folds_other_characters() -> None:
    o = strings.OTHER_CHAR
    assert strings.credential_text(SYM_AB, "AxBBB") == f"A{o}B"
    assert strings.prefix_credential(SYM_AB, "A-") == Credential("s", "str", f"A{o}")


def test_string_fine_split() -> None:
    o = strings.OTHER_CHAR
    root = Credential("s", "str", "")
    assert strings.fine_split(SYM_AB, root) == (
        Credential("s", "str", "", True), Credential("s", "str", "A"),
        Credential("s", "str", "B"), Credential("s", "str", o))
    assert len(strings.fine_split(SYM_AB, root, 2)) == 1 + 3 * 4
    for cred in (Credential("s", "str", "AB", True), Credential("s", "str", "ABA")):
        assert strings.fine_split(SYM_AB, cred, 3) == (cred,)
    assert strings.fine_split(SYM, Credential("s", "str", "IB")) == (Credential("s", "str", "IB"),)


@SETTINGS
@given(prefix=st.text("AB-", max_size=3), value=st.text("AB-x", max_size=6),
       depth=st.integers(0, 3))
def test_string_fine_split_is_a_partition(prefix: str, value: str, depth: int) -> None:
    """A value under the credential lies under exactly one fine credential, and vice versa."""
    cred = strings.prefix_credential(SYM_AB, prefix)
    fine = strings.fine_split(SYM_AB, cred, depth)
    path = strings.enclosing_path(SYM_AB, value)
    under = covering_credential([cred], path) is not None
    assert under == strings.credential_text(SYM_AB, value).startswith(cred.path)
    hits = [c for c in fine if c in path]
    assert len(hits) == (1 if under else 0)
    assert all(cred.covers(c) for c in fine)


@SETTINGS
@given(pattern=st.text("ABC", max_size=6), value=st.text("ABC", max_size=7),
       equality=st.booleans())
def test_string_credentials_never_miss_a_match(pattern: str, value: str, equality: bool) -> None:
    cred = (strings.equality_credential(SYM, pattern) if equality
            else strings.prefix_credential(SYM, pattern))
    matches = value == pattern if equality else value.startswith(pattern)
    path = strings.enclosing_path(SYM, value)
    hit = covering_credential([cred], path)
    if matches:
        assert hit == cred
    if hit is not None and len(value) < SYM.max_length and len(pattern) <= SYM.max_length:
        assert matches  # without truncation the credential is exact


# --------------------------------------------------------------------------- decompose


def test_decompose_per_schema_attribute() -> None:
    s = default_schema()
    d = decompose(s, parse_predicate(s, 'symbol prefix "IB" and price in [10, 20]'))
    assert list(d) == ["symbol", "price", "volume"]
    assert d["symbol"] == (Credential("symbol", "str", "IB"),)
    assert d["volume"] == (Credential("volume", "num", ""),)
    assert len(d["price"]) > 3
    capped = decompose(s, parse_predicate(s, "price in [10, 20]"), max_credentials=3)
    assert len(capped["price"]) <= 3
    assert capped["symbol"] == (Credential("symbol", "str", ""),)
    assert decompose(s, parse_predicate(s, 'symbol = "IBM"'))["symbol"] == (
        Credential("symbol", "str", "IBM", True),)


def test_event_paths_and_matching_keys() -> None:
    s = default_schema()
    pred = parse_predicate(s, 'symbol prefix "IB" and price < 50 and volume >= 100')
    creds = decompose(s, pred)
    hit = {"symbol": "IBM", "price": 12.25, "volume": 5000}
    miss = {"symbol": "IBM", "price": 60.0, "volume": 5000}
    for event, expect in ((hit, True), (miss, False)):
        paths = event_paths(s, event)
        found = {a: covering_credential(creds[a], paths[a]) for a in s.names}
        assert all(found.values()) == expect == pred.matches(event)
    assert enclosing_path(s, "price", 0.0)[-1] == Credential("price", "num", "0" * 16)
    assert len(enclosing_path(s, "volume", 7)) == 21
    assert len(enclosing_path(s, "symbol", "TOOLONGSYMBOL")) == 10


def test_fine_credentials() -> None:
    schema = Schema("t", (Attribute("n", "int", min=0, max=15, bits=4), SYM_AB))
    creds = decompose(schema, parse_predicate(schema, 'n in [4, 11] and s prefix "A"'))
    assert creds["n"] == (Credential("n", "num", "01"), Credential("n", "num", "10"))
    fine = fine_credentials(schema, creds)
    assert fine["n"] == tuple(Credential("n", "num", p) for p in ("010", "011", "100", "101"))
    assert len(fine["s"]) == 4
    flat = fine_credentials(schema, [Credential("n", "num", "0101")], depth=3)
    assert flat == {"n": (Credential("n", "num", "0101"),)}
    assert fine_split(schema, Credential("n", "num", "01"), 2)[0] == Credential("n", "num", "0100")
