"""Training-step windows on the device clock: where each ``ProfilerStep#N`` really ended on the GPU.

The host marks a step done as soon as it has *launched* the step's work; the GPU may still be busy
with it long after. Timing steps from host markers alone therefore blames the wrong step for slow
kernels. This module moves each step's boundaries to the device exactly as the PyTorch TensorBoard
profiler plugin did (``StepParser._find_device_steps`` / ``_update_steps_duration``), so traceread's
per-step numbers line up with what users saw in that tool.

The rule (µs, trace clock), applied to the host ``ProfilerStep#N`` rows sorted by start:

1. A GPU activity (kernel, memcpy, memset) *belongs to* step *i* when the runtime call that
   launched it (``gpu.launch_row`` -> ``host.ts``/``host.end``) lies entirely inside the host step:
   ``step.ts <= launch.ts`` and ``launch.end <= step.end``. Launches that straddle a step boundary
   belong to no step (as in the plugin).
2. ``prev_end`` starts at the first host step's start. If step 0 launched GPU work, it is raised to
   the end of any GPU activity that belongs to no step and ends before step 0's first GPU activity
   (leftover work from before profiling must not be charged to step 0).
3. For each step in order: ``start = max(prev_end, host start)``; ``end = max(host end, last end of
   the GPU activity belonging to the step)``, or ``max(host end, start)`` when it has none;
   ``prev_end = end``. Steps therefore never overlap.
4. Partial trailing steps are dropped (only when the trace has GPU work at all and more than one
   step): steps after the last step that launched any GPU work are dropped, and that last step is
   dropped too when it launched fewer than 80 % as many GPU activities as the step before it — the
   profiler stopped before capturing all of its kernels. Dropped step numbers are listed in
   :attr:`StepWindows.dropped` and explained in :attr:`StepWindows.note`.

With GPU work but no launch links at all (no correlation ids) steps keep their host windows.
Without any ``ProfilerStep#`` marker the whole trace is one step, numbered :data:`NO_MARKER_STEP`
(-1, so it can never be mistaken for a real ``ProfilerStep#0``), spanning the earliest start to the
latest end of every host and GPU event — the plugin's fallback.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from traceread.fmt import NO_MARKER_STEP as NO_MARKER
from traceread.model import RankTrace, as_float

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

#: Step number given to the single whole-trace window of a trace without ``ProfilerStep#`` markers.
NO_MARKER_STEP = NO_MARKER  # -1 (traceread.fmt.NO_MARKER_STEP: how every view names it)

#: A trailing step is partial when it launched fewer GPU activities than this share of the step
#: before it (TensorBoard plugin's rule).
PARTIAL_STEP_RATIO = 0.8

STEP_WINDOW_SCHEMA: dict[str, PolarsDataType] = {
    "step": pl.Int64,
    "start": pl.Float64,
    "end": pl.Float64,
    "duration": pl.Float64,
}


@dataclass
class StepWindows:
    """Device-aligned step windows of one rank (µs on the trace clock)."""

    table: pl.DataFrame  # step:int64, start:f64, end:f64, duration:f64, sorted by start
    dropped: list[int] = field(default_factory=list)  # partial steps left out (step numbers)
    note: str | None = None  # why steps were dropped / why there is a single synthetic step

    @property
    def span(self) -> tuple[float, float] | None:
        """``(first start, last end)`` of the kept steps, or None when there are none."""
        if self.table.height == 0:
            return None
        return as_float(self.table["start"].min()), as_float(self.table["end"].max())


def _frame(steps: list[int], starts: list[float], ends: list[float]) -> pl.DataFrame:
    s = np.asarray(starts, dtype=np.float64)
    e = np.asarray(ends, dtype=np.float64)
    return pl.DataFrame(
        {"step": steps, "start": s, "end": e, "duration": e - s}, schema=STEP_WINDOW_SCHEMA
    )


def _trace_span(rt: RankTrace) -> tuple[float, float] | None:
    los: list[float] = []
    his: list[float] = []
    for df in (rt.host, rt.gpu):
        if df.height:
            lo, hi = df["ts"].min(), df["end"].max()
            if lo is not None and hi is not None:
                los.append(as_float(lo))
                his.append(as_float(hi))
    if not los:
        return None
    return min(los), max(his)


def device_steps(rt: RankTrace) -> StepWindows:
    """Step windows of ``rt`` aligned to the device (rule in the module docstring)."""
    host_steps = rt.steps.filter(pl.col("ts").is_not_null() & pl.col("end").is_not_null())
    if host_steps.height == 0:
        span = _trace_span(rt)
        if span is None:
            return StepWindows(_frame([], [], []), [], "trace has no events")
        return StepWindows(
            _frame([NO_MARKER_STEP], [span[0]], [span[1]]),
            [],
            "no ProfilerStep# markers: one window spans the whole trace",
        )
    host_steps = host_steps.sort("ts").unique(subset=["step"], keep="first", maintain_order=True)
    numbers = host_steps["step"].to_list()
    h_start = host_steps["ts"].to_numpy().astype(np.float64)
    h_end = host_steps["end"].to_numpy().astype(np.float64)
    n = len(numbers)

    gpu = rt.gpu.filter(pl.col("ts").is_not_null() & pl.col("end").is_not_null())
    g_start = gpu["ts"].to_numpy().astype(np.float64)
    g_end = gpu["end"].to_numpy().astype(np.float64)
    owner = np.full(gpu.height, -1, dtype=np.int64)
    if gpu.height and rt.host.height:
        has = gpu["launch_row"].is_not_null().to_numpy()
        if has.any():
            rows = gpu["launch_row"].drop_nulls().to_numpy().astype(np.int64)
            ok = (rows >= 0) & (rows < rt.host.height)
            l_ts = np.full(rows.size, np.nan)
            l_end = np.full(rows.size, np.nan)
            l_ts[ok] = rt.host["ts"].to_numpy()[rows[ok]]
            l_end[ok] = rt.host["end"].to_numpy()[rows[ok]]
            # The step whose start is the last one <= launch start; launch must also end inside it.
            idx = np.searchsorted(h_start, l_ts, side="right") - 1
            valid = ok & (idx >= 0) & ~np.isnan(l_ts)
            idx_c = np.clip(idx, 0, n - 1)
            inside = valid & (l_ts >= h_start[idx_c]) & (l_end <= h_end[idx_c])
            own = np.where(inside, idx_c, -1)
            owner[np.flatnonzero(has)] = own

    counts = np.bincount(owner[owner >= 0], minlength=n) if n else np.zeros(0, dtype=np.int64)
    dev_min = np.full(n, np.inf)
    dev_max = np.full(n, -np.inf)
    if (owner >= 0).any():
        np.minimum.at(dev_min, owner[owner >= 0], g_start[owner >= 0])
        np.maximum.at(dev_max, owner[owner >= 0], g_end[owner >= 0])

    use_gpu = bool((owner >= 0).any())
    starts = h_start.copy()
    ends = h_end.copy()
    dropped: list[int] = []
    notes: list[str] = []
    if use_gpu:
        prev_end = h_start[0]
        if counts[0] > 0:
            stray = (owner < 0) & (g_end < dev_min[0])
            if stray.any():
                prev_end = max(prev_end, float(g_end[stray].max()))
        for i in range(n):
            start = max(prev_end, h_start[i])
            if counts[i] == 0:
                end = max(h_end[i], start)
            else:
                end = max(h_end[i], dev_max[i], start)
            starts[i], ends[i] = start, end
            prev_end = end
        keep = n
        if n > 1:
            last = int(np.flatnonzero(counts > 0)[-1])
            keep = last + 1
            if keep < n:
                notes.append(f"steps {[int(x) for x in numbers[keep:]]} launched no GPU work")
            if last > 0 and counts[last - 1] * PARTIAL_STEP_RATIO > counts[last]:
                keep = last
                notes.insert(
                    0,
                    f"step {numbers[last]} launched {counts[last]} GPU activities vs "
                    f"{counts[last - 1]} in the step before (the profiler stopped mid-step)",
                )
            dropped = [int(x) for x in numbers[keep:]]
        numbers, starts, ends = numbers[:keep], starts[:keep], ends[:keep]
    elif gpu.height:
        notes.append("GPU work has no launch links: steps keep their host windows")
    note = (
        "dropped partial trailing steps " + str(dropped) + ": " + "; ".join(notes)
        if dropped
        else ("; ".join(notes) or None)
    )
    return StepWindows(_frame([int(x) for x in numbers], list(starts), list(ends)), dropped, note)
