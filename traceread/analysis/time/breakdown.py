"""Where a rank's GPU time goes: compute, communication, memcpy and idle, on one window.

Definitions (µs; TraceLens ``GPUEventAnalyser`` / HTA temporal breakdown, with exposed parts made
explicit). GPU events are the rank's kernels, memcpys and memsets (``RankTrace.gpu``; CUDA sync rows
are not GPU work and are not in that table). Each is the interval ``[ts, ts + dur)`` clipped to the
window; classes come from :mod:`traceread.analysis.kinds` (COMM = communication kernels, by name
or launching operator: NCCL/RCCL, symmetric memory, custom all-reduce, NVSHMEM/DeepEP, MSCCL++; MEMCPY = memcpy,
COMP = every other kernel and every memset). ``∪`` is the union over *all streams*, so two kernels
running at once count once.

* ``window_us``       — window length. Default: first GPU event start to last GPU event end
  (TraceLens, HTA); :func:`step_breakdowns` uses device-aligned step windows instead.
* ``gpu_busy_us``     — |∪ all GPU events|
* ``compute_us``      — |∪ COMP|
* ``comm_us``         — |∪ COMM|
* ``exposed_comm_us`` — |∪COMM − ∪COMP|: communication no compute kernel hides
* ``memcpy_us``       — |∪ MEMCPY|
* ``exposed_memcpy_us`` — |∪MEMCPY − ∪COMP − ∪COMM|
* ``idle_us``         — window − gpu_busy
* ``comm_overlap_pct`` — |∪COMM ∩ ∪COMP| / |∪COMM| × 100 (HTA's comp/comm overlap); None without comm
* ``gpu_util_pct``    — gpu_busy / window × 100

Identity: compute + exposed_comm + exposed_memcpy + idle = window. The arithmetic runs on whole
nanoseconds (:func:`snap_ns`), so it holds exactly, as do sums against ns-exact ground truth.
A trace with no GPU events gets a Breakdown whose fields are all None: it cannot support them.
When a rank's trace holds events from several devices, only the rank's own device
(``RankMeta.device_id``) is counted.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from traceread import intervals as iv
from traceread.analysis.kinds import gpu_classes
from traceread.analysis.time.steps import StepWindows
from traceread.model import RankTrace, as_float

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

BREAKDOWN_FIELDS = (
    "window_us",
    "gpu_busy_us",
    "compute_us",
    "comm_us",
    "exposed_comm_us",
    "memcpy_us",
    "exposed_memcpy_us",
    "idle_us",
    "comm_overlap_pct",
    "gpu_util_pct",
)


@dataclass
class Breakdown:
    """One window's GPU time split (definitions in the module docstring). None = not supported."""

    window_us: float | None = None
    gpu_busy_us: float | None = None
    compute_us: float | None = None
    comm_us: float | None = None
    exposed_comm_us: float | None = None
    memcpy_us: float | None = None
    exposed_memcpy_us: float | None = None
    idle_us: float | None = None
    comm_overlap_pct: float | None = None
    gpu_util_pct: float | None = None

    def to_dict(self) -> dict[str, float | None]:
        """Field name -> value, the keys of ``report_schema.RankEntry``."""
        return asdict(self)


def device_gpu_rows(rt: RankTrace) -> pl.DataFrame:
    """The rank's GPU events with a valid interval, restricted to its own device when it has several."""
    gpu = rt.gpu.filter(pl.col("ts").is_not_null() & pl.col("end").is_not_null())
    if rt.meta.device_id is not None and gpu.height:
        devices = gpu["device"].drop_nulls().unique()
        if devices.len() > 1:
            gpu = gpu.filter(pl.col("device") == rt.meta.device_id)
    return gpu


def snap_ns(values_us: np.ndarray | float, base_us: float) -> np.ndarray:
    """Times as whole nanoseconds after ``base_us`` (float64 holding exact integers).

    Kineto timestamps carry at most ns resolution, so this loses nothing, and every sum of
    interval lengths becomes exact integer arithmetic. Plain float µs near 2.6e9 µs would accumulate
    ~1e-5 µs of rounding over thousands of kernels and break agreement with exact ground truth.
    """
    return np.round((np.asarray(values_us, dtype=np.float64) - base_us) * 1000.0)


@dataclass
class ClassSets:
    """Merged (disjoint, sorted) intervals of each GPU class in ns after ``base``; built once per rank."""

    comp: iv.Intervals
    comm: iv.Intervals
    memcpy: iv.Intervals
    base: float  # µs on the trace clock; the first GPU event start
    lo: float  # first GPU start, µs
    hi: float  # last GPU end, µs

    @classmethod
    def of(cls, gpu: pl.DataFrame, host: pl.DataFrame | None = None) -> ClassSets:
        lo = as_float(gpu["ts"].min()) if gpu.height else 0.0
        hi = as_float(gpu["end"].max()) if gpu.height else 0.0
        classes = gpu.select("ts", "end").with_columns(gpu_classes(gpu, host))
        sets = {}
        for name in ("comp", "comm", "memcpy"):
            part = classes.filter(pl.col("gpu_class") == name)
            sets[name] = iv.merge(snap_ns(part["ts"].to_numpy(), lo), snap_ns(part["end"].to_numpy(), lo))
        return cls(sets["comp"], sets["comm"], sets["memcpy"], lo, lo, hi)

    def breakdown(self, window: tuple[float, float] | None = None) -> Breakdown:
        """The breakdown on ``window`` (µs; default first GPU start .. last GPU end)."""
        lo, hi = window if window is not None else (self.lo, self.hi)
        lo_ns, hi_ns = float(snap_ns(lo, self.base)), float(snap_ns(hi, self.base))
        return breakdown_of_sets(self.comp, self.comm, self.memcpy, (lo_ns, hi_ns), scale=1e-3)


def breakdown_of_sets(
    comp: iv.Intervals,
    comm: iv.Intervals,
    memcpy: iv.Intervals,
    window: tuple[float, float],
    scale: float = 1.0,
) -> Breakdown:
    """The breakdown of already-merged class intervals on ``window`` (lengths × ``scale`` -> µs)."""
    lo, hi = window
    width = max(float(hi) - float(lo), 0.0)
    c = iv.clip_sorted(comp, lo, hi)
    m = iv.clip_sorted(comm, lo, hi)
    p = iv.clip_sorted(memcpy, lo, hi)
    compute = iv.length(c)
    comm_len = iv.length(m)
    exposed_comm = iv.length(iv.subtract(m, c))
    memcpy_len = iv.length(p)
    exposed_memcpy = iv.length(iv.subtract(iv.subtract(p, c), m))
    busy = iv.length(iv.union(c, m, p))
    idle = width - busy
    overlap = comm_len - exposed_comm
    return Breakdown(
        window_us=width * scale,
        gpu_busy_us=busy * scale,
        compute_us=compute * scale,
        comm_us=comm_len * scale,
        exposed_comm_us=exposed_comm * scale,
        memcpy_us=memcpy_len * scale,
        exposed_memcpy_us=exposed_memcpy * scale,
        idle_us=idle * scale,
        comm_overlap_pct=(overlap / comm_len * 100.0) if comm_len > 0 else None,
        gpu_util_pct=(busy / width * 100.0) if width > 0 else None,
    )


def rank_breakdown(rt: RankTrace, window: tuple[float, float] | None = None) -> Breakdown:
    """GPU time split of one rank on ``window`` (default: first GPU start .. last GPU end)."""
    gpu = device_gpu_rows(rt)
    if gpu.height == 0:
        return Breakdown()
    return ClassSets.of(gpu, rt.host).breakdown(window)


STEP_BREAKDOWN_SCHEMA: dict[str, PolarsDataType] = {
    "step": pl.Int64,
    **{name: pl.Float64 for name in BREAKDOWN_FIELDS},
}


def step_breakdowns(rt: RankTrace, steps: StepWindows) -> pl.DataFrame:
    """One row per step window: ``step`` plus every :class:`Breakdown` field, on that window.

    Empty (with the columns) when the trace has no GPU events or there are no steps.
    """
    gpu = device_gpu_rows(rt)
    if gpu.height == 0 or steps.table.height == 0:
        return pl.DataFrame(schema=STEP_BREAKDOWN_SCHEMA)
    sets = ClassSets.of(gpu, rt.host)
    rows: dict[str, list[float | None]] = {name: [] for name in BREAKDOWN_FIELDS}
    for start, end in zip(steps.table["start"].to_list(), steps.table["end"].to_list()):
        b = sets.breakdown((start, end))
        for f in fields(b):
            rows[f.name].append(getattr(b, f.name))
    return pl.DataFrame(
        {"step": steps.table["step"].to_list(), **rows}, schema=STEP_BREAKDOWN_SCHEMA
    )


def identity_error(b: Breakdown) -> float:
    """|compute + exposed_comm + exposed_memcpy + idle − window| (0 up to rounding); NaN when None."""
    if b.window_us is None:
        return float("nan")
    total = np.float64(b.compute_us) + b.exposed_comm_us + b.exposed_memcpy_us + b.idle_us
    return float(abs(total - b.window_us))
