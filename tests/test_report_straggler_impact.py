"""straggler_impact.step_impact_per_step on hand-built timelines where the step time saved is known.

Two ranks, one step, three collectives of 100 µs; rank 1 arrives 1000, 1500 and 2000 µs after rank 0.
"""

from __future__ import annotations

import polars as pl
import pytest

from traceread.analysis.straggler_impact import step_impact_per_step

GAPS = [1000.0, 1500.0, 2000.0]
T = 100.0
EPS = 5.0


def timeline(*, overlapped: bool, queued: bool, direct: bool = True) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(records, timing). ``overlapped``: rank 0 computes through each collective; ``queued``: its next
    collective starts the moment the previous one ends (same stream), else 50 µs later."""
    rows, recs = [], []
    a0, busy0, busy1 = 0.0, 0.0, 0.0
    for i, g in enumerate(GAPS):
        a1 = a0 + g
        end = a1 + T
        d0 = (end - a0) if overlapped else 0.0
        rows.append(dict(instance=i, rank=0, step=10, ts=a0, end=end, busy_at_start=busy0, busy_at_end=busy0 + d0))
        rows.append(dict(instance=i, rank=1, step=10, ts=a1, end=end, busy_at_start=busy1, busy_at_end=busy1 + T))
        busy0 += d0 + 10.0
        busy1 += T + 10.0
        recs.append(dict(instance=i, step=10, rank=1, blame_us=g, gap_us=g, direct=direct))
        a0 = end if queued else end + 50.0
    return pl.DataFrame(recs), pl.DataFrame(rows)


def test_overlapped_collectives_count_the_delay_once() -> None:
    """DDP buckets: rank 1's lateness at each bucket already contains the earlier one; the step ends
    2000 µs late, not 4500 (the sum of the waits)."""
    rec, tim = timeline(overlapped=True, queued=False)
    assert step_impact_per_step(rec, tim, n_steps=1, eps=EPS) == {1: pytest.approx(GAPS[-1])}


def test_blocking_collectives_add_up() -> None:
    """Tensor parallel: rank 0 waits for each result, so every gap is new time on the step."""
    rec, tim = timeline(overlapped=False, queued=False)
    assert step_impact_per_step(rec, tim, n_steps=1, eps=EPS) == {1: pytest.approx(sum(GAPS))}


def test_queued_collectives_add_up() -> None:
    """Same comm stream: rank 0's next collective could only start when the late one ended."""
    rec, tim = timeline(overlapped=True, queued=True)
    assert step_impact_per_step(rec, tim, n_steps=1, eps=EPS) == {1: pytest.approx(sum(GAPS))}


def test_propagated_lateness_and_steps() -> None:
    rec, tim = timeline(overlapped=True, queued=False, direct=False)
    assert step_impact_per_step(rec, tim, n_steps=1, eps=EPS) == {1: 0.0}  # someone else's delay
    rec, tim = timeline(overlapped=True, queued=False)
    assert step_impact_per_step(rec, tim, n_steps=4, eps=EPS) == {1: pytest.approx(GAPS[-1] / 4)}
    assert step_impact_per_step(rec.clear(), tim, n_steps=1, eps=EPS) == {}
