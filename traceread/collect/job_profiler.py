"""The collect summary's line for a job that ran its own profiler (the ranks' ``job_profiler`` entries).

A rank that saw the job start ``torch.profiler`` stepped aside before it (bootstrap
``_traceread_profiler_guard``; two profiler sessions in one process crash it) and wrote, in
``ranks/rank{R}.json``, ``job_profiler``: the optimizer step it started in (``from_step``), the API, what
happened to traceread's own window, and where the job's traces go (``trace_dirs``, ``traces``).
"""

from __future__ import annotations

from typing import Any


def job_profilers(ranks: dict[int, dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Rank -> its ``job_profiler`` entry, for the ranks that saw the job's own profiler."""
    return {r: i["job_profiler"] for r, i in sorted(ranks.items()) if isinstance(i.get("job_profiler"), dict)}


def job_trace_dirs(jobs: dict[int, dict[str, Any]]) -> list[str]:
    """The folders the job's own traces went to, over all ranks (files' folders included)."""
    dirs: set[str] = set()
    for job in jobs.values():
        dirs.update(d for d in job.get("trace_dirs") or [] if isinstance(d, str))
    return sorted(dirs)


def summary_line(ranks: dict[int, dict[str, Any]]) -> str | None:
    """``profiler: the job ran its own profiler from step N; traceread stepped aside ...; its traces: DIR``."""
    jobs = job_profilers(ranks)
    if not jobs:
        return None
    steps = sorted({j["from_step"] for j in jobs.values() if isinstance(j.get("from_step"), int)})
    when = (f"from step {steps[0]}" if len(steps) == 1 else f"from steps {steps[0]}-{steps[-1]}") if steps else ""
    windows = sorted({str(j.get("traceread_window")) for j in jobs.values() if j.get("traceread_window")})
    files = sum(len(j.get("traces") or []) for j in jobs.values())
    dirs = job_trace_dirs(jobs)
    where = ", ".join(dirs) if dirs else "not found (its handler wrote none traceread could see)"
    return (f"profiler: the job ran its own profiler {when} on {len(jobs)} rank(s); traceread stepped aside "
            f"({'; '.join(windows) or 'its window: unknown'}); its traces ({files} file(s)): {where}")
