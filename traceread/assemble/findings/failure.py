"""The failure finding: the job died, so why it died leads the report, before the hang and the window.

What it says comes from ``report['failure']`` (:mod:`traceread.analysis.hang.failure`): the first
failure by time with its rank, host, exception, line and step, the other ranks' errors named as its
consequences (never as the cause), the attempts of a restarted job, and the next step of the failure's
family (CUDA illegal access -> CUDA_LAUNCH_BLOCKING / compute-sanitizer on that rank, out of memory ->
the memory section, NCCL errors -> the NCCL diagnosis, SIGKILL without a Python error -> the host's OOM
killer or the scheduler).
"""

from __future__ import annotations

from typing import Any

from traceread.assemble.findings.base import make_finding
from traceread.assemble.findings.window import Window
from traceread.report_schema import Finding, Report

ECHO_WORDS = {"peer_gone": "its peer was gone", "comm_aborted": "its communicator was aborted",
              "watchdog_timeout": "its collective timed out", "terminated": "the launcher stopped it"}


def _title(first: dict[str, Any]) -> str:
    what = first.get("message") or first.get("family") or "failed"
    where = f" at {first['where']}" if first.get("where") else ""
    step = f" after optimizer step {first['step']}" if isinstance(first.get("step"), int) and first["step"] > 0 else ""
    return f"Job died: rank {first.get('rank')} failed first: {what}{where}{step}"


def _one_story(report: Report, first: dict[str, Any] | None) -> list[str]:
    """What the other evidence says about the same end: the hang diagnosis' culprits and NCCL's errors."""
    out = []
    h = report.get("hang") or {}
    named = sorted({c["rank"] for c in h.get("culprits") or [] if isinstance(c, dict) and isinstance(c.get("rank"), int)}
                   | {r for r in h.get("missing_ranks") or [] if isinstance(r, int)})
    if first is not None and named:
        rank = first.get("rank")
        out.append(f"Flight Recorder / stacks agree: rank {rank} is the rank the others waited for" if rank in named
                   else f"note: the hang evidence names rank(s) {', '.join(map(str, named[:8]))}, not rank {rank}: "
                        "read both (the hang below may be a consequence of the failure, or a second problem)")
    for d in [d for d in (report.get("nccl") or {}).get("diagnoses") or []
              if isinstance(d, dict) and d.get("severity") == "error"][:3]:
        out.append(f"NCCL log: {str(d.get('message') or d.get('id'))[:200]}")
    return out


def failure(report: Report, win: Window | None = None) -> list[Finding]:
    """The failure as a finding; ``[]`` when the job did not fail."""
    fail: dict[str, Any] = dict(report.get("failure") or {})
    if not fail:
        return []
    first = fail.get("first") if isinstance(fail.get("first"), dict) else None
    echoes = [e for e in fail.get("consequences") or [] if isinstance(e, dict)]
    if first is None and report.get("hang"):
        return []  # every error is an echo of the hang: the hang finding names its culprits
    attempts = [a for a in fail.get("attempts") or [] if isinstance(a, dict)]
    here = next((a for a in attempts if a.get("attempt") == fail.get("attempt")), None)
    recovered = bool(attempts) and here is not attempts[-1] and not attempts[-1].get("failed")
    if first is not None and recovered and here is not None:
        lost = ", ".join(x for x in (f"{here['steps_lost']} step(s)" if here.get("steps_lost") is not None else "",
                                     f"{here['time_lost_s']:.1f} s" if here.get("time_lost_s") is not None else "")
                         if x)
        title = (_title(first).replace("Job died: rank", f"Attempt {here.get('attempt')} died and torchrun restarted "
                                       "the job: rank", 1) + (f" ({lost} lost)" if lost else ""))
    elif first is not None:
        title = _title(first)
    elif echoes:
        title = (f"Job died, and every error is an echo: rank {echoes[0].get('rank')} reported first "
                 f"({ECHO_WORDS.get(str(echoes[0].get('family')), echoes[0].get('family'))}); the cause left no error")
    else:
        title = f"Job exited with code {fail.get('exit_code')} and no rank left an error"
    evidence = list(fail.get("lines") or [])
    if first is not None:
        evidence += [f"rank {first.get('rank')} traceback: " + " <- ".join(reversed(first.get("traceback") or []))] \
            if first.get("traceback") else []
        evidence.append(f"rank {first.get('rank')}: time from {first.get('time_from')}; evidence "
                        + ", ".join(first.get("sources") or []))
    for e in echoes[:8]:
        evidence.append(f"rank {e.get('rank')}: {ECHO_WORDS.get(str(e.get('family')), e.get('family'))} (a consequence): "
                        f"{str(e.get('message'))[:200]}")
    for o in (fail.get("others") or [])[:4]:
        evidence.append(f"rank {o.get('rank')} failed later, of its own: {str(o.get('message'))[:200]}")
    evidence += _one_story(report, first)
    sugg = []
    if first is not None and first.get("next_step"):
        sugg.append(f"Rank {first.get('rank')}: {first['next_step']}")
    if first is None:
        sugg.append("Read the hang diagnosis (traceread hang RUN): a rank that stopped without an error leaves the "
                    "others to fail of it.")
    if len(fail.get("attempts") or []) > 1:
        sugg.append("The job was restarted (torchrun --max-restarts): each attempt's files are in RUN/attempts/; "
                    "the report analyses the latest window (choose another with --cycle).")
    expl = ("The job died. When one rank fails, every other rank fails soon after of that failure (its peer is gone, "
            "its communicator aborted, its collective timed out, the launcher stops it); those are consequences. "
            "The first failure by time, of its own, is the cause; the recorded window's findings follow below.")
    step = win.mean_step_us if win is not None else 0.0
    one = Window(1, step, step, None, {}) if step else None
    rank = first.get("rank") if first is not None else None
    f = make_finding("failure", title, step, one, "failure", None, rank if isinstance(rank, int) else None, expl,
                     evidence, sugg)
    f["impact_pct"] = 100.0 if step else None  # a dead job loses every step from then on
    if recovered:
        f["recovered"] = True  # a later attempt ran to the end: the window below is that attempt's
    return [f]
