"""Summaries -> the job's cross-rank results (the reduce): rank numbering, collectives, clocks,
bandwidth, stragglers, pipeline bubble, slow steps, merged kernel table and formula MFU.

Needs nothing but the per-rank :class:`RankSummary` objects (and run.json / NCCL-log facts the driver
already holds): no rank file is read here, so the reduce runs on one machine whatever executor ran
the map. The pipeline bubble uses each stage's ``stage_activity`` carried in its summary.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any, cast

import polars as pl

from traceread.assemble.rank_map import RankSummary
from traceread.errors import TraceFileError, guarded
from traceread.model import FLOW_SCHEMA, GPU_SCHEMA, HOST_SCHEMA, STEP_SCHEMA, RankTrace, empty_frame
from traceread.options import MAX_MISMATCH_WARNINGS, ReportOptions
from traceread.report_schema import LEDGER_CAUSES, Report

if TYPE_CHECKING:
    from traceread.report_schema import Memory


def assign_ranks(summaries: list[RankSummary]) -> list[str]:
    """Rank numbers for the whole set (reader rules), checked to be one job; extracts renumbered."""
    from traceread.read.ranks import assign_ranks as assign

    stubs = [RankTrace(s.entry["rank"], s.file, s.meta, empty_frame(GPU_SCHEMA), empty_frame(HOST_SCHEMA),
                       empty_frame(STEP_SCHEMA), empty_frame(FLOW_SCHEMA)) for s in summaries]
    old = [s.entry["rank"] for s in summaries]
    warnings = assign(stubs)  # raises RankConflictError for two runs mixed
    by_file = {st.file: st.rank for st in stubs}
    for s, before in zip(summaries, old):
        if by_file[s.file] != before:
            s.set_rank(by_file[s.file])
    summaries.sort(key=lambda s: s.entry["rank"])
    return warnings


def merge_kernels(summaries: list[RankSummary], top: int) -> list[dict[str, Any]]:
    """Kernel table summed over ranks: calls and times add, per-call geometry is time-weighted."""
    rows = [dict(k, _rank=s.entry["rank"]) for s in summaries for k in s.kernels]
    if not rows:
        return []
    df = pl.DataFrame(rows, infer_schema_length=None)

    def w(col: str) -> pl.Expr:
        has = pl.col(col).is_not_null()
        den = pl.col("total_us").filter(has).sum()
        return pl.when(den > 0).then((pl.col(col) * pl.col("total_us")).filter(has).sum() / den).otherwise(None)

    agg = df.group_by("name").agg(
        pl.col("calls").sum(), pl.col("total_us").sum(), w("blocks_per_sm").alias("blocks_per_sm"),
        w("occupancy_pct").alias("occupancy_pct"), w("wave_efficiency_pct").alias("wave_efficiency_pct"),
        pl.when(pl.col("sm_time_lost_us").is_not_null().any()).then(pl.col("sm_time_lost_us").sum())
        .otherwise(None).alias("sm_time_lost_us"),
        pl.col("_rank").n_unique().alias("ranks"),
        (pl.col("comm_kind").drop_nulls().first() if "comm_kind" in df.columns else pl.lit(None)).alias("comm_kind"),
    ).with_columns((pl.col("total_us") / pl.col("calls")).alias("mean_us"))
    agg = agg.sort(["total_us", "name"], descending=[True, False]).head(top)  # name breaks ties: stable output
    cols = ["name", "calls", "total_us", "mean_us", "blocks_per_sm", "occupancy_pct", "wave_efficiency_pct",
            "sm_time_lost_us", "ranks", "comm_kind"]
    return [{c: r[c] for c in cols} for r in agg.to_dicts()]


def run_hosts(run_info: dict[str, Any] | None, warnings: list[str]) -> tuple[dict[int, str], dict[int, float]]:
    if not run_info:
        return {}, {}
    from traceread.analysis.comm.clocks import hosts_from_run_info

    return guarded("run.json hosts", warnings, lambda: hosts_from_run_info(run_info), ({}, {}))


def cross_rank(report: Report, summaries: list[RankSummary], hosts: dict[int, str], recorded: dict[int, float],
                opts: ReportOptions, warnings: list[str], run_info: dict[str, Any] | None = None) -> tuple[Any, Any]:
    """Layout, collectives, clocks, stragglers, pipeline and slow steps from the per-rank extracts;
    returns (matched collectives, clock alignment) for the step ledger (None, None without them).

    With a ``run.json`` (``run_info``) the clock uncertainty ``traceread collect`` measured is the
    floor of ε, the margin below which arrival differences are not blamed on anyone.
    """
    from traceread.analysis.comm import clocks, collectives, pipeline, stragglers
    from traceread.analysis.comm import perf as comm_perf
    from traceread.analysis.comm.layout import layout_from_summaries
    from traceread.analysis.time import slow_steps

    report["layout"] = guarded("parallel layout", warnings, lambda: layout_from_summaries(
        summaries, hosts=hosts, nccl=report.get("nccl")).to_json())
    frames = {s.entry["rank"]: s.step_frame for s in summaries if s.step_frame.height}
    report["slow_steps"] = guarded("slow steps", warnings, lambda: slow_steps.find_slow_steps(frames), []) if frames else []
    if report["slow_steps"]:
        guarded("slow-step host activity", warnings, lambda: _host_activity(report["slow_steps"], summaries))

    extracts = [s.comm for s in summaries if s.comm.height]
    if not extracts:
        return None, None
    matched = guarded("collective matching", warnings, lambda: collectives.match_collectives(extracts))
    if matched is None:
        return None, None
    for m in matched.mismatches[:MAX_MISMATCH_WARNINGS]:
        warnings.append(f"collectives: {m}")
    if len(matched.mismatches) > MAX_MISMATCH_WARNINGS:
        warnings.append(f"collectives: {len(matched.mismatches) - MAX_MISMATCH_WARNINGS} more mismatches")
    eps_floor = clocks.recorded_uncertainty(run_info) if run_info else 0.0
    clock = guarded("clock alignment", warnings, lambda: clocks.estimate_offsets(
        matched, hosts or None, recorded or None, recorded_epsilon_us=eps_floor))
    if clock is not None:
        report["source"]["clock"] = clock.to_json()
        warnings.extend(f"clocks: {n}" for n in clock.notes if "not checked" not in n)
    device_names = {s.entry["rank"]: s.meta.device_name for s in summaries}
    from traceread.analysis.comm.layout import node_map

    nodes, _src = guarded("node map", warnings, lambda: node_map(
        matched.ranks, hosts=hosts or None, nccl=report.get("nccl"),
        devices={s.entry["rank"]: s.meta.device_id for s in summaries},
        world_size=next((s.meta.world_size for s in summaries if s.meta.world_size), None) or len(summaries)),
        ({}, None))
    report["collectives"] = guarded(
        "collective bandwidth", warnings,
        lambda: comm_perf.collective_table(matched, clock, hosts=hosts or None, device_names=device_names,
                                           nodes=nodes or None, nccl=report.get("nccl")), [])
    windows = {s.entry["rank"]: s.windows for s in summaries}
    st = guarded("stragglers", warnings, lambda: stragglers.attribute(matched, windows, clock))
    if st is not None:
        report["stragglers"] = st.entries
        report["straggler_heatmap"] = st.heatmap
        warnings.extend(f"stragglers: {n}" for n in st.notes)
    report["pipeline"] = guarded("pipeline", warnings,
                                  lambda: _pipeline(matched, summaries, clock, pipeline))
    return matched, clock


def step_ledger(report: Report, summaries: list[RankSummary], matched: Any, clock: Any) -> None:
    """The step ledger (analysis.job_ledger): ``report["ledger"]`` and each ``ranks[].ledger``."""
    from traceread.analysis.ledger import job as job_ledger

    segments = {s.entry["rank"]: s.ledger_segments for s in summaries if s.ledger_segments is not None}
    if not segments:
        return
    # Roles of the process groups from the layout (report["layout"]); without one the ledger falls
    # back to send/recv → pp, all-to-all → ep, else other.
    from traceread.analysis.comm.layout import group_key

    layout = report.get("layout")
    roles = {str(g["pg"]): g["role"] for g in (layout.get("groups") if layout else None) or []}
    role_of = (lambda pg: roles.get(group_key(pg, roles), "other")) if roles else None
    host_only = {s.entry["rank"] for s in summaries if s.entry.get("compute_us") is None}
    led = job_ledger.build(segments, [s.comm for s in summaries if s.comm.height], matched, clock, role_of, host_only)
    report["ledger"] = led.job
    for e in report["ranks"]:
        if e["rank"] in led.per_rank:
            e["ledger"] = led.per_rank[e["rank"]]
    straggler_costs(report)


def straggler_costs(report: Report) -> None:
    """Each straggler entry's ``impact_us_per_step`` from the window ledger: the step time its delay
    cost, once per step whatever number of collectives waited on it, and never more than the other
    ranks' own work allows (``ledger.window.late[].saving_us``); ``noise`` when that delay is within
    the run's own step-to-step spread (docs/ledger.md)."""
    w = (report.get("ledger") or {}).get("window")
    if not w or not w.get("steps"):
        return
    late = {int(x["rank"]): x for x in w.get("late") or []}
    for e in report.get("stragglers") or []:
        x = late.get(int(e["rank"]))
        e["impact_us_per_step"] = float(x["saving_us"]) / int(w["steps"]) if x else 0.0
        e["noise"] = not (x and x.get("straggler"))
        if x and x.get("cause") in LEDGER_CAUSES:  # what its own steps show beyond the others'
            e["cause"] = x["cause"]


def _host_activity(slow: list[Any], summaries: list[RankSummary]) -> None:
    """For host-caused slow steps, and those of one late rank (on that rank): which host activity grew
    (analysis.host_activity), into ``detail`` and the extra ``host_activity`` ([{name, growth_us}])."""
    from traceread.analysis.time import host_activity
    from traceread.fmt import ms

    per = {s.entry["rank"]: s.host_self for s in summaries if s.host_self is not None and s.host_self.height}
    if not per:
        return
    all_steps = sorted({int(x) for f in per.values() for x in f["step"].unique().to_list()})
    slow_set = {int(s["step"]) for s in slow}
    normal = [x for x in all_steps if x not in slow_set]
    for s in slow:
        cause = str(s.get("cause") or "")
        if cause != "host" and not cause.startswith("rank:"):
            continue
        # a late rank's slow step: what grew on that rank (the others only waited for it)
        mine = {int(cause[5:]): per[int(cause[5:])]} if cause.startswith("rank:") and int(cause[5:]) in per else per
        g = host_activity.grown(mine, int(s["step"]), normal, float(s["excess_us"]))
        s["host_activity"] = [{"name": n, "growth_us": d} for n, d in g]
        if g:
            what = ", ".join(f"{n} +{ms(d)}" for n, d in g)
            s["detail"] = (f"{s.get('detail') or 'the GPU sat idle'}; host time not covered by any nested "
                           f"operator grew in: {what}")


def _pipeline(matched: Any, summaries: list[RankSummary], clock: Any, pipeline: Any) -> Any:
    """Detect the pipeline from p2p transfers; the bubble from the stages' ``stage_activity``
    extracts, carried in their summaries (no rank file is re-read)."""
    chains, _ring = pipeline.pipeline_chains(matched)
    if not chains:
        return None
    by_rank = {s.entry["rank"]: s for s in summaries}
    activity: dict[int, pl.DataFrame] = {}
    for r in chains[0]:
        s = by_rank.get(r)
        if s is not None and s.stage_activity is not None:
            activity[r] = s.stage_activity
    offsets = clock.offsets_us if clock is not None else None
    return pipeline.detect_pipeline(matched, activity, offsets)


def memory(report: Report, summaries: list[RankSummary], opts: ReportOptions, warnings: list[str],
           snapshot_files: list[Any]) -> None:
    """``report["memory"]`` (analysis.memory.job): the ranks' memory summaries compared, the guide's model
    with --params, and the memory snapshots (the OOM ones and the peak rank's first); stays None
    without memory events and snapshots."""
    from traceread.analysis.memory import snapshot as snap
    from traceread.analysis.memory.job import job_memory

    per_rank = {s.entry["rank"]: s.memory for s in summaries if s.memory}
    peak = max(per_rank, key=lambda r: (per_rank[r]["devices"][0]["peak_allocated_bytes"], -r)) if per_rank else None
    def read(f: Any) -> Any:
        try:
            return snap.read_snapshot(f)
        except TraceFileError as exc:  # bad input: one line naming the file; the others are read
            warnings.append(str(exc))
            return None

    snaps = []
    for f in snap.choose(snapshot_files, peak):
        res = guarded(f"memory snapshot {f}", warnings, partial(read, f))
        if res is not None:
            snaps.append(res)
    if len(snapshot_files) > snap.MAX_SNAPSHOTS:
        warnings.append(f"memory: {len(snapshot_files)} snapshots found, {snap.MAX_SNAPSHOTS} read "
                        "(those after an OOM and the peak rank's first)")
    report["memory"] = cast("Memory | None", job_memory(
        per_rank, layout=report.get("layout"), world_size=(report.get("source") or {}).get("world_size"),
        params=opts.params, zero_stage=opts.zero_stage, dtype=opts.param_dtype, optimizer=opts.optimizer,
        master_weights=opts.master_weights, snapshots=snaps))


def formula_mfu(report: Report, opts: ReportOptions, warnings: list[str]) -> None:
    """MFU = 6·N·D ÷ (step time × GPUs × peak) when --params and --tokens-per-step are given
    (+ 12·L·s·d·D when --n-layers, --seq-len and --d-model are too: attention's score and value
    matmuls, which 6·N leaves out).

    D is the whole job's tokens per step, so each rank is credited D ÷ world size over its own median
    step duration (``steps[].duration_us``; the whole-trace window when it has no steps). Replaces
    the trace-counted MFU (which needs recorded shapes).
    """
    if not opts.params or not opts.tokens_per_step:
        return
    from traceread.analysis.compute import mfu as mfu_mod
    from traceread.analysis.hardware import lookup_device
    from traceread.assemble.queries import median_step_duration_us

    ranks = report.get("ranks") or []
    world = len(ranks) or 1
    precision = (report.get("roofline") or {}).get("precision") or "bf16"
    for e in ranks:
        if not e.get("window_us"):
            continue
        match = lookup_device(e.get("device"), e.get("num_sms"), opts.device_spec)
        if match.spec is None:
            warnings.append(f"rank {e['rank']}: MFU needs the device's peak ({match.reason}); pass --device-spec")
            continue
        step_us = median_step_duration_us(e)
        if not step_us:
            continue
        val = guarded(f"rank {e['rank']}: formula MFU", warnings, partial(
            mfu_mod.formula_mfu, opts.params, opts.tokens_per_step / world, step_us / 1e6, match.spec, precision,
            opts.n_layers, opts.seq_len, opts.d_model))
        if val is not None:
            e["mfu_pct"] = float(val)
            e.pop("mfu_note", None)  # the trace MFU's reason no longer applies
