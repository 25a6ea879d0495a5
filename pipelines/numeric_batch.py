"""The batch path of ``numeric``: cell intervals and dyadic covers of many ranges at once.

Bulk enrolment decomposes millions of ranges; doing it one range at a time in Python
costs most of the time. These functions compute, with numpy bit arithmetic over
arrays of ranges, exactly what ``numeric.cell_interval``, ``numeric.free_interval`` and
``numeric.dyadic_cover`` compute for one range. Exactly, not approximately: ints use
int64 arithmetic, which ``supported`` checks is exact for the attribute, and a float
bound whose cell position lies too close to a cell boundary for float64 to decide is
settled by ``numeric``'s rational arithmetic instead.
"""

from __future__ import annotations

import math

import numpy as np

from ibe_pubsub.credentials import Attribute, numeric

# float64 error of (v - min) / (max - min) * 2**bits is below 4 ulp of the result;
# a position farther than this (relative) from an integer has a certain floor.
_FLOAT_MARGIN = 2.0 ** -40


def supported(attr: Attribute) -> bool:
    """True if int64 holds every intermediate of the attribute's cell arithmetic."""
    if attr.type != "int":
        return True
    span = attr.max - attr.min  # type: ignore[operator]
    return span.bit_length() + attr.bits < 62 and max(abs(attr.min), abs(attr.max)) < 2 ** 61  # type: ignore[arg-type,operator]


def int_cells(attr: Attribute, values: np.ndarray) -> np.ndarray:
    """``value_cell`` of int values of the domain: min(((v - min) << bits) // (max - min), last)."""
    span, bits = attr.max - attr.min, attr.bits  # type: ignore[operator]
    cells = ((values - attr.min) << bits) // span  # type: ignore[operator]
    return np.minimum(cells, attr.cells - 1)


def float_positions(attr: Attribute, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """floor((v - min) * 2**bits / (max - min)) and whether that position is an integer.

    Exact for float values of the domain: float64 decides where the position is far
    from an integer, the domain ends are known, and the rest go through ``numeric._ratio``.
    """
    scale = float(1 << attr.bits)  # type: ignore[operator]
    positions = (values - attr.min) / (attr.max - attr.min) * scale  # type: ignore[operator]
    floors = np.floor(positions)
    integral = np.zeros(len(values), dtype=bool)
    nearest = np.rint(positions)
    near = np.abs(positions - nearest) <= _FLOAT_MARGIN * (np.abs(positions) + 1.0)
    ends = (values == attr.min) | (values == attr.max)
    floors[ends], integral[ends] = nearest[ends], True
    for i in np.flatnonzero(near & ~ends):
        exact = numeric._ratio(attr, float(values[i]))
        floors[i], integral[i] = math.floor(exact), exact.denominator == 1
    return floors.astype(np.int64), integral


def float_cell_intervals(attr: Attribute, lo: np.ndarray, hi: np.ndarray,
                         hi_open: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``cell_interval`` of float ranges already clipped to the domain (``lo``, ``hi`` finite).

    A strict upper bound exactly on a cell boundary excludes the cell starting there."""
    last = attr.cells - 1
    lo_floor, _ = float_positions(attr, lo)
    hi_floor, hi_integral = float_positions(attr, hi)
    first = np.minimum(lo_floor, last)
    end = np.where(hi_open & hi_integral & (hi_floor <= last), hi_floor - 1,
                   np.minimum(hi_floor, last))
    return first, end


def int_free_intervals(attr: Attribute, lo: np.ndarray, hi: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(first, last) cells of closed int ranges inside the domain, and their free intervals:
    widened by the empty cells up to the neighbouring values (``numeric.free_interval``)."""
    dmin, dmax = attr.min, attr.max
    first, end = int_cells(attr, lo), int_cells(attr, hi)
    below = int_cells(attr, np.maximum(lo - 1, dmin)) + 1  # type: ignore[call-overload]
    above = int_cells(attr, np.minimum(hi + 1, dmax)) - 1  # type: ignore[call-overload]
    free_first = np.minimum(np.where(lo > dmin, below, 0), first)  # type: ignore[operator]
    free_end = np.maximum(np.where(hi < dmax, above, attr.cells - 1), end)  # type: ignore[operator]
    return first, end, free_first, free_end


def _bit_length(values: np.ndarray) -> np.ndarray:
    """int.bit_length of non-negative int64 values below 2**53."""
    return np.frexp(values.astype(np.float64))[1].astype(np.int64)


def maximal_blocks(first: np.ndarray, last: np.ndarray,
                   bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``numeric.maximal_blocks`` of every interval [first[i], last[i]] at once.

    Returns (owner, start, level): block j covers cells start[j] .. start[j] + 2**level[j] - 1
    and belongs to interval owner[j]; blocks come by owner, then in cell order. With h the
    level of the smallest dyadic block holding both ends and s the middle of that block,
    the blocks of [first, s) follow the bits of s - first, smallest first, and those of
    [s, last] the bits of last + 1 - s, largest first; unless the interval is that block.
    """
    levels = np.arange(bits + 1, dtype=np.int64)
    h = _bit_length(first ^ last)
    whole = ((first & ((np.int64(1) << h) - 1)) == 0) & (last + 1 - first == np.int64(1) << h)
    middle = np.where(h > 0, (last >> np.maximum(h - 1, 0)) << np.maximum(h - 1, 0), first)
    left = np.where(whole, np.int64(1) << h, middle - first)
    right = np.where(whole, 0, last + 1 - middle)
    left_starts = first[:, None] + (left[:, None] & ((np.int64(1) << levels) - 1))
    right_levels = levels[::-1]
    right_starts = middle[:, None] + ((right[:, None] >> (right_levels + 1)) << (right_levels + 1))
    present = np.concatenate([(left[:, None] >> levels) & 1,
                              (right[:, None] >> right_levels) & 1], axis=1).astype(bool)
    owner, slot = np.nonzero(present)
    starts = np.concatenate([left_starts, right_starts], axis=1)[owner, slot]
    return owner, starts, np.concatenate([levels, right_levels])[slot]


def dyadic_covers(first: np.ndarray, last: np.ndarray, free_first: np.ndarray,
                  free_last: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``numeric.dyadic_cover`` of every interval at once: the maximal blocks of the free
    interval that meet [first, last]. Returns (owner, start, level) as ``maximal_blocks``."""
    owner, starts, levels = maximal_blocks(free_first, free_last, bits)
    meets = (starts <= last[owner]) & (starts + (np.int64(1) << levels) - 1 >= first[owner])
    return owner[meets], starts[meets], levels[meets]


def fine_blocks(starts: np.ndarray, levels: np.ndarray,
                depth: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``numeric.fine_split`` of every block: its sub-blocks ``depth`` levels down (at most to
    the leaves). Returns (parent, start, level), by parent, then in cell order."""
    down = np.minimum(depth, levels)
    counts = np.int64(1) << down
    parent = np.repeat(np.arange(len(starts)), counts)
    offsets = np.cumsum(counts) - counts
    child = np.arange(len(parent)) - offsets[parent]
    child_levels = (levels - down)[parent]
    return parent, starts[parent] + (child << child_levels), child_levels
