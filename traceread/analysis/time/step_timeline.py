"""Real GPU intervals of a few steps, for the report's step timeline chart.

Map (per rank, :func:`rank_intervals`, carried in the rank summary): the rank's slowest step and
the :data:`MIDDLE_STEPS` steps in the middle of its step-time order (the job's median step is among
them for nearly every rank of a synchronous job, whose ranks wait for each other), each as rows
``step, stream, start, end, kind, pg``:

* one row per run of GPU activity on a stream (``kind`` compute | comm | memcpy, classes of
  :mod:`traceread.analysis.kinds`); consecutive activities of the same kind and process group on a stream
  separated by less than the merge gap are merged into one row (starting at :data:`MERGE_GAP_US`,
  doubled until the step has at most :data:`MAX_ROWS_PER_STEP` rows; communication is never
  merged across collectives, so every collective keeps its own start);
* ``stream == -1`` rows for the GPU's idle gaps (nothing on any stream), ``kind`` ``host_bound``
  for the part of a gap before the work ending it was launched (:mod:`traceread.analysis.time.idle`'s
  class, the step ledger's rule), else ``idle``.

Reduce (:func:`job_timeline`): picks the job's median and slowest step, samples ranks for big jobs
(stragglers, the ranks that arrive last, one per pipeline stage, slowest and fastest), moves times
onto the report's clock, and finds the critical path: for each collective of the step, the rank
that arrived last (the k-th communication on a process group is the same collective on every
member, as NCCL requires). The ``category`` column — what the chart colours — is a function of each
row (:func:`category`) so a finer ledger classification can replace it.
"""

from __future__ import annotations

from collections import Counter
from statistics import median
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from traceread import intervals as iv
from traceread.model import RankTrace, as_float

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

    from traceread.report_schema import Report

MERGE_GAP_US = 2.0
MAX_ROWS_PER_STEP = 250
MIDDLE_STEPS = 3
MAX_LANES = 12
SCHEMA: dict[str, PolarsDataType] = {"step": pl.Int64, "stream": pl.Int64, "start": pl.Float64, "end": pl.Float64,
                                     "kind": pl.Utf8, "pg": pl.Utf8}
IDLE_STREAM = -1


def host_bound_gaps(rt: RankTrace) -> iv.Intervals:
    """GPU idle gaps (all streams) classed host-bound by :mod:`traceread.analysis.time.idle`, in µs."""
    from traceread.analysis.time import idle

    snapped = idle._snapped_gpu(rt)  # the same gaps and classes as the report's numbers
    if snapped is None:
        return np.empty(0), np.empty(0)
    _gpu, base, ts, end, launch = snapped
    g0, g1, cls = idle._whole_gpu_gaps(ts, end, launch, idle.KERNEL_GAP_THRESHOLD_US * 1000.0)
    keep = (cls == idle.HOST_BOUND) & np.isfinite(g0) & np.isfinite(g1)
    return base + g0[keep] / 1000.0, base + g1[keep] / 1000.0


def _kept_steps(windows: pl.DataFrame) -> list[int]:
    """The rank's slowest step and the MIDDLE_STEPS steps around its median step time."""
    if windows.height == 0:
        return []
    w = windows.sort("duration")["step"].to_list()
    mid = w.index(w[len(w) // 2])
    lo = max(0, mid - MIDDLE_STEPS // 2)
    return sorted({int(x) for x in w[lo: lo + MIDDLE_STEPS]} | {int(w[-1])})


def _merge_runs(rows: pl.DataFrame, gap: float) -> pl.DataFrame:
    """Merge consecutive rows of one stream, kind and pg closer than ``gap`` (never comm)."""
    rows = rows.sort("stream", "start")
    prev_end = pl.col("end").cum_max().shift(1).over("stream")
    new = ((pl.col("stream") != pl.col("stream").shift(1)) | (pl.col("kind") != pl.col("kind").shift(1))
           | (pl.col("pg").fill_null("") != pl.col("pg").fill_null("").shift(1)) | (pl.col("kind") == "comm")
           | (pl.col("start") - prev_end > gap)).fill_null(True)
    return (rows.with_columns(new.cum_sum().alias("_run"))
            .group_by("_run", maintain_order=True)
            .agg(pl.col("step").first(), pl.col("stream").first(), pl.col("start").min(), pl.col("end").max(),
                 pl.col("kind").first(), pl.col("pg").first())
            .drop("_run"))


def rank_intervals(rt: RankTrace, windows: pl.DataFrame) -> pl.DataFrame:
    """The rank's extract (module docstring): at most ``(MIDDLE_STEPS + 1) × MAX_ROWS_PER_STEP`` rows
    plus the idle gaps."""
    from traceread.analysis.kinds import gpu_classes
    from traceread.analysis.time.breakdown import device_gpu_rows

    steps = _kept_steps(windows)
    gpu = device_gpu_rows(rt)
    if not steps or gpu.height == 0:
        return pl.DataFrame(schema=SCHEMA)
    gpu = gpu.with_columns(gpu_classes(gpu, rt.host)).select(
        pl.col("stream").fill_null(0), "ts", "end",
        pl.col("gpu_class").replace({"comp": "compute"}).alias("kind"), pl.col("pg_name").alias("pg"))
    hb = host_bound_gaps(rt)
    busy_all = iv.merge(gpu["ts"].to_numpy(), gpu["end"].to_numpy())
    out = []
    for step, lo, hi in windows.filter(pl.col("step").is_in(steps)).select("step", "start", "end").iter_rows():
        part = gpu.filter((pl.col("end") > lo) & (pl.col("ts") < hi)).select(
            pl.lit(step, pl.Int64).alias("step"), "stream", pl.col("ts").clip(lo, hi).alias("start"),
            pl.col("end").clip(lo, hi), "kind", "pg")
        gap = MERGE_GAP_US
        rows = _merge_runs(part, gap)
        while rows.height > MAX_ROWS_PER_STEP and gap < (hi - lo) / 50:
            gap *= 2
            rows = _merge_runs(rows, gap)
        rows = rows.sort(pl.col("end") - pl.col("start"), descending=True).head(MAX_ROWS_PER_STEP)
        idle = iv.complement(busy_all, float(lo), float(hi))
        host = iv.intersect(idle, iv.merge(*hb))
        other = iv.subtract(idle, host)
        for kind, (s, e) in (("host_bound", host), ("idle", other)):
            if s.size > MAX_ROWS_PER_STEP:  # keep the longest gaps
                keep = np.sort(np.argsort(-(e - s), kind="stable")[:MAX_ROWS_PER_STEP])
                s, e = s[keep], e[keep]
            if s.size:
                rows = pl.concat([rows, pl.DataFrame({"step": step, "stream": IDLE_STREAM, "start": s, "end": e,
                                                      "kind": kind, "pg": None}, schema=SCHEMA)])
        out.append(rows.select(pl.col(c).cast(t) for c, t in SCHEMA.items()))
    return pl.concat(out).sort("step", "stream", "start") if out else pl.DataFrame(schema=SCHEMA)


# ------------------------------------------------------------------------------------------------
# job level


def pg_roles(layout: Any) -> dict[str, str]:
    """Process group -> parallelism role (tp, dp, pp, ...) from the report's ``layout`` when it has
    one: ``{"pg_roles": {pg: role}}`` or ``{"groups": [{"pg"|"name": .., "role"|"kind": ..}]}``."""
    if not isinstance(layout, dict):
        return {}
    if isinstance(layout.get("pg_roles"), dict):
        return {str(k): str(v) for k, v in layout["pg_roles"].items()}
    out: dict[str, str] = {}
    for g in layout.get("groups") or []:
        if isinstance(g, dict):
            pg, role = g.get("pg", g.get("name")), g.get("role", g.get("kind"))
            if pg is not None and role:
                out[str(pg)] = str(role)
    return out


def category(kind: str, pg: str | None, roles: dict[str, str], pipeline: bool) -> str:
    """What a row is coloured as: compute, comm by role (else by process group), memcpy, idle (a
    bubble in a pipeline job) or host-bound idle."""
    if kind == "comm":
        from traceread.analysis.comm.layout import group_key  # traffic naming no group: its layout row

        key = group_key(pg, roles)
        return f"comm {roles[key]}" if key in roles else f"comm pg {pg if pg is not None else '?'}"
    if kind == "idle":
        return "idle / bubble" if pipeline else "idle"
    if kind == "host_bound":
        return "host-bound idle"
    return kind


def _job_step_us(report: Report) -> dict[int, float]:
    """Job step time per step: the slowest rank's step duration (every rank waits for it)."""
    job: dict[int, float] = {}
    for e in report.get("ranks") or []:
        for s in e.get("steps") or []:
            job[int(s["step"])] = max(job.get(int(s["step"]), 0.0), float(s.get("duration_us") or 0.0))
    return job


def _pick_steps(per_rank: dict[int, pl.DataFrame], report: Report) -> list[tuple[str, int]]:
    have = Counter(int(s) for f in per_rank.values() for s in f["step"].unique().to_list())
    job = _job_step_us(report)
    most = max(n for s, n in have.items()) if have else 0
    cands = [s for s, n in have.items() if n == most and s in job] or [s for s in have if s in job]
    if not cands:
        return []
    slowest = max(cands, key=lambda s: job[s])
    m = median(job.values())
    rest = [s for s in cands if s != slowest] or cands
    med = min(rest, key=lambda s: (abs(job[s] - m), s))
    return [("median step", med)] + ([("slowest step", slowest)] if slowest != med else [])


def _pick_ranks(ranks: list[int], report: Report, limit: int) -> tuple[list[int], str | None]:
    if len(ranks) <= limit:
        return ranks, None
    chosen: list[int] = []
    why: list[str] = []

    def add(rs: list[int], label: str) -> None:
        new = [r for r in dict.fromkeys(rs) if r in ranks and r not in chosen][: max(0, limit - len(chosen))]
        if new:
            chosen.extend(new)
            why.append(label)

    add([int(s["rank"]) for s in report.get("stragglers") or []], "stragglers")
    hm = sorted(report.get("stragglers") or [], key=lambda s: -int(s.get("arrived_last") or 0))
    add([int(s["rank"]) for s in hm[:2]], "last arrivals")
    add([int(s["rank"]) for s in (report.get("pipeline") or {}).get("per_stage") or [] if s.get("rank") is not None],
        "one per pipeline stage")
    by_time = sorted((e for e in report.get("ranks") or [] if e["rank"] in ranks),
                     key=lambda e: -max((float(s.get("duration_us") or 0) for s in e.get("steps") or []), default=0.0))
    add([int(e["rank"]) for e in by_time[:2]], "slowest")
    add([int(e["rank"]) for e in by_time[-1:]], "fastest")
    stride = max(1, len(ranks) // max(1, limit - len(chosen)))
    add(ranks[::stride] + ranks, "evenly spaced")
    return sorted(chosen), f"{len(chosen)} of {len(ranks)} ranks shown: {', '.join(why)}"


def _critical_path(rows: pl.DataFrame) -> list[dict[str, Any]]:
    """For each collective of the step (k-th comm row per pg on every rank): the last arrival."""
    # Every sort has a full key (stream last): ties (a stage's send and recv start together) must not
    # depend on the order the ranks' summaries arrived in.
    comm = rows.filter((pl.col("kind") == "comm") & pl.col("pg").is_not_null()).sort("rank", "start", "stream")
    if comm.height == 0:
        return []
    comm = comm.with_columns(pl.int_range(pl.len()).over("rank", "pg").alias("k"))
    members = comm.group_by("pg").agg(pl.col("rank").n_unique().alias("n"))
    comm = comm.join(members, on="pg").filter(pl.col("n") > 1)
    last = (comm.sort("start", "rank", "stream").group_by("pg", "k").agg(pl.col("rank").last(), pl.col("stream").last(),
                                                      pl.col("start").last(), pl.col("rank").len().alias("m"),
                                                      pl.col("n").first())
            .filter(pl.col("m") == pl.col("n")).sort("start", "pg", "k"))
    return [{"rank": int(r), "stream": int(s), "t": float(t), "pg": str(pg)}
            for r, s, t, pg in last.select("rank", "stream", "start", "pg").iter_rows()]


def job_timeline(per_rank: dict[int, pl.DataFrame], report: Report, limit: int = MAX_LANES) -> dict[str, Any] | None:
    """The report's ``step_timeline`` extra (module docstring), or None without intervals.

    ``{"steps": [{"label", "step", "duration_us" (span drawn), "step_us" (job step time),
    "critical": [{"rank", "stream", "t", "pg"}]}],
    "ranks": [...], "note": str | None, "clock": method, "rows": {"step", "rank", "stream", "start",
    "end", "kind", "pg", "category"}}`` with times in µs from the step's first start on the
    report's clock."""
    per_rank = {r: f for r, f in per_rank.items() if f is not None and f.height}
    if not per_rank:
        return None
    chosen = _pick_steps(per_rank, report)
    if not chosen:
        return None
    ranks, note = _pick_ranks(sorted(per_rank), report, limit)
    clock = (report.get("source") or {}).get("clock") or {}
    offsets = {int(k): float(v) for k, v in (clock.get("offsets_us") or {}).items()}
    roles = pg_roles(report.get("layout"))
    pipeline = bool(report.get("pipeline"))
    frames = [per_rank[r].with_columns(pl.lit(r, pl.Int64).alias("rank"),
                                       pl.col("start") - offsets.get(r, 0.0), pl.col("end") - offsets.get(r, 0.0))
              for r in ranks]
    rows = pl.concat(frames)
    steps_out = []
    parts = []
    for label, step in chosen:
        srows = rows.filter(pl.col("step") == step)
        if srows.height == 0:
            continue
        t0 = as_float(srows["start"].min())
        srows = srows.with_columns(pl.col("start") - t0, pl.col("end") - t0)
        steps_out.append({"label": label, "step": step, "duration_us": as_float(srows["end"].max()),
                          "step_us": _job_step_us(report).get(step),
                          "critical": _critical_path(srows)})
        parts.append(srows)
    if not parts:
        return None
    allrows = pl.concat(parts).with_columns(
        pl.struct("kind", "pg").map_elements(lambda x: category(x["kind"], x["pg"], roles, pipeline),
                                             return_dtype=pl.Utf8).alias("category"))
    return {"steps": steps_out, "ranks": ranks, "note": note, "clock": clock.get("method", "none"),
            "rows": {c: allrows[c].to_list() for c in ("step", "rank", "stream", "start", "end", "kind", "pg", "category")}}
