"""Traces in, report document out: find the files, run the engine, reduce, findings.

The shape is map → reduce. The map (:func:`traceread.assemble.run_map.summarise_files`) reads and
summarises each rank alone (:mod:`traceread.assemble.rank_map`) on an executor (in-process, local processes,
Ray) through the parse and summary caches; the reduce (:mod:`traceread.assemble.job_reduce`) runs on the
summaries alone; the findings (:mod:`traceread.assemble.findings.assemble`) read the assembled document.
The whole document is cached too (:mod:`traceread.engine.caches`): a second report of an unchanged
run, in another format or to another path, only renders. This module imports neither polars nor the
analyses until the document cache misses, so that warm path stays light.

Robustness: every analysis runs under :func:`traceread.errors.guarded`; one that fails or lacks data
leaves its part of the document null/empty and adds a warning. Only "no trace could be read at all"
is an error (:class:`NothingUsableError`, exit code 3).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from traceread.assemble import run_folder
from traceread.assemble.job_traces import use_job_traces
from traceread.errors import TraceReadError
from traceread.options import TOP_KERNELS, ReportOptions
from traceread.read.jsonfile import load_json_object
from traceread.report_schema import SCHEMA_ID, RankEntry, Report

__all__ = ["NothingUsableError", "ReportOptions", "TOP_KERNELS", "build_report"]

class NothingUsableError(TraceReadError):
    """Nothing to analyse. ``bad_input``: files or paths were given but unreadable/missing (exit 2);
    otherwise no trace file was found at all (exit 3)."""

    def __init__(self, message: str, *, bad_input: bool = False) -> None:
        super().__init__(message)
        self.bad_input = bad_input


def build_report(paths: Sequence[str | Path], options: ReportOptions | None = None) -> Report:
    """The report document for the traces under ``paths`` (folders, globs, files, object URLs).

    Raises :class:`NothingUsableError` when nothing can be analysed, and
    :class:`traceread.errors.RankConflictError` when the files are not one job.
    """
    from traceread.engine import caches
    from traceread.read.discover import find

    opts = options or ReportOptions()
    caches.take_notes()  # notes of an earlier report in this process are not this one's
    found = _on_nodes(paths, opts) if opts.node_local else find(paths, storage_options=opts.storage_options)
    found = use_job_traces(found)  # a run where collect stepped aside for the job's own profiler
    run_dir = run_folder.run_dir_of(paths, found.run_json)
    root = caches.cache_root(opts.cache_dir) if opts.use_cache else None
    key = None
    if root is not None and found.files and not found.missing:
        key = caches.document_key([str(p) for p in paths], found.files,
                                  run_folder.side_files(paths, run_dir) + [Path(p) for p in opts.snapshots], opts.analysis_key(),
                                  str(opts.device_spec) if opts.device_spec else None)
        hit = caches.load_document(root, key) if key is not None else None
        if hit is not None:
            return hit
    report = _analyse(paths, found, run_dir, opts)
    if key is not None and root is not None:
        caches.store_document(root, key, report)
    if root is not None:
        caches.evict(root)  # the size bound: least recently used entries go first
    return _with_cache_notes(report, caches.take_notes())


def _with_cache_notes(report: Report, notes: list[str]) -> Report:
    """Damaged cache entries met on the way, said in this report's warnings only (never stored in the
    document cache: the next report, which finds a sound cache, has nothing to say about it)."""
    if not notes:
        return report
    return {**report, "warnings": [*(report.get("warnings") or []), *notes]}


def _on_nodes(paths: Sequence[str | Path], opts: ReportOptions) -> Any:
    """The trace files as each Ray node lists them on its own disk (``--node-local``); ``run.json``
    where the driver sees one."""
    from traceread.engine.node_local import find_on_nodes
    from traceread.read.discover import Found

    files, notes = find_on_nodes([str(p) for p in paths], opts.ray_address)
    run_json = [Path(p) / "run.json" for p in paths if (Path(p) / "run.json").is_file()]
    # NodeFiles ride in Found.files as RemoteFiles do: the engine passes them through unopened
    return Found(files=files, run_json=run_json, notes=notes)  # type: ignore[arg-type]


def _analyse(paths: Sequence[str | Path], found: Any, run_dir: Path | None, opts: ReportOptions) -> Report:
    """Map, reduce, findings: the document from scratch."""
    from traceread.analysis.comm import nccl as nccl_records
    from traceread.assemble import job_reduce as crossrank
    from traceread.assemble.rank_map import RankSummary
    from traceread.assemble.run_map import summarise_files
    from traceread.engine.jobs import explain_failure
    from traceread.errors import guarded
    from traceread.read import cycles

    warnings: list[str] = []
    for m in found.missing:
        warnings.append(f"{m}: {found.why(m)}")
    warnings.extend(found.notes)
    run_info = load_json_object(found.run_json[0], warnings) if found.run_json else None
    # NCCL logs and NCCL Inspector files (a file named explicitly is then not a trace)
    nccl, nccl_files = guarded("NCCL logs", warnings, lambda: nccl_records.load(paths, run_dir), (None, []))
    found.files = [f for f in found.files if f not in nccl_files]
    # several cycles/runs: analyse one (local files; objects in a bucket are not grouped yet)
    remote = [f for f in found.files if getattr(f, "url", None) is not None]
    local = [f for f in found.files if getattr(f, "url", None) is None]
    chosen = cycles.select(local, opts.cycle, warnings) if local else None
    found.files = (cycles.chosen_files(chosen, local) if chosen is not None else []) + remote
    if remote and (opts.cycle or "latest").strip().lower() not in ("latest", "all"):
        warnings.append(f"--cycle {opts.cycle} applies to files this machine can read; the {len(remote)} object URL(s) "
                        "or node-local file(s) are not grouped into cycles, so all of them were analysed")

    results = summarise_files(found.files, opts) if found.files else {}
    summaries: list[RankSummary] = []
    unreadable: dict[int, str] = {}
    for f in found.files:
        res = results[f]
        if isinstance(res, RankSummary):
            summaries.append(res)
            continue
        failure, message = explain_failure(found, f, res.message)
        warnings.append(message)
        if failure is not None and failure.rank is not None:
            unreadable[failure.rank] = message
    hang = None
    if run_dir is not None:
        from traceread.analysis.hang.diagnose import diagnose_hang

        hang = guarded("hang diagnosis", warnings, lambda: diagnose_hang(run_dir))
    died = run_folder.failure_of(run_dir, warnings)
    if not summaries and hang is None and died is None and run_info is not None and not (nccl or {}).get("diagnoses"):
        raise NothingUsableError(run_folder.no_trace_line(run_dir or Path(str(paths[0])), run_info))
    if not summaries and hang is None and died is None and nccl is None:
        where = ", ".join(str(p) for p in paths)
        detail = f" ({warnings[0]})" if warnings else ""
        if found.files or found.missing:
            raise NothingUsableError(f"no readable trace under {where}{detail}", bad_input=True)
        raise NothingUsableError(f"no trace files (*.json, *.json.gz) found under {where}")

    if nccl is not None and summaries:  # the traces name the GPUs: hardware-fitted NCCL advice
        guarded("NCCL diagnoses", warnings, lambda: nccl_records.refit(nccl, [s.meta.device_name for s in summaries
                                                                               if s.meta.device_name]))
    partial = run_folder.partial_window(run_info)
    if partial:
        warnings.append(partial)
    warnings.extend(crossrank.assign_ranks(summaries))
    for s in summaries:
        warnings.extend(s.warnings)
    ranks: list[RankEntry] = [s.entry for s in summaries]
    hosts, recorded = crossrank.run_hosts(run_info, warnings)
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
        "straggler_heatmap": None, "nccl": nccl, "layout": None, "ledger": None, "memory": None,
    }
    if died is not None:
        report["failure"] = died  # type: ignore[typeddict-item]
    run_folder.mark_missing_ranks(report, unreadable)
    if summaries:
        from traceread.analysis.time.iterations import job_workload

        report["workload"] = guarded("workload", warnings, lambda: job_workload([s.workload for s in summaries]))
    if summaries:
        matched, clock = crossrank.cross_rank(report, summaries, hosts, recorded, opts, warnings, run_info=run_info)
        guarded("step ledger", warnings, lambda: crossrank.step_ledger(report, summaries, matched, clock))
        report["kernels"] = guarded("kernel table", warnings,
                                    lambda: crossrank.merge_kernels(summaries, opts.top_kernels), [])
        report["roofline"] = next((s.roofline for s in summaries if s.roofline), None)
        from traceread.analysis.time.step_timeline import job_timeline

        report["step_timeline"] = guarded("step timeline", warnings, lambda: job_timeline(
            {s.entry["rank"]: s.timeline for s in summaries if s.timeline is not None}, report))
        crossrank.formula_mfu(report, opts, warnings)
    from traceread.analysis.memory.snapshot import find_snapshots

    snapshot_files = guarded("memory snapshot search", warnings,
                             lambda: find_snapshots([str(p) for p in paths], run_dir, opts.snapshots), [])
    guarded("memory", warnings, lambda: crossrank.memory(report, summaries, opts, warnings, snapshot_files))

    if chosen is not None:
        cycles.annotate(report, chosen, warnings, [s.warm_names for s in summaries])
    from traceread.assemble.findings.assemble import build_findings, coverage
    from traceread.assemble.findings.layout import fit_to_workload

    report["findings"] = fit_to_workload(build_findings(report, warn=warnings.append), report)
    report["coverage"] = coverage(report["findings"], report)  # type: ignore[typeddict-item]
    if report["source"].get("missing_ranks"):
        from traceread.assemble.findings.assemble import missing_note

        report["source"]["missing_note"] = missing_note(report, unreadable)
    return report


