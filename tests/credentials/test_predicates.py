"""The predicate language: parsing, canonical form, exact matching, errors, containment."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ibe_pubsub.credentials.predicates import (
    NumericRange,
    Predicate,
    PredicateError,
    StringConstraint,
    check_within,
    parse_predicate,
    quote,
)
from ibe_pubsub.credentials.schema import Attribute, Schema, default_schema

SETTINGS = settings(derandomize=True, deadline=None, max_examples=200)

STOCKS = default_schema()
SMALL = Schema("small", (
    Attribute("n", "int", min=0, max=40, bits=5),
    Attribute("f", "float", min=-5.0, max=5.0, bits=5),
    Attribute("s", "string", max_length=3),
))


def P(text: str, schema: Schema = STOCKS) -> Predicate:
    return parse_predicate(schema, text)


# --------------------------------------------------------------------------- examples


@pytest.mark.parametrize(("text", "constraints"), [
    ("price in [10, 20]", {"price": NumericRange(10.0, 20.0)}),
    ("price < 5", {"price": NumericRange(None, 5.0, hi_open=True)}),
    ("price <= 5", {"price": NumericRange(None, 5.0)}),
    ("price > 5", {"price": NumericRange(5.0, None, lo_open=True)}),
    ("price >= 5", {"price": NumericRange(5.0, None)}),
    ("price = 12.5", {"price": NumericRange(12.5, 12.5)}),
    ("price > 0", {"price": NumericRange(0.0, None, lo_open=True)}),
    ("price >= 0", {}),
    ("price < 2000 and volume >= -3", {}),
    ("price in [-10, 1e2]", {"price": NumericRange(None, 100.0)}),
    ("volume > 10.5 and volume < 20", {"volume": NumericRange(11, 19)}),
    ("volume <= 999999.5", {"volume": NumericRange(None, 999999)}),
    ("volume >= 1e3", {"volume": NumericRange(1000, None)}),
    ('symbol = "IBM"', {"symbol": StringConstraint(equals="IBM")}),
    ('symbol prefix "IB"', {"symbol": StringConstraint(prefix="IB")}),
    ('symbol prefix ""', {}),
    ('symbol prefix "I" and symbol prefix "IBM"', {"symbol": StringConstraint(prefix="IBM")}),
    ('symbol prefix "I" and symbol = "IBM"', {"symbol": StringConstraint(equals="IBM")}),
    ('symbol = "a\\"b\\\\c\\n\\u0041"', {"symbol": StringConstraint(equals='a"b\\c\nA')}),
    ("price > 10 and price <= 20 and price >= 10 and price < 30",
     {"price": NumericRange(10.0, 20.0, lo_open=True)}),
    ("", {}),
    ("   ", {}),
])
def test_parse_examples(text: str, constraints: dict) -> None:
    p = P(text)
    assert dict(p.constraints) == constraints
    assert P(str(p)) == p


def test_constraints_are_in_schema_order_and_canonical_text() -> None:
    p = P('volume >= 100 and price in [1, 2] and symbol prefix "A"')
    assert p.attributes == ("symbol", "price", "volume")
    assert str(p) == 'symbol prefix "A" and price in [1.0, 2.0] and volume >= 100'
    assert str(P("price > 1 and price < 2")) == "price > 1.0 and price < 2.0"
    assert str(P("price in [3, 3]")) == "price = 3.0"
    assert str(P("price>=1 and price<=2")) == str(P(" price  in [ 1 ,2 ] "))
    assert p.get("volume") == NumericRange(100, None)
    assert p.get("nothing") is None


def test_matches_uses_full_values() -> None:
    p = P('symbol = "ABCDEFGHIJ" and price < 10')
    assert p.matches({"symbol": "ABCDEFGHIJ", "price": 9.99, "volume": 1})
    assert not p.matches({"symbol": "ABCDEFGHIX", "price": 9.99, "volume": 1})
    assert not p.matches({"symbol": "ABCDEFGHIJ", "price": 10.0, "volume": 1})
    assert not p.matches({"symbol": "ABCDEFGHIJ"})
    assert P("").matches({})
    assert P('symbol prefix "AB"').matches({"symbol": "ABX"})
    assert not P('symbol prefix "AB"').matches({"symbol": 12})


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(("text", "position", "message"), [
    ("price > 2000", 0, "selects no value of 'price'"),
    ("price < 0", 0, "selects no value"),
    ("price in [20, 10]", 0, "selects no value"),
    ("volume > 3 and volume < 4", 15, "contradicts the earlier clauses on 'volume'"),
    ('price prefix "1"', 6, "type mismatch: 'prefix' needs a string attribute"),
    ("symbol < 3", 7, "type mismatch: 'symbol' is a string attribute"),
    ("symbol = 3", 9, "expected a quoted string"),
    ('price = "3"', 8, "expected a number"),
    ("bid = 3", 0, "unknown attribute 'bid'"),
    ('symbol = "A" and symbol = "B"', 17, "contradicts"),
    ('symbol = "AB" and symbol prefix "B"', 18, "contradicts"),
    ('symbol prefix "A" and symbol prefix "B"', 22, "contradicts"),
    ("price", 5, "expected an operator"),
    ("price in [1 2]", 12, "expected ','"),
    ("price in [1, 2", 14, "expected ']'"),
    ("price < 5 and", 13, "expected an attribute name, found end of input"),
    ("price < 5 or price > 6", 10, "expected 'and' or end of input, found 'or'"),
    ("and price < 5", 0, "expected an attribute name"),
    ("price == 5", 7, "expected a number or a quoted string"),
    ("price < 5x", 8, "malformed number"),
    ("price < 1.", 10, "expected digits after the decimal point"),
    ("price < 1e", 10, "expected digits in the exponent"),
    ("price < -x", 9, "expected digits"),
    ('symbol = "abc', 9, "unterminated string"),
    ('symbol = "a\\qb"', 11, "unknown escape \\q"),
    ('symbol = "a\\u12"', 11, "four hex digits"),
    ("price ! 5", 6, "unexpected character '!'"),
])
def test_errors_carry_position(text: str, position: int, message: str) -> None:
    with pytest.raises(PredicateError) as info:
        P(text)
    err = info.value
    assert err.position == position
    assert message in err.message
    lines = str(err).splitlines()
    assert f"at position {position}" in lines[0]
    assert lines[2].index("^") == lines[1].index(text[:1] or " ") + position


# --------------------------------------------------------------------------- random predicates

N_LIT = st.one_of(st.integers(-5, 45), st.integers(-50, 90).map(lambda k: k / 2))
F_LIT = st.one_of(st.integers(-12, 12).map(lambda k: k / 2),
                  st.floats(-6, 6).map(lambda x: round(x, 3)), st.sampled_from([1e-3, -2.5e0]))
S_LIT = st.text(st.sampled_from('AB"\\\n\t\x01é'), max_size=4)


def _num_text(x: float) -> str:
    return str(x) if isinstance(x, int) else repr(x)


@st.composite
def clause(draw):
    """(text, attribute, python test) for one random, type-correct clause."""
    name = draw(st.sampled_from(["n", "f", "s"]))
    if name == "s":
        lit = draw(S_LIT)
        if draw(st.booleans()):
            return f"s = {quote(lit)}", "s", lambda v, lit=lit: v == lit
        return f"s prefix {quote(lit)}", "s", lambda v, lit=lit: v.startswith(lit)
    lit_st = N_LIT if name == "n" else F_LIT
    op = draw(st.sampled_from(["in", "<", "<=", ">", ">=", "="]))
    a = draw(lit_st)
    if op == "in":
        b = draw(lit_st)
        return (f"{name} in [{_num_text(a)}, {_num_text(b)}]", name,
                lambda v, a=a, b=b: a <= v <= b)
    test = {"<": lambda v, a=a: v < a, "<=": lambda v, a=a: v <= a,
            ">": lambda v, a=a: v > a, ">=": lambda v, a=a: v >= a,
            "=": lambda v, a=a: v == a}[op]
    return f"{name} {op} {_num_text(a)}", name, test


def candidates(attr_name: str, texts: list[str]) -> list:
    """Values of one attribute that witness every distinction the clauses can make."""
    if attr_name == "n":
        return list(range(0, 41))
    if attr_name == "s":
        lits = [parse_predicate(SMALL, t).get("s") for t in texts if _ok(t)]
        base = {"", "A", "x"}
        for c in lits:
            if c is not None:
                w = c.equals if c.equals is not None else c.prefix
                base |= {w, w + "A", w + "x", w[:-1]}
        return sorted(base)
    pts = {-5.0, 5.0, 0.0}
    for t in texts:
        for tok in t.replace("[", " ").replace("]", " ").replace(",", " ").split():
            try:
                x = float(tok)
            except ValueError:
                continue
            pts |= {x, math.nextafter(x, -math.inf), math.nextafter(x, math.inf)}
    srt = sorted(pts)
    pts |= {(a + b) / 2 for a, b in itertools.pairwise(srt)}
    return [x for x in sorted(pts) if -5.0 <= x <= 5.0]


def _ok(text: str) -> bool:
    try:
        parse_predicate(SMALL, text)
    except PredicateError:
        return False
    return True


@SETTINGS
@given(st.lists(clause(), max_size=4))
def test_random_predicates_round_trip_and_semantics(clauses) -> None:
    text = " and ".join(t for t, _, _ in clauses)
    try:
        p = parse_predicate(SMALL, text)
    except PredicateError as err:
        # only emptiness can fail here; check by brute force that nothing matches
        assert "selects no value" in err.message or "contradicts" in err.message
        starts = [sum(len(c[0]) + 5 for c in clauses[:i]) for i in range(len(clauses))]
        failing = starts.index(err.position)
        name = clauses[failing][1]
        upto = [c for c in clauses[:failing + 1] if c[1] == name]
        vals = candidates(name, [c[0] for c in upto])
        assert not any(all(test(v) for _, _, test in upto) for v in vals)
        return
    assert parse_predicate(SMALL, str(p)) == p
    for name in ("n", "f", "s"):
        mine = [c for c in clauses if c[1] == name]
        for v in candidates(name, [c[0] for c in mine]):
            want = all(test(v) for _, _, test in mine)
            constraint = p.get(name)
            got = constraint is None or constraint.contains(v)
            assert got == want, (text, name, v)
    event = {"n": 3, "f": 0.5, "s": "AB"}
    assert p.matches(event) == all(test(event[n]) for _, n, test in clauses)


@SETTINGS
@given(st.text(max_size=12))
def test_quote_round_trips_any_string(s: str) -> None:
    p = parse_predicate(SMALL, f"s = {quote(s)}")
    assert p.get("s") == StringConstraint(equals=s)
    assert parse_predicate(SMALL, str(p)) == p


# --------------------------------------------------------------------------- containment


@pytest.mark.parametrize(("inner", "policy", "offending"), [
    ("price in [1, 2]", "price < 5", None),
    ("price in [1, 20]", "price < 5", "price < 5.0"),
    ("price < 5", "price <= 5", None),
    ("price <= 5", "price < 5", "price < 5.0"),
    ("price > 5", "price >= 5", None),
    ("price >= 5", "price > 5", "price > 5.0"),
    ("", "price < 5", "price < 5.0"),
    ("price < 5", "", None),
    ('symbol = "IBM" and price < 3', 'symbol prefix "IB" and price < 5', None),
    ('symbol prefix "IBM"', 'symbol prefix "IB"', None),
    ('symbol prefix "I"', 'symbol prefix "IB"', 'symbol prefix "IB"'),
    ('symbol prefix "IBM"', 'symbol = "IBM"', 'symbol = "IBM"'),
    ('symbol = "IBM"', 'symbol = "IBM"', None),
    ("price < 5", 'symbol = "IBM"', 'symbol = "IBM"'),
    ("volume in [10, 20]", "volume > 9.5 and volume < 20.5", None),
    ("volume in [10, 21]", "volume >= 10 and volume <= 20", "volume in [10, 20]"),
    ("volume >= 10", "volume >= 10", None),
])
def test_check_within(inner: str, policy: str, offending: str | None) -> None:
    assert check_within(STOCKS, P(inner), P(policy)) == offending


@SETTINGS
@given(st.lists(clause(), min_size=1, max_size=2), st.lists(clause(), min_size=1, max_size=2))
def test_check_within_agrees_with_brute_force(inner_cl, policy_cl) -> None:
    texts = [" and ".join(t for t, _, _ in cl) for cl in (inner_cl, policy_cl)]
    if not all(_ok(t) for t in texts):
        return
    inner, policy = (parse_predicate(SMALL, t) for t in texts)
    verdict = check_within(SMALL, inner, policy)
    every = [t for cl in (inner_cl, policy_cl) for t, _, _ in cl]
    counterexample = None
    for attr in SMALL.attributes:
        outer = policy.get(attr.name)
        if outer is None:
            continue
        own = inner.get(attr.name)
        for v in candidates(attr.name, [t for t in every if t.startswith(attr.name)]):
            if (own is None or own.contains(v)) and not outer.contains(v):
                counterexample = (attr.name, v)
                break
        if counterexample:
            break
    assert (verdict is None) == (counterexample is None), (texts, verdict, counterexample)
    if verdict is not None:
        assert verdict.startswith(counterexample[0])
