"""Which rank makes the others wait, how much step time that costs, and why it was late.

Per-rank timers cannot see a straggler: the collective is a barrier, so every rank's step takes as
long as the slowest one's. Only arrivals at matched collectives name the culprit.

Definitions (µs, clock-aligned arrivals = GPU start of the collective kernel, :mod:`comm_perf`),
over complete synchronising instances (allreduce, allgather, reduce-scatter, all-to-all, barrier,
broadcast):

* **late cluster** of an instance: the ranks arriving within ``ε`` (clock uncertainty,
  :mod:`clocks`) of the last arrival. **gap** = last arrival − latest arrival outside the cluster.
  Instances with ``gap ≤ ε`` blame nobody (skew noise is never attributed).
* **blame** of a cluster member = gap / cluster size: the time the collective — and so the step —
  would finish earlier if that rank were not late (TraceLens' "arrived last", quantified).
* ``blame_us_per_step`` = Σ blame over the instances, ÷ number of steps analysed (direct and
  propagated lateness alike: the definition is "how much sooner the collectives it was last to
  join would have finished"; ``root`` says whether the delay was its own). It is the time the others
  spent waiting for the rank, not what the step would gain: see ``impact_us_per_step``.
* ``arrived_last`` = number of instances where the rank was in a blamed late cluster.
* **cause** of one late arrival, from what the late rank's GPU did since its previous synchronising
  collective ``c⁻`` compared with the median on-time rank: ``gpu`` when it spent more extra time
  computing (compute-kernel busy time, slower kernels or more work) than sitting idle, ``host``
  when the extra time was idle — the GPU waited for work (dataloader, GC, Python, host sync).
  Without a previous collective: ``host`` when the launch came less than half the gap before the
  kernel started (most lateness accrued before the host issued it), else ``gpu`` — ``unknown``
  where no GPU work is measured (host-side collectives: the CPU issued it early, yet it started
  late). ``unknown`` without launch times. A rank's cause is the one carrying most of its (root) blame.
* **root vs propagated** (Böhme et al., Scalasca delay analysis): with ``c⁻`` the previous
  synchronising instance of each rank, the local interval ``I_r = arrival_r(c) − end_r(c⁻)``. The
  late rank is a *root* when ``I_late − median(I_on-time) > max(ε, gap/2)`` — it spent longer since
  its last synchronisation. Otherwise it only left ``c⁻`` late: if it was itself the one blamed in
  ``c⁻`` the delay is still its own (root); if another rank was, the lateness is *propagated* and
  ``evidence`` names that rank. A rank is ``root`` when most of its blame is.
* ``impact_us_per_step`` (extra) = how much shorter the job's step would be if this rank were on
  time, estimated from the trace's arrivals: its delays followed from collective to collective and
  counted once. Blame charges the full gap at every collective the rank was last to join; when its
  GPU keeps computing while a collective runs (DDP gradient buckets overlapping backward), that
  collective does not reset its lateness and the same delay makes it late again at the next bucket
  (8 ranks, 4 buckets, one GPU 3 ms/step slow: 8.7 ms/step of blame, 2.8 ms/step saved). Rule, per
  blamed instance ``c``: the *reference* rank is the latest on-time arrival (the one the gap is
  measured from), ``c⁻`` its previous synchronising collective in the same step. The reference
  **carries** ``c⁻``'s delay when its arrival at ``c`` could not have come before ``c⁻`` ended: it
  started within ``ε`` of ``c⁻``'s end (queued behind it on the stream) or its GPU computed for
  less than :data:`OVERLAP_FRACTION` of ``c⁻`` (its work waited for the result, as after a
  tensor-parallel all-reduce). For each *direct* late arrival of rank r (a fresh delay: its own
  interval ``I_r`` was longer, by the test of the previous point) the job's accumulated delay due
  to r is ``Δ_r(c) = blame_r(c) + (Δ_r(c⁻) if the reference carries c⁻ else 0)`` (r's latest Δ in
  the step stands in when r was not late at ``c⁻``). ``impact_us_per_step`` = Σ over steps of the
  largest Δ_r in the step ÷ steps analysed. In DDP that is the lateness at the last bucket; in
  tensor parallelism the sum of the fresh per-collective delays, a delay carried from the TP into
  the DP all-reduce counted once. Each Δ is a sum of distinct direct blames, so impact ≤ blame.
  Like blame it assumes nobody else would then be last. Against simulated re-runs without the
  straggler it is within a few % when the others' collectives overlap compute without queuing (DDP
  buckets ready one by one) or block on the result (TP); when their buckets queue behind the late
  one on the comm stream it can overstate the saving by up to ~30 %: the trace does not say how long
  before the queue freed each bucket was ready, and the rule carries the whole delay.

A rank is listed only when it stands out above noise: ``blame_us_per_step > max(ε, 1 % of the
median job step time, 3 × the lower-quartile rank's blame)``. The quartile is what jitter alone
hands a typical rank: when every rank is "last" now and then, nobody is listed; a median/MAD rule
would instead hide a straggler pair in a 4-rank job.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from traceread.analysis.comm.clocks import MIN_EPSILON_US, ClockModel
from traceread.analysis.comm.collectives import SYNC_OPS, Matched
from traceread.analysis.comm.perf import instance_timing, wait_matrix
from traceread.model import as_float
from traceread.report_schema import StragglerEntry

BLAME_OPS = SYNC_OPS | {"broadcast"}
#: A rank is listed when its blame exceeds this share of the median job step time ...
MIN_STEP_FRACTION = 0.01
#: ... and this many times the lower-quartile rank's blame (the share jitter alone gives a rank).
K_JITTER = 3.0
#: The reference rank's GPU computing for less than this share of a collective means its next work
#: waited for the result (a blocking collective passes the delay on).
OVERLAP_FRACTION = 0.5


@dataclass
class StragglerResult:
    """Listed stragglers, the heat map, and the per-instance blame records behind them."""

    entries: list[StragglerEntry]
    heatmap: dict[str, Any] | None
    records: pl.DataFrame  # instance, step, rank, blame_us, gap_us, cause, root, from_rank, pg, op
    epsilon_us: float
    n_steps: int
    step_time_us: float | None
    notes: list[str] = field(default_factory=list)


def _window_table(w: Any) -> pl.DataFrame:
    return w.table if hasattr(w, "table") else w


def job_step_times(step_windows_by_rank: dict[int, Any] | None) -> pl.DataFrame:
    """Job step time per step = max over ranks of the device step duration (step, duration)."""
    if not step_windows_by_rank:
        return pl.DataFrame(schema={"step": pl.Int64, "duration": pl.Float64})
    frames = [_window_table(w).select("step", "duration") for w in step_windows_by_rank.values()]
    frames = [f for f in frames if f.height]
    if not frames:
        return pl.DataFrame(schema={"step": pl.Int64, "duration": pl.Float64})
    return pl.concat(frames).group_by("step").agg(pl.col("duration").max()).sort("step")


def attribute(
    matched: Matched,
    step_windows_by_rank: dict[int, Any] | None = None,
    clock: ClockModel | None = None,
) -> StragglerResult:
    """Blame, cause and root/propagated per late rank (definitions in the module docstring)."""
    eps = clock.epsilon_us if clock is not None else MIN_EPSILON_US
    t = instance_timing(matched, clock, BLAME_OPS).sort(["instance", "rank"])
    steps_tab = job_step_times(step_windows_by_rank)
    # The steps analysed: the device step windows when given (partial trailing steps are already
    # dropped there), else the steps the collectives were launched in; real ProfilerSteps only when
    # there are any (events outside them, e.g. before the first marker, are not charged to a step).
    valid = {x for x in (steps_tab["step"].to_list() if steps_tab.height else matched.steps) if x is not None}
    if any(x >= 0 for x in valid):
        valid = {x for x in valid if x >= 0}
    n_steps = max(len(valid), 1)
    notes: list[str] = []
    step_time = as_float(steps_tab["duration"].median()) if steps_tab.height else None
    if step_time is None and t.height:
        step_time = (as_float(t["end"].max()) - as_float(t["ts"].min())) / n_steps
    records = _blame_records(t, eps)
    if valid and records.height and not records["step"].is_in(list(valid)).all():
        outside = int((~records["step"].is_in(list(valid))).sum())
        records = records.filter(pl.col("step").is_in(list(valid)))
        notes.append(f"{outside} late arrival(s) outside the analysed steps not counted")
    impacts = impact_per_step(records, t, n_steps, eps)
    entries = _aggregate(records, impacts, matched.ranks, n_steps, step_time, eps)
    ranks, hsteps, m = wait_matrix(matched, clock, BLAME_OPS)
    cols = [i for i, x in enumerate(hsteps) if x in valid] or list(range(len(hsteps)))
    heat = ({"ranks": ranks, "steps": [hsteps[i] for i in cols], "wait_us": m[:, cols].round(3).tolist()}
            if t.height else None)
    return StragglerResult(entries, heat, records, eps, n_steps, step_time, notes)


_RECORD_SCHEMA = {
    "instance": pl.Int64, "step": pl.Int64, "rank": pl.Int64, "blame_us": pl.Float64,
    "gap_us": pl.Float64, "cause": pl.Utf8, "root": pl.Boolean, "direct": pl.Boolean, "from_rank": pl.Int64,
    "pg": pl.Utf8, "op": pl.Utf8,
}


def _blame_records(t: pl.DataFrame, eps: float) -> pl.DataFrame:
    """One row per (blamed instance, late rank)."""
    if t.height == 0:
        return pl.DataFrame(schema=_RECORD_SCHEMA)
    # Previous synchronising instance of each rank, for the local interval I_r.
    t = t.sort(["rank", "ts"]).with_columns(
        pl.col("end").shift(1).over("rank").alias("prev_end"),
        pl.col("instance").shift(1).over("rank").alias("prev_instance"),
        pl.col("busy_at_end").shift(1).over("rank").alias("prev_busy"),
    ).with_columns(
        (pl.col("ts") - pl.col("prev_end")).alias("interval"),
        (pl.col("busy_at_start") - pl.col("prev_busy")).alias("busy"),
        pl.col("ts").max().over("instance").alias("_last"),
    ).sort(["_last", "instance", "ts"])
    inst_ids = t["instance"].to_numpy()
    bounds = np.flatnonzero(np.diff(inst_ids)) + 1
    starts = np.concatenate(([0], bounds))
    stops = np.concatenate((bounds, [len(inst_ids)]))
    ts = t["ts"].to_numpy()
    launch = t["launch_ts"].to_numpy().astype(np.float64)
    interval = t["interval"].to_numpy().astype(np.float64)
    busy = t["busy"].to_numpy().astype(np.float64)
    ranks = t["rank"].to_numpy()
    prev_inst = t["prev_instance"].to_list()
    stepc = t["step"].to_numpy()
    pgs = t["pg"].to_list()
    ops = t["op"].to_list()
    host_side = (t["backend"] == "gloo").to_numpy() if "backend" in t.columns else np.zeros(t.height, dtype=bool)
    rows: list[dict[str, Any]] = []
    blamed_in: dict[int, int] = {}  # instance -> rank with the largest blame there
    for a, b in zip(starts, stops):
        arr = ts[a:b]  # sorted ascending within the instance
        last = arr[-1]
        late = arr >= last - eps
        if late.all():
            continue
        on_time = ~late
        gap = float(last - arr[on_time].max())
        if gap <= eps:
            continue
        k = int(late.sum())
        i_on = interval[a:b][on_time]
        b_on = busy[a:b][on_time]
        best = None
        for j in np.flatnonzero(late):
            idx = a + j
            q = launch[idx]
            cause = _cause(interval[idx], busy[idx], i_on, b_on, ts[idx], q, gap, bool(host_side[idx]))
            root, direct, from_rank = True, True, None
            if not np.isnan(interval[idx]) and np.any(~np.isnan(i_on)):
                delta = interval[idx] - _median(i_on[~np.isnan(i_on)])
                if delta <= max(eps, 0.5 * gap):
                    root = direct = False
                    p = prev_inst[idx]
                    from_rank = blamed_in.get(p) if p is not None else None
                    if from_rank == int(ranks[idx]):
                        root, from_rank = True, None  # still its own delay, carried over one sync
            rows.append({
                "instance": int(inst_ids[idx]), "step": int(stepc[idx]), "rank": int(ranks[idx]),
                "blame_us": gap / k, "gap_us": gap, "cause": cause, "root": root, "direct": direct,
                "from_rank": from_rank, "pg": pgs[idx], "op": ops[idx],
            })
            best = int(ranks[idx]) if best is None else best
        if best is not None:
            blamed_in[int(inst_ids[a])] = best
    return pl.DataFrame(rows, schema=_RECORD_SCHEMA) if rows else pl.DataFrame(schema=_RECORD_SCHEMA)


def impact_per_step(records: pl.DataFrame, timing: pl.DataFrame, n_steps: int, eps: float) -> dict[int, float]:
    """Per rank with blame records: ``impact_us_per_step`` (Σ over steps of the largest Δ_r ÷
    ``n_steps``, module docstring); 0 for a rank late only through others' delays.

    ``records``: :attr:`StragglerResult.records` (uses instance, step, rank, blame_us, direct);
    ``timing``: :func:`comm_perf.instance_timing` over the same collectives; ``eps``: the ε of the records.
    """
    if records.height == 0 or timing.height == 0:
        return {}
    carries = _carries(timing, eps)
    last = timing.group_by("instance").agg(pl.col("ts").max().alias("_last"))
    rec = records.filter(pl.col("direct")).join(last, on="instance", how="left").sort("_last")
    delta: dict[tuple[int, int], float] = {}  # (rank, instance) -> Δ
    latest: dict[tuple[int, int], float] = {}  # (rank, step) -> most recent Δ
    worst: dict[tuple[int, int], float] = defaultdict(float)  # (rank, step) -> largest Δ
    for inst, step, rank, blame in rec.select("instance", "step", "rank", "blame_us").iter_rows():
        r, s = int(rank), int(step)
        carry, prev = carries.get(int(inst), (False, None))
        carried = delta.get((r, prev), latest.get((r, s), 0.0)) if carry and prev is not None else 0.0
        d = float(blame) + carried
        delta[(r, int(inst))] = latest[(r, s)] = d
        worst[(r, s)] = max(worst[(r, s)], d)
    out = {int(r): 0.0 for r in records["rank"].unique().to_list()}
    for (r, _s), d in worst.items():
        out[r] += d / max(int(n_steps), 1)
    return out


def _carries(timing: pl.DataFrame, eps: float) -> dict[int, tuple[bool, int | None]]:
    """instance -> (its reference arrival carries the delay of ``c⁻``, ``c⁻``) — module docstring."""
    t = timing.select("instance", "rank", "step", "ts", "end", "busy_at_start", "busy_at_end").sort(["rank", "ts"])
    dur = (pl.col("end") - pl.col("ts")).clip(lower_bound=0.0)
    t = t.with_columns(
        ((pl.col("busy_at_end") - pl.col("busy_at_start")) >= OVERLAP_FRACTION * dur).alias("_ovl"),
    ).with_columns(
        pl.col("instance").shift(1).over("rank").alias("prev_instance"),
        pl.col("step").shift(1).over("rank").alias("prev_step"),
        pl.col("end").shift(1).over("rank").alias("prev_end"),
        pl.col("_ovl").shift(1).over("rank").alias("prev_ovl"),
        pl.col("ts").max().over("instance").alias("_last"),
    )
    ref = (t.filter(pl.col("ts") < pl.col("_last") - eps)
           .sort("ts").group_by("instance").agg(pl.all().last()))
    out: dict[int, tuple[bool, int | None]] = {}
    for row in ref.iter_rows(named=True):
        same_step = row["prev_instance"] is not None and row["prev_step"] == row["step"]
        queued = row["prev_end"] is not None and row["ts"] - row["prev_end"] <= eps
        waited = row["prev_ovl"] is False  # null (no busy data) is not evidence of waiting
        out[int(row["instance"])] = (bool(same_step and (queued or waited)),
                                     int(row["prev_instance"]) if same_step else None)
    return out


def _median(a: np.ndarray) -> float:
    """``np.median`` of a small NaN-free 1-D float array, without its per-call overhead (same value:
    the middle element, or the mean of the two middle ones computed as (lo + hi) / 2)."""
    s = np.sort(a)
    m = s.size // 2
    return float(s[m]) if s.size % 2 else float((s[m - 1] + s[m]) / 2)


def _cause(interval: float, busy: float, i_on: np.ndarray, b_on: np.ndarray, arrival: float,
           launch: float, gap: float, host_side: bool = False) -> str:
    """gpu / host / unknown for one late arrival (see the module docstring)."""
    ok = ~np.isnan(i_on) & ~np.isnan(b_on)
    if not np.isnan(interval) and not np.isnan(busy) and ok.any():
        more_busy = busy - _median(b_on[ok])
        more_idle = (interval - busy) - _median((i_on - b_on)[ok])
        return "gpu" if more_busy >= more_idle else "host"
    if np.isnan(launch):
        return "unknown"
    if host_side:  # a host-side collective (gloo): no GPU work measured, never "gpu"
        return "host" if arrival - launch < 0.5 * gap else "unknown"
    return "host" if arrival - launch < 0.5 * gap else "gpu"


def _aggregate(
    rec: pl.DataFrame, impacts: dict[int, float], ranks: list[int], n_steps: int,
    step_time: float | None, eps: float,
) -> list[StragglerEntry]:
    if rec.height == 0:
        return []
    per = {r: 0.0 for r in ranks}
    for r, v in rec.group_by("rank").agg(pl.col("blame_us").sum()).iter_rows():
        per[int(r)] = float(v) / n_steps
    vals = np.array(list(per.values()))
    jitter = float(np.percentile(vals, 25))  # what run-to-run jitter alone hands a typical rank
    threshold = max(eps, MIN_STEP_FRACTION * (step_time or 0.0), K_JITTER * jitter)
    out: list[StragglerEntry] = []
    order = sorted(per.items(), key=lambda kv: -kv[1])
    for r, blame in order:
        if blame <= threshold:
            continue
        mine = rec.filter(pl.col("rank") == r)
        direct = mine.filter(pl.col("root"))
        root = float(direct["blame_us"].sum()) >= 0.5 * float(mine["blame_us"].sum())
        basis = direct if (root and direct.height) else mine
        by_cause = basis.group_by("cause").agg(pl.col("blame_us").sum()).sort("blame_us", descending=True)
        cause = str(by_cause["cause"][0])
        top = (mine.group_by(["pg", "op"]).agg(pl.col("blame_us").sum(), pl.len().alias("n"))
               .sort("blame_us", descending=True).row(0, named=True))
        ev = (f"arrived last {mine.height}× (gap ≥ ε = {eps:.0f} µs); most in {top['op']} on pg "
              f"'{top['pg'] or 'default'}' ({top['n']}×, {top['blame_us'] / n_steps:.0f} µs/step)")
        if cause == "host":
            ev += "; before the collective its GPU sat idle longer than its peers' (the host was late with work)"
        elif cause == "gpu":
            ev += "; before the collective its GPU computed longer than its peers' (slower GPU or more work)"
        if not root:
            froms = [x for x in mine["from_rank"].to_list() if x is not None and x != r]
            ev += ("; late only because it left the previous collective late"
                   + (f" (waiting on rank {max(set(froms), key=froms.count)})" if froms else ""))
        out.append({
            "rank": r, "blame_us_per_step": blame, "arrived_last": mine.height, "cause": cause,
            "root": root, "evidence": ev,
            "impact_us_per_step": impacts.get(r, 0.0),
        })
    return out
