"""The slow-step rule of traceread.analysis.time.slow_steps, case by case, on per-rank step tables
whose every number is stated: which steps are slow, and what grew in them."""

from __future__ import annotations

import polars as pl

from traceread.analysis.time.slow_steps import MIN_EXCESS_FRACTION, find_slow_steps


def steps_table(n_ranks: int, n_steps: int, **extra: float) -> list[dict[str, float | int]]:
    """Every rank and step 10 000 µs: 7 000 compute, 2 000 exposed comm, 1 000 idle (+ ``extra``)."""
    return [dict(rank=r, step=s, duration=10_000.0, compute_us=7_000.0, exposed_comm_us=2_000.0, idle_us=1_000.0,
                 exposed_memcpy_us=0.0, **extra) for s in range(n_steps) for r in range(n_ranks)]


def test_tight_run_jitter_under_five_percent_is_not_slow() -> None:
    """A µs-tight run: the MAD is ~0, so the robust z-score alone flags any jitter; the 5 % floor keeps
    a step 3 % over the median normal, while one 6 % over is slow."""
    rows = steps_table(2, 8)
    for row in rows:
        row["duration"] += 0.5 * (row["step"] % 2)  # 0.5 µs of jitter: MAD 0.25 µs
        if row["step"] == 5:
            row["duration"] += 300.0  # +3 %
            row["idle_us"] += 300.0
    assert 300.0 < MIN_EXCESS_FRACTION * 10_000.0
    assert find_slow_steps(pl.DataFrame(rows)) == []
    for row in rows:
        if row["step"] == 5:
            row["duration"] += 300.0  # +6 %
            row["idle_us"] += 300.0
    (slow,) = find_slow_steps(pl.DataFrame(rows))
    # median job step 10 000.25 µs (four steps of 10 000, three of 10 000.5, the slow one)
    assert (slow["step"], slow["cause"], slow["excess_us"]) == (5, "host", 600.25)


def test_checkpoint_copies_nobody_hides_are_host_time() -> None:
    """Every rank copies its state to the host in step 4 (checkpoint D2H, exposed memcpy): the step is
    slow because of the host side, not 'unknown' and not one rank."""
    rows = steps_table(4, 10)
    for row in rows:
        if row["step"] == 4:
            row["exposed_memcpy_us"] += 5_000.0
            row["duration"] += 5_000.0
    (slow,) = find_slow_steps(pl.DataFrame(rows))
    assert (slow["step"], slow["cause"], slow["rank"], slow["excess_us"]) == (4, "host", None, 5_000.0)


def test_growth_that_explains_under_a_third_is_unknown() -> None:
    """Step 6 is 3 ms slower but no component grew by a third of that (1 ms): the cause is unknown,
    never the component that happens to be largest."""
    rows = steps_table(4, 10)
    for row in rows:
        if row["step"] == 6:
            row["duration"] += 3_000.0
            row["compute_us"] += 900.0
            row["exposed_comm_us"] += 800.0
            row["idle_us"] += 700.0
    (slow,) = find_slow_steps(pl.DataFrame(rows))
    assert (slow["step"], slow["cause"], slow["rank"], slow["excess_us"]) == (6, "unknown", None, 3_000.0)
    for row in rows:  # one more µs of compute than a third of the excess: compute is the cause
        if row["step"] == 6:
            row["compute_us"] += 101.0
    (slow,) = find_slow_steps(pl.DataFrame(rows))
    assert slow["cause"] == "compute"
