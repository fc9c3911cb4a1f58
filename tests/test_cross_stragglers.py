"""Straggler blame, impact, cause, root vs propagated, skew robustness, and slow steps (hand-built inputs).

Every expected number follows from how the rows are constructed: NCCL semantics (all members end at
last arrival + transfer), launch 20 µs before a kernel that was not waiting, etc.
"""

from __future__ import annotations

import polars as pl
import pytest

from traceread.analysis.comm.clocks import estimate_offsets
from traceread.analysis.comm.collectives import EXTRACT_SCHEMA, match_collectives
from traceread.analysis.comm.stragglers import attribute, impact_per_step
from traceread.analysis.time.slow_steps import find_slow_steps


def _ev(rank: int, pg: str, seq: int, ts: float, end: float, launch: float, step: int,
        ranks: list[int], busy: float | None = None) -> dict[str, object]:
    return dict(rank=rank, backend="nccl", stream=7, kernel="ncclDevKernel_AllReduce", op="allreduce",
                p2p=False, pg=pg, pg_desc=pg, pg_ranks=str(ranks), group_size=len(ranks), dtype="BFloat16",
                in_nelems=1 << 20, out_nelems=1 << 20, seq=seq, comms_id=None, src_rank=None, dst_rank=None,
                ts=ts, end=end, launch_ts=launch, step=step, busy_at_start=busy, busy_at_end=busy)


def ddp(n: int, steps: int, late: int, delay: float, *, host_late: bool, skew: dict[int, float] | None = None,
        step_len: float = 10_000.0, late_launch: bool = True) -> pl.DataFrame:
    """One allreduce per step after 4 ms of compute; ``late`` reaches it ``delay`` µs late.
    Host-late: its GPU computed the same 4 ms but sat idle ``delay`` longer, and the launch is late
    too; GPU-late: launched on time, its GPU computed ``delay`` longer."""
    rows = []
    for s in range(steps):
        t0 = step_len * s + 5_000.0
        end = t0 + delay + 100.0
        for r in range(n):
            o = (skew or {}).get(r, 0.0)
            a = t0 + (delay if r == late else 0.0)
            q = (a - 20.0) if (host_late and late_launch and r == late) else (t0 - 20.0)
            per_step = 4_000.0 + (delay if (r == late and not host_late) else 0.0)
            rows.append(_ev(r, "0", s + 1, a + o, end + o, q + o, s, list(range(n)), busy=per_step * (s + 1)))
    return pl.DataFrame(rows, schema=EXTRACT_SCHEMA)


def windows(n: int, steps: int, step_len: float = 10_000.0) -> dict[int, pl.DataFrame]:
    t = pl.DataFrame({"step": list(range(steps)), "start": [step_len * s for s in range(steps)],
                      "end": [step_len * (s + 1) for s in range(steps)], "duration": [step_len] * steps})
    return {r: t for r in range(n)}


@pytest.mark.parametrize("host_late,cause", [(True, "host"), (False, "gpu")])
def test_single_straggler_blame_and_cause(host_late: bool, cause: str) -> None:
    m = match_collectives(ddp(8, 5, 3, 400.0, host_late=host_late))
    res = attribute(m, windows(8, 5), estimate_offsets(m))
    assert [e["rank"] for e in res.entries] == [3]
    e = res.entries[0]
    assert e["blame_us_per_step"] == pytest.approx(400.0)
    assert e["arrived_last"] == 5 and e["cause"] == cause and e["root"] is True
    assert e["impact_us_per_step"] == pytest.approx(400.0)  # one fresh delay per step: impact = blame
    hm = res.heatmap
    assert hm is not None and hm["ranks"] == list(range(8)) and hm["steps"] == list(range(5))
    assert hm["wait_us"][3] == [0.0] * 5 and hm["wait_us"][0] == [400.0] * 5


def test_host_cause_from_idle_gpu_even_when_the_collective_was_launched_early() -> None:
    """A dataloader stall at the start of the step: the host then launches everything, the
    collective included, ahead of the GPU — the launch looks early, but the GPU sat idle ``delay``
    longer than its peers since the previous collective: host."""
    m = match_collectives(ddp(8, 5, 3, 400.0, host_late=True, late_launch=False))
    res = attribute(m, windows(8, 5), estimate_offsets(m))
    assert [(e["rank"], e["cause"]) for e in res.entries] == [(3, "host")]


def test_blame_unchanged_under_host_clock_skew() -> None:
    """Ranks 4-7 on a second host whose clock runs 5 ms ahead: uncorrected, every one of them would
    look 5 ms late. After alignment the blame is the same as without skew."""
    skew = {r: 5_000.0 for r in range(4, 8)}
    base = attribute(m0 := match_collectives(ddp(8, 5, 2, 300.0, host_late=False)), windows(8, 5),
                     estimate_offsets(m0))
    m = match_collectives(ddp(8, 5, 2, 300.0, host_late=False, skew=skew))
    clock = estimate_offsets(m)
    assert clock.offsets_us[5] == pytest.approx(5_000.0)
    res = attribute(m, windows(8, 5), clock)
    assert [(e["rank"], round(e["blame_us_per_step"], 6), e["cause"]) for e in res.entries] == \
        [(e["rank"], round(e["blame_us_per_step"], 6), e["cause"]) for e in base.entries]
    # without the correction the second host takes the blame: the reason for clocks.py
    wrong = attribute(m, windows(8, 5), None)
    assert {e["rank"] for e in wrong.entries} != {2}


def test_noise_below_threshold_blames_nobody() -> None:
    m = match_collectives(ddp(8, 5, 1, 40.0, host_late=False))  # 40 µs = 0.4 % of a 10 ms step
    assert attribute(m, windows(8, 5), estimate_offsets(m)).entries == []
    m = match_collectives(ddp(8, 5, 1, 3.0, host_late=False))  # below ε: not even a record
    assert attribute(m, windows(8, 5), estimate_offsets(m)).records.height == 0


def test_propagated_lateness_is_not_root() -> None:
    """TP groups {0,1},{2,3}, DP groups {0,2},{1,3}. Rank 1 is 300 µs late to its TP allreduce
    (GPU-late); ranks 0 and 1 leave TP 300 µs after ranks 2, 3 and both arrive 300 µs late at their
    DP allreduce 50 µs later. Rank 1 is the root: blamed 300 µs in TP plus 300 µs in its DP
    allreduce (last there too, carrying its own delay) = 600 µs/step by the definition; rank 0 is
    last in dp0 by 300 µs only because it waited on rank 1 (root False)."""
    rows = []
    for s in range(4):
        t0 = 10_000.0 * s + 1_000.0
        tp_end = {0: t0 + 400, 1: t0 + 400, 2: t0 + 100, 3: t0 + 100}
        for r in range(4):
            a = t0 + (300.0 if r == 1 else 0.0)
            tp = "tp0" if r < 2 else "tp1"
            rows.append(_ev(r, tp, s + 1, a, tp_end[r], t0 - 20, s, [0, 1] if r < 2 else [2, 3]))
        for dp, members in (("dp0", [0, 2]), ("dp1", [1, 3])):
            end = max(tp_end[x] for x in members) + 50 + 100
            for r in members:
                rows.append(_ev(r, dp, s + 1, tp_end[r] + 50, end, t0 - 10, s, members))  # host ran ahead
    m = match_collectives(pl.DataFrame(rows, schema=EXTRACT_SCHEMA))
    res = attribute(m, windows(4, 4), estimate_offsets(m))
    by = {e["rank"]: e for e in res.entries}
    assert by[1]["root"] is True and by[1]["blame_us_per_step"] == pytest.approx(600.0)
    assert by[0]["blame_us_per_step"] == pytest.approx(300.0)
    # the 300 µs rank 1 carries into the DP all-reduce is the same delay: impact counts it once
    assert by[1]["impact_us_per_step"] == pytest.approx(300.0)
    assert by[0]["impact_us_per_step"] == 0.0
    assert by[1]["cause"] == "gpu"
    assert by[0]["root"] is False and "rank 1" in by[0]["evidence"]
    assert res.entries[0]["rank"] == 1  # roots come first



GAPS = [1000.0, 1500.0, 2000.0]  # rank 1's lateness at the 3 collectives of a step
T = 100.0  # transfer time: every member ends at last arrival + T
EPS = 5.0


def buckets(*, overlapped: bool, n: int = 4, steps: int = 3, step_len: float = 20_000.0) -> pl.DataFrame:
    """3 all-reduces per step, rank 1 late by :data:`GAPS`, its GPU slow (it computes the whole time).

    ``overlapped`` (DDP buckets): the on-time ranks compute through every collective and reach the
    next one at a fixed time, 3 ms apart, whatever the previous one did — were rank 1 on time, only
    the last bucket (so the step) would end earlier, by GAPS[-1]. Else (tensor parallel) they wait
    for each result and compute 1 ms before the next one: every gap shifts the rest of the step, so
    the step would be sum(GAPS) shorter.
    """
    rows = []
    for s in range(steps):
        t0 = step_len * s + 1_000.0
        busy = {r: step_len * s for r in range(n)}
        a0 = t0
        for i, g in enumerate(GAPS):
            a1 = a0 + g
            end = a1 + T
            for r in range(n):
                a = a1 if r == 1 else a0
                start_busy = (a - t0 + step_len * s) if (overlapped or r == 1) else busy[r]
                end_busy = (end - t0 + step_len * s) if overlapped else start_busy
                row = _ev(r, "0", 3 * s + i + 1, a, end, a - 20.0, s, list(range(n)))
                row.update(busy_at_start=start_busy, busy_at_end=end_busy)
                rows.append(row)
                busy[r] = end_busy + 1_000.0
            a0 = (t0 + 3_000.0 * (i + 1)) if overlapped else (end + 1_000.0)
    return pl.DataFrame(rows, schema=EXTRACT_SCHEMA)


@pytest.mark.parametrize("overlapped,saved", [(True, GAPS[-1]), (False, sum(GAPS))])
def test_impact_is_the_step_time_saved(overlapped: bool, saved: float) -> None:
    """Blame is the others' wait at every collective (4500 µs/step either way); impact is what the
    step gains: the last gap when the others compute through the collectives, the sum when they wait."""
    m = match_collectives(buckets(overlapped=overlapped))
    res = attribute(m, windows(4, 3, 20_000.0), estimate_offsets(m))
    (e,) = res.entries
    assert e["rank"] == 1 and e["root"] is True and e["cause"] == "gpu"
    assert e["blame_us_per_step"] == pytest.approx(sum(GAPS))
    assert e["impact_us_per_step"] == pytest.approx(saved)


def timeline(*, overlapped: bool, queued: bool, direct: bool = True) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(records, timing) of two ranks, one step, rank 1 late by :data:`GAPS`. ``overlapped``: rank 0
    computes through each collective; ``queued``: its next collective starts the moment the previous
    one ends (same stream), else 50 µs later."""
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


def test_impact_overlapped_collectives_count_the_delay_once() -> None:
    """DDP buckets: rank 1's lateness at each bucket already contains the earlier one; the step ends
    2000 µs late, not 4500 (the sum of the waits)."""
    rec, tim = timeline(overlapped=True, queued=False)
    assert impact_per_step(rec, tim, n_steps=1, eps=EPS) == {1: pytest.approx(GAPS[-1])}


def test_impact_blocking_collectives_add_up() -> None:
    """Tensor parallel: rank 0 waits for each result, so every gap is new time on the step."""
    rec, tim = timeline(overlapped=False, queued=False)
    assert impact_per_step(rec, tim, n_steps=1, eps=EPS) == {1: pytest.approx(sum(GAPS))}


def test_impact_queued_collectives_add_up() -> None:
    """Same comm stream: rank 0's next collective could only start when the late one ended (the rule
    takes it as ready before then: the trace cannot say)."""
    rec, tim = timeline(overlapped=True, queued=True)
    assert impact_per_step(rec, tim, n_steps=1, eps=EPS) == {1: pytest.approx(sum(GAPS))}


def test_impact_propagated_lateness_and_steps() -> None:
    rec, tim = timeline(overlapped=True, queued=False, direct=False)
    assert impact_per_step(rec, tim, n_steps=1, eps=EPS) == {1: 0.0}  # someone else's delay
    rec, tim = timeline(overlapped=True, queued=False)
    assert impact_per_step(rec, tim, n_steps=4, eps=EPS) == {1: pytest.approx(GAPS[-1] / 4)}
    assert impact_per_step(rec.clear(), tim, n_steps=1, eps=EPS) == {}


def _breakdown(n: int, steps: int) -> list[dict[str, float | int]]:
    rows = []
    for s in range(steps):
        for r in range(n):
            rows.append(dict(rank=r, step=s, duration=10_000.0 + 10 * ((s * 7 + r) % 3), compute_us=7_000.0,
                             exposed_comm_us=2_000.0, idle_us=1_000.0 + 10 * ((s * 7 + r) % 3)))
    return rows


def test_slow_steps_one_rank_and_job_wide_causes() -> None:
    rows = _breakdown(4, 12)
    for row in rows:
        if row["step"] == 3:  # rank 2 computes 3 ms more; the others wait -> exposed comm grows
            if row["rank"] == 2:
                row["compute_us"] += 3_000.0
            else:
                row["exposed_comm_us"] += 3_000.0
            row["duration"] += 3_000.0
        if row["step"] == 7:  # every rank idle 2 ms longer: data loader
            row["idle_us"] += 2_000.0
            row["duration"] += 2_000.0
        if row["step"] == 9:  # network slowdown: exposed comm everywhere
            row["exposed_comm_us"] += 1_500.0
            row["duration"] += 1_500.0
    out = find_slow_steps(pl.DataFrame(rows))
    got = {e["step"]: (e["cause"], round(e["excess_us"])) for e in out}
    # job step time = max over ranks = 10 020 µs in every normal step (some rank has +20 jitter),
    # so the excess is exactly what was added
    assert got == {3: ("rank:2", 3_000), 7: ("host", 2_000), 9: ("exposed_comm", 1_500)}
    assert all(e["median_us"] == 10_020.0 for e in out)


def test_slow_steps_needs_real_excess() -> None:
    assert find_slow_steps(pl.DataFrame(_breakdown(4, 12))) == []  # ±20 µs jitter only
    assert find_slow_steps(pl.DataFrame(_breakdown(2, 2))) == []  # too few steps to judge
