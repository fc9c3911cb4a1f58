"""Traces in, report document out: read every rank, run every analysis, assemble :class:`Report`.

Memory: a rank's full tables are needed only while that rank is summarised. Each rank is read and
reduced (in a worker process when it must be parsed, in this process when it is in the parse cache)
to its :class:`RankEntry` plus small extracts (communication events, step windows, per-step
breakdown, top kernels); the tables are then dropped. The cross-rank analyses (collective matching,
clocks, bandwidth, stragglers, pipeline, slow steps) run on the extracts, so a 1024-rank job needs
memory for the extracts, not for 1024 traces. The summaries are kept in the summary cache
(:func:`load_summary`), so a second report of the same files skips the per-rank work. Only the
ranks of the detected pipeline are read a second time (from the parse cache) for the bubble.

Robustness: every analysis runs under :func:`_guarded`; one that fails or lacks data leaves its part
of the document null/empty and adds a warning. Only "no trace could be read at all" is an error
(:class:`NothingUsableError`, exit code 3).
"""

from __future__ import annotations

import functools
import hashlib
import json
import multiprocessing
import os
import pickle
import sys
import tempfile
import traceback
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from traceread.errors import TraceFileError, TraceReadError
from traceread.model import RankMeta, RankTrace, empty_frame, FLOW_SCHEMA, GPU_SCHEMA, HOST_SCHEMA, STEP_SCHEMA
from traceread.report_schema import SCHEMA_ID, RankEntry, Report, StepEntry

#: Kernels kept per rank before merging across ranks (by total time and by SM time lost).
KERNELS_PER_RANK = 40
#: Kernels in the report.
TOP_KERNELS = 30
MAX_MISMATCH_WARNINGS = 10


class NothingUsableError(TraceReadError):
    """Nothing to analyse. ``bad_input``: files or paths were given but unreadable/missing (exit 2);
    otherwise no trace file was found at all (exit 3)."""

    def __init__(self, message: str, *, bad_input: bool = False) -> None:
        super().__init__(message)
        self.bad_input = bad_input


@dataclass
class ReportOptions:
    """Knobs of ``traceread report`` that change the analysis (not the rendering)."""

    use_cache: bool = True
    cache_dir: Path | None = None
    workers: int | None = None
    progress: bool = False
    params: float | None = None  # model parameters, for formula MFU (6·N·D)
    tokens_per_step: float | None = None  # tokens processed per step by the whole job
    n_layers: int | None = None  # with seq_len and d_model: the attention term 12·L·s·d per token
    seq_len: int | None = None
    d_model: int | None = None
    device_spec: Path | None = None  # user file with device peaks (--device-spec)
    cycle: str | None = None  # profiling cycle to analyse: None/latest, N, RUN:N (reader.cycles)
    top_kernels: int = TOP_KERNELS


@dataclass
class RankSummary:
    """Everything the report keeps of one rank once its tables are gone."""

    entry: dict[str, Any]
    meta: RankMeta
    file: str
    comm: pl.DataFrame  # collectives.comm_events extract
    windows: pl.DataFrame  # device step windows: step, start, end, duration
    step_frame: pl.DataFrame  # step_breakdowns (+ rank)
    kernels: list[dict[str, Any]] = field(default_factory=list)
    roofline: dict[str, Any] | None = None
    host_self: pl.DataFrame | None = None  # host_activity.host_self_time: what the host did per step
    timeline: pl.DataFrame | None = None  # step_timeline.rank_intervals: bounded GPU intervals of a few steps
    warnings: list[str] = field(default_factory=list)
    ledger_segments: pl.DataFrame | None = None  # analysis.ledger.rank_segments: the step ledger's pieces


# ------------------------------------------------------------------------------------------------
# per rank (runs in worker processes)


def _guarded(name: str, warnings: list[str], fn: Callable[[], Any], default: Any = None) -> Any:
    """Run one analysis; on failure record a one-line warning and return ``default``."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - the report must survive any single analysis
        where = traceback.extract_tb(exc.__traceback__)[-1]
        warnings.append(f"{name} skipped: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} "
                        f"({Path(where.filename).name}:{where.lineno})")
        return default


def _f(v: Any) -> float | None:
    if v is None:
        return None
    v = float(v)
    return v if np.isfinite(v) else None


def _gpu_window(rt: RankTrace) -> tuple[float, float] | None:
    """The whole-trace GPU window: first GPU event start .. last GPU event end (HTA, TraceLens)."""
    from traceread.analysis.breakdown import device_gpu_rows

    gpu = device_gpu_rows(rt)
    if gpu.height == 0:
        return None
    return float(gpu["ts"].min()), float(gpu["end"].max())  # type: ignore[arg-type]


def _rank_entry(rt: RankTrace, windows: Any, frame: pl.DataFrame, warnings: list[str]) -> dict[str, Any]:
    """The rank's RankEntry.

    Rank-level fields use the whole-trace window (first GPU event start .. last GPU event end, as
    HTA and TraceLens): :func:`breakdown.rank_breakdown`, :func:`occupancy.sm_metrics` and
    :func:`idle.idle_breakdown` on that one window. ``steps`` holds each device-aligned step's own
    breakdown (plus its host-bound idle); per-step views are computed from those entries
    (``reports.stats``), never as whole-trace totals ÷ steps. CPU-only ranks have no GPU window:
    their ``window_us`` is the sum of the host step windows and every GPU field stays null.
    """
    from traceread.analysis import breakdown, cpu_breakdown, idle, occupancy

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
        hb = _guarded(f"rank {rt.rank}: per-step idle breakdown", warnings,
                      lambda: idle.host_bound_per_window(rt, spans))
        for i, row in enumerate(frame.iter_rows(named=True)):
            steps.append({
                "step": int(row["step"]), "start_us": float(row["_start"]), "duration_us": float(row["window_us"] or 0.0),
                "compute_us": _f(row["compute_us"]), "comm_us": _f(row["comm_us"]),
                "exposed_comm_us": _f(row["exposed_comm_us"]), "exposed_memcpy_us": _f(row["exposed_memcpy_us"]),
                "idle_us": _f(row["idle_us"]), "host_bound_us": (_f(hb[i]) if hb is not None else None),
            })  # type: ignore[typeddict-item]
    elif windows is not None and windows.table.height:
        # No GPU work: the step windows are the host's; GPU fields stay null, the step time is known.
        steps = [{"step": int(s), "start_us": float(a), "duration_us": float(d)}
                 for s, a, d in windows.table.select("step", "start", "duration").iter_rows()]
        e["window_us"] = float(windows.table["duration"].sum())
    e["steps"] = steps

    if rt.gpu.height:
        span = _guarded(f"rank {rt.rank}: GPU window", warnings, lambda: _gpu_window(rt))
        if span is not None:
            b = _guarded(f"rank {rt.rank}: time breakdown", warnings, lambda: breakdown.rank_breakdown(rt))
            if b is not None:
                e.update({k: _f(v) for k, v in b.to_dict().items()})
            sm = _guarded(f"rank {rt.rank}: SM efficiency", warnings, lambda: occupancy.sm_metrics(rt, window=span))
            if sm is not None:
                e["sm_efficiency_pct"] = _f(sm.sm_efficiency_pct)
                e["achieved_occupancy_pct"] = _f(sm.achieved_occupancy_pct)
                if e["num_sms"] is None:
                    e["num_sms"] = sm.num_sms
            ib = _guarded(f"rank {rt.rank}: idle breakdown", warnings, lambda: idle.idle_breakdown(rt, span))
            if ib:
                e["idle_breakdown"] = {"host_bound_us": float(ib["host_bound_us"]),
                                       "kernel_gap_us": float(ib["kernel_gap_us"]), "other_us": float(ib["other_us"])}
    else:
        e["cpu"] = _guarded(f"rank {rt.rank}: CPU breakdown", warnings, lambda: cpu_breakdown.cpu_breakdown(rt))
    return e


def _kernels(rt: RankTrace, windows: Any, warnings: list[str]) -> list[dict[str, Any]]:
    """The rank's kernel table over its analysed steps (kernels starting inside the device-aligned
    step span; the whole trace when there are no steps), so that totals ÷ steps is the mean per
    step the findings and ``traceread diff`` report."""
    from dataclasses import replace

    from traceread.analysis import occupancy

    span = windows.span if windows is not None else None
    src = rt
    if span is not None and rt.gpu.height:
        src = replace(rt, gpu=rt.gpu.filter((pl.col("ts") >= span[0]) & (pl.col("ts") < span[1])))
    kt = _guarded(f"rank {rt.rank}: kernel table", warnings, lambda: occupancy.kernel_table(src))
    if kt is None or kt.height == 0:
        return []
    by_time = kt.sort("total_us", descending=True).head(KERNELS_PER_RANK)
    by_lost = kt.head(KERNELS_PER_RANK // 2)
    keep = pl.concat([by_time, by_lost]).unique(subset="name", keep="first", maintain_order=True)
    return keep.to_dicts()


def _ops_and_device(rt: RankTrace, spec_file: Path | None, warnings: list[str]) -> tuple[Any, Any, str | None]:
    """(operator table, device spec, why that device) — shared by MFU and the roofline."""
    from traceread.analysis import roofline as rf
    from traceread.analysis.devices import device_for_meta

    match = _guarded(f"rank {rt.rank}: device lookup", warnings, lambda: device_for_meta(rt.meta, spec_file))
    spec = match.spec if match is not None else None
    ops = None
    if rt.gpu.height and rt.host.height:
        ops = _guarded(f"rank {rt.rank}: operator FLOPs", warnings, lambda: rf.operator_table(rt, spec))
    return ops, spec, (match.reason if match is not None else None)


def _roofline(rt: RankTrace, ops: Any, spec: Any, reason: str | None, warnings: list[str]) -> dict[str, Any] | None:
    """Roofline of one rank's operators (analysis.roofline) with the field names the renderers read."""
    from traceread.analysis import roofline as rf

    if ops is None:
        return None

    def run() -> dict[str, Any]:
        r = rf.roofline_summary(rt, spec, device_reason=reason, ops=ops)
        for op in r.get("ops") or []:
            op.setdefault("time_us", op.get("kernel_time_us"))
            op.setdefault("roofline_pct", op.get("pct_of_roof"))
        return r

    return _guarded(f"rank {rt.rank}: roofline", warnings, run)


def _with_scale(roof: dict[str, Any] | None, entry: dict[str, Any]) -> dict[str, Any] | None:
    """Op times are the rank's totals: ``time_scale`` = 1 / its steps turns them into per-step times."""
    if roof is not None:
        roof["time_scale"] = 1.0 / max(1, len(entry.get("steps") or []))
    return roof


def _trace_mfu(rt: RankTrace, windows: Any, ops: Any, spec: Any, entry: dict[str, Any], warnings: list[str]) -> None:
    """Trace-counted MFU/HFU (analysis.mfu) into the entry; stays None without shapes or device."""
    from traceread.analysis import mfu as mfu_mod

    if ops is None or windows is None or spec is None:
        return
    res = _guarded(f"rank {rt.rank}: MFU", warnings, lambda: mfu_mod.trace_mfu(rt, windows.table, spec, ops=ops))
    if res is not None:
        entry["mfu_pct"] = _f(res.mfu_pct)
        entry["hfu_pct"] = _f(res.hfu_pct)
        entry["model_flops_per_step"] = _f(res.model_flops_per_step)


def summarise_rank(rt: RankTrace, *, spec_file: Path | None = None, detail: bool = False) -> RankSummary:
    """Reduce one rank to its report entry and cross-rank extracts (never raises for bad data)."""
    from traceread.analysis import breakdown, collectives, steps as steps_mod

    warnings: list[str] = []
    windows = _guarded(f"rank {rt.rank}: step windows", warnings, lambda: steps_mod.device_steps(rt))
    if windows is not None and windows.note:
        warnings.append(f"rank {rt.rank}: {windows.note}")
    frame = pl.DataFrame()
    if windows is not None and rt.gpu.height:
        frame = _guarded(f"rank {rt.rank}: time breakdown", warnings,
                         lambda: breakdown.step_breakdowns(rt, windows), pl.DataFrame())
        if frame.height:
            frame = frame.join(windows.table.select("step", pl.col("start").alias("_start")), on="step", how="left")
    entry = _rank_entry(rt, windows, frame, warnings)
    ops, spec, reason = _ops_and_device(rt, spec_file, warnings)
    _trace_mfu(rt, windows, ops, spec, entry, warnings)
    wtab = windows.table if windows is not None else pl.DataFrame(
        schema={"step": pl.Int64, "start": pl.Float64, "end": pl.Float64, "duration": pl.Float64})
    comm = _guarded(f"rank {rt.rank}: communication events", warnings,
                    lambda: collectives.comm_events(rt, wtab), None)
    if comm is None:
        comm = pl.DataFrame(schema=collectives.EXTRACT_SCHEMA)
    from traceread.analysis import host_activity, step_timeline

    host_self = _guarded(f"rank {rt.rank}: host activity", warnings,
                         lambda: host_activity.host_self_time(rt, wtab)) if rt.host.height else None
    from traceread.analysis import ledger

    segments = _guarded(f"rank {rt.rank}: step ledger", warnings,
                        lambda: ledger.rank_segments(rt, wtab, ops)) if rt.gpu.height else None
    sf = frame.drop("_start") if "_start" in frame.columns else frame
    if sf.height:
        sf = sf.with_columns(pl.lit(rt.rank, pl.Int64).alias("rank"))
    return RankSummary(
        entry=entry, meta=rt.meta, file=rt.file, comm=comm, windows=wtab, step_frame=sf,
        kernels=_kernels(rt, windows, warnings),
        roofline=_with_scale(_roofline(rt, ops, spec, reason, warnings), entry) if detail else None,
        warnings=warnings, host_self=host_self, ledger_segments=segments,
        timeline=_guarded(f"rank {rt.rank}: step timeline", warnings, lambda: step_timeline.rank_intervals(rt, wtab)),
    )


# ------------------------------------------------------------------------------------------------
# summary cache: a rank's RankSummary, next to the parse cache, so that a second report of the same
# run reads a few kB per rank instead of re-running every per-rank analysis.

SUMMARY_FOLDER = "summaries"


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """Hash of everything a rank summary depends on besides its file: the source of the
    ``traceread`` package (reader and analyses), Python, polars and numpy versions. Any edit or
    upgrade makes every cached summary a miss."""
    h = hashlib.sha256(f"{sys.version}|{pl.__version__}|{np.__version__}".encode())
    pkg = Path(__file__).resolve().parent
    for p in sorted(pkg.rglob("*")):
        if p.suffix in (".py", ".json", ".toml", ".csv") and "__pycache__" not in p.parts and p.is_file():
            h.update(str(p.relative_to(pkg)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def _summary_key(path: str, spec_file: str | None, detail: bool, fingerprint: str) -> dict[str, Any] | None:
    """What a cached summary must match: the path as given (it is in the entry), the file as it is
    now (size, mtime), the code, the --device-spec file's bytes and whether it has the roofline."""
    try:
        p = Path(path)
        st = p.stat()
        spec = hashlib.sha256(Path(spec_file).read_bytes()).hexdigest() if spec_file else None
        return {"path": path, "abs": str(p.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                "code": fingerprint, "spec": spec, "detail": detail}
    except OSError:
        return None


def _summary_file(cache_dir: str | None, key: dict[str, Any]) -> Path:
    from traceread.reader.cache import cache_root

    name = hashlib.sha256(f"{key['abs']}|{key['path']}|{key['detail']}".encode()).hexdigest()[:24]
    return cache_root(Path(cache_dir) if cache_dir else None) / SUMMARY_FOLDER / f"{name}.pkl"


def load_summary(path: str, cache_dir: str | None, spec_file: str | None, detail: bool,
                 fingerprint: str) -> RankSummary | None:
    """The cached summary of ``path`` when its key still matches, else None (never raises)."""
    try:
        key = _summary_key(path, spec_file, detail, fingerprint)
        if key is None:
            return None
        with open(_summary_file(cache_dir, key), "rb") as fh:
            got_key, summary = pickle.load(fh)
        return summary if got_key == key and isinstance(summary, RankSummary) else None
    except Exception:  # noqa: BLE001 - a missing/corrupt/foreign entry is a miss
        return None


def store_summary(summary: RankSummary, key: dict[str, Any], cache_dir: str | None) -> None:
    """Write the summary under ``key`` (:func:`_summary_key`, taken before the file was read, so a
    file rewritten meanwhile is a miss next time) atomically; any trouble is silently skipped."""
    try:
        dest = _summary_file(cache_dir, key)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=dest.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                pickle.dump((key, summary), fh, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, dest)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except Exception:  # noqa: BLE001 - caching is an optimisation only
        return


def _summarise_path(path: str, use_cache: bool, cache_dir: str | None, spec_file: str | None,
                    detail: bool, fingerprint: str | None = None) -> RankSummary | TraceFileError:
    """Worker entry point: read one file and summarise it; a bad file comes back as the error.

    With ``use_cache`` and a ``fingerprint`` (:func:`code_fingerprint`) the summary is also written
    to the summary cache."""
    key = _summary_key(path, spec_file, detail, fingerprint) if use_cache and fingerprint else None
    summary = _summarise_uncached(path, use_cache, cache_dir, spec_file, detail)
    if key is not None and isinstance(summary, RankSummary):
        store_summary(summary, key, cache_dir)
    return summary


def _summarise_uncached(path: str, use_cache: bool, cache_dir: str | None, spec_file: str | None,
                        detail: bool) -> RankSummary | TraceFileError:
    from traceread.reader import read_rank
    from traceread.reader.ranks import identify

    try:
        rt = read_rank(path, use_cache=use_cache, cache_dir=Path(cache_dir) if cache_dir else None)
    except TraceFileError as exc:
        return exc
    except Exception as exc:  # noqa: BLE001 - a reader bug fails one file, not the job
        return TraceFileError(f"reader failed: {type(exc).__name__}: {exc}".splitlines()[0], path)
    identify(rt, single=False)
    summary = summarise_rank(rt, spec_file=Path(spec_file) if spec_file else None, detail=detail)
    # Only what rank assignment and the job checks need travels back (pg_config lists every member
    # of every group: megabytes per rank on a 1024-rank job; the layout keeps it as compact ranges).
    dist = rt.meta.distributed_info or {}
    summary.meta.distributed_info = {k: dist[k] for k in ("rank", "world_size", "backend", "nccl_version") if k in dist}
    from traceread.analysis.layout import compact_groups

    summary.meta.pg_config = compact_groups(rt.meta.pg_config)
    return summary


# ------------------------------------------------------------------------------------------------
# whole job


@contextmanager
def _progress(enabled: bool, total: int, label: str) -> Iterator[Callable[[str], None]]:
    if not enabled or total == 0:
        yield lambda _d: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from traceread.reports.sanitize import clean

    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}", markup=False), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("", total=total)
        yield lambda d: bar.update(task, advance=1, description=clean(d))  # d is a file name


#: Ranks already in the parse cache that are summarised in this process instead of in a worker:
#: their work (tens of ms each) is far below a spawned worker's start-up (re-importing polars and
#: numpy, ~0.5 s). Beyond this many, the rest go to the worker pool for parallelism.
IN_PROCESS_CACHED = 64


def _in_cache(path: Path, opts: ReportOptions) -> bool:
    """True when ``path``'s parse-cache entry matches the file as it is now (a read is cheap)."""
    if not opts.use_cache:
        return False
    try:
        from traceread.reader import cache

        d = cache.entry_dir(cache.cache_root(opts.cache_dir), path)
        return bool(json.loads((d / "meta.json").read_text()).get("key") == cache.file_key(path))
    except Exception:  # noqa: BLE001 - any doubt: treat as not cached (parse in a worker)
        return False


def _summarise_local(files: list[Path], args: tuple[Any, ...], fingerprint: str | None, detail: dict[Path, bool],
                     threads: int, out: dict[Path, RankSummary | TraceFileError],
                     advance: Callable[[str], None]) -> None:
    """Summarise parse-cached ranks in this process, ``threads`` at a time (polars and the parquet
    reader release the GIL, so two ranks overlap on two cores)."""
    if threads <= 1 or len(files) <= 1:
        for f in files:
            out[f] = _summarise_path(str(f), *args, detail[f], fingerprint)
            advance(f.name)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=threads) as pool:
        futs = {f: pool.submit(_summarise_path, str(f), *args, detail[f], fingerprint) for f in files}
        for f, fut in futs.items():
            out[f] = fut.result()
            advance(f.name)


def _summarise_all(files: list[Path], opts: ReportOptions) -> dict[Path, RankSummary | TraceFileError]:
    """Summarise every file: from the summary cache when it matches, else parse-cached ranks in this
    process and ranks to parse in spawned workers, both at once (the main thread works through the
    cached ranks while the workers parse). The first file (in ``files`` order) also gets the
    roofline detail."""
    n = len(files)
    workers = opts.workers if opts.workers is not None else min(os.cpu_count() or 1, n)
    workers = max(1, min(workers, n))
    cache_dir = str(opts.cache_dir) if opts.cache_dir else None
    spec_file = str(opts.device_spec) if opts.device_spec else None
    fingerprint = _guarded("code fingerprint", [], code_fingerprint) if opts.use_cache else None
    args = (opts.use_cache, cache_dir, spec_file)
    detail = {f: i == 0 for i, f in enumerate(files)}
    out: dict[Path, RankSummary | TraceFileError] = {}
    with _progress(opts.progress, n, "analysing ranks") as advance:
        if fingerprint:
            for f in files:
                hit = load_summary(str(f), cache_dir, spec_file, detail[f], fingerprint)
                if hit is not None:
                    out[f] = hit
                    advance(f.name)
        todo = [f for f in files if f not in out]
        if workers == 1:
            for f in todo:
                out[f] = _summarise_path(str(f), *args, detail[f], fingerprint)
                advance(f.name)
            return out
        local = [f for f in todo if _in_cache(f, opts)][:IN_PROCESS_CACHED]
        local_set = set(local)
        pooled = [f for f in todo if f not in local_set]
        if not pooled:
            _summarise_local(local, args, fingerprint, detail, workers, out, advance)
            return out
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=min(workers, len(pooled)), mp_context=ctx) as pool:
            futs: dict[Future[Any], Path] = {pool.submit(_summarise_path, str(f), *args, detail[f], fingerprint): f
                                              for f in pooled}
            _summarise_local(local, args, fingerprint, detail, 1, out, advance)
            pending = set(futs)
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    f = futs.pop(fut)
                    try:
                        out[f] = fut.result()
                    except Exception as exc:  # noqa: BLE001 - a crashed worker fails one file
                        out[f] = TraceFileError(f"analysis process failed: {type(exc).__name__}: {exc}".splitlines()[0], str(f))
                    advance(f.name)
    return out


def _assign_ranks(summaries: list[RankSummary]) -> list[str]:
    """Rank numbers for the whole set (reader rules), checked to be one job; extracts renumbered."""
    from traceread.reader.ranks import assign_ranks

    stubs = [RankTrace(s.entry["rank"], s.file, s.meta, empty_frame(GPU_SCHEMA), empty_frame(HOST_SCHEMA),
                       empty_frame(STEP_SCHEMA), empty_frame(FLOW_SCHEMA)) for s in summaries]
    old = [s.entry["rank"] for s in summaries]
    warnings = assign_ranks(stubs)  # raises RankConflictError for two runs mixed
    by_file = {st.file: st.rank for st in stubs}
    for s, before in zip(summaries, old):
        r = by_file[s.file]
        if r != before:
            s.entry["rank"] = r
            if s.comm.height:
                s.comm = s.comm.with_columns(pl.lit(r, pl.Int64).alias("rank"))
            if s.step_frame.height:
                s.step_frame = s.step_frame.with_columns(pl.lit(r, pl.Int64).alias("rank"))
    summaries.sort(key=lambda s: s.entry["rank"])
    return warnings


def _merge_kernels(summaries: list[RankSummary], top: int) -> list[dict[str, Any]]:
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


def _run_dir(paths: Sequence[str | Path], run_json: list[Path]) -> Path | None:
    """The collected RUN folder (run.json, fr/, stacks/, nccl/), when the user pointed at one."""
    if run_json:
        return run_json[0].parent
    for p in paths:
        q = Path(p)
        if q.is_dir():
            for cand in (q, q.parent):
                if any((cand / d).exists() for d in ("run.json", "fr", "stacks", "nccl", "hang.json")):
                    return cand
    return None


def _load_json(path: Path, warnings: list[str]) -> dict[str, Any] | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        warnings.append(f"{path}: cannot read ({str(exc).splitlines()[0]})")
        return None
    return doc if isinstance(doc, dict) else None


def _hosts(run_info: dict[str, Any] | None, warnings: list[str]) -> tuple[dict[int, str], dict[int, float]]:
    if not run_info:
        return {}, {}
    from traceread.analysis.clocks import hosts_from_run_info

    return _guarded("run.json hosts", warnings, lambda: hosts_from_run_info(run_info), ({}, {}))


def _network_gbps(nccl: dict[str, Any] | None, devices: dict[int, str | None]) -> float | None:
    """Per-GPU network peak: the typical NIC of the GPU generation when the NCCL log shows a NET link."""
    from traceread.analysis import devices as dev

    name = next((d for d in devices.values() if d), None)
    if not name:
        return None
    spec = dev.resolve_device(name, None)
    key = dev.TYPICAL_NIC.get(spec.name) if spec else None
    if nccl and nccl.get("network") and "socket" in str(nccl.get("network")).lower():
        return None  # sockets: no meaningful line rate
    return dev.LINKS[key].per_direction_bytes_per_s / 1e9 if key else None


def build_report(paths: Sequence[str | Path], options: ReportOptions | None = None) -> Report:
    """The report document for the traces under ``paths`` (folders, globs, files).

    Raises :class:`NothingUsableError` when nothing can be analysed, and
    :class:`traceread.errors.RankConflictError` when the files are not one job.
    """
    from traceread.analysis.nccl_log import nccl_logs_under, parse_nccl_logs
    from traceread.reader.discover import find
    from traceread.reader.read import explain_failure

    opts = options or ReportOptions()
    warnings: list[str] = []
    found = find(paths)
    for m in found.missing:
        warnings.append(f"{m}: no such file or folder")
    run_info = _load_json(found.run_json[0], warnings) if found.run_json else None
    run_dir = _run_dir(paths, found.run_json)
    nccl_logs = _guarded("NCCL log search", warnings, lambda: nccl_logs_under(paths, run_dir), [])
    found.files = [f for f in found.files if f not in nccl_logs]  # a log named explicitly is not a trace
    nccl = _guarded("NCCL log", warnings, lambda: parse_nccl_logs(nccl_logs)) if nccl_logs else None

    from traceread.reader import cycles

    chosen = cycles.select(found.files, opts.cycle, warnings)  # several cycles/runs: analyse one
    found.files = cycles.chosen_files(chosen, found.files)

    results = _summarise_all(found.files, opts) if found.files else {}
    summaries: list[RankSummary] = []
    for f in found.files:
        res = results[f]
        if isinstance(res, RankSummary):
            summaries.append(res)
            continue
        warnings.append(explain_failure(found, f, res.message)[1])
    hang = None
    if run_dir is not None:
        from traceread.analysis.hang import diagnose_hang

        hang = _guarded("hang diagnosis", warnings, lambda: diagnose_hang(run_dir))
    if not summaries and hang is None and nccl is None:
        where = ", ".join(str(p) for p in paths)
        detail = f" ({warnings[0]})" if warnings else ""
        if found.files or found.missing:
            raise NothingUsableError(f"no readable trace under {where}{detail}", bad_input=True)
        raise NothingUsableError(f"no trace files (*.json, *.json.gz) found under {where}")

    warnings.extend(_assign_ranks(summaries))
    for s in summaries:
        warnings.extend(s.warnings)
    ranks: list[RankEntry] = [s.entry for s in summaries]  # type: ignore[misc]
    hosts, recorded = _hosts(run_info, warnings)
    for e in ranks:
        e["host"] = hosts.get(e["rank"])

    report: Report = {
        "schema": SCHEMA_ID,
        "source": {
            "paths": [str(p) for p in paths],
            "world_size": next((s.meta.world_size for s in summaries if s.meta.world_size), None) or (len(summaries) or None),
            "backend": next((s.meta.backend for s in summaries if s.meta.backend), None),
            "devices": sorted({s.meta.device_name for s in summaries if s.meta.device_name}),
            "files": len(found.files),
            "ranks_read": len(summaries),
        },
        "warnings": warnings, "ranks": ranks, "collectives": [], "stragglers": [], "pipeline": None,
        "slow_steps": [], "hang": hang, "findings": [], "kernels": [], "roofline": None,
        "straggler_heatmap": None, "nccl": nccl, "layout": None, "ledger": None,
    }
    if summaries:
        matched, clock = _cross_rank(report, summaries, hosts, recorded, opts, warnings, run_info=run_info)
        _guarded("step ledger", warnings, lambda: _ledger(report, summaries, matched, clock))
        report["kernels"] = _guarded("kernel table", warnings, lambda: _merge_kernels(summaries, opts.top_kernels), [])
        detail = next((s.roofline for s in summaries if s.roofline), None)
        report["roofline"] = detail
        _formula_mfu(report, opts, warnings)
        from traceread.analysis.step_timeline import job_timeline

        report["step_timeline"] = _guarded("step timeline", warnings, lambda: job_timeline(
            {s.entry["rank"]: s.timeline for s in summaries if s.timeline is not None}, report))

    cycles.annotate(report, chosen, warnings)  # type: ignore[arg-type]
    from traceread.reports.findings import build_findings

    report["findings"] = build_findings(report, warn=warnings.append)
    from traceread.reports.ledger_findings import coverage

    report["coverage"] = coverage(report["findings"], (report.get("ledger") or {}).get("step_us"))
    return report


def _ledger(report: Report, summaries: list[RankSummary], matched: Any, clock: Any) -> None:
    """The step ledger (analysis.job_ledger): ``report["ledger"]`` and each ``ranks[].ledger``."""
    from traceread.analysis import job_ledger

    segments = {s.entry["rank"]: s.ledger_segments for s in summaries if s.ledger_segments is not None}
    if not segments:
        return
    # Roles of the process groups from the layout (report["layout"]); without one the ledger falls
    # back to send/recv → pp, all-to-all → ep, else other.
    roles = {str(g["pg"]): g["role"] for g in (report.get("layout") or {}).get("groups") or []}
    role_of = (lambda pg: roles.get(str(pg), "other")) if roles else None
    led = job_ledger.build(segments, [s.comm for s in summaries if s.comm.height], matched, clock, role_of)
    report["ledger"] = led.job
    for e in report["ranks"]:
        if e["rank"] in led.per_rank:
            e["ledger"] = led.per_rank[e["rank"]]


def _cross_rank(report: Report, summaries: list[RankSummary], hosts: dict[int, str], recorded: dict[int, float],
                opts: ReportOptions, warnings: list[str], run_info: dict[str, Any] | None = None) -> tuple[Any, Any]:
    """Collectives, clocks, stragglers, pipeline and slow steps from the per-rank extracts.

    With a ``run.json`` (``run_info``) the clock uncertainty ``traceread collect`` measured is the
    floor of ε, the margin below which arrival differences are not blamed on anyone.
    """
    from traceread.analysis import clocks, collectives, comm_perf, pipeline, slow_steps, stragglers
    from traceread.analysis.layout import layout_from_summaries

    report["layout"] = _guarded("parallel layout", warnings, lambda: layout_from_summaries(
        summaries, hosts=hosts, nccl=report.get("nccl")).to_json())
    frames = {s.entry["rank"]: s.step_frame for s in summaries if s.step_frame.height}
    report["slow_steps"] = _guarded("slow steps", warnings, lambda: slow_steps.find_slow_steps(frames), []) if frames else []
    if report["slow_steps"]:
        _guarded("slow-step host activity", warnings, lambda: _host_activity(report["slow_steps"], summaries))

    extracts = [s.comm for s in summaries if s.comm.height]
    if not extracts:
        return None, None
    matched = _guarded("collective matching", warnings, lambda: collectives.match_collectives(extracts))
    if matched is None:
        return None, None
    for m in matched.mismatches[:MAX_MISMATCH_WARNINGS]:
        warnings.append(f"collectives: {m}")
    if len(matched.mismatches) > MAX_MISMATCH_WARNINGS:
        warnings.append(f"collectives: {len(matched.mismatches) - MAX_MISMATCH_WARNINGS} more mismatches")
    eps_floor = clocks.recorded_uncertainty(run_info) if run_info else 0.0
    clock = _guarded("clock alignment", warnings, lambda: clocks.estimate_offsets(
        matched, hosts or None, recorded or None, recorded_epsilon_us=eps_floor))
    if clock is not None:
        report["source"]["clock"] = clock.to_json()  # type: ignore[index]
        warnings.extend(f"clocks: {n}" for n in clock.notes if "not checked" not in n)
    device_names = {s.entry["rank"]: s.meta.device_name for s in summaries}
    net = _guarded("network peak", warnings, lambda: _network_gbps(report.get("nccl"), device_names))
    report["collectives"] = _guarded(
        "collective bandwidth", warnings,
        lambda: comm_perf.collective_table(matched, clock, hosts=hosts or None, device_names=device_names,
                                           network_gbps=net), [])
    windows = {s.entry["rank"]: s.windows for s in summaries}
    st = _guarded("stragglers", warnings, lambda: stragglers.attribute(matched, windows, clock))
    if st is not None:
        report["stragglers"] = st.entries
        report["straggler_heatmap"] = st.heatmap
        warnings.extend(f"stragglers: {n}" for n in st.notes)
    report["pipeline"] = _guarded("pipeline", warnings,
                                  lambda: _pipeline(matched, summaries, clock, opts, pipeline))
    return matched, clock


def _host_activity(slow: list[Any], summaries: list[RankSummary]) -> None:
    """For host-caused slow steps: which host activity grew (analysis.host_activity), into ``detail``
    and the extra ``host_activity`` ([{name, growth_us}])."""
    from traceread.analysis import host_activity
    from traceread.reports.stats import ms

    per = {s.entry["rank"]: s.host_self for s in summaries if s.host_self is not None and s.host_self.height}
    if not per:
        return
    all_steps = sorted({int(x) for f in per.values() for x in f["step"].unique().to_list()})
    slow_set = {int(s["step"]) for s in slow}
    normal = [x for x in all_steps if x not in slow_set]
    for s in slow:
        if s.get("cause") != "host":
            continue
        g = host_activity.grown(per, int(s["step"]), normal, float(s["excess_us"]))
        s["host_activity"] = [{"name": n, "growth_us": d} for n, d in g]
        if g:
            what = ", ".join(f"{n} +{ms(d)}" for n, d in g)
            s["detail"] = (f"{s.get('detail') or 'the GPU sat idle'}; host time not covered by any nested "
                           f"operator grew in: {what}")


def _pipeline(matched: Any, summaries: list[RankSummary], clock: Any, opts: ReportOptions, pipeline: Any) -> Any:
    """Detect the pipeline from p2p transfers; re-read only the first chain's ranks for the bubble."""
    chains, _ring = pipeline.pipeline_chains(matched)
    if not chains:
        return None
    from traceread.reader import read_rank

    by_rank = {s.entry["rank"]: s for s in summaries}
    activity: dict[int, pl.DataFrame] = {}
    for r in chains[0]:
        s = by_rank.get(r)
        if s is None:
            continue
        rt = read_rank(s.file, use_cache=opts.use_cache, cache_dir=opts.cache_dir)
        rt.rank = r
        activity[r] = pipeline.stage_activity(rt, s.windows)
        del rt
    offsets = clock.offsets_us if clock is not None else None
    return pipeline.detect_pipeline(matched, activity, offsets)


def _formula_mfu(report: Report, opts: ReportOptions, warnings: list[str]) -> None:
    """MFU = 6·N·D ÷ (step time × GPUs × peak) when --params and --tokens-per-step are given
    (+ 12·L·s·d·D when --n-layers, --seq-len and --d-model are too: attention's score and value
    matmuls, which 6·N leaves out).

    D is the whole job's tokens per step, so each rank is credited D ÷ world size over its own median
    step duration (``steps[].duration_us``; the whole-trace window when it has no steps). Replaces the trace-counted MFU (which needs recorded shapes).
    """
    if not opts.params or not opts.tokens_per_step:
        return
    from traceread.analysis import mfu as mfu_mod
    from traceread.analysis.devices import lookup_device
    from traceread.reports.stats import median_step_duration_us

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
        step_us = median_step_duration_us(e)  # type: ignore[arg-type]
        if not step_us:
            continue
        step_s = step_us / 1e6
        val = _guarded(f"rank {e['rank']}: formula MFU", warnings, lambda: mfu_mod.formula_mfu(
            opts.params, opts.tokens_per_step / world, step_s, match.spec, precision,
            opts.n_layers, opts.seq_len, opts.d_model))
        if val is not None:
            e["mfu_pct"] = float(val)
