"""The findings engine: every finding is a share of the window ledger, each µs in at most one.

The window (:mod:`traceread.assemble.findings.window`) is the sum of every recorded step's critical-path
ledger. Findings claim from it (:class:`~traceread.assemble.findings.base.Budget`) in this order, the
more specific cause first:

1. **slow steps** — a step clearly slower than the others (the slow-step rule of
   :mod:`traceread.analysis.time.slow_steps` on the steps' critical durations) claims its excess over
   the median step, out of the (category, role) parts that grew in it, largest growth first: a host
   stall (with the operator or annotation the host was in: data loading, ``checkpoint.save``, Python
   with no operator for garbage collection), copies, a late rank, communication. Steps of the same
   cause make one finding.
2. **straggler** — a late rank whose delay per step (median over the steps) is above the run's own
   step-to-step spread (``ledger.window.late[].straggler``, docs/ledger.md): its own work on the
   critical path, or, when it is the critical rank itself and the others waited on it, its work in
   excess of theirs. Charged once per step however many collectives waited on it; the predicted
   saving is capped by what the other ranks' own work allows (``saving_us``).
3. **missing rank** — communication of collectives whose member's trace is missing, after every
   present member had arrived: waiting for that rank or transfer, the traces cannot tell; the
   missing rank is the likely straggler.
4. layout causes (a TP group spanning nodes: its TP transfer), NCCL transport diagnoses (their
   estimated loss out of the transfer), kernels too small for the GPU (SM time lost out of
   ``compute_other``);
5. one finding per recoverable (category, role) for the rest: ``bubble`` (pp), ``comm_transfer`` and
   ``comm_wait`` per role, ``host_bound``, ``memory_bound``, ``exposed_memcpy``, ``dependency``. Useful
   compute and the step's tail (``idle_other``) are not findings.

``impact_us_per_step`` is the share per step on average over the window, ``impact_us_total`` the
share of the whole window and ``impact_pct`` its percentage: findings never add up to more than the
window. A hang is not a share (the job stopped): it comes first, outside the coverage.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from traceread.assemble import explain
from traceread.assemble.findings import spans as sp
from traceread.assemble.findings.base import Budget, SpanId, make_finding
from traceread.assemble.findings.window import Key, Window, parts_by_key
from traceread.assemble.queries import med, network_loss_us
from traceread.fmt import ms, rank_list, step_name
from traceread.report_schema import LEDGER_CAUSES, Finding, Report

#: Ledger categories that are time to recover (a finding each), with the finding id.
RECOVERABLE: dict[str, str] = {
    "bubble": "pipeline_bubble", "comm_transfer": "exposed_comm", "comm_wait": "comm_wait",
    "host_bound": "host_bound", "memory_bound": "memory_bound", "exposed_memcpy": "exposed_memcpy",
    "dependency": "dependency_wait",
}
#: Communication categories: on a late peer they are communication (the role's finding), not the
#: peer's own slowness (the straggler finding).
COMM_CATEGORIES = frozenset({"comm_transfer", "comm_wait", "bubble"})
COMPUTE_CATEGORIES = frozenset({"compute_bound", "memory_bound", "compute_other"})
HOST_CATEGORIES = frozenset({"host_bound", "idle_other", "exposed_memcpy", "dependency"})
#: Slow steps need this many steps to tell slow from typical.
MIN_SLOW_STEPS = 3


def _per(win: Window, us: float) -> str:
    return ms(us / win.n if win.n else us)


def _cpu_ranks(report: Report) -> set[int]:
    """Ranks without GPU work (their ledger is the host's: no "gpu" cause there)."""
    return {int(r["rank"]) for r in report.get("ranks") or [] if r.get("cpu") is not None or r.get("compute_us") is None}


def _span_fields(sc: sp.SpanCause | None, win: Window) -> dict[str, Any]:
    """The finding's ``spans`` (additive): the host spans its time was in, per step, largest first."""
    if sc is None:
        return {}
    return {"spans": [{"rank": r, "family": sid[0] if sid else None, "span": sid[1] if sid else None,
                       "us_per_step": us / max(win.n, 1)} for r, sid, us in sc.parts[:8]]}


# ---- 1. slow steps --------------------------------------------------------------------------------


def _grouped(parts: list[dict[str, Any]]) -> dict[tuple[str, str | None], list[tuple[Key, float]]]:
    out: dict[tuple[str, str | None], list[tuple[Key, float]]] = defaultdict(list)
    for key, us in parts_by_key(parts).items():
        out[(key[0], key[1])].append((key, us))
    return out


def _host_names(entry: Mapping[str, Any] | None) -> list[str]:
    names = [str(a.get("name")) for a in (entry or {}).get("host_activity") or [] if a.get("name")]
    return sorted(names, key=lambda n: n.lower().startswith(("cuda", "cudnn")))  # the runtime's own waits last


def _slow_cause(step: Mapping[str, Any], top: tuple[str, str | None], top_rank: int,
                entry: Mapping[str, Any] | None, cpu: set[int]) -> tuple[tuple[str, str], str]:
    """(group label, what happened) for a slow step whose largest growth is in ``top``."""
    cat, role = top
    late = str((entry or {}).get("cause") or "")
    if late.startswith("rank:") and cat not in COMM_CATEGORIES:  # one rank's own time grew (slow_steps.py)
        names = _host_names(entry)
        inside = f" (its host was in {names[0]})" if names else ""
        return ("rank", late[5:]), f"rank {late[5:]} was late{inside} and the others waited for it"
    crit_v = step.get("critical_rank")
    crit = int(crit_v) if crit_v is not None else -1
    if top_rank != crit and cat not in COMM_CATEGORIES:
        return ("rank", str(top_rank)), f"rank {top_rank} was late and the others waited for it"
    if cat in COMM_CATEGORIES:
        return ("comm", str(role)), f"{role or 'unclassified'} communication took longer"
    if cat in COMPUTE_CATEGORIES:
        if top_rank in cpu:
            return ("compute", ""), f"rank {top_rank}'s operators on the CPU took longer"
        return ("compute", ""), "compute took longer"
    names = _host_names(entry)
    gpu = top_rank not in cpu
    if names:
        where = ", ".join(names[:2])
        return ("host", names[0]), (f"the host was in {where} while the GPU waited" if gpu else f"the host was in {where}")
    if cat == "exposed_memcpy":
        return ("host", "copies"), "memory copies ran with nothing to hide them"
    return ("host", ""), ("the GPU waited for the host (no operator recorded: Python, garbage collection, "
                          "data loading)" if gpu else "the host ran no recorded operator (Python, garbage collection, "
                          "data loading, sleeping)")


def _slow_steps(report: Report, win: Window, budget: Budget) -> list[Finding]:
    from traceread.analysis.time.slow_steps import slow_step_threshold

    if win.n < MIN_SLOW_STEPS or not win.by_step:
        return []
    _med, thr = slow_step_threshold(np.array([float(b["step_us"]) for b in win.by_step]))
    ref = next((b for b in win.by_step if b["step"] == win.median_step), None)
    if ref is None:
        return []
    ref_parts = {cr: sum(us for _, us in v) for cr, v in _grouped(ref["parts"]).items()}
    entries = {int(s["step"]): s for s in report.get("slow_steps") or [] if isinstance(s.get("step"), int)}
    cpu = _cpu_ranks(report)
    groups: dict[tuple[str, str], dict[str, Any]] = {}
    for b in win.by_step:
        if float(b["step_us"]) <= thr:
            continue
        excess = float(b["step_us"]) - float(ref["step_us"])
        mine = _grouped(b["parts"])
        growth = sorted(((sum(us for _, us in v) - ref_parts.get(cr, 0.0), cr) for cr, v in mine.items()),
                        key=lambda x: -x[0])
        growth = [(d, cr) for d, cr in growth if d > 0]
        if not growth or excess <= 0:
            continue
        got, left, claimed = 0.0, excess, []
        budget.drain()
        prefer = sp.grown_spans(b, ref)
        for d, cr in growth:
            keys = [k for k, _ in sorted(mine[cr], key=lambda kv: -kv[1])]
            take = budget.claim(keys, min(d, left), prefer)
            got += take
            left -= take
            if take > 0:
                claimed.append((take, cr, max(mine[cr], key=lambda kv: kv[1])[0][2]))
            if left <= 0:
                break
        taken = budget.drain()
        if got <= 0:
            continue
        _take, top, top_rank = claimed[0]
        sc = sp.cause_of(taken) if top[0] in HOST_CATEGORIES else None
        if sc is not None and sc.named and sc.us >= 0.5 * _take:
            word = sp.FAMILY_WORDS.get(sc.family or "", "span")
            label = ("host", str(sc.span))
            what = (f"rank {sc.rank}'s host was in {sc.span} ({word}) while the GPU waited" if sc.rank not in cpu
                    else f"rank {sc.rank}'s host was in {sc.span} ({word})")
            if sc.rank != b.get("critical_rank"):
                what += " and the others waited for it"
        else:
            label, what = _slow_cause(b, top, top_rank, entries.get(int(b["step"])), cpu)
        g = groups.setdefault(label, {"steps": [], "share": 0.0, "what": what, "top": top, "rank": top_rank,
                                      "taken": {}, "family": sc.family if sc is not None and sc.named else None})
        g["steps"].append((int(b["step"]), excess, float(b["step_us"])))
        g["share"] += got
        for k2, us in taken.items():
            g["taken"][k2] = g["taken"].get(k2, 0.0) + us
    out = []
    for label, g in groups.items():
        steps = g["steps"]
        where = (f"Step {steps[0][0]} took {ms(steps[0][1])} longer than the median step" if len(steps) == 1 else
                 f"{len(steps)} slow steps ({', '.join(str(s) for s, _, _ in steps[:6])}) took "
                 f"{ms(sum(e for _, e, _ in steps))} longer than the median step in all")
        title = f"{where}: {g['what']} ({_per(win, g['share'])} per step over the {win.n} recorded steps)"
        ev = [f"step {s}: {ms(d)} vs median step {ms(win.median_step_us)} (+{ms(e)})"
              + (f" — {entries[s]['detail']}" if entries.get(s, {}).get("detail") else "") for s, e, d in steps[:6]]
        expl = (f"Most steps take about {ms(win.median_step_us)}, but these took much longer. Over the "
                f"{win.n} recorded steps that excess is {ms(g['share'])} in all, {_per(win, g['share'])} per step "
                "on average: the share of the window shown. Periodic slow steps usually come from checkpointing, "
                "evaluation, garbage collection or data-loader stalls.")
        kind = label[0]
        sugg = {
            "host": [f"Take what the host does in {label[1] or 'that step'} off the step: asynchronous checkpointing "
                     "(torch.distributed.checkpoint.async_save), more data-loader workers with prefetch, gc.freeze() "
                     "after start-up and gc.collect() on a schedule."],
            "rank": [f"See what rank {label[1]} did in that step (traceread export, its timeline): a one-off stall on "
                     "one rank stops every rank at the next collective."],
            "comm": ["Communication was slower in that step only: look for network congestion or another job on the "
                     "same links at that time."],
        }.get(kind, ["Compare the slow step with a typical one in the timeline (traceread export)."])
        cat, role = g["top"]
        sc_all = sp.cause_of(g["taken"])
        if kind == "rank" and not g["family"]:  # advice for the span that grew on the late rank
            from traceread.analysis.time.host_spans import family_of

            names = [_host_names(entries.get(s_)) for s_, _, _ in steps]
            fam = explain.span_advice(family_of(names[0][0], None)) if names and names[0] else None
            sugg = [fam, *sugg] if fam else sugg
        if g["family"]:
            fam = explain.span_advice(g["family"])
            sugg = [fam] if fam else sugg
            ev += sp.evidence(report, sc_all, win.n) if sc_all is not None else []
        out.append(make_finding("slow_steps", title, g["share"], win, cat, role, g["rank"], expl, ev, sugg,
                                predicted_us=g["share"], steps=[s for s, _, _ in steps], **_span_fields(sc_all, win)))
    return out


# ---- 2. stragglers ----------------------------------------------------------------------------------


def _straggler_cause(report: Report, rank: int, claims: list[dict[str, Any]], ledger_cause: str | None) -> str:
    """gpu / host / cpu_ops / unknown: what the late rank's own steps show beyond the other ranks'
    (window ledger), else the straggler analysis' cause, else what its critical-path time was; "gpu"
    only where GPU work is measured (a CPU-only rank's compute is its operators: "cpu_ops")."""
    cpu = rank in _cpu_ranks(report)
    entry = next((s for s in report.get("stragglers") or [] if s.get("rank") == rank), None)
    cause = ledger_cause if ledger_cause in LEDGER_CAUSES else str((entry or {}).get("cause") or "")
    if cause not in LEDGER_CAUSES:
        mix: dict[str, float] = defaultdict(float)
        for c in claims:
            mix["gpu" if c["category"] in COMPUTE_CATEGORIES else "host"] += float(c["us"])
        cause = max(mix, key=lambda k: mix[k]) if mix else "unknown"
    if cause == "gpu" and cpu:
        cause = "cpu_ops"
    return cause


#: How a straggler's cause reads in its title.
CAUSE_WORDS = {"cpu_ops": "CPU operators"}


#: How a collective reads in a sentence.
OP_WORDS = {"allreduce": "all-reduce", "all_reduce": "all-reduce", "_allgather_base": "all-gather",
            "allgather": "all-gather", "all_gather": "all-gather", "_reduce_scatter_base": "reduce-scatter",
            "reduce_scatter": "reduce-scatter", "alltoall": "all-to-all", "all_to_all": "all-to-all",
            "broadcast": "broadcast", "send": "send/recv", "recv": "send/recv"}


def _waited_in(report: Report, role: str | None) -> str:
    """"the gradient all-reduce (dp)" — the collective the others spent most time in, of ``role``'s groups."""
    if not role or role == "other":
        return "collectives"
    lay: Mapping[str, Any] = report.get("layout") or {}
    groups = {str(g["pg"]): g.get("role") for g in lay.get("groups") or []}
    time: dict[str, float] = defaultdict(float)
    for c in report.get("collectives") or []:
        if groups.get(str(c.get("pg")).split(" ")[0]) == role:
            time[str(c.get("name"))] += float(c.get("latency_us") or 0.0) * int(c.get("count") or 1)
    if not time:
        return f"{role} communication"
    op = OP_WORDS.get(max(time, key=lambda k: time[k]), "")
    if not op:
        return f"{role} communication"
    if role == "dp" and op == "all-reduce":
        return "the gradient all-reduce (dp)"
    return f"the {role} {op}"


def _stragglers(report: Report, win: Window, budget: Budget) -> list[Finding]:
    out = []
    entries = {s.get("rank"): s for s in report.get("stragglers") or [] if isinstance(s, dict)}
    for e in win.late:
        if not e.get("straggler"):
            continue
        rank = int(e["rank"])
        budget.drain()
        prefer: list[SpanId] = [(x.get("family"), str(x["span"])) for x in e.get("spans") or []]
        got = sum(budget.claim([(str(c["category"]), c.get("role"), int(c["rank"]))], float(c["us"]), prefer)
                  for c in e.get("claims") or [])
        sc = sp.cause_of(budget.drain())
        if got <= 0:
            continue
        share_all = float(e.get("share_us") or got)
        saving = e.get("saving_us")
        if saving is None:  # a document without a window: the straggler analysis' what-if
            imp = (entries.get(rank) or {}).get("impact_us_per_step")
            saving = float(imp) * win.n if imp is not None else got
        saving = min(float(saving) * got / share_all if share_all else 0.0, got)
        cause = _straggler_cause(report, rank, e.get("claims") or [], e.get("cause"))
        role = e.get("role")
        st = entries.get(rank) or {}
        where = _waited_in(report, role)
        title = (f"Rank {rank} is a straggler ({CAUSE_WORDS.get(cause, cause)}): the others waited for it in {where}, "
                 f"{_per(win, got)} per step of its own work on the critical path; steps would be about "
                 f"{_per(win, saving)} shorter if it were on time")
        why_late = sp.late_cause(e)  # from its host time beyond the other ranks', per covering span
        host_said = sp.describe(report, why_late, win.n) if cause == "host" and why_late is not None else None
        if host_said is not None:
            why = f"late because {host_said[0]}" if host_said[1] else f"late, and {host_said[0]}"
            title = (f"Rank {rank} is a straggler (host), {why}; the others wait for it in {where} "
                     f"({_per(win, got)} per step of its own work on the critical path; steps would be about "
                     f"{_per(win, saving)} shorter if it were on time)")
        ev = sp.evidence(report, why_late, win.n) if host_said is not None and why_late is not None else []
        if e.get("steps_late") is not None:
            ev.append(f"late in {e['steps_late']} of {win.n} steps, {ms(e.get('delay_us'))} per step typically "
                      f"(above the run's own step-to-step spread, {ms(win.noise_us)})")
        if e.get("critical_steps"):
            ev.append(f"in {e['critical_steps']} step(s) rank {rank} had the longest step itself: its work in excess "
                      "of the other ranks' is counted, not all of it")
        ev.append(f"the step cannot shrink below the other ranks' own work: at most {_per(win, saving)} per step")
        if st.get("blame_us_per_step") is not None:
            ev.append(f"the others waited {ms(st['blame_us_per_step'])} per step in all collectives it was last to join "
                      "(blame: the same delay counted at every collective)")
        if st.get("evidence"):
            ev.append(str(st["evidence"]))
        mix = ", ".join(f"{ms(float(c['us']) / win.n)} {c['category']}" for c in (e.get("claims") or [])[:3])
        if mix:
            ev.append(f"its share per step: {mix}")
        extra = ", ".join(f"{c['category']} +{ms(float(c['us']) / max(int(e.get('steps_late') or 1), 1))}"
                          for c in (e.get("excess") or [])[:3])
        if extra:
            ev.append(f"its own work per late step beyond the other ranks': {extra} (cause: {cause})")
        advice, _p = explain.advice(role, "comm_wait", {"share_us": saving / win.n, "rank": rank, "cause": cause})
        expl = explain.straggler(rank, saving / win.n, cause, win.mean_step_us, st.get("blame_us_per_step"))
        sugg = [advice]
        fam_advice = explain.span_advice(host_said[1]) if host_said is not None else None
        if fam_advice:
            sugg.insert(0, fam_advice)
        out.append(make_finding("straggler", title, got, win, "comm_wait", role, rank, expl, ev, sugg,
                                predicted_us=saving, blame_us_per_step=st.get("blame_us_per_step"),
                                **_span_fields(sc, win)))
    return out


# ---- 3. missing ranks --------------------------------------------------------------------------------


def missing_ranks(report: Report) -> list[int]:
    """Ranks of the job with no readable trace (``source.missing_ranks``)."""
    return [int(r) for r in (report.get("source") or {}).get("missing_ranks") or []]


def _missing(report: Report, win: Window, budget: Budget) -> list[Finding]:
    gone = set(missing_ranks(report))
    by_rank: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for b in win.blind:
        if int(b.get("present") or 0) >= 2:  # one present member alone cannot tell waiting from moving data
            by_rank[int(b["rank"])].append(b)
    out = []
    for m, entries in sorted(by_rank.items()):
        if gone and m not in gone:
            continue
        got, roles = 0.0, []
        for b in entries:
            take = budget.claim(budget.keys("comm_transfer", b.get("role")), float(b["us"]))
            got += take
            if take > 0:
                roles.append(b.get("role") or "unclassified")
        if got <= 0:
            continue
        role = entries[0].get("role")
        title = (f"Rank {m}'s trace is missing and the others spent {_per(win, got)} per step in "
                 f"{'/'.join(dict.fromkeys(roles))} collectives with it after all of them had arrived: rank {m} "
                 "is the likely straggler")
        ev = [f"the present members of the collectives with rank {m} had all arrived, yet the collectives went on: "
              f"waiting for rank {m}, or moving data"]
        for b in entries[:2]:
            if b.get("instances"):
                ev.append(f"{b['instances']} {b.get('role') or ''} collective(s) with rank {m}: the present members "
                          f"arrived within {ms(b.get('present_spread_us'))} of each other, then stayed "
                          f"{ms(b.get('after_us'))} (median) until it ended")
        ev.append(f"ranks read: {len(report.get('ranks') or [])}; missing: {rank_list(sorted(gone or {m}))}")
        expl = (f"Rank {m}'s trace could not be read, so its own time is not in the ledger. A collective ends only "
                f"when its last member arrives: the other ranks arrived, then waited, either for rank {m} or for the "
                "data to move — without its trace the two cannot be told apart. That time is shown here, not as "
                "transfer.")
        sugg = [f"Recover rank {m}'s trace (see the warning that names its file) and re-run the report; or profile "
                f"rank {m} against a healthy rank (traceread diff)."]
        out.append(make_finding("missing_rank", title, got, win, "comm_transfer", role, m, expl, ev, sugg))
    return out


# ---- 4. layout, NCCL, SM efficiency --------------------------------------------------------------------


def _layout(report: Report, win: Window, budget: Budget) -> list[Finding]:
    from traceread.assemble.findings.layout import tp_across_nodes

    return tp_across_nodes(report, budget, win)


def _nccl(report: Report, win: Window, budget: Budget) -> list[Finding]:
    n = report.get("nccl") or {}
    diags = [d for d in n.get("diagnoses") or [] if isinstance(d, dict) and d.get("severity") != "info"]
    if not diags:
        return []
    _net, lost = network_loss_us(report)
    out = []
    for d in diags[:3]:
        keys = budget.keys("comm_transfer")
        got = budget.claim(keys, lost * win.n)
        msg = str(d.get("message") or d.get("id") or "NCCL problem")
        ev = [str(e) for e in (d.get("evidence") or [])][:5]
        sugg = [str(d["suggestion"])] if d.get("suggestion") else []
        out.append(make_finding("nccl_" + str(d.get("id") or "diagnosis"), f"NCCL: {msg}", got, win, "comm_transfer",
                                keys[0][1] if keys else None, keys[0][2] if keys else None,
                                "The NCCL log shows how each pair of ranks is connected. " + msg, ev, sugg,
                                severity=str(d.get("severity") or "warning")))
    return out


def _sm_efficiency(report: Report, win: Window, budget: Budget) -> list[Finding]:
    from traceread.analysis.kinds import is_comm_kernel_row
    from traceread.assemble.queries import total_steps

    kernels = [k for k in report.get("kernels") or []
               if k.get("sm_time_lost_us") and not is_comm_kernel_row(k)]
    if not kernels:
        return []
    steps, nr = total_steps(report), max(1, len(report.get("ranks") or []))
    lost = sum(float(k["sm_time_lost_us"]) / max(int(k.get("ranks") or nr), 1) / steps for k in kernels)
    keys = budget.keys("compute_other")
    got = budget.claim(keys, lost * win.n)
    if got <= 0:
        return []
    worst = max(kernels, key=lambda k: float(k["sm_time_lost_us"]))
    ranks = report.get("ranks") or []
    expl = explain.sm_efficiency(med(r.get("sm_efficiency_pct") for r in ranks),
                                 med(r.get("achieved_occupancy_pct") for r in ranks), (ranks or [{}])[0].get("num_sms"))
    return [make_finding("low_sm_efficiency", f"Kernels too small for the GPU waste {_per(win, got)} per step "
                         f"(worst: {worst['name']})", got, win, "compute_other", None, keys[0][2], expl,
                         [f"SM time lost per step and rank, all small kernels: {ms(lost)} (the share is capped by the "
                          "compute time no roofline class covers)"],
                         ["Batch small launches together: larger micro-batch, fused kernels (torch.compile), "
                          "foreach/fused optimizers."], kernel=worst["name"])]


def _roofline_memory(report: Report, win: Window, budget: Budget) -> list[Finding]:
    """Windows without roofline classes (from per-rank breakdowns): the roofline's memory-bound
    operators claim their time out of the compute."""
    if win.source != "per-rank steps" or any(k[0] == "memory_bound" for k in win.parts):
        return []
    r = report.get("roofline") or {}
    ops = sorted((o for o in r.get("ops") or [] if o.get("bound") == "memory" and o.get("time_us")),
                 key=lambda o: -float(o["time_us"]))[:5]
    if not ops:
        return []
    from traceread.assemble.queries import total_steps

    scale = float(r.get("time_scale") or 1.0 / total_steps(report))
    want = sum(float(o["time_us"]) for o in ops) * scale * win.n
    keys = budget.keys("compute_other")
    got = budget.claim(keys, want)
    if got <= 0:
        return []
    ev = [f"{o['name']}: {o.get('intensity', 0):.2g} FLOP/byte, {ms(float(o['time_us']) * scale)} per step" for o in ops]
    return [make_finding("memory_bound", f"Memory-bound operators take {_per(win, got)} per step (top: {ops[0]['name']})",
                         got, win, "memory_bound", None, keys[0][2] if keys else None, explain.roofline(r), ev,
                         ["Fuse chains of element-wise ops (torch.compile) so intermediate tensors never go to memory."],
                         op=ops[0]["name"])]


# ---- 5. the rest, per (category, role) -------------------------------------------------------------------


def _numbers(report: Report, role: str | None, share: float, step: float) -> dict[str, Any]:
    """The job's numbers the guide's cost models need (explain.advice), for a per-step share of ``role``."""
    p = report.get("pipeline") or {}
    lay: Mapping[str, Any] = report.get("layout") or {}
    groups = [g for g in lay.get("groups") or [] if g.get("role") == role]
    n: dict[str, Any] = {"share_us": share, "step_us": step, "stages": p.get("stages"),
                         "microbatches": p.get("microbatches"),
                         "virtual": 2 if p.get("schedule") == "interleaved" else 1}
    if groups:
        from traceread.assemble.findings.layout import role_numbers

        n.update(role_numbers(report, role))  # nodes, group size, GPUs per node, measured busbw, NVLink peak
    return n


def _rank_evidence(report: Report, category: str, role: str | None, top: int = 4) -> list[str]:
    """The ranks with the most of (category, role) in their own ledger of the median step."""
    vals = []
    for r in report.get("ranks") or []:
        led = r.get("ledger") or {}
        us = sum(float(p["us"]) for p in led.get("parts") or [] if p["category"] == category and p.get("role") == role)
        if us > 0:
            vals.append((us, int(r["rank"])))
    vals.sort(reverse=True)
    return [f"rank {rk}: {ms(us)} of its own {step_name((report.get('ledger') or {}).get('step'))}" for us, rk in vals[:top]]


def _category_finding(report: Report, win: Window, category: str, role: str | None, rank: int, share: float,
                      cpu: bool, sc: sp.SpanCause | None = None) -> Finding:
    """The finding for one recoverable (category, role) share of the window (µs over the window)."""
    fid = RECOVERABLE[category]
    per = share / win.n
    step = win.mean_step_us
    ev = _rank_evidence(report, category, role)
    advice, predicted = explain.advice(role, category, _numbers(report, role, per, step))
    sugg = [advice]
    if category == "bubble":
        p = report.get("pipeline") or {}
        stages, mb = int(p.get("stages") or 0), int(p.get("microbatches") or 0)
        title = f"Pipeline bubble: {ms(per)} per step of stages waiting for their neighbours"
        if stages >= 2 and mb >= 1:
            title += f" (P={stages} stages, M={mb} micro-batches, {p.get('schedule')})"
        expl = explain.pipeline(p, step) if p else (
            "Pipeline stages sat idle waiting for the neighbouring stage's activations or gradients.")
    elif category in ("comm_transfer", "comm_wait"):
        what = "moving data" if category == "comm_transfer" else "waiting inside the collective for a peer"
        groups = f"{role.upper()} groups" if role and role != "other" else "unclassified process groups"
        gloo = str((report.get("source") or {}).get("backend") or "").lower() == "gloo"
        where = ("on the host (CPU collectives)" if cpu else
                 "in host-side (gloo) collectives while the GPU idled" if gloo else "with no compute to hide it")
        title = f"Exposed communication on {groups}: {ms(per)} per step {what} {where} (rank {rank})"
        expl = explain.exposed_comm(per, step, None)
        if gloo and not cpu:
            sugg.insert(0, "These collectives run on the host over gloo: every gradient bucket is copied off the GPU, "
                           "all-reduced by the CPU and copied back while the GPU waits. Use the NCCL backend (one GPU "
                           "per rank) so they run on the GPU and overlap backward.")
    elif category == "host_bound" and sc is not None and sc.named:
        per_span, oth = sp.span_numbers(report, sc, win.n)
        word = sp.FAMILY_WORDS.get(sc.family or "", "span")
        part = "all of it" if sc.us >= 0.99 * share else f"{ms(sc.us / win.n)} of it"
        title = (f"Host time outside operators: {ms(per)} per step (rank {sc.rank})" if cpu
                 else f"GPU idle waiting for the CPU: {ms(per)} per step (rank {sc.rank})")
        title += (f"; {part} in its {word}, {sc.span} (the span takes {ms(per_span)} per step there"
                  + (f"; {oth})" if oth else ")"))
        rank = sc.rank if sc.rank is not None else rank
        expl = (f"{ms(sc.us / win.n)} per step of this time was inside {sc.span}, the innermost recorded span "
                "covering it (docs/ledger.md: which span covers host time)"
                + ("" if cpu else ": " + explain.host_bound(per, step)))
        ev = sp.evidence(report, sc, win.n) + ev
        fam = explain.span_advice(sc.family)
        sugg = [fam] if fam else sugg
        if cpu:
            predicted = None
    elif category == "host_bound":
        if cpu:
            title = f"Host time outside any recorded span: {ms(per)} per step (rank {rank})"
            expl = ("The host ran no recorded operator, annotation or collective: Python between operators, data "
                    f"loading without annotations, sleeping or waiting ({sp.checked(report, rank)}). Profile with "
                    "with_stack=True, or wrap the suspects in torch.profiler.record_function, to see where.")
            sugg = ["Look at the Python around the training step (data loading, logging, .item()/.cpu() syncs); "
                    "record stacks (with_stack=True) to name it."]
            predicted = None
        else:
            title = f"GPU idle waiting for the CPU to launch work: {ms(per)} per step (rank {rank})"
            expl = explain.host_bound(per, step)
    elif category == "memory_bound":
        title = f"Memory-bound operators take {ms(per)} per step (rank {rank})"
        expl = explain.roofline(report.get("roofline") or {})
        sugg = ["Fuse chains of element-wise ops (torch.compile) so intermediate tensors never go to memory.",
                "Use bf16 activations where fp32 is not needed: half the bytes, half the time for these ops."]
    elif category == "exposed_memcpy":
        title = f"Exposed memory copies: {ms(per)} per step with nothing else running (rank {rank})"
        expl = "Host↔device copies ran while no kernel did: the GPU waited for data to arrive."
        sugg = ["Use pin_memory=True and non_blocking=True copies on a side stream, prefetching the next batch."]
    else:  # dependency
        title = f"GPU idle with work already launched, waiting on a dependency: {ms(per)} per step (rank {rank})"
        expl = ("The next kernel had been launched but could not start: it waited for an event, another stream or "
                "a synchronisation. This is not the CPU being slow.")
        sugg = ["Look for cross-stream waits and synchronisations (cudaStreamWaitEvent, torch.cuda.synchronize) "
                "inside the step; overlap the work they wait for."]
    return make_finding(fid, title, share, win, category, role, rank, expl, ev, sugg,
                        predicted_us=(predicted * win.n if predicted is not None else None), **_span_fields(sc, win))


def _categories(report: Report, win: Window, budget: Budget) -> list[Finding]:
    groups: dict[tuple[str, str | None], list[Key]] = defaultdict(list)
    for key, left in budget.left.items():
        if key[0] in RECOVERABLE and left > 0:
            groups[(key[0], key[1])].append(key)
    cpu = _cpu_ranks(report)
    out = []
    for (category, role), keys in groups.items():
        rank = max(keys, key=lambda k: budget.left.get(k, 0.0))[2]
        budget.drain()
        got = budget.claim(keys)
        if got > 0:
            out.append(_category_finding(report, win, category, role, rank, got, rank in cpu,
                                         sp.cause_of(budget.drain())))
    return out


STAGES = (_slow_steps, _stragglers, _missing, _layout, _nccl, _sm_efficiency, _roofline_memory, _categories)


def ledger_findings(report: Report, win: Window, warn: Callable[[str], None] | None = None) -> list[Finding]:
    """Every finding of the window (module docstring), biggest share first. A stage that fails is
    skipped with a warning; the later stages still claim what it left."""
    budget = Budget(win.parts, win.spans)
    out: list[Finding] = []
    for stage in STAGES:
        try:
            out += stage(report, win, budget)
        except Exception as exc:
            if warn:
                warn(f"finding '{stage.__name__.strip('_')}' skipped: {type(exc).__name__}: {exc}")
    out.sort(key=lambda f: -f["impact_us_per_step"])
    return out
