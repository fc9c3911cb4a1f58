"""One rank's tables -> its small summary (the map): report entry plus the extracts the cross-rank
analyses need, so that the tables can be dropped as soon as the rank is summarised.

:class:`RankSummary` is the only thing that crosses from a worker (local process or Ray task) to the
driver and the only thing the summary cache stores. Its fields are plain data (dicts, lists, numbers,
strings, polars frames, :class:`RankMeta`), because :mod:`traceread.engine.caches` serialises every
field generically by its type: adding a field is adding a dataclass field with a default, nothing else.

``stage_activity`` (per step: merged compute and p2p intervals, :func:`pipeline.stage_activity`) is
kept for ranks that sent or received point-to-point, so the pipeline bubble is computed from
summaries alone, without re-reading any rank on the driver.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import polars as pl

from traceread.errors import guarded
from traceread.model import RankMeta, RankTrace, as_float
from traceread.options import KERNELS_PER_RANK
from traceread.report_schema import RankEntry, StepEntry

if TYPE_CHECKING:  # the analyses load when a rank is summarised, not when this module is imported
    from traceread.analysis.time.steps import StepWindows
    from traceread.devices import DeviceSpec


@dataclass
class RankSummary:
    """Everything the report keeps of one rank once its tables are gone."""

    entry: RankEntry
    meta: RankMeta
    file: str
    comm: pl.DataFrame  # collectives.comm_events extract
    windows: pl.DataFrame  # device step windows: step, start, end, duration
    step_frame: pl.DataFrame  # step_breakdowns (+ rank)
    kernels: list[dict[str, Any]] = field(default_factory=list)
    roofline: dict[str, Any] | None = None
    host_self: pl.DataFrame | None = None  # host_activity.host_self_time: what the host did per step
    warnings: list[str] = field(default_factory=list)
    stage_activity: pl.DataFrame | None = None  # pipeline.stage_activity, for ranks with p2p transfers
    timeline: pl.DataFrame | None = None  # step_timeline.rank_intervals: bounded GPU intervals of a few steps
    ledger_segments: pl.DataFrame | None = None  # analysis.ledger.rank_segments: the step ledger's pieces
    warm_names: dict[str, float] = field(default_factory=dict)  # analysis.warmup.warm_names_of: start-up events
    memory: dict[str, Any] | None = None  # analysis.memory.rank.rank_memory: [memory] events (profile_memory=True)
    workload: dict[str, Any] | None = None  # analysis.time.iterations.workload: training, serving, inference

    def set_rank(self, rank: int) -> None:
        """Renumber the rank everywhere it is written (entry and every frame with a ``rank`` column)."""
        self.entry["rank"] = rank
        for name in ("comm", "step_frame", "stage_activity", "host_self", "timeline"):
            df = getattr(self, name)
            if isinstance(df, pl.DataFrame) and df.height and "rank" in df.columns:
                setattr(self, name, df.with_columns(pl.lit(rank, pl.Int64).alias("rank")))


def _f(v: Any) -> float | None:
    if v is None:
        return None
    v = float(v)
    return v if np.isfinite(v) else None


def _gpu_window(rt: RankTrace) -> tuple[float, float] | None:
    """The whole-trace GPU window: first GPU event start .. last GPU event end (HTA, TraceLens)."""
    from traceread.analysis.time.breakdown import device_gpu_rows

    gpu = device_gpu_rows(rt)
    if gpu.height == 0:
        return None
    return as_float(gpu["ts"].min()), as_float(gpu["end"].max())


def _rank_entry(rt: RankTrace, windows: StepWindows | None, frame: pl.DataFrame, warnings: list[str]) -> RankEntry:
    """The rank's RankEntry.

    Rank-level fields use the whole-trace window (first GPU event start .. last GPU event end, as
    HTA and TraceLens): :func:`breakdown.rank_breakdown`, :func:`occupancy.sm_metrics` and
    :func:`idle.idle_breakdown` on that one window. ``steps`` holds each device-aligned step's own
    breakdown (plus its host-bound idle); per-step views are computed from those entries
    (``reports.stats``), never as whole-trace totals ÷ steps. CPU-only ranks have no GPU window:
    their ``window_us`` is the sum of the host step windows and every GPU field stays null.
    """
    from traceread.analysis.compute import occupancy
    from traceread.analysis.time import breakdown, cpu_breakdown, idle

    e: dict[str, Any] = {
        "rank": rt.rank, "file": rt.file, "device": rt.meta.device_name, "num_sms": rt.meta.num_sms,
        "window_us": None, "gpu_busy_us": None, "compute_us": None, "comm_us": None, "exposed_comm_us": None,
        "memcpy_us": None, "exposed_memcpy_us": None, "idle_us": None, "comm_overlap_pct": None,
        "gpu_util_pct": None, "sm_efficiency_pct": None, "achieved_occupancy_pct": None, "mfu_pct": None,
        "steps": [], "host": None, "idle_breakdown": None, "hfu_pct": None, "cpu": None,
        "dropped_partial_step": (windows.dropped[-1] if windows is not None and windows.dropped else None),
    }
    steps: list[StepEntry] = []
    if frame.height:
        spans = [(float(a), float(a) + float(w or 0.0)) for a, w in zip(frame["_start"], frame["window_us"])]
        hb = guarded(f"rank {rt.rank}: per-step idle breakdown", warnings,
                      lambda: idle.host_bound_per_window(rt, spans))
        for i, row in enumerate(frame.iter_rows(named=True)):
            steps.append({
                "step": int(row["step"]), "start_us": float(row["_start"]), "duration_us": float(row["window_us"] or 0.0),
                "compute_us": _f(row["compute_us"]), "comm_us": _f(row["comm_us"]),
                "exposed_comm_us": _f(row["exposed_comm_us"]), "exposed_memcpy_us": _f(row["exposed_memcpy_us"]),
                "idle_us": _f(row["idle_us"]), "host_bound_us": (_f(hb[i]) if hb is not None else None),
            })
    elif windows is not None and windows.table.height:
        # No GPU work: the step windows are the host's; GPU fields stay null, the step time is known.
        steps = [{"step": int(s), "start_us": float(a), "duration_us": float(d)}
                 for s, a, d in windows.table.select("step", "start", "duration").iter_rows()]
        e["window_us"] = float(windows.table["duration"].sum())
    e["steps"] = steps

    if rt.gpu.height:
        span = guarded(f"rank {rt.rank}: GPU window", warnings, lambda: _gpu_window(rt))
        if span is not None:
            b = guarded(f"rank {rt.rank}: time breakdown", warnings, lambda: breakdown.rank_breakdown(rt))
            if b is not None:
                e.update({k: _f(v) for k, v in b.to_dict().items()})
            sm = guarded(f"rank {rt.rank}: SM efficiency", warnings, lambda: occupancy.sm_metrics(rt, window=span))
            if sm is not None:
                e["sm_efficiency_pct"] = _f(sm.sm_efficiency_pct)
                e["achieved_occupancy_pct"] = _f(sm.achieved_occupancy_pct)
                if e["num_sms"] is None:
                    e["num_sms"] = sm.num_sms
            ib = guarded(f"rank {rt.rank}: idle breakdown", warnings, lambda: idle.idle_breakdown(rt, span))
            if ib:
                e["idle_breakdown"] = {"host_bound_us": float(ib["host_bound_us"]),
                                       "kernel_gap_us": float(ib["kernel_gap_us"]), "other_us": float(ib["other_us"])}
    else:
        e["cpu"] = guarded(f"rank {rt.rank}: CPU breakdown", warnings, lambda: cpu_breakdown.cpu_breakdown(rt))
        split = guarded(f"rank {rt.rank}: CPU breakdown per step", warnings, lambda: cpu_breakdown.cpu_step_split(
            rt, [(s["start_us"], s["duration_us"]) for s in steps]))
        for s, part in zip(steps, split or []):
            s.update(part)
    return cast(RankEntry, e)  # built field by field above (breakdown fields by name)


def _kernels(rt: RankTrace, windows: StepWindows | None, warnings: list[str]) -> list[dict[str, Any]]:
    """The rank's kernel table over its analysed steps (kernels starting inside the device-aligned
    step span; the whole trace when there are no steps), so that totals ÷ steps is the mean per
    step the findings and ``traceread diff`` report."""
    from dataclasses import replace

    from traceread.analysis.compute import occupancy

    span = windows.span if windows is not None else None
    src = rt
    if span is not None and rt.gpu.height:
        src = replace(rt, gpu=rt.gpu.filter((pl.col("ts") >= span[0]) & (pl.col("ts") < span[1])))
    kt = guarded(f"rank {rt.rank}: kernel table", warnings, lambda: occupancy.kernel_table(src))
    if kt is None or kt.height == 0:
        return []
    by_time = kt.sort("total_us", descending=True).head(KERNELS_PER_RANK)
    by_lost = kt.head(KERNELS_PER_RANK // 2)
    keep = pl.concat([by_time, by_lost]).unique(subset="name", keep="first", maintain_order=True)
    return keep.to_dicts()


def _ops_and_device(rt: RankTrace, spec_file: Path | None,
                    warnings: list[str]) -> tuple[pl.DataFrame | None, DeviceSpec | None, str | None]:
    """(operator table, device spec, why that device) — shared by MFU and the roofline."""
    from traceread.analysis.compute import roofline as rf
    from traceread.analysis.hardware import device_for_meta

    match = guarded(f"rank {rt.rank}: device lookup", warnings, lambda: device_for_meta(rt.meta, spec_file))
    spec = match.spec if match is not None else None
    ops = None
    if rt.gpu.height and rt.host.height:
        ops = guarded(f"rank {rt.rank}: operator FLOPs", warnings, lambda: rf.operator_table(rt, spec))
    return ops, spec, (match.reason if match is not None else None)


def _roofline(rt: RankTrace, ops: pl.DataFrame | None, spec: DeviceSpec | None, reason: str | None,
              warnings: list[str]) -> dict[str, Any] | None:
    """Roofline of one rank's operators (analysis.roofline) with the field names the renderers read."""
    from traceread.analysis.compute import roofline as rf

    if ops is None:
        return None

    def run() -> dict[str, Any]:
        r = rf.roofline_summary(rt, spec, device_reason=reason, ops=ops)
        for op in r.get("ops") or []:
            op.setdefault("time_us", op.get("kernel_time_us"))
            op.setdefault("roofline_pct", op.get("pct_of_roof"))
        return r

    return guarded(f"rank {rt.rank}: roofline", warnings, run)


def _with_scale(roof: dict[str, Any] | None, entry: RankEntry) -> dict[str, Any] | None:
    """Op times are the rank's totals: ``time_scale`` = 1 / its steps turns them into per-step times."""
    if roof is not None:
        roof["time_scale"] = 1.0 / max(1, len(entry.get("steps") or []))
    return roof


def _trace_mfu(rt: RankTrace, windows: StepWindows | None, ops: pl.DataFrame | None, spec: DeviceSpec | None,
               entry: RankEntry, warnings: list[str]) -> None:
    """Trace-counted MFU/HFU (analysis.mfu) into the entry; without shapes or device it stays None
    and ``mfu_note`` says why (it also says what MFU leaves out, e.g. activation recompute)."""
    from traceread.analysis.compute import mfu as mfu_mod

    if ops is None or windows is None:
        return
    res = guarded(f"rank {rt.rank}: MFU", warnings, partial(mfu_mod.trace_mfu, rt, windows.table, spec, ops=ops))
    if res is not None and res.note:
        entry["mfu_note"] = res.note
    if res is not None and spec is not None:  # without a peak the FLOPs alone are no utilisation
        entry["mfu_pct"] = _f(res.mfu_pct)
        entry["hfu_pct"] = _f(res.hfu_pct)
        entry["model_flops_per_step"] = _f(res.model_flops_per_step)


def summarise_rank(rt: RankTrace, *, spec_file: Path | None = None, detail: bool = False) -> RankSummary:
    """Reduce one rank to its report entry and cross-rank extracts (never raises for bad data)."""
    from dataclasses import replace

    from traceread.analysis.comm import collectives
    from traceread.analysis.kinds import fill_launch_comm_args
    from traceread.analysis.time import breakdown
    from traceread.analysis.time import steps as steps_mod

    warnings: list[str] = []
    from traceread.analysis.time import iterations as iters

    rt = replace(rt, gpu=guarded(f"rank {rt.rank}: comm args", warnings,
                                 lambda: fill_launch_comm_args(rt.gpu, rt.host), rt.gpu))
    # a serving engine has no ProfilerStep: its own iteration annotations are the steps
    its = guarded(f"rank {rt.rank}: engine iterations", warnings,
                  lambda: iters.engine_iterations(rt.host)) if rt.steps.height == 0 else None
    if its is not None:
        rt = replace(rt, steps=its.steps)
    work = guarded(f"rank {rt.rank}: workload", warnings,
                   lambda: iters.workload(rt.host, rt.steps.height > 0, its, rt.gpu.height > 0))
    windows = guarded(f"rank {rt.rank}: step windows", warnings, lambda: steps_mod.device_steps(rt))
    if windows is not None and windows.note:
        warnings.append(f"rank {rt.rank}: {windows.note}")
    if work is not None and rt.host.height:  # the framework the trace shows, gradient accumulation
        from traceread.analysis.time import frameworks

        work["framework"] = guarded(f"rank {rt.rank}: framework", warnings, lambda: frameworks.detect(rt.host))
        if windows is not None:
            work["micro_steps"] = guarded(f"rank {rt.rank}: micro-steps", warnings,
                                          lambda: frameworks.micro_steps(rt.host, windows.table))
    frame = pl.DataFrame()
    if windows is not None and rt.gpu.height:
        frame = guarded(f"rank {rt.rank}: time breakdown", warnings,
                         lambda: breakdown.step_breakdowns(rt, windows), pl.DataFrame())
        if frame.height:
            frame = frame.join(windows.table.select("step", pl.col("start").alias("_start")), on="step", how="left")
    entry = _rank_entry(rt, windows, frame, warnings)
    if its is not None:  # prefill / decode / mixed per iteration, where the engine says
        for s in entry["steps"]:
            s["iteration"] = its.kinds.get(int(s["step"])) or None
    ops, spec, reason = _ops_and_device(rt, spec_file, warnings)
    _trace_mfu(rt, windows, ops, spec, entry, warnings)
    wtab = windows.table if windows is not None else pl.DataFrame(
        schema={"step": pl.Int64, "start": pl.Float64, "end": pl.Float64, "duration": pl.Float64})
    comm = guarded(f"rank {rt.rank}: communication events", warnings,
                    lambda: collectives.comm_events(rt, wtab), None)
    if comm is None:
        comm = pl.DataFrame(schema=collectives.EXTRACT_SCHEMA)
    comm = collectives.compact_pg_ranks(comm)  # O(group) text per row would make summaries O(world)
    from traceread.analysis.time import host_activity, step_timeline
    from traceread.read import warmup

    host_self = guarded(f"rank {rt.rank}: host activity", warnings,
                         lambda: host_activity.host_self_time(rt, wtab)) if rt.host.height else None
    from traceread.analysis.ledger import rank as ledger

    if rt.gpu.height:
        segments = guarded(f"rank {rt.rank}: step ledger", warnings, lambda: ledger.rank_segments(rt, wtab, ops, comm))
    else:  # CPU-only rank: the host's ledger (operators, host-side collectives, the rest)
        segments = guarded(f"rank {rt.rank}: step ledger", warnings, lambda: ledger.host_segments(rt, wtab, comm))
    from traceread.analysis.time import host_spans

    span_times = guarded(f"rank {rt.rank}: host spans", warnings,
                         lambda: host_spans.span_times(rt, wtab)) if rt.host.height else None
    if span_times is not None and span_times.height:  # "the same span on the other ranks"
        n = max(wtab.height, 1)
        entry["host_spans"] = [{"name": nm, "family": f, "us_per_step": us / n, "count": c}
                               for nm, f, us, c in span_times.select("name", "family", "us", "count").iter_rows()]
    sf = frame.drop("_start") if "_start" in frame.columns else frame
    if sf.height:
        sf = sf.with_columns(pl.lit(rt.rank, pl.Int64).alias("rank"))
    return RankSummary(
        entry=entry, meta=rt.meta, file=rt.file, comm=comm, windows=wtab, step_frame=sf,
        kernels=_kernels(rt, windows, warnings),
        roofline=_with_scale(_roofline(rt, ops, spec, reason, warnings), entry) if detail else None,
        warnings=warnings, host_self=host_self, ledger_segments=segments,
        stage_activity=_stage_activity(rt, comm, wtab, warnings),
        timeline=guarded(f"rank {rt.rank}: step timeline", warnings, lambda: step_timeline.rank_intervals(rt, wtab)),
        warm_names=guarded(f"rank {rt.rank}: start-up events", warnings, lambda: warmup.warm_names_of(rt.host), {}),
        memory=_memory(rt, spec_file, warnings),
        workload=work,
    )


def _memory(rt: RankTrace, spec_file: Path | None, warnings: list[str]) -> dict[str, Any] | None:
    """The rank's memory summary, only for traces recorded with ``profile_memory=True``."""
    if not rt.memory.height:
        return None
    from traceread.analysis.memory.rank import rank_memory

    return guarded(f"rank {rt.rank}: memory", warnings, lambda: rank_memory(rt, spec_file))


def _stage_activity(rt: RankTrace, comm: pl.DataFrame, wtab: pl.DataFrame, warnings: list[str]) -> pl.DataFrame | None:
    """The pipeline bubble's per-rank extract, only for ranks that did point-to-point transfers
    (only those can be pipeline stages): other ranks carry nothing."""
    if not comm.height or "p2p" not in comm.columns or not bool(comm["p2p"].fill_null(False).any()):
        return None
    from traceread.analysis.comm import pipeline

    return guarded(f"rank {rt.rank}: pipeline stage activity", warnings, lambda: pipeline.stage_activity(rt, wtab))


def slim_meta(meta: RankMeta) -> RankMeta:
    """Only what rank assignment, the job checks and the layout need travels to the driver
    (``pg_config`` lists every member of every group: megabytes per rank on a 1024-rank job; the
    layout keeps it as compact rank ranges)."""
    from traceread.analysis.comm.layout import compact_groups

    dist = meta.distributed_info or {}
    meta.distributed_info = {k: dist[k] for k in ("rank", "world_size", "backend", "nccl_version") if k in dist}
    meta.pg_config = compact_groups(meta.pg_config)
    return meta

