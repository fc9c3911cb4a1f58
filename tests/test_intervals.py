"""traceread.intervals against a brute-force model: sets of covered integer ticks."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from traceread import intervals as iv

SPANS = st.lists(
    st.tuples(st.integers(0, 60), st.integers(0, 60)), max_size=12
)


def _arrays(spans: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    s = np.array([a for a, _ in spans], dtype=np.float64)
    e = np.array([b for _, b in spans], dtype=np.float64)
    return s, e


def _ticks(spans) -> set[int]:
    """Brute force: the unit cells [t, t+1) an interval set covers."""
    out: set[int] = set()
    for a, b in spans:
        out.update(range(int(a), int(b)))
    return out


def _ticks_of(result: iv.Intervals) -> set[int]:
    s, e = result
    return _ticks(zip(s.tolist(), e.tolist()))


def _well_formed(result: iv.Intervals) -> None:
    s, e = result
    assert s.dtype == np.float64 and e.dtype == np.float64
    assert (e > s).all()
    assert (s[1:] >= e[:-1]).all()  # sorted and disjoint


settings_ = settings(max_examples=200, deadline=None)


@settings_
@given(SPANS)
def test_merge(spans) -> None:
    m = iv.merge(*_arrays(spans))
    _well_formed(m)
    assert (m[0][1:] > m[1][:-1]).all()  # touching blocks are merged too
    assert _ticks_of(m) == _ticks(spans)
    assert iv.length(m) == len(_ticks(spans))


@settings_
@given(SPANS, SPANS)
def test_intersect_subtract_union(a, b) -> None:
    ma, mb = iv.merge(*_arrays(a)), iv.merge(*_arrays(b))
    inter = iv.intersect(ma, mb)
    _well_formed(inter)
    assert _ticks_of(inter) == _ticks(a) & _ticks(b)
    diff = iv.subtract(ma, mb)
    _well_formed(diff)
    assert _ticks_of(diff) == _ticks(a) - _ticks(b)
    uni = iv.union(ma, mb)
    _well_formed(uni)
    assert _ticks_of(uni) == _ticks(a) | _ticks(b)
    assert iv.length(inter) + iv.length(diff) == iv.length(ma)


@settings_
@given(SPANS, st.integers(0, 60), st.integers(0, 60))
def test_clip_and_complement(a, lo, hi) -> None:
    m = iv.merge(*_arrays(a))
    window = set(range(lo, hi))
    clipped = iv.clip(m, lo, hi)
    assert _ticks_of(clipped) == _ticks(a) & window
    comp = iv.complement(m, lo, hi)
    _well_formed(comp)
    assert _ticks_of(comp) == window - _ticks(a)


def test_empty_inputs() -> None:
    empty = iv.merge([], [])
    assert iv.length(empty) == 0.0
    one = iv.merge([1.0], [2.0])
    assert iv.length(iv.intersect(one, empty)) == 0.0
    assert iv.length(iv.subtract(one, empty)) == 1.0
    assert iv.length(iv.union()) == 0.0


def test_clip_sorted_equals_clip_on_merged_intervals() -> None:
    """The binary-search clip gives exactly clip's arrays on disjoint sorted intervals, for windows
    before, inside, across and after them (and at their edges)."""
    import numpy as np

    from traceread import intervals as iv

    rng = np.random.default_rng(7)
    starts = np.sort(rng.uniform(0, 1000, 400))
    merged = iv.merge(starts, starts + rng.uniform(0, 5, 400))
    edges = [float(merged[0][3]), float(merged[1][10])]
    for lo, hi in [(-50, -1), (-1, 2000), (100, 101), (500, 700), (1500, 1600), (edges[0], edges[1]),
                   (float(merged[1][5]), float(merged[0][6]))]:
        a, b = iv.clip(merged, lo, hi), iv.clip_sorted(merged, lo, hi)
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]), (lo, hi)
