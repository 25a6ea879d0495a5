"""Issued credentials lie inside the identity's policy, whatever max_credentials asks (a
cap the policy's region cannot meet gives way to the fewest blocks inside it).

Runs the key server's own planning code (``within_policy`` + ``plan_subscriber`` /
``plan_publisher``) on random schemas, policies, requests and caps. Each issued
credential is checked without the code under test's region logic: we ask the
decryption-side path code (``enclosing_path`` + ``covering_credential``) which
candidate values the credential opens, and the exact predicate semantics
(``Predicate.matches``) whether each of them satisfies the policy. Candidates are
every value of small int domains, and for floats and strings the values at and
next to every policy bound, block edge and truncation/folding boundary.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Iterable
from fractions import Fraction

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from ibe_pubsub.credentials.credential import Credential
from ibe_pubsub.credentials.decomposition import covering_credential, decompose, enclosing_path
from ibe_pubsub.credentials.numeric import path_cells
from ibe_pubsub.credentials.policy_regions import inner_cells
from ibe_pubsub.credentials.predicates import (
    NumericRange,
    Predicate,
    PredicateError,
    StringConstraint,
    parse_predicate,
    quote,
)
from ibe_pubsub.credentials.schema import Attribute, Schema, default_schema
from ibe_pubsub.credentials.strings import OTHER_CHAR
from ibe_pubsub.keyserver.enrolment import plan_publisher, plan_subscriber, within_policy
from ibe_pubsub.keyserver.errors import ApiError

SETTINGS = settings(derandomize=True, deadline=None, max_examples=250, database=None)
OUTSIDE_CHARS = "~é"  # never in a drawn alphabet: they fold into OTHER_CHAR


# --------------------------------------------------------------------------- the checker


def _float_candidates(attr: Attribute, cred: Credential, c: NumericRange) -> set[float]:
    """The extreme floats of the credential's block and the floats around each policy bound."""
    dmin, dmax = Fraction(attr.min), Fraction(attr.max)
    first, last = path_cells(cred.path, attr.bits)
    width = (dmax - dmin) / attr.cells
    edges = [float(dmin + first * width), float(dmin + (last + 1) * width)]
    edges += [b for b in (c.lo, c.hi) if b is not None]
    out = {float(attr.min), float(attr.max)}
    for x in edges:
        out |= {x, math.nextafter(x, -math.inf), math.nextafter(x, math.inf)}
    return {v for v in out if attr.min <= v <= attr.max}


def _string_candidates(attr: Attribute, cred: Credential, c: StringConstraint) -> set[str]:
    """Values at the credential's and the policy's text, extended, truncated and folded."""
    alphabet = attr.alphabet or "AB"
    bases = {cred.path, (c.equals if c.equals is not None else c.prefix) or ""}
    bases |= {b[:attr.max_length] for b in bases}
    out: set[str] = set()
    for base in bases:
        for variant in {base, base.replace(OTHER_CHAR, OUTSIDE_CHARS[0]),
                        "".join(ch if ch in alphabet else OUTSIDE_CHARS[1] for ch in base)}:
            for tail in ("", alphabet[0], OUTSIDE_CHARS[0], "Z" * (attr.max_length + 1)):
                out.add(variant + tail)
    return out


def _candidates(attr: Attribute, cred: Credential, constraint) -> Iterable:
    if attr.type == "int":
        return range(attr.min, attr.max + 1)  # type: ignore[arg-type]
    if attr.type == "float":
        return _float_candidates(attr, cred, constraint)
    return _string_candidates(attr, cred, constraint)


def violation(schema: Schema, cred: Credential, policy: Predicate | None):
    """A value that ``cred`` opens but the policy excludes, or None."""
    constraint = None if policy is None else policy.get(cred.attribute)
    if constraint is None:
        return None
    only = Predicate(((cred.attribute, constraint),))
    attr = schema.attribute(cred.attribute)
    for v in _candidates(attr, cred, constraint):
        opened = covering_credential([cred], enclosing_path(schema, attr.name, v)) == cred
        if opened and not only.matches({attr.name: v}):
            return v
    return None


# --------------------------------------------------------------------------- strategies


@st.composite
def numeric_attribute(draw, name: str) -> Attribute:
    bits = draw(st.integers(1, 12))
    if draw(st.booleans()):
        lo = draw(st.integers(-40, 40))
        # from a few values per cell down to several cells per value
        return Attribute(name, "int", lo, lo + draw(st.integers(1, 500)), bits)
    lo = draw(st.sampled_from([-10.0, 0.0, 0.5, 100.0]))
    return Attribute(name, "float", lo, lo + draw(st.sampled_from([0.7, 1.0, 3.0, 1000.0])),
                     bits)


@st.composite
def string_attribute(draw, name: str) -> Attribute:
    alphabet = draw(st.sampled_from([None, "AB", "ABC"]))
    return Attribute(name, "string", max_length=draw(st.integers(1, 5)), alphabet=alphabet)


@st.composite
def schemas(draw) -> Schema:
    attrs = [draw(numeric_attribute("n0")), draw(numeric_attribute("n1")),
             draw(string_attribute("s"))]
    return Schema("prop", tuple(draw(st.permutations(attrs))))


def _number(attr: Attribute, draw) -> str:
    if attr.type == "int":
        return str(draw(st.integers(attr.min - 2, attr.max + 2)))  # type: ignore[operator]
    span = attr.max - attr.min  # type: ignore[operator]
    how = draw(st.sampled_from(["edge", "near", "any"]))
    k = draw(st.integers(0, attr.cells))
    x = attr.min + span * k / attr.cells  # type: ignore[operator]
    if how == "near":
        x = math.nextafter(x, draw(st.sampled_from([-math.inf, math.inf])))
    elif how == "any":
        x = draw(st.floats(attr.min - 1, attr.max + 1))  # type: ignore[operator]
    return repr(float(x))


@st.composite
def numeric_clauses(draw, attr: Attribute) -> list[str]:
    out = []
    for _ in range(draw(st.integers(1, 2))):
        op = draw(st.sampled_from(["in", "<", "<=", ">", ">=", "="]))
        if op == "in":
            a, b = _number(attr, draw), _number(attr, draw)
            a, b = sorted((a, b), key=float)
            out.append(f"{attr.name} in [{a}, {b}]")
        else:
            out.append(f"{attr.name} {op} {_number(attr, draw)}")
    return out


@st.composite
def string_clause(draw, attr: Attribute, base: str = "", op: str | None = None) -> list[str]:
    chars = (attr.alphabet or "ABC") + OUTSIDE_CHARS
    text = base + draw(st.text(st.sampled_from(chars), max_size=attr.max_length + 2))  # type: ignore[operator]
    op = op or draw(st.sampled_from(["=", "prefix"]))
    return [f"{attr.name} {op} {quote(text)}"]


def clauses(attr: Attribute) -> st.SearchStrategy[list[str]]:
    return numeric_clauses(attr) if attr.is_numeric else string_clause(attr)


@st.composite
def narrower(draw, attr: Attribute, own: list[str]) -> list[str]:
    """Clauses selecting a part of what ``own`` (the policy's clauses on ``attr``) selects."""
    if attr.is_numeric:
        return own + draw(numeric_clauses(attr))
    policy = parse_predicate(Schema("one", (attr,)), own[0]).get(attr.name)
    if not isinstance(policy, StringConstraint) or policy.prefix is None:
        return own
    return draw(string_clause(attr, base=policy.prefix))


@st.composite
def cases(draw) -> tuple[Schema, str, str, int | None, str, int]:
    """(schema, policy text, request text, max_credentials, role, fine_depth)."""
    schema = draw(schemas())
    policy: list[str] = []
    request: list[str] = []
    for attr in schema.attributes:
        if not draw(st.booleans()):  # unconstrained by the policy
            request += draw(clauses(attr)) if draw(st.booleans()) else []
            continue
        own = draw(clauses(attr))
        policy += own
        # mostly inside the policy (its clauses, or narrower), sometimes anything
        how = draw(st.sampled_from(["same", "narrower", "narrower", "anything"]))
        if how == "same":
            request += own
        else:
            request += draw(narrower(attr, own) if how == "narrower" else clauses(attr))
    cap = draw(st.one_of(st.none(), st.integers(1, 12)))
    role = draw(st.sampled_from(["subscriber", "publisher"]))
    return (schema, " and ".join(policy), " and ".join(request), cap, role,
            draw(st.integers(0, 2)))


# --------------------------------------------------------------------------- the property


def _common_prefix(a: str, b: str) -> str:
    """The path of the smallest block holding both blocks ``a`` and ``b``."""
    same = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                min(len(a), len(b)))
    return a[:same]


def _outcome(schema: Schema, policy_text: str, request_text: str, cap: int | None, role: str,
             fine_depth: int) -> str:
    try:
        policy = parse_predicate(schema, policy_text)
    except PredicateError:
        assume(False)
    try:
        predicate = within_policy(schema, request_text, policy, "request")
        if role == "subscriber":
            creds, fine = plan_subscriber(schema, predicate, cap, fine_depth, policy)
        else:
            creds, fine = plan_publisher(schema, predicate, cap, policy), []
    except ApiError as exc:
        assert exc.status in (403, 422), exc.message
        if exc.code == "invalid_predicate":
            assume(False)
        if exc.status == 422:
            return "too_many"
        assert exc.code == "outside_policy" and exc.message
        return "refused_cells" if "attribute" in (exc.detail or {}) else "refused_predicate"
    for cred in creds + fine:
        bad = violation(schema, cred, policy)
        assert bad is None, (f"{cred} opens {bad!r}, outside the policy {policy}; "
                             f"request {predicate}, cap {cap}")
    outcome = "served"
    for attr in schema.attributes:
        own = [c for c in creds if c.attribute == attr.name]
        assert own, f"no credential for {attr.name}"
        if cap is not None and attr.is_numeric and len(own) > cap:
            # the cap gave way to the policy: merging any two neighbouring blocks leaves it
            for a, b in itertools.pairwise(own):
                merged = Credential(attr.name, "num", _common_prefix(a.path, b.path))
                assert violation(schema, merged, policy) is not None, (
                    f"{len(own)} credentials for cap {cap}, but {merged} fits the policy "
                    f"{policy}; request {predicate}")
            outcome = "served_past_cap"
    return outcome


def test_every_issued_credential_lies_inside_the_policy() -> None:
    outcomes: Counter[str] = Counter()

    @SETTINGS
    @given(cases())
    def run(case: tuple[Schema, str, str, int | None, str, int]) -> None:
        outcomes[_outcome(*case)] += 1

    run()
    print(f"outcomes: {dict(outcomes)}")
    # not vacuous: most requests are served and checked, and every outcome occurs (how often
    # varies with the process's string hashing, which orders the sets the decomposition walks)
    assert outcomes["served"] >= 80 and outcomes["served_past_cap"] >= 1, outcomes
    assert outcomes["refused_cells"] >= 5 and outcomes["refused_predicate"] >= 5, outcomes


def _brute_inside(attr: Attribute, c: NumericRange) -> tuple[set[int], set[int]]:
    """(cells all of whose values match, cells holding at least one value), by brute force."""
    if attr.type == "int":
        held: dict[int, list[int]] = {}
        for v in range(attr.min, attr.max + 1):  # type: ignore[arg-type]
            held.setdefault(min(math.floor(Fraction((v - attr.min) * attr.cells,
                                                    attr.max - attr.min)),  # type: ignore[operator]
                                attr.cells - 1), []).append(v)
        inside = {k for k in range(attr.cells) if all(c.contains(v) for v in held.get(k, []))}
        return inside, set(held)
    dmin, dmax, n = Fraction(attr.min), Fraction(attr.max), attr.cells
    lo = (dmin, False) if c.lo is None else (Fraction(c.lo), c.lo_open)
    hi = (dmax, False) if c.hi is None else (Fraction(c.hi), c.hi_open)
    inside = set()
    for k in range(n):
        a, b = dmin + (dmax - dmin) * k / n, dmin + (dmax - dmin) * (k + 1) / n
        lo_ok = a > lo[0] or (a == lo[0] and not lo[1])
        last_ok = b < hi[0] or (b == hi[0] and not hi[1])  # the last cell holds max itself
        hi_ok = last_ok if k == n - 1 else b <= hi[0]
        if lo_ok and hi_ok:
            inside.add(k)
    return inside, set(range(n))


@SETTINGS
@given(st.data())
def test_inner_cells_are_exactly_the_cells_inside(data) -> None:
    """Cutting to the inner cells gives up nothing the policy allows: a cell left out holds a
    value outside the range (or, for ints, no value at all)."""
    attr = data.draw(numeric_attribute("n"))
    text = " and ".join(data.draw(numeric_clauses(attr)))
    try:
        c = parse_predicate(Schema("one", (attr,)), text).get("n")
    except PredicateError:
        assume(False)
    assume(isinstance(c, NumericRange))
    cells = inner_cells(attr, c)
    mine = set() if cells is None else set(range(cells[0], cells[1] + 1))
    inside, holding = _brute_inside(attr, c)
    assert mine <= inside, (text, sorted(mine - inside)[:5])
    assert (inside - mine) & holding == set(), (text, sorted((inside - mine) & holding)[:5])


# --------------------------------------------------------------------------- controls


STOCKS = default_schema()


def test_checker_catches_the_old_overshooting_decomposition() -> None:
    """The same checker flags what plain ``decompose`` (no policy) issued before the fix."""
    policy = parse_predicate(STOCKS, "price in [100, 200]")
    capped = decompose(STOCKS, policy, max_credentials=1)["price"]
    assert [str(c) for c in capped] == ["price:00"]
    bad = violation(STOCKS, capped[0], policy)
    assert bad is not None and bad < 100
    # without a cap the edge cells straddle both bounds: one cell too much on each side
    edges = decompose(STOCKS, policy)["price"]
    flagged = [c for c in edges if violation(STOCKS, c, policy) is not None]
    assert flagged == [edges[0], edges[-1]]
    # the planning code cuts exactly the two straddling cells off
    served, _ = plan_subscriber(STOCKS, policy, None, 0, policy)
    price = [c for c in served if c.attribute == "price"]
    assert all(violation(STOCKS, c, policy) is None for c in price)
    straddling = {path_cells(edges[0].path, 16)[0], path_cells(edges[-1].path, 16)[1]}
    assert _cells(price) == _cells(edges) - straddling


def _cells(creds: Iterable[Credential]) -> set[int]:
    return {k for c in creds for k in range(path_cells(c.path, 16)[0],
                                            path_cells(c.path, 16)[1] + 1)}


def test_string_credentials_that_truncation_widens_are_refused() -> None:
    """``symbol = "ABCDEFGHIJ"`` (max_length 8): terminal "ABCDEFGH" opens longer values too."""
    policy = parse_predicate(STOCKS, 'symbol = "ABCDEFGHIJ"')
    old = decompose(STOCKS, policy)["symbol"][0]
    bad = violation(STOCKS, old, policy)
    assert bad is not None and bad.startswith("ABCDEFGH") and bad != "ABCDEFGHIJ"
    try:
        plan_subscriber(STOCKS, policy, None, 1, policy)
    except ApiError as exc:
        assert exc.status == 403 and exc.code == "outside_policy"
        assert exc.detail["attribute"] == "symbol" and "8 characters" in exc.message
    else:
        raise AssertionError("a truncated equality policy was served")
    # a prefix policy the trie can express is served
    wide = parse_predicate(STOCKS, 'symbol prefix "ABC"')
    creds, _ = plan_subscriber(STOCKS, policy, None, 1, wide)
    assert [str(c) for c in creds if c.attribute == "symbol"] == ['symbol:"ABCDEFGH"$']
