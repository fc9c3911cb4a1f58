"""What a collected run folder adds beside its traces, as the report driver needs it.

The side files an analysis reads (Flight Recorder, stacks, NCCL logs, run.json: part of the
document cache's key), the one line for a run that recorded no trace, the warning for a window the
end of the job cut short, and the ranks of the job that have no readable trace.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from traceread.report_schema import Report

#: Folders and files of a collected run folder that analyses read besides the traces (document key).
RUN_SIDE_DIRS = ("fr", "stacks", "nccl", "errors", "progress", "ranks", "torchrun", "logs", "inject", "memory",
                 "attempts")
RUN_SIDE_FILES = ("run.json", "hang.json", "launcher.log")
LOG_SUFFIXES = (".log", ".txt", ".out", ".err", ".jsonl")


def run_dir_of(paths: Sequence[str | Path], run_json: list[Path]) -> Path | None:
    """The collected RUN folder (run.json, fr/, stacks/, nccl/), when the user pointed at one."""
    if run_json:
        return run_json[0].parent
    for p in paths:
        if isinstance(p, str) and "://" in p:
            continue
        q = Path(p)
        if q.is_dir():
            for cand in (q, q.parent):
                if any((cand / d).exists() for d in ("run.json", "fr", "stacks", "nccl", "hang.json")):
                    return cand
    return None


def side_files(paths: Sequence[str | Path], run_dir: Path | None) -> list[Path]:
    """Non-trace inputs an analysis may read, for the document key: the run folder's hang evidence,
    NCCL logs and run.json, and logs lying directly in a folder the user named."""
    out: list[Path] = []
    if run_dir is not None:
        out += [run_dir / n for n in RUN_SIDE_FILES if (run_dir / n).is_file()]
        for d in RUN_SIDE_DIRS:
            if (run_dir / d).is_dir():
                out += sorted(p for p in (run_dir / d).rglob("*") if p.is_file())
    for p in paths:
        q = Path(p) if not (isinstance(p, str) and "://" in p) else None
        if q is not None and q.is_dir():
            out += sorted(f for f in q.iterdir() if f.suffix in LOG_SUFFIXES and f.is_file())
        elif q is not None and q.suffix in LOG_SUFFIXES and q.is_file():
            out.append(q)
    return out


def failure_of(run_dir: Path | None, warnings: list[str]) -> dict[str, Any] | None:
    """``Report["failure"]`` of a collected run folder (:mod:`traceread.analysis.hang.failure`): why the job
    stopped, when it did; a failure of the reading itself is one warning, never the report's end."""
    if run_dir is None:
        return None
    from traceread.analysis.hang.failure import diagnose_failure

    try:
        return diagnose_failure(run_dir)
    except Exception as exc:  # the answer still comes from the traces
        warnings.append(f"{run_dir}: failure diagnosis: {type(exc).__name__}: {exc}")
        return None


def _ranks(run_info: dict[str, Any] | None) -> dict[str, Any]:
    """run.json's ``ranks`` map, or empty when it is missing or of another shape (a damaged file)."""
    ranks = (run_info or {}).get("ranks")
    return ranks if isinstance(ranks, dict) else {}


def no_trace_line(run_dir: Path, run_info: dict[str, Any]) -> str:
    """One line for a collected run that recorded no trace: why, and how to collect one."""
    given = run_info.get("options")
    o: dict[str, Any] = given if isinstance(given, dict) else {}
    ran = [i["steps"] for i in _ranks(run_info).values() if isinstance(i, dict) and isinstance(i.get("steps"), int)]
    if _ranks(run_info) and not any(isinstance(i, dict) and i.get("torch") for i in _ranks(run_info).values()):
        return f"{run_dir}: no trace: no rank imported torch, so there was nothing to profile"
    need = 1 + int(o.get("wait") or 0) + int(o.get("warmup") or 0) + 1
    why = (f"the job ran {max(ran)} optimizer step(s), and the profiler records from step {need} on "
           f"(--wait {o.get('wait')} --warmup {o.get('warmup')})" if ran and max(ran) < need else
           "no rank reported an optimizer step" if not ran else "no rank wrote one (see launcher.log)")
    active = max(1, max(ran) - 2) if ran else 3  # what fits the job's steps after --wait 0 --warmup 1
    return f"{run_dir}: no trace: {why}; collect again with e.g. --wait 0 --warmup 1 --active {active}"


def partial_window(run_info: dict[str, Any] | None) -> str | None:
    """The warning of a window the end of the job cut short (collect keeps its recorded steps)."""
    parts = [i["partial"] for i in _ranks(run_info).values() if isinstance(i, dict) and isinstance(i.get("partial"), dict)]
    if not parts:
        return None
    p = parts[0]
    cut = "the job started its own profiler" if "profiler" in str(p.get("cut_by")) else "the job ended"
    return (f"partial window: {cut} after {p.get('recorded')} of the --active {p.get('active')} recorded steps "
            f"({len(parts)} rank(s)); the report covers those steps")


def mark_missing_ranks(report: Report, unreadable: dict[int, str]) -> None:
    """``source.missing_ranks``: ranks of the job (its world size, or a file naming them) with no
    readable trace — the answer cannot see their own time."""
    present = {int(r["rank"]) for r in report.get("ranks") or []}
    world = report["source"].get("world_size") or 0
    missing = (set(range(int(world))) - present) | (set(unreadable) - present)
    if missing and present:
        report["source"]["missing_ranks"] = sorted(missing)
