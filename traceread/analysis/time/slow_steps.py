"""Steps much slower than the others, and what grew in them.

Definitions (µs):

* **job step time** of step s = max over ranks of that rank's step duration (the job advances at the
  pace of its slowest rank).
* **slow step**: job step time > ``median + 3.5 · 1.4826 · MAD`` (the modified z-score of Iglewicz &
  Hoaglin, robust to the outliers it looks for) **and** > 5 % over the median (a µs-tight run must
  not flag 0.1 % jitter). Needs at least :data:`MIN_STEPS` steps.
* **excess_us** = job step time − median job step time.
* **what grew**: each rank's compute, exposed communication and idle time in the slow step minus
  that rank's median over the normal steps (``Δcompute, Δexposed_comm, Δidle``):

  - ``rank:<r>`` when one rank's own work (Δcompute + Δidle + Δexposed_memcpy) grew by at least half the excess while
    the typical rank's did not grow by a quarter of it (the others only waited for r, which shows up
    on them as exposed communication);
  - otherwise the component with the largest median growth across ranks, if it explains at least a
    third of the excess: ``compute`` (more or slower kernels), ``exposed_comm`` (transfers got
    slower: network, congestion) or ``host`` (the GPU sat idle, or copied memory nothing hid
    (``exposed_memcpy_us`` when given): data loading, synchronisation, Python gaps, GC, checkpoint
    writes);
  - ``unknown`` when nothing explains it.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from traceread.report_schema import SlowStepEntry

MIN_STEPS = 3
MAD_Z = 3.5
MIN_EXCESS_FRACTION = 0.05

_COMPONENTS = (("compute_us", "compute"), ("exposed_comm_us", "exposed_comm"), ("idle_us", "host"),
               ("exposed_memcpy_us", "memcpy"))


def _normalise(frame: pl.DataFrame) -> pl.DataFrame:
    """Accept ``step_breakdowns`` output (``window_us``) or a frame with ``duration``."""
    if "duration" not in frame.columns and "window_us" in frame.columns:
        frame = frame.with_columns(pl.col("window_us").alias("duration"))
    if "rank" not in frame.columns:
        frame = frame.with_columns(pl.lit(0, pl.Int64).alias("rank"))
    for c, _ in _COMPONENTS:
        if c not in frame.columns:
            frame = frame.with_columns(pl.lit(None, pl.Float64).alias(c))
    return frame.select(
        pl.col("rank").cast(pl.Int64), pl.col("step").cast(pl.Int64), pl.col("duration").cast(pl.Float64),
        *[pl.col(c).cast(pl.Float64) for c, _ in _COMPONENTS],
    ).filter(pl.col("duration").is_not_null())


def slow_step_threshold(durations: np.ndarray) -> tuple[float, float]:
    """(median, threshold) of the slow-step rule for an array of job step times."""
    med = float(np.median(durations))
    mad = float(np.median(np.abs(durations - med)))
    return med, max(med + MAD_Z * 1.4826 * mad, med * (1 + MIN_EXCESS_FRACTION))


def find_slow_steps(
    per_rank_step_breakdowns: pl.DataFrame | dict[int, pl.DataFrame],
) -> list[SlowStepEntry]:
    """Slow steps with their cause (definitions in the module docstring); [] with < 3 steps.

    Input: one frame with columns ``rank, step, duration`` (or ``window_us``), ``compute_us,
    exposed_comm_us, idle_us``; or ``{rank: step_breakdowns(...)}``.
    """
    if isinstance(per_rank_step_breakdowns, dict):
        frames = [
            f.with_columns(pl.lit(r, pl.Int64).alias("rank")) for r, f in per_rank_step_breakdowns.items()
            if f.height
        ]
        if not frames:
            return []
        frame = pl.concat([_normalise(f) for f in frames])
    else:
        frame = _normalise(per_rank_step_breakdowns)
    job = frame.group_by("step").agg(
        pl.col("duration").max().alias("job"),
        pl.col("rank").sort_by("duration").last().alias("slowest"),
    ).sort("step")
    if job.height < MIN_STEPS:
        return []
    dur = job["job"].to_numpy()
    med, thr = slow_step_threshold(dur)
    slow = job.filter(pl.col("job") > thr)
    if slow.height == 0:
        return []
    normal_steps = job.filter(pl.col("job") <= thr)["step"].to_list()
    base = (
        frame.filter(pl.col("step").is_in(normal_steps)).group_by("rank")
        .agg(*[pl.col(c).median().alias(f"b_{c}") for c, _ in _COMPONENTS])
    )
    n_ranks = frame["rank"].n_unique()
    out: list[SlowStepEntry] = []
    for step, d, _slowest in slow.iter_rows():
        excess = float(d) - med
        rows = frame.filter(pl.col("step") == step).join(base, on="rank", how="left")
        deltas = {
            name: (rows[c] - rows[f"b_{c}"]).to_numpy().astype(np.float64) for c, name in _COMPONENTS
        }
        # copies nobody hides (checkpoint D2H, batch H2D) are host-driven time like idle
        deltas["host"] = np.nan_to_num(deltas["host"]) + np.nan_to_num(deltas.pop("memcpy"))
        ranks = rows["rank"].to_numpy()
        own = np.nan_to_num(deltas["compute"]) + np.nan_to_num(deltas["host"])
        cause, rank, detail = "unknown", None, ""
        if n_ranks > 1 and own.size:
            i = int(np.argmax(own))
            others = np.delete(own, i)
            if own[i] >= 0.5 * excess and (others.size == 0 or float(np.median(others)) < 0.25 * excess):
                rank = int(ranks[i])
                grew = "compute" if np.nan_to_num(deltas["compute"][i]) >= np.nan_to_num(deltas["host"][i]) \
                    else "idle (host)"
                cause = f"rank:{rank}"
                others_comm = np.delete(deltas["exposed_comm"], i)
                waited = float(np.nanmedian(others_comm)) if np.any(~np.isnan(others_comm)) else 0.0
                detail = (f"rank {rank}'s {grew} grew by {own[i]:.0f} µs; the other ranks waited for it "
                          f"(their exposed communication grew by a median {waited:.0f} µs)")
        if rank is None:
            med_d = {name: float(np.nanmedian(v)) if np.any(~np.isnan(v)) else float("nan")
                     for name, v in deltas.items()}
            valid = {k: v for k, v in med_d.items() if not np.isnan(v)}
            if valid:
                name, grow = max(valid.items(), key=lambda kv: kv[1])
                if grow >= excess / 3:
                    cause = name
                    what = {"compute": "compute", "exposed_comm": "exposed communication",
                            "host": "GPU idle time (host side: data loading, synchronisation, Python)"}[name]
                    detail = f"{what} grew by a median {grow:.0f} µs across ranks"
            if cause == "unknown":
                detail = "no single component (compute, exposed communication, idle) explains the excess"
        out.append({
            "step": int(step), "duration_us": float(d), "median_us": med, "excess_us": excess,
            "cause": cause, "rank": rank, "detail": detail,
        })
    return out
