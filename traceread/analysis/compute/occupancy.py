"""How much of the GPU's SMs the kernels kept busy: the TensorBoard plugin's three numbers, plus a
per-kernel table that says which kernels leave SMs empty and why.

"GPU utilization" only says *some* kernel ran; a one-block kernel on a 132-SM GPU counts as 100 %
busy. These estimates use the launch geometry Kineto records on each kernel to say how many SMs
had work. Definitions follow the PyTorch TensorBoard profiler plugin exactly
(``gpu_metrics_parser.py``), on its window: the device-aligned step span (first step start .. last
step end, :func:`traceread.analysis.time.steps.device_steps`) unless a window is given.

* **gpu_util_pct** — |∪ kernel intervals ∩ window| / window × 100. Kernels only (memcpy/memset do
  not count here, unlike :mod:`traceread.analysis.time.breakdown`).
* **sm_efficiency_pct** (Est. SM efficiency) — each kernel carries ``blocks_per_sm`` = grid blocks
  ÷ number of SMs. Sweep time: in every slice, *add* the values of all kernels running then (any
  stream), clip the sum to 1; integrate over the window and divide by the window length (idle time
  counts as 0) × 100. Kernels with ``blocks_per_sm <= 0`` or missing are left out. None when no
  kernel with a value overlaps the window.
* **achieved_occupancy_pct** (Est. achieved occupancy) — mean of Kineto's ``est. achieved
  occupancy %`` over kernels that carry it (>= 0), weighted by the kernel's duration inside the
  window; concurrent kernels are *not* added. None when no such kernel overlaps the window.
* **sm_efficiency_busy_pct** (extra) — the same SM-efficiency integral divided by kernel busy time
  instead of the window: how full the SMs were *while the GPU was working*.

ROCm traces carry no ``blocks per SM``: it is computed as grid blocks ÷ ``num_sms`` (CUs). ROCm's
``grid`` is sometimes in work-items (hipLaunchKernel) and sometimes in blocks (module launches, e.g.
Triton): when every grid dimension is >= and divisible by the block dimension, grid is read as
work-items (blocks = grid/block per dimension), otherwise as blocks. That is a heuristic; CUDA
traces never need it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from traceread import intervals as iv
from traceread.analysis.kinds import comm_kinds
from traceread.analysis.time.breakdown import device_gpu_rows
from traceread.analysis.time.steps import device_steps
from traceread.model import RankTrace

if TYPE_CHECKING:
    from polars._typing import PolarsDataType


@dataclass
class SmMetrics:
    """SM-level estimates of one rank on one window (definitions in the module docstring)."""

    window_us: float | None = None
    gpu_util_pct: float | None = None
    sm_efficiency_pct: float | None = None
    achieved_occupancy_pct: float | None = None
    sm_efficiency_busy_pct: float | None = None
    blocks_per_sm_source: str | None = None  # "trace" (Kineto) | "grid" (computed) | None
    num_sms: int | None = None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def grid_blocks_expr() -> pl.Expr:
    """Number of thread blocks of a launch; grid read as work-items when it divides by block (ROCm)."""
    dims = ("x", "y", "z")
    grid = [pl.col(f"grid_{d}").cast(pl.Float64) for d in dims]
    block = [pl.col(f"block_{d}").fill_null(1).cast(pl.Float64) for d in dims]
    as_items = pl.lit(True)
    for g, b in zip(grid, block):
        as_items = as_items & (b > 0) & (g >= b) & ((g % b) == 0)
    blocks_if_items = (grid[0] / block[0]) * (grid[1] / block[1]) * (grid[2] / block[2])
    blocks_if_blocks = grid[0] * grid[1] * grid[2]
    return pl.when(as_items).then(blocks_if_items).otherwise(blocks_if_blocks)


def kernels_with_geometry(rt: RankTrace, num_sms: int | None = None) -> tuple[pl.DataFrame, str | None]:
    """The rank's kernels with ``bps`` (blocks per SM: recorded, else computed) and ``blocks``.

    Returns the frame and where ``bps`` came from ("trace", "grid" or None when unavailable).
    """
    sms = num_sms if num_sms is not None else rt.meta.num_sms
    k = device_gpu_rows(rt).filter(pl.col("kind") == "kernel")
    has_trace = k.height > 0 and k["blocks_per_sm"].drop_nulls().len() > 0
    k = k.with_columns(
        pl.col("grid_x").cast(pl.Float64).mul(pl.col("grid_y")).mul(pl.col("grid_z")).alias("grid_blocks")
    )
    if has_trace:
        # CUDA: Kineto's own value; the block count is the grid (grid is always blocks on CUDA).
        k = k.with_columns(pl.col("blocks_per_sm").alias("bps"), pl.col("grid_blocks").alias("blocks"))
        return k, "trace"
    k = k.with_columns(grid_blocks_expr().alias("blocks"))
    if sms and sms > 0 and k.height and k["blocks"].drop_nulls().len() > 0:
        return k.with_columns((pl.col("blocks") / float(sms)).alias("bps")), "grid"
    return k.with_columns(pl.lit(None, dtype=pl.Float64).alias("bps")), None


def _sweep_clipped_sum(
    ts: np.ndarray, end: np.ndarray, val: np.ndarray, lo: float, hi: float
) -> float:
    """∫ min(Σ values of kernels active at t, 1) dt over [lo, hi)."""
    s = np.clip(ts, lo, hi)
    e = np.clip(end, lo, hi)
    keep = e > s
    s, e, v = s[keep], e[keep], val[keep]
    if s.size == 0:
        return 0.0
    times = np.concatenate((s, e))
    deltas = np.concatenate((v, -v))
    counts = np.concatenate((np.ones(s.size, np.int64), -np.ones(s.size, np.int64)))
    order = np.argsort(times, kind="stable")
    times, deltas, counts = times[order], deltas[order], counts[order]
    level = np.cumsum(deltas)
    active = np.cumsum(counts)
    seg = np.diff(times)
    value = np.where(active[:-1] > 0, np.clip(level[:-1], 0.0, 1.0), 0.0)
    return float(np.sum(value * seg))


def sm_metrics(
    rt: RankTrace, window: tuple[float, float] | None = None, num_sms: int | None = None
) -> SmMetrics:
    """TensorBoard-plugin GPU utilization, Est. SM efficiency and Est. achieved occupancy."""
    k, source = kernels_with_geometry(rt, num_sms)
    sms = num_sms if num_sms is not None else rt.meta.num_sms
    if window is None:
        window = device_steps(rt).span
    if window is None or k.height == 0:
        return SmMetrics(num_sms=sms, blocks_per_sm_source=source)
    lo, hi = float(window[0]), float(window[1])
    width = hi - lo
    if width <= 0:
        return SmMetrics(window_us=max(width, 0.0), num_sms=sms, blocks_per_sm_source=source)
    ts = k["ts"].to_numpy().astype(np.float64)
    end = k["end"].to_numpy().astype(np.float64)
    busy = iv.length(iv.clip_sorted(iv.merge(ts, end), lo, hi))
    util = busy / width * 100.0

    sm_eff = sm_busy = None
    bps = k["bps"].fill_null(0.0).to_numpy().astype(np.float64)
    has_v = bps > 0
    overlap = np.minimum(end, hi) - np.maximum(ts, lo)
    if (has_v & (overlap > 0)).any():
        integral = _sweep_clipped_sum(ts[has_v], end[has_v], bps[has_v], lo, hi)
        sm_eff = integral / width * 100.0
        sm_busy = integral / busy * 100.0 if busy > 0 else None

    occ = None
    occ_v = k["occupancy_pct"].fill_null(-1.0).to_numpy().astype(np.float64)
    w = np.maximum(overlap, 0.0) * (occ_v >= 0)
    if w.sum() > 0:
        occ = float(np.sum(occ_v * w) / np.sum(w))
    return SmMetrics(
        window_us=width,
        gpu_util_pct=util,
        sm_efficiency_pct=sm_eff,
        achieved_occupancy_pct=occ,
        sm_efficiency_busy_pct=sm_busy,
        blocks_per_sm_source=source,
        num_sms=sms,
    )


KERNEL_TABLE_SCHEMA: dict[str, PolarsDataType] = {
    "name": pl.Utf8,
    "calls": pl.Int64,
    "total_us": pl.Float64,
    "mean_us": pl.Float64,
    "blocks_per_sm": pl.Float64,
    "occupancy_pct": pl.Float64,
    "wave_efficiency_pct": pl.Float64,
    "sm_time_lost_us": pl.Float64,
    "comm_kind": pl.Utf8,  # communication family (analysis.commkind), null for compute kernels
}


def _weighted(value: str) -> pl.Expr:
    """Duration-weighted mean of ``value`` over the calls that have it; null when none (or 0 time)."""
    has = pl.col(value).is_not_null()
    num = (pl.col(value) * pl.col("dur")).filter(has).sum()
    den = pl.col("dur").filter(has).sum()
    return pl.when(den > 0).then(num / den).otherwise(None)


def kernel_table(rt: RankTrace, num_sms: int | None = None) -> pl.DataFrame:
    """Per kernel name: where SM time is lost, sorted by ``sm_time_lost_us`` (largest first).

    * ``calls``, ``total_us`` (Σ dur), ``mean_us``.
    * ``blocks_per_sm`` — duration-weighted mean of blocks/SM over calls that have it.
    * ``occupancy_pct`` — duration-weighted mean of Kineto's est. achieved occupancy %.
    * ``wave_efficiency_pct`` — wave quantisation: a launch of B blocks on S SMs runs in
      ⌈B/S⌉ waves assuming one resident block per SM per wave; efficiency = B / (⌈B/S⌉·S) × 100,
      the share of SM-slots the waves actually fill (a 133-block grid on 132 SMs: 50.4 %). With
      several resident blocks per SM the real wave count is smaller, so read it as a shape
      indicator, not a measurement. S is ``num_sms`` (argument, else ``RankMeta.num_sms``, else
      inferred per kernel as round(grid blocks ÷ Kineto's blocks/SM)). Duration-weighted.
    * ``sm_time_lost_us`` — Σ dur × (1 − min(blocks_per_sm, 1)): kernel time during which SMs had
      no block of this kernel at all (ignores concurrency with other kernels).
    * ``comm_kind`` — the communication family (:mod:`traceread.analysis.kinds`). Communication
      kernels use few SMs by design (they are sized to the link), so their ``wave_efficiency_pct``
      and ``sm_time_lost_us`` are null: they are never judged by SM use.
    """
    k, _source = kernels_with_geometry(rt, num_sms)
    if k.height == 0:
        return pl.DataFrame(schema=KERNEL_TABLE_SCHEMA)
    sms = num_sms if num_sms is not None else rt.meta.num_sms
    if sms and sms > 0:
        s_expr = pl.lit(float(sms))
    else:
        s_expr = pl.when(pl.col("bps") > 0).then((pl.col("blocks") / pl.col("bps")).round(0)).otherwise(None)
    k = k.with_columns(s_expr.alias("_sms"), comm_kinds(k, rt.host))
    waves = (pl.col("blocks") / pl.col("_sms")).ceil()
    k = k.with_columns(
        pl.when((pl.col("blocks") > 0) & (pl.col("_sms") > 0) & pl.col("comm_kind").is_null())
        .then(pl.col("blocks") / (waves * pl.col("_sms")) * 100.0)
        .otherwise(None)
        .alias("_wave"),
        pl.when(pl.col("bps").is_not_null() & pl.col("comm_kind").is_null())
        .then(pl.col("dur") * (1.0 - pl.min_horizontal(pl.col("bps"), pl.lit(1.0))))
        .otherwise(None)
        .alias("_lost"),
    )
    out = k.group_by("name").agg(
        pl.len().cast(pl.Int64).alias("calls"),
        pl.col("dur").sum().alias("total_us"),
        pl.col("dur").mean().alias("mean_us"),
        _weighted("bps").alias("blocks_per_sm"),
        _weighted("occupancy_pct").alias("occupancy_pct"),
        _weighted("_wave").alias("wave_efficiency_pct"),
        pl.when(pl.col("_lost").is_not_null().any()).then(pl.col("_lost").sum()).otherwise(None).alias("sm_time_lost_us"),
        pl.col("comm_kind").first(),
    )
    return (
        out.select(pl.col(c).cast(t) for c, t in KERNEL_TABLE_SCHEMA.items())
        .sort(["sm_time_lost_us", "total_us"], descending=True, nulls_last=True)
    )
