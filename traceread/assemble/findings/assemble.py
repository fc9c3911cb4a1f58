"""The report's findings: a failure (the job died) first, then a hang, then the shares of the window ledger, biggest first.

One engine (:mod:`traceread.assemble.findings.ledger`) on one window ledger
(:mod:`traceread.assemble.findings.window`, read from any document) and one builder
(:func:`traceread.assemble.findings.base.make_finding`). A hang is not a share of the window — the job
stopped — so it leads, outside the coverage. Shares below :data:`MIN_IMPACT_PCT` of the window are
dropped (a hang, NCCL diagnoses and slow steps are always kept).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from traceread.assemble.findings.base import MIN_IMPACT_PCT, make_finding
from traceread.assemble.findings.hang import hang
from traceread.assemble.findings.window import window_of
from traceread.fmt import rank_list
from traceread.report_schema import Finding, Report

__all__ = ["MIN_IMPACT_PCT", "build_findings", "coverage", "hang"]


def _nccl_alone(report: Report) -> list[Finding]:
    """NCCL diagnoses of a document without any step (an NCCL log alone): no share to claim."""
    out = []
    for d in [d for d in (report.get("nccl") or {}).get("diagnoses") or []
              if isinstance(d, dict) and d.get("severity") != "info"][:3]:
        msg = str(d.get("message") or d.get("id") or "NCCL problem")
        out.append(make_finding("nccl_" + str(d.get("id") or "diagnosis"), f"NCCL: {msg}", 0.0, None, "comm_transfer",
                                None, None, "The NCCL log shows how each pair of ranks is connected. " + msg,
                                [str(e) for e in (d.get("evidence") or [])][:5],
                                [str(d["suggestion"])] if d.get("suggestion") else [],
                                severity=str(d.get("severity") or "warning")))
    return out


def _nccl_error(f: Finding) -> bool:
    return f["id"].startswith("nccl_") and f.get("severity") == "error"


def _kept(f: Finding) -> bool:
    if f["id"] in ("failure", "hang", "slow_steps") or f["id"].startswith("nccl_"):
        return True
    pct = f.get("impact_pct")
    return (pct or 0.0) >= MIN_IMPACT_PCT or (pct is None and f["impact_us_per_step"] > 0)


def build_findings(report: Report, warn: Callable[[str], None] | None = None) -> list[Finding]:
    """All findings, biggest share of the window first (a hang always first)."""
    from traceread.assemble.findings.ledger import ledger_findings

    win = None
    try:
        win = window_of(report)
    except Exception as exc:
        if warn:
            warn(f"window ledger unreadable, findings limited: {type(exc).__name__}: {exc}")
    for note in win.notes if win is not None else []:
        if warn:
            warn(note)
    from traceread.assemble.findings.failure import failure

    found = failure(report, win) + hang(report, win)  # the job died / stopped: why leads
    found += ledger_findings(report, win, warn) if win is not None else _nccl_alone(report)
    keep = [f for f in found if _kept(f)]
    # why the job died or stopped leads; an NCCL error (a WARN, a failed call, a timeout) means the job
    # failed or hung there, so it comes before the shares of time, which describe a job that ran
    keep.sort(key=lambda f: (f["id"] != "failure", f["id"] != "hang", not _nccl_error(f), -f["impact_us_per_step"]))
    from traceread.assemble.findings.memory import memory_findings

    # Memory findings cost no step time and come after the time findings, except an out-of-memory
    # error: the job died of it, so it comes first after a hang, like a hang.
    memory = memory_findings(report)
    oom = [f for f in memory if f["id"] == "memory_oom"]
    hung = [f for f in keep if f["id"] in ("failure", "hang")]
    return hung + oom + [f for f in keep if f["id"] not in ("failure", "hang")] + \
        [f for f in memory if f["id"] != "memory_oom"]


def coverage(findings: list[Finding], report: Report) -> dict[str, Any] | None:
    """How much of the window the findings explain, per step and in total (the hang is left out)."""
    win = window_of(report)
    if win is None or not win.total_us:
        return None
    total = sum(float(f.get("impact_us_total") or 0.0) for f in findings if f["id"] not in ("failure", "hang"))
    total = min(total, win.total_us)
    return {"explained_us": total / win.n, "step_us": win.mean_step_us, "explained_total_us": total,
            "window_us": win.total_us, "steps": win.n, "median_step_us": win.median_step_us}


def missing_note(report: Report, unreadable: dict[int, str] | None = None) -> str:
    """The line that says which ranks are missing and what the answer can and cannot see."""
    src = report.get("source") or {}
    gone = [int(r) for r in src.get("missing_ranks") or []]
    read = len(report.get("ranks") or [])
    why = next(iter((unreadable or {}).values()), None)
    text = (f"rank(s) {rank_list(gone)} of {src.get('world_size') or read + len(gone)} have no trace here"
            + (f" ({why})" if why and len(gone) == 1 else "") + f"; the answer covers the {read} rank(s) read and "
            "cannot see the missing ranks' own time.")
    likely = [f for f in report.get("findings") or [] if f["id"] == "missing_rank"]
    if likely:
        f = likely[0]
        text += (f" Collectives with rank {f.get('rank')} went on {f['impact_us_per_step'] / 1000:.1f} ms per step "
                 "after every other member had arrived (waiting for it, or moving data): rank "
                 f"{f.get('rank')} is the likely straggler.")
    else:
        text += " Their waits in collectives count as communication here."
    return text
