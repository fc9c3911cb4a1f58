"""Interval arithmetic on sorted numpy arrays: the one place unions and overlaps are computed.

Every time-breakdown number in traceread is a length of a union, difference or intersection of
sets of ``[start, end)`` intervals (kernels on many streams). Keeping the arithmetic here, exact and
vectorised, means all analyses agree to the last float bit.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

Intervals = tuple[NDArray[np.float64], NDArray[np.float64]]


def merge(starts: ArrayLike, ends: ArrayLike) -> Intervals:
    """Union of intervals as disjoint, sorted ``(starts, ends)``. Empty/negative ones are dropped."""
    s = np.asarray(starts, dtype=np.float64)
    e = np.asarray(ends, dtype=np.float64)
    keep = e > s
    s, e = s[keep], e[keep]
    if s.size == 0:
        return s, e
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    running_end = np.maximum.accumulate(e)
    # A new block starts where an interval begins after everything before it has ended.
    new_block = np.empty(s.size, dtype=bool)
    new_block[0] = True
    new_block[1:] = s[1:] > running_end[:-1]
    block_id = np.cumsum(new_block) - 1
    out_s = s[new_block]
    out_e = np.zeros(out_s.size, dtype=np.float64)
    np.maximum.at(out_e, block_id, running_end)
    return out_s, out_e


def length(iv: Intervals) -> float:
    """Total covered time of disjoint intervals."""
    s, e = iv
    return float(np.sum(e - s)) if s.size else 0.0


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """Intersection of two disjoint sorted interval sets."""
    a_s, a_e = a
    b_s, b_e = b
    if a_s.size == 0 or b_s.size == 0:
        return np.empty(0), np.empty(0)
    # Candidate pairs: for each a-interval, the b-intervals that start before it ends.
    lo = np.searchsorted(b_e, a_s, side="right")
    hi = np.searchsorted(b_s, a_e, side="left")
    counts = np.maximum(hi - lo, 0)
    if counts.sum() == 0:
        return np.empty(0), np.empty(0)
    a_idx = np.repeat(np.arange(a_s.size), counts)
    offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    b_idx = np.repeat(lo, counts) + offsets
    s = np.maximum(a_s[a_idx], b_s[b_idx])
    e = np.minimum(a_e[a_idx], b_e[b_idx])
    keep = e > s
    return s[keep], e[keep]


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """``a`` minus ``b`` for disjoint sorted sets: the parts of ``a`` not covered by ``b``."""
    a_s, a_e = a
    if a_s.size == 0:
        return a_s, a_e
    if b[0].size == 0:
        return a_s.copy(), a_e.copy()
    lo = min(float(a_s[0]), float(b[0][0]))
    hi = max(float(a_e[-1]), float(b[1][-1]))
    not_b = complement(b, lo, hi)
    return intersect(a, not_b)


def complement(iv: Intervals, lo: float, hi: float) -> Intervals:
    """The gaps of ``iv`` inside ``[lo, hi)``."""
    s, e = clip(iv, lo, hi)
    gap_s = np.concatenate(([lo], e))
    gap_e = np.concatenate((s, [hi]))
    keep = gap_e > gap_s
    return gap_s[keep], gap_e[keep]


def clip(iv: Intervals, lo: float, hi: float) -> Intervals:
    """Restrict disjoint sorted intervals to the window ``[lo, hi)``."""
    s, e = iv
    s = np.clip(s, lo, hi)
    e = np.clip(e, lo, hi)
    keep = e > s
    return s[keep], e[keep]


def clip_sorted(iv: Intervals, lo: float, hi: float) -> Intervals:
    """:func:`clip` for disjoint intervals sorted by start (what :func:`merge` returns): only the
    intervals that reach into the window are touched (binary search), so clipping one trace to each
    of its steps costs O(steps · log n + n), not O(steps · n) — quadratic on a long window."""
    s, e = iv
    i0 = int(np.searchsorted(e, lo, side="right"))
    i1 = int(np.searchsorted(s, hi, side="left"))
    return clip((s[i0:i1], e[i0:i1]), lo, hi)


def union(*sets: Intervals) -> Intervals:
    """Union of several interval sets."""
    if not sets:
        return np.empty(0), np.empty(0)
    return merge(np.concatenate([s for s, _ in sets]), np.concatenate([e for _, e in sets]))
