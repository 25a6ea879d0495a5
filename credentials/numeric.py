"""Numeric-subspace credentials: quantization and dyadic decomposition of a domain.

A numeric attribute's closed domain [min, max] is cut into ``2**bits`` equal
cells; a credential is a bit-string prefix, i.e. a dyadic block of cells. A
value lies in one leaf cell, and the prefixes of that cell's bit string are the
credentials enclosing it (the path used for encryption). A range predicate
becomes the minimal set of disjoint blocks covering the cells it touches.

Cell of a value: ``floor((v - min) / (max - min) * 2**bits)``, clamped to
``2**bits - 1`` (so ``max`` lies in the last cell, which is closed). The
computation is exact (rational arithmetic on the float or int value), so cell
boundaries and strict bounds never suffer from rounding.

Ints: when an int domain has fewer values than ``2**bits`` cells, the formula
spreads the values out (``v -> floor((v - min) * 2**bits / (max - min))``), so
consecutive ints land one or more cells apart and some cells hold no value at
all. Such empty cells are "free": the decomposition may include them at no cost
whenever that yields fewer or coarser credentials, since no event can fall in
them. When the domain has more values than cells, several ints share a cell.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from fractions import Fraction

from ibe_pubsub.credentials.credential import Credential
from ibe_pubsub.credentials.exceptions import DecompositionError
from ibe_pubsub.credentials.schema import Attribute

Number = int | float


def _numeric(attr: Attribute) -> int:
    if attr.bits is None:
        raise DecompositionError(f"attribute {attr.name!r} is not numeric")
    return attr.bits


def _ratio(attr: Attribute, v: Number) -> Fraction:
    """Exact position of ``v`` measured in cells from ``min``."""
    bits = _numeric(attr)
    lo, hi = attr.min, attr.max
    if attr.type == "int" and isinstance(v, int):
        return Fraction((v - lo) << bits, hi - lo)  # type: ignore[operator]
    return (Fraction(v) - Fraction(lo)) * (1 << bits) / (Fraction(hi) - Fraction(lo))  # type: ignore[arg-type]


def value_cell(attr: Attribute, v: Number) -> int:
    """Leaf cell index of a value of the domain."""
    if not attr.min <= v <= attr.max:  # type: ignore[operator]
        raise DecompositionError(
            f"attribute {attr.name!r}: value {v!r} outside [{attr.min}, {attr.max}]")
    return min(math.floor(_ratio(attr, v)), attr.cells - 1)


def cell_bits(attr: Attribute, cell: int) -> str:
    """The ``bits``-long bit string naming a leaf cell."""
    bits = _numeric(attr)
    if not 0 <= cell < 1 << bits:
        raise DecompositionError(f"cell {cell} outside 0..{(1 << bits) - 1}")
    return format(cell, f"0{bits}b")


def value_bits(attr: Attribute, v: Number) -> str:
    """Bit string of the leaf cell holding ``v``."""
    return cell_bits(attr, value_cell(attr, v))


def path_cells(path: str, bits: int) -> tuple[int, int]:
    """First and last leaf cell (inclusive) of the block named by a bit-string prefix."""
    if len(path) > bits:
        raise DecompositionError(f"path {path!r} longer than {bits} bits")
    width = bits - len(path)
    start = int(path, 2) << width if path else 0
    return start, start + (1 << width) - 1


def enclosing_paths(attr: Attribute, v: Number) -> tuple[str, ...]:
    """Prefixes of the value's leaf bit string, lengths 0..bits (index = position)."""
    leaf = value_bits(attr, v)
    return tuple(leaf[:j] for j in range(len(leaf) + 1))


def enclosing_path(attr: Attribute, v: Number) -> tuple[Credential, ...]:
    """The credentials enclosing ``v``, root first; index = credential position."""
    return tuple(Credential(attr.name, "num", p) for p in enclosing_paths(attr, v))


def int_bounds(attr: Attribute, lo: Number | None, hi: Number | None,
               lo_open: bool = False, hi_open: bool = False) -> tuple[int, int]:
    """The closed integer interval of an int attribute selected by a range, clipped.

    ``None`` means unbounded on that side. The result may be empty (lo > hi).
    """
    dmin, dmax = attr.min, attr.max
    if (lo is not None and lo > dmax) or (hi is not None and hi < dmin):  # type: ignore[operator]
        return dmax + 1, dmax  # type: ignore[operator,return-value]
    # Clip first so that rounding never sees an out-of-domain (possibly infinite) bound.
    lo_i = dmin if lo is None or lo < dmin else (  # type: ignore[operator]
        math.floor(lo) + 1 if lo_open else math.ceil(lo))
    hi_i = dmax if hi is None or hi > dmax else (  # type: ignore[operator]
        math.ceil(hi) - 1 if hi_open else math.floor(hi))
    return max(lo_i, dmin), min(hi_i, dmax)  # type: ignore[type-var,return-value]


def cell_interval(attr: Attribute, lo: Number | None, hi: Number | None,
                  lo_open: bool = False, hi_open: bool = False) -> tuple[int, int]:
    """The cells [a, b] holding at least one value of the range (clipped to the domain).

    A strict upper bound that falls exactly on a cell boundary excludes the cell
    starting there; a strict lower bound on a boundary keeps the cell above it
    (values just above the bound lie in it). Raises ValueError if the range
    selects no value of the domain.
    """
    last = attr.cells - 1
    if attr.type == "int":
        lo_i, hi_i = int_bounds(attr, lo, hi, lo_open, hi_open)
        if lo_i > hi_i:
            raise DecompositionError(f"attribute {attr.name!r}: the range selects no value")
        return value_cell(attr, lo_i), value_cell(attr, hi_i)
    dmin, dmax = attr.min, attr.max
    if lo is None or lo < dmin or (lo == dmin and not lo_open):  # type: ignore[operator]
        lo, lo_open = dmin, False
    if hi is None or hi > dmax or (hi == dmax and not hi_open):  # type: ignore[operator]
        hi, hi_open = dmax, False
    if lo > hi or (lo == hi and (lo_open or hi_open)):  # type: ignore[operator]
        raise DecompositionError(f"attribute {attr.name!r}: the range selects no value")
    a = min(math.floor(_ratio(attr, lo)), last)  # type: ignore[arg-type]
    r = _ratio(attr, hi)  # type: ignore[arg-type]
    b = min(math.floor(r), last)
    if hi_open and r.denominator == 1 and r <= last:
        b = int(r) - 1
    return a, b


def free_interval(attr: Attribute, lo: Number | None, hi: Number | None,
                  lo_open: bool = False, hi_open: bool = False) -> tuple[int, int]:
    """The widest cell interval around ``cell_interval`` that holds no non-matching value.

    For floats every cell holds values, so it equals ``cell_interval``. For ints
    it adds the empty cells between the range and its neighbouring values.
    """
    a, b = cell_interval(attr, lo, hi, lo_open, hi_open)
    if attr.type != "int":
        return a, b
    lo_i, hi_i = int_bounds(attr, lo, hi, lo_open, hi_open)
    fa = value_cell(attr, lo_i - 1) + 1 if lo_i > attr.min else 0  # type: ignore[operator]
    fb = value_cell(attr, hi_i + 1) - 1 if hi_i < attr.max else attr.cells - 1  # type: ignore[operator]
    return min(fa, a), max(fb, b)


def inner_interval(attr: Attribute, lo: Number | None, hi: Number | None,
                   lo_open: bool = False, hi_open: bool = False) -> tuple[int, int] | None:
    """The cells lying entirely inside the range (every value they hold matches), or None.

    The inner counterpart of ``free_interval``: a cell that straddles a bound is
    left out, so blocks of these cells never enclose a value outside the range.
    Float cells count as real intervals; int cells that hold no value are inside.
    """
    last = attr.cells - 1
    if attr.type == "int":
        lo_i, hi_i = int_bounds(attr, lo, hi, lo_open, hi_open)
        if lo_i > hi_i:
            return None
        first = value_cell(attr, lo_i - 1) + 1 if lo_i > attr.min else 0  # type: ignore[operator]
        end = value_cell(attr, hi_i + 1) - 1 if hi_i < attr.max else last  # type: ignore[operator]
        return (first, end) if first <= end else None
    dmin, dmax = attr.min, attr.max
    first, end = 0, last
    if lo is not None and (lo > dmin or (lo == dmin and lo_open)):  # type: ignore[operator]
        # cell c starts at ratio c: it must start at (or, if open, after) the bound
        r = _ratio(attr, lo)
        first = math.floor(r) + 1 if lo_open else math.ceil(r)
    if hi is not None and (hi < dmax or (hi == dmax and hi_open)):  # type: ignore[operator]
        # cell c ends at ratio c + 1 (exclusive); the last cell holds max, outside the range
        end = min(math.floor(_ratio(attr, hi)) - 1, last - 1)
    return (first, end) if 0 <= first <= end <= last else None


def maximal_blocks(first: int, last: int, bits: int) -> tuple[str, ...]:
    """The canonical (minimal) decomposition of cells [first, last] into dyadic blocks.

    These are exactly the maximal dyadic blocks inside the interval, in order.
    """
    if not 0 <= first <= last < 1 << bits:
        raise DecompositionError(f"bad cell interval [{first}, {last}] for {bits} bits")
    out: list[str] = []
    pos = first
    while pos <= last:
        k = bits
        while k > 0 and (pos % (1 << k) or pos + (1 << k) - 1 > last):
            k -= 1
        out.append(format(pos >> k, f"0{bits - k}b") if k < bits else "")
        pos += 1 << k
    return tuple(out)


def dyadic_cover(first: int, last: int, bits: int,
                 free: tuple[int, int] | None = None) -> tuple[str, ...]:
    """Minimal set of disjoint dyadic blocks covering cells [first, last].

    With ``free`` = [fa, fb] ⊇ [first, last], blocks may also spill into cells of
    ``free`` (cells that hold no value that must be excluded); the result is the
    maximal blocks of ``free`` that meet [first, last]. Every dyadic block inside
    ``free`` lies in one of its maximal blocks, so no cover has fewer blocks.
    """
    fa, fb = free if free is not None else (first, last)
    if not fa <= first <= last <= fb:
        raise DecompositionError("free interval must contain the cell interval")
    blocks = maximal_blocks(fa, fb, bits)
    keep = []
    for p in blocks:
        s, e = path_cells(p, bits)
        if s <= last and e >= first:
            keep.append(p)
    return tuple(keep)


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


class OutsideCells(DecompositionError):
    """No cover of a range stays inside the allowed cells (see ``range_cover``).

    ``needed``: the fewest blocks a cover inside takes (None: no cell of it is left).
    """

    def __init__(self, message: str, needed: int | None = None) -> None:
        super().__init__(message)
        self.needed = needed


def coarsen(paths: tuple[str, ...], bits: int, cap: int,
            weight: Callable[[int, int], int] | None = None,
            within: tuple[int, int] | None = None) -> tuple[str, ...]:
    """Shrink a disjoint cover to at most ``cap`` blocks by greedy merging.

    Each step replaces two neighbouring blocks (and whatever lies between them)
    by their common ancestor, choosing the step that adds the least ``weight``
    (default: the number of extra cells). The result is a disjoint superset.
    With ``within`` = [first, last] (holding every block), only ancestors inside
    those cells are taken; the merging then stops at one block per maximal dyadic
    block of ``within`` that the cover meets, which is the fewest any cover inside
    can have, and OutsideCells says so if that is still more than ``cap``.
    """
    if cap < 1:
        raise DecompositionError("max_credentials must be at least 1")
    weight = weight or (lambda s, e: e - s + 1)
    blocks = sorted(paths, key=lambda p: path_cells(p, bits))
    while len(blocks) > cap:
        best: tuple[int, int, int, str, int, int] | None = None
        for i in range(len(blocks) - 1):
            anc = _common_prefix(blocks[i], blocks[i + 1])
            s, e = path_cells(anc, bits)
            if within is not None and not within[0] <= s <= e <= within[1]:
                continue
            inside = [j for j, p in enumerate(blocks) if s <= path_cells(p, bits)[0] <= e]
            extra = weight(s, e) - sum(weight(*path_cells(blocks[j], bits)) for j in inside)
            cand = (extra, -len(inside), i, anc, inside[0], inside[-1])
            if best is None or cand[:3] < best[:3]:
                best = cand
        if best is None:
            raise OutsideCells(f"at least {len(blocks)} credentials are needed to stay inside "
                               f"the allowed cells, max_credentials is {cap}", len(blocks))
        _, _, _, anc, j0, j1 = best
        blocks[j0:j1 + 1] = [anc]
    return tuple(blocks)


def value_weight(attr: Attribute) -> Callable[[int, int], int]:
    """Weight of a cell interval for coarsening: its cells (floats) or its ints (ints)."""
    if attr.type != "int":
        return lambda s, e: e - s + 1
    span, bits = attr.max - attr.min, _numeric(attr)  # type: ignore[operator]

    def first_value_at_or_after(k: int) -> int:
        # smallest offset v - min with cell(v) >= k (the clamp only moves max down)
        if k >= 1 << bits:
            return span + 1
        return -((-k * span) >> bits)  # ceil(k * span / 2**bits)

    return lambda s, e: first_value_at_or_after(e + 1) - first_value_at_or_after(s)


def range_cover(attr: Attribute, lo: Number | None, hi: Number | None,
                lo_open: bool = False, hi_open: bool = False,
                max_credentials: int | None = None,
                within: tuple[int, int] | None = None) -> tuple[str, ...]:
    """Bit-string prefixes of the minimal disjoint cover of a range (optionally capped).

    ``within`` = [first, last] confines every block to those cells (e.g. the
    ``inner_interval`` of a policy): the range's cells are clipped to it and
    coarsening merges only inside it. OutsideCells if no cell of the range is
    left, or if ``max_credentials`` blocks cannot cover it inside.
    """
    bits = _numeric(attr)
    a, b = cell_interval(attr, lo, hi, lo_open, hi_open)
    fa, fb = free_interval(attr, lo, hi, lo_open, hi_open)
    if within is not None:
        a, b = max(a, within[0]), min(b, within[1])
        fa, fb = max(fa, within[0]), min(fb, within[1])
        if a > b:
            raise OutsideCells("no cell of the range lies inside the allowed cells")
    cover = dyadic_cover(a, b, bits, (fa, fb))
    if max_credentials is not None:
        cover = coarsen(cover, bits, max_credentials, value_weight(attr), within)
    return cover


def range_credentials(attr: Attribute, lo: Number | None, hi: Number | None,
                      lo_open: bool = False, hi_open: bool = False,
                      max_credentials: int | None = None,
                      within: tuple[int, int] | None = None) -> tuple[Credential, ...]:
    """The credentials for a range, ordered by cell (``within``: see ``range_cover``)."""
    return tuple(Credential(attr.name, "num", p)
                 for p in range_cover(attr, lo, hi, lo_open, hi_open, max_credentials, within))


def fine_split(attr: Attribute, cred: Credential, depth: int = 1) -> tuple[Credential, ...]:
    """The ``2**depth`` sub-blocks of a numeric credential ``depth`` bits deeper.

    Capped at the leaf level: a leaf credential splits into itself.
    """
    bits = _numeric(attr)
    if cred.kind != "num" or cred.attribute != attr.name:
        raise DecompositionError(f"{cred} is not a credential of numeric attribute {attr.name!r}")
    if depth < 0:
        raise DecompositionError("depth must be >= 0")
    d = min(depth, bits - len(cred.path))
    return tuple(Credential(attr.name, "num", cred.path + (format(i, f"0{d}b") if d else ""))
                 for i in range(1 << d))
