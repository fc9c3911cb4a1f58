"""The job's own profiler traces, read when ``traceread collect`` stepped aside for them.

A job that runs its own ``torch.profiler`` makes collect step aside (two profiler sessions in one
process crash it; docs/collect.md); each rank records in ``run.json`` (``ranks.R.job_profiler``) the
trace files the job exported and the folders its ``on_trace_ready`` handler writes to. When the run
folder holds no trace of traceread's own, the report reads those files instead and says so; when it
does, the warning names where the job's own traces are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from traceread.read.discover import Found, find
from traceread.read.jsonfile import load_json_object


def job_profilers(run_info: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The ranks' ``job_profiler`` entries in a run.json document (none in a damaged one)."""
    ranks = (run_info or {}).get("ranks")
    if not isinstance(ranks, dict):
        return []
    return [i["job_profiler"] for i in ranks.values() if isinstance(i, dict) and isinstance(i.get("job_profiler"), dict)]


def job_trace_paths(run_info: dict[str, Any] | None) -> list[Path]:
    """The job's own trace files that still exist: the ones it exported (exact), else the trace-named
    files of the folders its handler writes to."""
    jobs = job_profilers(run_info)
    files = sorted({Path(f) for j in jobs for f in j.get("traces") or [] if isinstance(f, str)})
    if files:
        return [f for f in files if f.is_file()]
    dirs = sorted({Path(d) for j in jobs for d in j.get("trace_dirs") or [] if isinstance(d, str)})
    return [d for d in dirs if d.is_dir()]


def use_job_traces(found: Found) -> Found:
    """``found`` itself, or — when a collected run folder has no trace but the job's own profiler wrote
    some — the job's traces, with a note naming them (a note also when both exist)."""
    if not found.run_json:
        return found
    info = load_json_object(found.run_json[0], [])
    jobs = job_profilers(info)
    if not jobs:
        return found
    paths = job_trace_paths(info)
    steps = sorted({j["from_step"] for j in jobs if isinstance(j.get("from_step"), int)})
    own = f"the job ran its own profiler (from step {steps[0]})" if steps else "the job ran its own profiler"
    where = ", ".join(str(p) for p in paths) or "none found on this machine"
    if found.files or not paths:
        found.notes.append(f"{own} and traceread stepped aside; the job's own traces: {where}")
        return found
    theirs = find([str(p) for p in paths])
    theirs.run_json = found.run_json
    theirs.notes = [*found.notes, *theirs.notes,
                    f"{own} and traceread stepped aside, so this report reads the job's own traces: {where}"]
    return theirs
