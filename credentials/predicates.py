"""The subscription/advertisement predicate language and its exact semantics.

A predicate is one line of clauses joined by ``and``::

    symbol prefix "IB" and price in [10, 20] and volume >= 1000

Clauses: ``a in [x, y]`` (inclusive), ``a < x``, ``a <= x``, ``a > x``,
``a >= x``, ``a = x`` on numeric attributes; ``a = "s"`` and ``a prefix "s"``
on string attributes (double quotes, backslash escapes ``\\\\ \\" \\n \\t \\r
\\uXXXX``; a surrogate pair of escapes is one character, a lone surrogate is an error,
as it is no text). An attribute not named ranges over its whole domain; clauses on the
same attribute intersect. A predicate that selects nothing inside the domain
is an error, never an empty set, so a typo cannot silently subscribe to
nothing. The empty text selects every event.

Parsed predicates are canonical: ranges are clipped to the domain (a bound at
or beyond the domain's end becomes ``None``), int ranges use closed integer
bounds, and constraints that select the whole domain are dropped. So
``str(p)`` parses back to an equal ``Predicate`` and equal predicates select
equal event sets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ibe_pubsub.credentials.exceptions import CredentialsError
from ibe_pubsub.credentials.numeric import int_bounds
from ibe_pubsub.credentials.schema import Attribute, Schema, SchemaError

Number = int | float
KEYWORDS = ("and", "in", "prefix")
COMPARISONS = ("<", "<=", ">", ">=", "=")


class PredicateError(CredentialsError, ValueError):
    """A predicate does not parse or selects nothing; carries the character position."""

    def __init__(self, message: str, text: str, position: int) -> None:
        self.message = message
        self.text = text
        self.position = position
        line = "".join(" " if ch.isspace() else "?" if _is_surrogate(ord(ch)) else ch
                       for ch in text)
        super().__init__(f"{message} (at position {position})\n  {line}\n  {' ' * position}^")

    def __reduce__(self) -> tuple[type, tuple[str, str, int]]:
        """Pickled with its own arguments, so it crosses a process pool."""
        return type(self), (self.message, self.text, self.position)


class ConstraintError(CredentialsError, ValueError):
    """A constraint that is malformed or selects no value (parsing adds the position)."""


def _fmt_number(x: Number) -> str:
    return str(x) if isinstance(x, int) else repr(float(x))


def quote(s: str) -> str:
    """Double-quote a string literal so that the tokenizer reads it back unchanged."""
    out = ['"']
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


@dataclass(frozen=True)
class NumericRange:
    """A numeric interval; ``None`` means unbounded (the domain end) on that side."""

    lo: Number | None = None
    hi: Number | None = None
    lo_open: bool = False
    hi_open: bool = False

    def contains(self, v: Number) -> bool:
        if self.lo is not None and (v <= self.lo if self.lo_open else v < self.lo):
            return False
        return not (self.hi is not None and (v >= self.hi if self.hi_open else v > self.hi))

    def clauses(self, name: str) -> list[str]:
        """Canonical clause texts for attribute ``name``."""
        lo, hi = self.lo, self.hi
        if lo is not None and hi is not None and not self.lo_open and not self.hi_open:
            if lo == hi:
                return [f"{name} = {_fmt_number(lo)}"]
            return [f"{name} in [{_fmt_number(lo)}, {_fmt_number(hi)}]"]
        out = []
        if lo is not None:
            out.append(f"{name} {'>' if self.lo_open else '>='} {_fmt_number(lo)}")
        if hi is not None:
            out.append(f"{name} {'<' if self.hi_open else '<='} {_fmt_number(hi)}")
        return out


@dataclass(frozen=True)
class StringConstraint:
    """Exactly one of ``equals`` (the full value) or ``prefix``."""

    equals: str | None = None
    prefix: str | None = None

    def __post_init__(self) -> None:
        if (self.equals is None) == (self.prefix is None):
            raise ConstraintError("StringConstraint needs exactly one of equals / prefix")

    def contains(self, v: str) -> bool:
        if self.equals is not None:
            return v == self.equals
        return v.startswith(self.prefix)  # type: ignore[arg-type]

    def clauses(self, name: str) -> list[str]:
        if self.equals is not None:
            return [f"{name} = {quote(self.equals)}"]
        return [f"{name} prefix {quote(self.prefix)}"]  # type: ignore[arg-type]


Constraint = NumericRange | StringConstraint


class EventFilter(Protocol):
    """What decides that an event is delivered, or may be published: a :class:`Predicate`,
    or the region a bundle's credentials enclose (``peer.bundle_file.CredentialRegion``)."""

    def matches(self, values: Mapping[str, Any]) -> bool: ...


@dataclass(frozen=True)
class Predicate:
    """Per-attribute constraints, in schema order; unnamed attributes are unconstrained."""

    constraints: tuple[tuple[str, Constraint], ...] = ()

    def get(self, name: str) -> Constraint | None:
        """The constraint on ``name``, or None for the whole domain."""
        for n, c in self.constraints:
            if n == name:
                return c
        return None

    @property
    def attributes(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.constraints)

    def clauses(self) -> list[str]:
        return [cl for n, c in self.constraints for cl in c.clauses(n)]

    def __str__(self) -> str:
        return " and ".join(self.clauses())

    def matches(self, values: Mapping[str, Any]) -> bool:
        """Exact check of an event's (full, untruncated) values, done after decryption."""
        for name, c in self.constraints:
            if name not in values:
                return False
            v = values[name]
            if isinstance(c, StringConstraint):
                if not isinstance(v, str) or not c.contains(v):
                    return False
            elif isinstance(v, bool) or not isinstance(v, int | float) or not c.contains(v):
                return False
        return True


# --------------------------------------------------------------------------- tokenizer


@dataclass(frozen=True)
class _Tok:
    kind: str  # ident | number | string | op | [ | ] | , | end
    value: str
    pos: int


def _tokenize(text: str) -> list[_Tok]:
    toks: list[_Tok] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch.isspace():
            i += 1
        elif ch in "[],":
            toks.append(_Tok(ch, ch, i))
            i += 1
        elif ch in "<>=":
            op = text[i:i + 2] if text[i:i + 2] in ("<=", ">=") else ch
            toks.append(_Tok("op", op, i))
            i += len(op)
        elif ch == '"':
            value, j = _read_string(text, i)
            toks.append(_Tok("string", value, i))
            i = j
        elif ch == "-" or ch.isdigit():
            j = _read_number(text, i)
            toks.append(_Tok("number", text[i:j], i))
            i = j
        elif ch == "_" or ch.isidentifier():
            j = i + 1
            while j < n and text[i:j + 1].isidentifier():
                j += 1
            toks.append(_Tok("ident", text[i:j], i))
            i = j
        else:
            raise PredicateError(f"unexpected character {ch!r}", text, i)
    toks.append(_Tok("end", "", n))
    return toks


def _read_digits(text: str, i: int) -> int:
    while i < len(text) and text[i].isdigit() and text[i].isascii():
        i += 1
    return i


def _read_number(text: str, start: int) -> int:
    i = start + 1 if text[start] == "-" else start
    j = _read_digits(text, i)
    if j == i:
        raise PredicateError("expected digits in number", text, i)
    if j < len(text) and text[j] == ".":
        k = _read_digits(text, j + 1)
        if k == j + 1:
            raise PredicateError("expected digits after the decimal point", text, j + 1)
        j = k
    if j < len(text) and text[j] in "eE":
        k = j + 1
        if k < len(text) and text[k] in "+-":
            k += 1
        m = _read_digits(text, k)
        if m == k:
            raise PredicateError("expected digits in the exponent", text, k)
        j = m
    if j < len(text) and (text[j].isalnum() or text[j] in "_."):
        raise PredicateError("malformed number", text, start)
    return j


_ESCAPES = {'"': '"', "\\": "\\", "n": "\n", "t": "\t", "r": "\r"}


def _read_string(text: str, start: int) -> tuple[str, int]:
    out: list[str] = []
    i = start + 1
    while i < len(text):
        ch = text[i]
        if ch == '"':
            return "".join(out), i + 1
        if ch == "\\":
            esc = text[i + 1:i + 2]
            if esc in _ESCAPES:
                out.append(_ESCAPES[esc])
                i += 2
                continue
            if esc == "u":
                char, i = _read_unicode_escape(text, i)
                out.append(char)
                continue
            raise PredicateError(f"unknown escape \\{esc}" if esc else "dangling backslash",
                                 text, i)
        if _is_surrogate(ord(ch)):
            raise PredicateError(_LONE_SURROGATE, text, i)
        out.append(ch)
        i += 1
    raise PredicateError("unterminated string", text, start)


_LONE_SURROGATE = "lone UTF-16 surrogate (not a character)"


def _is_surrogate(code: int) -> bool:
    return 0xD800 <= code <= 0xDFFF


def _hex4(text: str, i: int) -> int:
    """The code unit of the ``\\uXXXX`` escape at ``i``."""
    digits = text[i + 2:i + 6]
    if len(digits) != 4 or not all(c in "0123456789abcdefABCDEF" for c in digits):
        raise PredicateError("\\u needs four hex digits", text, i)
    return int(digits, 16)


def _read_unicode_escape(text: str, i: int) -> tuple[str, int]:
    """The character of the ``\\uXXXX`` escape at ``i`` and the index after it. A surrogate
    pair of escapes is one character; a lone surrogate is refused, since it is no text (it
    cannot be encoded as UTF-8, so it could be neither hashed, stored nor sent)."""
    code = _hex4(text, i)
    if 0xD800 <= code < 0xDC00 and text[i + 6:i + 8] == "\\u":
        low = _hex4(text, i + 6)
        if 0xDC00 <= low <= 0xDFFF:
            return chr(0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)), i + 12
    if _is_surrogate(code):
        raise PredicateError(_LONE_SURROGATE, text, i)
    return chr(code), i + 6


# --------------------------------------------------------------------------- parser


@dataclass(frozen=True)
class _Clause:
    attr: Attribute
    op: str  # in | prefix | < | <= | > | >= | =
    args: tuple[_Tok, ...]
    pos: int
    end: int


class _Parser:
    def __init__(self, schema: Schema, text: str) -> None:
        self.schema = schema
        self.text = text
        self.toks = _tokenize(text)
        self.i = 0

    def error(self, message: str, pos: int) -> PredicateError:
        return PredicateError(message, self.text, pos)

    def peek(self) -> _Tok:
        return self.toks[self.i]

    def take(self, kind: str, what: str, value: str | None = None) -> _Tok:
        tok = self.peek()
        if tok.kind != kind or (value is not None and tok.value != value):
            found = "end of input" if tok.kind == "end" else repr(tok.value)
            raise self.error(f"expected {what}, found {found}", tok.pos)
        self.i += 1
        return tok

    def clauses(self) -> list[_Clause]:
        if self.peek().kind == "end":
            return []
        out = [self.clause()]
        while self.peek().kind != "end":
            self.take("ident", "'and' or end of input", "and")
            out.append(self.clause())
        return out

    def clause(self) -> _Clause:
        name = self.peek()
        if name.kind != "ident" or name.value in KEYWORDS:
            found = "end of input" if name.kind == "end" else repr(name.value)
            raise self.error(f"expected an attribute name, found {found}", name.pos)
        self.i += 1
        try:
            attr = self.schema.attribute(name.value)
        except SchemaError:
            raise self.error(f"unknown attribute {name.value!r} (schema {self.schema.name!r} "
                             f"has: {', '.join(self.schema.names)})", name.pos) from None
        optok = self.peek()
        if optok.kind == "ident" and optok.value == "in":
            self.i += 1
            self.take("[", "'['")
            lo = self.take("number", "a number")
            self.take(",", "','")
            hi = self.take("number", "a number")
            self.take("]", "']'")
            args: tuple[_Tok, ...] = (lo, hi)
        elif optok.kind == "ident" and optok.value == "prefix":
            self.i += 1
            args = (self.take("string", "a quoted string"),)
        elif optok.kind == "op":
            self.i += 1
            lit = self.peek()
            if lit.kind not in ("number", "string"):
                self.take("number", "a number or a quoted string")
            self.i += 1
            args = (lit,)
        else:
            self.take("op", "an operator (in, prefix, <, <=, >, >=, =)")
            raise AssertionError("unreachable")
        op = optok.value
        self.check_types(attr, op, optok, args)
        return _Clause(attr, op, args, name.pos, self.peek().pos)

    def check_types(self, attr: Attribute, op: str, optok: _Tok, args: tuple[_Tok, ...]) -> None:
        if attr.is_numeric:
            if op == "prefix":
                raise self.error(f"type mismatch: 'prefix' needs a string attribute, "
                                 f"{attr.name!r} is {attr.type}", optok.pos)
            if args[0].kind != "number":
                raise self.error(f"type mismatch: {attr.name!r} is {attr.type}, "
                                 f"expected a number", args[0].pos)
        else:
            if op not in ("=", "prefix"):
                raise self.error(f"type mismatch: {attr.name!r} is a string attribute, "
                                 f"use '=' or 'prefix'", optok.pos)
            if args[0].kind != "string":
                raise self.error(f"type mismatch: {attr.name!r} is a string attribute, "
                                 f"expected a quoted string", args[0].pos)


def _number(attr: Attribute, tok: _Tok) -> Number:
    if attr.type == "int" and all(c in "-0123456789" for c in tok.value):
        return int(tok.value)
    return float(tok.value)


def _raw_range(attr: Attribute, cl: _Clause) -> NumericRange:
    vals = [_number(attr, t) for t in cl.args]
    op = cl.op
    if op == "in":
        return NumericRange(vals[0], vals[1])
    v = vals[0]
    return {
        "=": NumericRange(v, v),
        "<": NumericRange(None, v, hi_open=True),
        "<=": NumericRange(None, v),
        ">": NumericRange(v, None, lo_open=True),
        ">=": NumericRange(v, None),
    }[op]


def _intersect(a: NumericRange, b: NumericRange) -> NumericRange:
    lo, lo_open = a.lo, a.lo_open
    if b.lo is not None and (lo is None or b.lo > lo):
        lo, lo_open = b.lo, b.lo_open
    elif b.lo is not None and b.lo == lo:
        lo_open = lo_open or b.lo_open
    hi, hi_open = a.hi, a.hi_open
    if b.hi is not None and (hi is None or b.hi < hi):
        hi, hi_open = b.hi, b.hi_open
    elif b.hi is not None and b.hi == hi:
        hi_open = hi_open or b.hi_open
    return NumericRange(lo, hi, lo_open, hi_open)


def canonical_range(attr: Attribute, r: NumericRange) -> NumericRange | None:
    """Clip a range to the domain in canonical form; None if it selects the whole domain.

    Raises ConstraintError if it selects no value of the domain.
    """
    dmin, dmax = attr.min, attr.max
    lo, hi, lo_open, hi_open = r.lo, r.hi, r.lo_open, r.hi_open
    # Bounds outside the domain (also +-inf) are settled before any rounding.
    if (lo is not None and (lo > dmax or (lo == dmax and lo_open))) or \
       (hi is not None and (hi < dmin or (hi == dmin and hi_open))):  # type: ignore[operator]
        raise ConstraintError("selects no value of the domain")
    if lo is not None and (lo < dmin or (lo == dmin and not lo_open)):  # type: ignore[operator]
        lo, lo_open = None, False
    if hi is not None and (hi > dmax or (hi == dmax and not hi_open)):  # type: ignore[operator]
        hi, hi_open = None, False
    if attr.type == "int":
        lo_i, hi_i = int_bounds(attr, lo, hi, lo_open, hi_open)
        if lo_i > hi_i:
            raise ConstraintError("selects no value of the domain")
        lo = None if lo_i <= dmin else lo_i  # type: ignore[operator]
        hi = None if hi_i >= dmax else hi_i  # type: ignore[operator]
        lo_open = hi_open = False
    else:
        lo = None if lo is None else float(lo)
        hi = None if hi is None else float(hi)
        elo = dmin if lo is None else lo
        ehi = dmax if hi is None else hi
        if elo > ehi or (elo == ehi and (lo_open or hi_open)):  # type: ignore[operator]
            raise ConstraintError("selects no value of the domain")
    if lo is None and hi is None:
        return None
    return NumericRange(lo, hi, lo_open, hi_open)


def _string_constraint(cl: _Clause) -> StringConstraint | None:
    s = cl.args[0].value
    if cl.op == "=":
        return StringConstraint(equals=s)
    return StringConstraint(prefix=s) if s else None


def _intersect_strings(a: StringConstraint, b: StringConstraint) -> StringConstraint:
    """Intersection of two string constraints; ConstraintError if it is empty."""
    if a.equals is not None and b.equals is not None:
        if a.equals != b.equals:
            raise ConstraintError
        return a
    if a.equals is not None or b.equals is not None:
        eq, pre = (a, b) if a.equals is not None else (b, a)
        if not eq.equals.startswith(pre.prefix):  # type: ignore[union-attr,arg-type]
            raise ConstraintError
        return eq
    pa, pb = a.prefix, b.prefix
    if pa.startswith(pb):  # type: ignore[union-attr,arg-type]
        return a
    if pb.startswith(pa):  # type: ignore[union-attr,arg-type]
        return b
    raise ConstraintError


def parse_predicate(schema: Schema, text: str) -> Predicate:
    """Parse and check a predicate against a schema; PredicateError says where it is wrong."""
    parser = _Parser(schema, text)
    current: dict[str, Constraint | None] = {}
    for cl in parser.clauses():
        name = cl.attr.name
        snippet = text[cl.pos:cl.end].strip()
        earlier = name in current
        prev = current.get(name)
        try:
            if cl.attr.is_numeric:
                raw = _raw_range(cl.attr, cl)
                if isinstance(prev, NumericRange):
                    raw = _intersect(prev, raw)
                new: Constraint | None = canonical_range(cl.attr, raw)
            else:
                new = _string_constraint(cl)
                if isinstance(prev, StringConstraint):
                    new = prev if new is None else _intersect_strings(prev, new)  # type: ignore[arg-type]
        except ValueError:
            if earlier:
                msg = f"{snippet!r} contradicts the earlier clauses on {name!r}: nothing matches"
            elif cl.attr.is_numeric:
                msg = (f"{snippet!r} selects no value of {name!r} "
                       f"(domain [{cl.attr.min}, {cl.attr.max}])")
            else:
                msg = f"{snippet!r} selects no value of {name!r}"
            raise PredicateError(msg, text, cl.pos) from None
        current[name] = new
    return Predicate(tuple((a.name, c) for a in schema.attributes
                           if (c := current.get(a.name)) is not None))


# --------------------------------------------------------------------------- containment


def _range_within(attr: Attribute, inner: NumericRange | None, outer: NumericRange) -> bool:
    inner = inner or NumericRange()
    if attr.type == "int":
        ilo, ihi = int_bounds(attr, inner.lo, inner.hi, inner.lo_open, inner.hi_open)
        olo, ohi = int_bounds(attr, outer.lo, outer.hi, outer.lo_open, outer.hi_open)
        return ilo > ihi or (olo <= ilo and ihi <= ohi)
    dmin, dmax = attr.min, attr.max
    ilo = (dmin, False) if inner.lo is None else (inner.lo, inner.lo_open)
    olo = (dmin, False) if outer.lo is None else (outer.lo, outer.lo_open)
    ihi = (dmax, False) if inner.hi is None else (inner.hi, inner.hi_open)
    ohi = (dmax, False) if outer.hi is None else (outer.hi, outer.hi_open)
    lo_ok = ilo[0] > olo[0] or (ilo[0] == olo[0] and (ilo[1] or not olo[1]))  # type: ignore[operator]
    hi_ok = ihi[0] < ohi[0] or (ihi[0] == ohi[0] and (ihi[1] or not ohi[1]))  # type: ignore[operator]
    return lo_ok and hi_ok


def _string_within(inner: StringConstraint | None, outer: StringConstraint) -> bool:
    if inner is None:
        return False  # the whole domain never fits in an equality or a non-empty prefix
    if outer.equals is not None:
        return inner.equals == outer.equals
    if inner.equals is not None:
        return inner.equals.startswith(outer.prefix)  # type: ignore[arg-type]
    return inner.prefix.startswith(outer.prefix)  # type: ignore[union-attr,arg-type]


def check_within(schema: Schema, inner: Predicate, policy: Predicate) -> str | None:
    """None if every event matching ``inner`` matches ``policy``.

    Otherwise the canonical text of the first policy clause(s) that ``inner``
    exceeds, e.g. ``'price <= 100.0'``, for an error message such as a 403.
    """
    for attr in schema.attributes:
        outer = policy.get(attr.name)
        if outer is None:
            continue
        own = inner.get(attr.name)
        if isinstance(outer, NumericRange):
            ok = (own is None or isinstance(own, NumericRange)) and \
                _range_within(attr, own, outer)  # type: ignore[arg-type]
        else:
            ok = (own is None or isinstance(own, StringConstraint)) and \
                _string_within(own, outer)  # type: ignore[arg-type]
        if not ok:
            return " and ".join(outer.clauses(attr.name))
    return None

