"""Pipeline detection and bubble on ideal hand-built schedules (exact theory applies).

The schedule below is a tiny dependency solver independent of traceread: stage i runs its ordered
list of forward F(j)/backward B(j); F(i, j) needs F(i-1, j), B(i, j) needs B(i+1, j) (on the last
stage, its own F). With uniform stages and instant transfers GPipe and 1F1B both take
(P-1+M)(f+b), each stage computes M(f+b): measured bubble = (P-1)/(P-1+M) exactly.
"""

from __future__ import annotations

import polars as pl
import pytest

from traceread.analysis.comm.collectives import EXTRACT_SCHEMA, match_collectives
from traceread.analysis.comm.pipeline import ACTIVITY_SCHEMA, detect_pipeline, pipeline_chains


def order(stage: int, P: int, M: int, schedule: str) -> list[tuple[str, int]]:
    if schedule == "gpipe":
        return [("F", j) for j in range(M)] + [("B", j) for j in range(M)]
    warm = min(P - stage - 1, M)
    out = [("F", j) for j in range(warm)]
    f, b = warm, 0
    while f < M:
        out += [("F", f), ("B", b)]
        f, b = f + 1, b + 1
    return out + [("B", j) for j in range(b, M)]


def solve(P: int, M: int, schedule: str, f: float, b: float, factors: list[float] | None = None):
    factors = factors or [1.0] * P
    end: dict[tuple[str, int, int], float] = {}
    start: dict[tuple[str, int, int], float] = {}
    pos = [0] * P
    free = [0.0] * P
    prev_end_at_issue: dict[tuple[str, int, int], float] = {}
    lists = [order(i, P, M, schedule) for i in range(P)]
    while any(pos[i] < len(lists[i]) for i in range(P)):
        progressed = False
        for i in range(P):
            while pos[i] < len(lists[i]):
                kind, j = lists[i][pos[i]]
                dep = ("F", i - 1, j) if kind == "F" and i > 0 else (
                    ("B", i + 1, j) if kind == "B" and i < P - 1 else (("F", i, j) if kind == "B" else None))
                if dep is not None and dep not in end:
                    break
                prev_end_at_issue[(kind, i, j)] = free[i]
                s = max(free[i], end[dep] if dep else 0.0)
                d = (f if kind == "F" else b) * factors[i]
                start[(kind, i, j)], end[(kind, i, j)] = s, s + d
                free[i] = s + d
                pos[i] += 1
                progressed = True
        assert progressed
    return start, end, prev_end_at_issue, max(free)


def build(P: int, M: int, schedule: str, steps: int = 2, f: float = 100.0, b: float = 200.0,
          factors: list[float] | None = None, dp: int = 1):
    rows, act = [], {}
    start, end, issue, T = solve(P, M, schedule, f, b, factors)
    for rep in range(dp):
        ranks = [rep * P + i for i in range(P)]
        for s in range(steps):
            t0 = s * (T + 50.0)
            for i, r in enumerate(ranks):
                a = [dict(rank=r, step=s, kind="window", start=t0, end=t0 + T)]
                for (kind, st, j), e in end.items():
                    if st == i:
                        a.append(dict(rank=r, step=s, kind="compute", start=t0 + start[(kind, st, j)], end=t0 + e))
                act[r] = pl.concat([act[r], pl.DataFrame(a, schema=ACTIVITY_SCHEMA)]) if r in act else \
                    pl.DataFrame(a, schema=ACTIVITY_SCHEMA)

            def p2p(rank: int, op: str, src: int, dst: int, launch: float, ts: float, e: float,
                    t0: float = t0, s: int = s) -> None:
                rows.append(dict(rank=rank, backend="nccl", stream=21, kernel="ncclDevKernel_SendRecv", op=op,
                                 p2p=True, pg="0", pg_desc="default_pg", pg_ranks=None, group_size=P * dp,
                                 dtype="BFloat16", in_nelems=1000, out_nelems=1000, seq=None, comms_id=None,
                                 src_rank=src, dst_rank=dst, ts=t0 + ts, end=t0 + e, launch_ts=t0 + launch, step=s))
            for j in range(M):
                for i in range(P - 1):
                    fe = end[("F", i, j)]  # activation i -> i+1, recv posted when stage i+1 issues F(j)
                    p2p(ranks[i], "send", ranks[i], ranks[i + 1], fe, fe, fe)
                    rl = issue[("F", i + 1, j)]
                    p2p(ranks[i + 1], "recv", ranks[i], ranks[i + 1], rl, min(rl, fe), fe)
                    be = end[("B", i + 1, j)]  # gradient i+1 -> i
                    p2p(ranks[i + 1], "send", ranks[i + 1], ranks[i], be, be, be)
                    rl = issue[("B", i, j)]
                    p2p(ranks[i], "recv", ranks[i + 1], ranks[i], rl, min(rl, be), be)
    return pl.DataFrame(rows, schema=EXTRACT_SCHEMA), act


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize("P,M", [(4, 4), (4, 8), (2, 6)])
def test_stages_microbatches_schedule_and_bubble(schedule: str, P: int, M: int) -> None:
    ex, act = build(P, M, schedule)
    m = match_collectives(ex)
    assert m.mismatches == [] and m.instances["complete"].all()
    pp = detect_pipeline(m, act)
    assert pp is not None
    assert pp["stages"] == P and pp["microbatches"] == M
    assert pp["schedule"] == schedule
    theory = (P - 1) / (P - 1 + M) * 100
    assert pp["theory_bubble_pct"] == pytest.approx(theory)
    assert pp["bubble_pct"] == pytest.approx(theory, abs=1.0)
    assert pp["unbalanced"] is False
    assert {b["kind"] for b in pp["timeline"]} <= {"fwd", "bwd", "p2p", "compute"}
    assert len(pp["per_stage"]) == P


def test_dp_replicas_and_unbalanced_stage() -> None:
    ex, act = build(4, 4, "1f1b", factors=[1.0, 1.0, 1.3, 1.0], dp=2)
    m = match_collectives(ex)
    chains, ring = pipeline_chains(m)
    assert chains == [[0, 1, 2, 3], [4, 5, 6, 7]] and not ring
    pp = detect_pipeline(m, act)
    assert pp is not None and pp["unbalanced"] is True
    # the slow stage computes most, so it has the smallest bubble
    stage2 = next(s for s in pp["per_stage"] if s["stage"] == 2)
    assert stage2["bubble_pct"] == min(s["bubble_pct"] for s in pp["per_stage"])


def test_no_pipeline_without_p2p() -> None:
    rows = [dict(rank=r, backend="nccl", stream=7, kernel="k", op="allreduce", p2p=False, pg="0", pg_desc=None,
                 pg_ranks=None, group_size=2, dtype="Float", in_nelems=1, out_nelems=1, seq=1, comms_id=None,
                 src_rank=None, dst_rank=None, ts=0.0, end=1.0, launch_ts=0.0, step=0) for r in range(2)]
    assert detect_pipeline(match_collectives(pl.DataFrame(rows, schema=EXTRACT_SCHEMA))) is None


def test_interleaved_ring_gives_virtual_stages() -> None:
    """Interleaved 1F1B with P=4 ranks, v=2 model chunks, M=4 microbatches: activations travel
    0->1->2->3 for each chunk and wrap 3->0 between chunks; gradients the other way. Per step a
    normal edge carries v*M = 8 forward transfers, the wrap edge (v-1)*M = 4."""
    P, v, M = 4, 2, 4
    rows, t = [], 0.0

    def xfer(src: int, dst: int) -> None:
        nonlocal t
        for rank, op in ((src, "send"), (dst, "recv")):
            rows.append(dict(rank=rank, backend="nccl", stream=21, kernel="ncclDevKernel_SendRecv", op=op, p2p=True,
                             pg="0", pg_desc=None, pg_ranks=None, group_size=P, dtype="BFloat16", in_nelems=8,
                             out_nelems=8, seq=None, comms_id=None, src_rank=src, dst_rank=dst, ts=t, end=t + 1,
                             launch_ts=t, step=0))
        t += 10.0

    for _ in range(M):
        for c in range(v):
            for i in range(P - 1):
                xfer(i, i + 1)
            if c < v - 1:
                xfer(P - 1, 0)
    for _ in range(M):
        for c in range(v):
            for i in range(P - 1, 0, -1):
                xfer(i, i - 1)
            if c < v - 1:
                xfer(0, P - 1)
    m = match_collectives(pl.DataFrame(rows, schema=EXTRACT_SCHEMA))
    chains, ring = pipeline_chains(m)
    assert ring and chains == [[0, 1, 2, 3]]
    pp = detect_pipeline(m)
    assert pp is not None
    assert (pp["stages"], pp["microbatches"], pp["schedule"]) == (4, 4, "interleaved")
    assert pp["theory_bubble_pct"] == pytest.approx(100 * (3 / 2) / (3 / 2 + 4))
    assert pp["bubble_pct"] is None  # no activity extracts given: no measured bubble


def test_even_ring_is_not_a_pipeline() -> None:
    """Ring attention: every rank sends to the next one around a ring, the same number of times on
    every edge — no wrap-around edge with less traffic, so no pipeline."""
    rows = []
    for k in range(3):
        for r in range(4):
            nxt = (r + 1) % 4
            for rank, op in ((r, "send"), (nxt, "recv")):
                rows.append(dict(rank=rank, backend="nccl", stream=21, kernel="ncclDevKernel_SendRecv", op=op,
                                 p2p=True, pg="0", pg_desc=None, pg_ranks=None, group_size=4, dtype="BFloat16",
                                 in_nelems=8, out_nelems=8, seq=None, comms_id=None, src_rank=r, dst_rank=nxt,
                                 ts=100.0 * k, end=100.0 * k + 5, launch_ts=100.0 * k, step=0))
    m = match_collectives(pl.DataFrame(rows, schema=EXTRACT_SCHEMA))
    assert pipeline_chains(m) == ([], False)
    assert detect_pipeline(m) is None
