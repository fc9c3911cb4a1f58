"""The hang finding: the job stopped, so it leads the report, and what it says comes from the hang's own evidence.

What to do depends on *why* each culprit stopped the job (``report['hang']['culprits'][*]['why']``,
decided by :mod:`traceread.analysis.hang.attribution`): a rank that never called the collective wants its
stack read; a rank whose GPU never started the collective its host enqueued wants its GPU looked at; ranks
that issue collectives in another order, or with other shapes, want their code paths aligned. When every
member is in the collective and none completes, no rank is missing: the advice says so.
"""

from __future__ import annotations

from typing import Any

from traceread.assemble.findings.base import make_finding
from traceread.assemble.findings.window import Window
from traceread.fmt import rank_list, ranks_words
from traceread.report_schema import Finding, Report

#: culprit kinds whose rank never called the collective (its host is elsewhere, or its process is gone)
ABSENT = ("host_elsewhere", "no_dump")


def _fail_fast_advice(report: Report) -> str:
    """How to make the next hang fail fast: NCCL's watchdog settings only mean something to NCCL."""
    backend = str((report.get("source") or {}).get("backend") or "").lower()
    h = report.get("hang") or {}
    gloo = "gloo" in backend or (not backend and any("gloo" in str(e).lower() for e in h.get("evidence") or []))
    if not gloo:
        return "Set TORCH_NCCL_ASYNC_ERROR_HANDLING=1 and a shorter timeout in init_process_group so the job fails fast."
    return ("Pass a shorter timeout to init_process_group (timeout=datetime.timedelta(minutes=5)): gloo then fails "
            "the stuck collective with an error instead of waiting 30 minutes.")


def _by_why(h: dict[str, Any]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for c in h.get("culprits") or []:
        if isinstance(c, dict) and isinstance(c.get("rank"), int):
            out.setdefault(str(c.get("why")), []).append(c["rank"])
    return out


def _never_started(h: dict[str, Any]) -> list[int]:
    """The ``gpu_stopped`` culprits whose GPU never started what its host enqueued (the others' GPUs stopped
    after running a collective their peers completed)."""
    return sorted(c["rank"] for c in h.get("culprits") or [] if isinstance(c, dict) and c.get("why") == "gpu_stopped"
                  and isinstance(c.get("rank"), int) and "never started it" in str(c.get("summary") or ""))


def _absent(why: dict[str, list[int]], missing: list[int]) -> list[int]:
    """Ranks that never called the collective: from the culprits' kinds, else (no Flight Recorder) ``missing``."""
    return sorted({r for k in ABSENT for r in why.get(k, [])}) if why else missing


def _what_happened(stuck: bool, why: dict[str, list[int]], absent: list[int], unstarted: list[int]) -> str:
    """The title's tail: who stopped the job, in the words of the evidence (``stuck``: a collective is known)."""
    parts = []
    if absent:
        parts.append(f"{ranks_words(absent)} never joined")
    if unstarted:
        parts.append(f"the GPU{'s' if len(unstarted) > 1 else ''} of {ranks_words(unstarted)} never started it")
    after = sorted(set(why.get("gpu_stopped", [])) - set(unstarted))
    if after:
        parts.append(f"the GPU{'s' if len(after) > 1 else ''} of {ranks_words(after)} stopped")
    if why.get("out_of_order"):
        parts.append(f"{ranks_words(why['out_of_order'])} issued collectives in another order")
    if why.get("mismatch"):
        parts.append(f"collective mismatch on {ranks_words(why['mismatch'])}")
    if not parts and stuck:
        parts.append("no rank is missing from it")
    return "; ".join(parts)


def _advice(report: Report, why: dict[str, list[int]], absent: list[int], unstarted: list[int]) -> list[str]:
    sugg = []
    after = sorted(set(why.get("gpu_stopped", [])) - set(unstarted))
    if after:
        sugg.append(f"Check the GPU of {ranks_words(after)}: its peers completed a collective its own record never saw "
                    "complete, so its GPU (or the watchdog polling it) stopped after running it. Look for Xid errors "
                    "in that node's kernel log (dmesg), run nvidia-smi there; drain the node if the GPU reports errors.")
    if unstarted:
        rs = unstarted
        sugg.append(f"Check the GPU of {ranks_words(rs)}: its host enqueued the collective but the GPU never started "
                    "it, so the GPU is stuck in earlier work or failed. Look for Xid errors in that node's kernel log "
                    "(dmesg), run nvidia-smi there, and read the last kernels before the collective; drain the node if "
                    "the GPU reports errors.")
    if absent:
        sugg.append(f"Look at the stacks of {ranks_words(absent)}: code that runs a collective on only some ranks "
                    "(rank-conditional logging, checkpointing, uneven data) is the usual cause.")
    if why.get("no_dump"):
        sugg.append(f"{ranks_words(why['no_dump']).capitalize()} left no Flight Recorder dump: read its exit status and "
                    "last log lines (the process died, was stopped, or holds the GIL in C code).")
    if why.get("out_of_order"):
        sugg.append("Make every rank issue the collectives of these groups in the same order: a branch taken on some "
                    "ranks only (or two threads issuing collectives) reorders them.")
    if why.get("mismatch"):
        sugg.append("Make every rank call the collective with the same sizes and dtype (uneven last batch, "
                    "rank-dependent shapes).")
    if not sugg:
        sugg.append("No rank is missing from the stuck collective: a GPU stopped inside it or the network failed. "
                    "Set TORCH_NCCL_ENABLE_TIMING=1 so the next Flight Recorder dump says which GPU never started it, "
                    "and read the NCCL logs for network errors (NCCL WARN, IB/RoCE errors).")
    sugg.append(_fail_fast_advice(report))
    return sugg


def hang(report: Report, win: Window | None = None) -> list[Finding]:
    """The hang as a finding; ``[]`` when the document has none."""
    h = report.get("hang")
    if not h:
        return []
    missing, waiting = h.get("missing_ranks") or [], h.get("waiting_ranks") or []
    why = _by_why(dict(h))
    absent = _absent(why, missing)
    unstarted = _never_started(dict(h))
    where = f"{h.get('op') or 'a collective'} (pg {h.get('pg')}, seq {h.get('seq')})"
    held = {(c.get("pg"), c.get("seq")) for c in h.get("culprits") or [] if isinstance(c, dict)}
    if len(held) > 1:  # several culprits in different groups: each one's collective is in its own line
        where += f" and {len(held) - 1} more collective{'s' if len(held) > 2 else ''}"
    tail = _what_happened(bool(h.get("groups") or waiting), why, absent, unstarted)
    title = f"Job hung in {where}" + (f": {tail}" if tail else "")
    stacks = h.get("stacks") or {}
    evidence = [c["summary"] for c in (h.get("culprits") or [])[:8]]  # one line per culprit first
    evidence += list(h.get("evidence") or [])
    evidence += [f"rank {r}: {loc}" for r, loc in list(stacks.items())[:8]]
    evidence += list(h.get("mismatches") or [])
    if why.get("gpu_stopped") and not unstarted and not (set(missing) - set(why["gpu_stopped"])):
        expl = (f"The GPU of {ranks_words(why['gpu_stopped'])} stopped: each one's own Flight Recorder record shows "
                "a collective never completing that its peers completed and went past, and the rest of the job waits "
                "for it" + (f" (ranks {rank_list(waiting)})" if waiting else "") + ", so the job stops.")
    elif why.get("gpu_stopped") and not (set(missing) - set(why["gpu_stopped"])):
        expl = (f"The host of {ranks_words(why['gpu_stopped'])} enqueued {where}, but its GPU never started it: the "
                "GPU is stuck in the work queued before it, or failed. Every later collective queues behind it"
                + (f", and ranks {rank_list(waiting)} wait for it" if waiting else "") + ", so the job stops.")
    elif missing:
        expl = (f"Ranks {rank_list(waiting)} entered {where} and waited for ranks {rank_list(missing)}, which never "
                "called it. A collective blocks until every member arrives, so the whole job stops. The missing "
                "ranks' stacks show what they were doing instead.")
    else:
        expl = (f"Every member of {where} is in it and none completes: no rank is missing, so a GPU stopped inside "
                "it or the network between the ranks failed.")
    step = win.mean_step_us if win is not None else 0.0
    one = Window(1, step, step, None, {}) if step else None
    f = make_finding("hang", title, step, one, "hang", None, missing[0] if missing else None, expl, evidence,
                     _advice(report, why, absent, unstarted), collective=h.get("op"))
    f["impact_pct"] = 100.0 if step else None  # a hung job loses every step from then on
    return [f]
