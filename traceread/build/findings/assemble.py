"""Rank the job's problems by the time each one costs per step, with evidence and what to change.

Each detector reads only the report document and returns zero or more :class:`Finding` dicts.
``impact_us_per_step`` is an *estimate of the time a step would get shorter if the problem went
away* (an upper bound: problems overlap, e.g. a straggler shows up as exposed communication on the
other ranks). ``impact_pct`` is that estimate as a share of the job's median step time. Findings
below :data:`MIN_IMPACT_PCT` of a step are dropped, except a hang, which always comes first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from traceread.analysis.kinds import is_comm_kernel_name
from traceread.build import explain
from traceread.build.queries import (
    coll_time,
    host_bound_per_step,
    med,
    median_step_us,
    network_loss_us,
    pct_of_step,
    per_step,
    total_steps,
    worst_rank,
)
from traceread.fmt import ms, nbytes, pct, rank_list
from traceread.report_schema import CollectiveEntry, Finding, Report, StragglerEntry

MIN_IMPACT_PCT = 1.0  # below this share of a step a problem is not worth a reader's attention
MAX_PER_KIND = 3


def _finding(id_: str, title: str, impact: float, report: Report, explanation: str,
             evidence: list[str], suggestions: list[str], **extra: Any) -> Finding:
    f: dict[str, Any] = {
        "id": id_, "title": title, "impact_us_per_step": float(max(impact, 0.0)), "explanation": explanation,
        "impact_pct": pct_of_step(max(impact, 0.0), report), "evidence": evidence, "suggestions": suggestions,
    }
    f.update(extra)
    return cast(Finding, f)  # the keys above plus a kind's extras (rank, kernel, collective, ...)


def _top_collective(report: Report) -> CollectiveEntry | None:
    colls = [c for c in report.get("collectives") or [] if c.get("latency_us") is not None]
    if not colls:
        return None
    return max(colls, key=coll_time)



def _coll_label(c: CollectiveEntry) -> str:
    size = f" ({nbytes(c['bytes'])})" if c.get("bytes") else ""
    return f"{c.get('name')} on process group {c.get('pg')}{size}"


def hang(report: Report) -> list[Finding]:
    h = report.get("hang")
    if not h:
        return []
    missing, waiting = h.get("missing_ranks") or [], h.get("waiting_ranks") or []
    step = median_step_us(report) or 0.0
    where = f"{h.get('op') or 'a collective'} (pg {h.get('pg')}, seq {h.get('seq')})"
    title = (f"Job hung in {where}: rank(s) {rank_list(missing)} never joined"
             if missing else f"Job hung in {where}")
    stacks = h.get("stacks") or {}
    evidence = [c["summary"] for c in (h.get("culprits") or [])[:8]]  # one line per culprit first
    evidence += list(h.get("evidence") or [])
    evidence += [f"rank {r}: {loc}" for r, loc in list(stacks.items())[:8]]
    evidence += list(h.get("mismatches") or [])
    expl = (f"Ranks {rank_list(waiting)} entered {where} and waited for ranks {rank_list(missing)}, which never "
            "called it. A collective blocks until every member arrives, so the whole job stops. The missing "
            "ranks' stacks show what they were doing instead.")
    sugg = ["Look at the missing ranks' stacks: code that runs a collective on only some ranks "
            "(rank-conditional logging, checkpointing, uneven data) is the usual cause.",
            "Set TORCH_NCCL_ASYNC_ERROR_HANDLING=1 and a shorter timeout in init_process_group so the job fails fast."]
    f = _finding("hang", title, step, report, expl, evidence, sugg,
                 rank=(missing[0] if missing else None), collective=h.get("op"))
    f["impact_pct"] = 100.0 if step else None  # a hung job loses every step from then on
    return [f]


def _straggler_impact(s: StragglerEntry) -> float:
    """Step time saved if the rank were on time (``impact_us_per_step``); blame for older documents."""
    v = s.get("impact_us_per_step")
    return float(v if v is not None else s.get("blame_us_per_step") or 0.0)


def _root_straggler_cost(report: Report) -> float:
    """Largest root straggler impact per step; 0 when the straggler section is missing or malformed
    (its own detector reports that; the others must not fail with it)."""
    best = 0.0
    for s in report.get("stragglers") or []:
        try:
            if s.get("root", True):
                best = max(best, _straggler_impact(s))
        except (TypeError, ValueError, AttributeError):
            continue
    return best


def stragglers(report: Report) -> list[Finding]:
    """Root stragglers ranked by the step time they cost (impact), not by the others' waiting (blame).

    Blame counts a delay at every collective it makes the others wait in; a rank whose GPU keeps
    computing through DDP's bucketed all-reduces is late to each bucket by the same accumulated
    delay, so its blame is several times what the step would gain. The finding's impact is the
    straggler entry's ``impact_us_per_step`` (each delay counted once).
    """
    out: list[Finding] = []
    step = median_step_us(report)
    cands = [s for s in report.get("stragglers") or [] if s.get("root", True) and _straggler_impact(s) > 0]
    cands.sort(key=lambda s: -_straggler_impact(s))
    for s in cands[:MAX_PER_KIND]:
        r, cause = int(s["rank"]), str(s.get("cause") or "unknown")
        impact, blame = _straggler_impact(s), float(s.get("blame_us_per_step") or 0.0)
        title = f"Rank {r} is a straggler: steps would be {ms(impact)} shorter if it were on time ({cause})"
        ev = [f"rank {r} arrived last at {s.get('arrived_last', 0)} collectives; the others waited "
              f"{ms(blame)} per step in them in total (blame)"]
        if s.get("evidence"):
            ev.append(str(s["evidence"]))
        sugg = {
            "gpu": [f"Compare rank {r}'s kernel times with a healthy rank (traceread diff on the two traces); "
                    "check its GPU clocks/temperature (nvidia-smi -q -d CLOCK,PERFORMANCE) for throttling.",
                    "If its work is genuinely larger (uneven sequence lengths, MoE routing), balance the input."],
            "host": [f"Rank {r}'s CPU launched late: check data-loader workers, CPU affinity/NUMA binding and other "
                     "processes on its host.",
                     "Move logging/checkpoint work off the critical path or to all ranks evenly."],
        }.get(cause, [f"Profile rank {r} against a healthy rank (traceread diff) to see which side is slow."])
        out.append(_finding("straggler", title, impact, report, explain.straggler(r, impact, cause, step, blame),
                            ev, sugg, rank=r, blame_us_per_step=blame))
    return out


def exposed_comm(report: Report) -> list[Finding]:
    ranks = report.get("ranks") or []
    vals = [(r, v) for r in ranks if (v := per_step(r, "exposed_comm_us")) is not None]
    if not vals:
        return []
    impact = med(v for _, v in vals) or 0.0
    # The others' exposed communication includes waiting for a straggler; that time is the straggler
    # finding's (counted once there), so it is taken out here, down to the least-exposed rank's value.
    late = _root_straggler_cost(report)
    waited = min(late, max(0.0, impact - min(v for _, v in vals)))
    impact -= waited
    worst, worst_v = worst_rank(report, "exposed_comm_us")
    assert worst is not None  # some rank has a value (above)
    top = _top_collective(report)
    where = f"; most of it in {_coll_label(top)}" if top else ""
    title = (f"Exposed communication: {ms(impact)} per step with no compute to hide it "
             f"(worst: rank {worst['rank']}, {ms(worst_v)}){where}")
    step = median_step_us(report)
    ev = [f"rank {r['rank']}: {ms(v)} exposed of {ms(per_step(r, 'comm_us'))} communication per step, "
          f"overlap {pct(r.get('comm_overlap_pct'), 0)}" for r, v in sorted(vals, key=lambda rv: -rv[1])[:4]]
    if waited > 0:
        ev.insert(0, f"{ms(waited)} per step of the median rank's exposed communication is waiting for the "
                     "straggler (see that finding) and is not counted here")
    if top:
        ev.append(f"{_coll_label(top)}: {top.get('count')} calls, median {ms(top.get('latency_us'), 2)}, "
                  f"wait {ms(top.get('wait_us'), 2)}, bus bandwidth "
                  + (f"{top['busbw_gbps']:.1f} GB/s" if top.get("busbw_gbps") else "n/a"))
    expl = explain.exposed_comm(impact, step, med(r.get("comm_overlap_pct") for r, _ in vals))
    if top:
        expl += " " + explain.ring_allreduce(top)
    sugg = ["Let communication start earlier: with DDP lower bucket_cap_mb so buckets fire during backward; with "
            "FSDP enable backward_prefetch=BACKWARD_PRE and forward_prefetch.",
            "Send fewer bytes: bf16 gradient reduction, gradient accumulation with no_sync() between optimizer steps.",
            "Keep bandwidth-heavy groups on NVLink (see the collectives table for busbw vs link peak)."]
    return [_finding("exposed_comm", title, impact, report, expl, ev, sugg, rank=int(worst["rank"]),
                     collective=(top.get("name") if top else None))]


def pipeline_bubble(report: Report) -> list[Finding]:
    p = report.get("pipeline")
    if not p or (bubble := p.get("bubble_pct")) is None:
        return []
    step = median_step_us(report) or 0.0
    impact = float(bubble) / 100.0 * step
    title = (f"Pipeline bubble: {pct(p['bubble_pct'])} of each step idle ({ms(impact)}), "
             f"P={p.get('stages')} stages, M={p.get('microbatches')} micro-batches, {p.get('schedule')}")
    per = p.get("per_stage") or []
    ev = [f"stage {s.get('stage')} (rank {s.get('rank')}): bubble {pct(s.get('bubble_pct'))}, "
          f"p2p wait {ms(s.get('p2p_wait_us'))}" for s in per[:8]]
    ev.insert(0, f"theory for this P and M: {pct(p.get('theory_bubble_pct'))}")
    sugg = [f"Raise the number of micro-batches (M={p.get('microbatches')}) to several times the stage count.",
            "Use an interleaved (virtual-stage) schedule to divide the fill/drain time."]
    if p.get("unbalanced"):
        sugg.insert(0, "Stages are unbalanced: move layers from the slowest stage to the fastest.")
    return [_finding("pipeline_bubble", title, impact, report, explain.pipeline(p, step), ev, sugg)]


def low_sm_efficiency(report: Report) -> list[Finding]:
    # Communication kernels use few blocks by design (they wait on the network): not an SM problem.
    kernels = [k for k in report.get("kernels") or []
               if k.get("sm_time_lost_us") and not is_comm_kernel_name(str(k.get("name")))]
    if not kernels:
        return []
    steps = total_steps(report)
    nr = max(1, len(report.get("ranks") or []))

    def lost(k: dict[str, Any]) -> float:
        return float(k["sm_time_lost_us"]) / max(int(k.get("ranks") or nr), 1) / steps

    impact = sum(lost(k) for k in kernels)
    worst = max(kernels, key=lost)
    title = f"Kernels too small for the GPU waste {ms(impact)} of SM time per step (worst: {worst['name']})"
    ev = [f"{k['name']}: {k.get('blocks_per_sm') if k.get('blocks_per_sm') is not None else 'n/a'} blocks/SM, "
          f"wave efficiency {pct(k.get('wave_efficiency_pct'), 0)}, {ms(lost(k))} lost per step"
          for k in sorted(kernels, key=lost, reverse=True)[:5]]
    r0 = (report.get("ranks") or [{}])[0]
    expl = explain.sm_efficiency(med(r.get("sm_efficiency_pct") for r in report.get("ranks") or []),
                                 med(r.get("achieved_occupancy_pct") for r in report.get("ranks") or []),
                                 r0.get("num_sms"))
    sugg = ["Batch small launches together: larger micro-batch, fused kernels (torch.compile), "
            "horizontal fusion of per-parameter optimizer kernels (foreach/fused=True).",
            "For GEMMs with grids that leave a partial last wave, pad dimensions to multiples of 64/128."]
    return [_finding("low_sm_efficiency", title, impact, report, expl, ev, sugg, kernel=worst["name"])]


def memory_bound(report: Report) -> list[Finding]:
    r = report.get("roofline") or {}
    ops = [o for o in r.get("ops") or [] if o.get("bound") == "memory" and o.get("time_us")]
    if not ops:
        return []
    steps = total_steps(report)
    ops.sort(key=lambda o: -float(o["time_us"]))
    hot = ops[:5]
    # Time these ops take per step on one rank: fusing them away removes most of it.
    scale = float(r.get("time_scale") or 1.0 / steps)  # op times are one rank's totals over the window
    impact = sum(float(o["time_us"]) for o in hot) * scale
    title = f"Memory-bound operators take {ms(impact)} per step (top: {hot[0]['name']})"
    ev = [f"{o['name']}: {o.get('intensity', 0):.2g} FLOP/byte, {ms(float(o['time_us']) * scale)} per step, "
          f"{pct(o.get('roofline_pct'), 0)} of the memory roofline" for o in hot]
    sugg = ["Fuse chains of element-wise ops (torch.compile) so intermediate tensors never go to memory.",
            "Use bf16 activations where fp32 is not needed: half the bytes, half the time for these ops."]
    return [_finding("memory_bound", title, impact, report, explain.roofline(r), ev, sugg, op=hot[0]["name"])]


def host_bound(report: Report) -> list[Finding]:
    vals = []
    for r in report.get("ranks") or []:
        v = host_bound_per_step(r)
        if v is not None:
            vals.append((r, v))
    if not vals:
        return []
    impact = med(v for _, v in vals) or 0.0
    worst, wv = max(vals, key=lambda rv: rv[1])
    title = f"GPU idle waiting for the CPU to launch work: {ms(impact)} per step (worst: rank {worst['rank']}, {ms(wv)})"
    ev = [f"rank {r['rank']}: {ms(v)} host-bound idle, {ms(per_step(r, 'idle_us'))} idle in total per step"
          for r, v in sorted(vals, key=lambda rv: -rv[1])[:4]]
    sugg = ["Capture the step with CUDA graphs or torch.compile(mode='reduce-overhead') to remove launch overhead.",
            "Give the data loader more workers and pin_memory=True; avoid .item()/.cpu() syncs inside the step."]
    return [_finding("host_bound", title, impact, report, explain.host_bound(impact, median_step_us(report)), ev, sugg,
                     rank=int(worst["rank"]))]


def slow_steps(report: Report) -> list[Finding]:
    slow = [s for s in report.get("slow_steps") or [] if (s.get("excess_us") or 0) > 0]
    if not slow:
        return []
    steps = total_steps(report)
    impact = sum(float(s["excess_us"]) for s in slow) / steps
    causes = sorted({str(s.get("cause")) for s in slow})
    title = (f"{len(slow)} slow step(s) cost {ms(impact)} per step on average "
             f"(step {slow[0]['step']}: +{ms(slow[0]['excess_us'])}, cause {', '.join(causes)})")
    ev = [f"step {s['step']}: {ms(s.get('duration_us'))} vs median {ms(s.get('median_us'))}, cause {s.get('cause')}"
          + (f" — {s['detail']}" if s.get("detail") else "") for s in slow[:6]]
    expl = (f"Most steps take about {ms(med(s.get('median_us') for s in slow))}, but {len(slow)} of the {steps} "
            "analysed steps took much longer. Averaged over all steps that is the impact shown. Periodic slow "
            "steps usually come from checkpointing, evaluation, garbage collection or data-loader stalls.")
    sugg = ["Check what runs on that step's schedule (checkpoint, eval, logging every N steps) and make it asynchronous.",
            "If the cause is a rank, see the straggler finding; if it is the host, look at the data loader."]
    return [_finding("slow_steps", title, impact, report, expl, ev, sugg)]


def nccl_transport(report: Report) -> list[Finding]:
    n = report.get("nccl") or {}
    diags = [d for d in n.get("diagnoses") or [] if isinstance(d, dict)]
    if not diags:
        return []
    out = []
    net, lost = network_loss_us(report)
    for d in diags[:MAX_PER_KIND]:
        msg = str(d.get("message") or d.get("id") or "NCCL problem")
        ev = [str(e) for e in (d.get("evidence") or [])][:5]
        ev += [f"{_coll_label(c)}: {c.get('busbw_gbps') or 0:.1f} of {c.get('link_peak_gbps') or 0:.0f} GB/s" for c in net[:3]]
        sugg = [str(d["suggestion"])] if d.get("suggestion") else []
        out.append(_finding("nccl_" + str(d.get("id") or "diagnosis"), f"NCCL: {msg}", lost, report,
                            "The NCCL log shows how each pair of ranks is connected. " + msg, ev, sugg))
    return out


DETECTORS: list[Callable[[Report], list[Finding]]] = [
    hang, stragglers, exposed_comm, pipeline_bubble, low_sm_efficiency, memory_bound, host_bound,
    slow_steps, nccl_transport,
]


#: Ledger category and role of each legacy detector's finding (documents without a ledger).
LEGACY_CATEGORY: dict[str, tuple[str, str | None]] = {
    "hang": ("hang", None), "straggler": ("comm_wait", None), "exposed_comm": ("comm_transfer", None),
    "pipeline_bubble": ("bubble", "pp"), "low_sm_efficiency": ("compute_other", None),
    "memory_bound": ("memory_bound", None), "host_bound": ("host_bound", None), "slow_steps": ("idle_other", None),
}


def _legacy_findings(report: Report, warn: Callable[[str], None] | None) -> list[Finding]:
    """Documents without a step ledger (CPU-only traces, older documents): the detectors' estimates,
    each capped so that together they never exceed the step (biggest first)."""
    found: list[Finding] = []
    for det in DETECTORS:
        try:
            found.extend(det(report))
        except Exception as exc:  # a detector bug must not cost the user the whole report
            if warn:
                warn(f"finding '{det.__name__}' skipped: {type(exc).__name__}: {exc}")
    found.sort(key=lambda f: (f["id"] != "hang", -f["impact_us_per_step"]))
    left = median_step_us(report)
    for f in found:
        cat, role = LEGACY_CATEGORY.get(f["id"], ("comm_transfer", None))
        f.setdefault("category", cat)
        f.setdefault("role", role)
        f.setdefault("rank", None)
        if f["id"] == "hang" or left is None:
            continue
        if f["impact_us_per_step"] > left:
            f["impact_us_per_step"] = max(left, 0.0)
            f["impact_pct"] = pct_of_step(f["impact_us_per_step"], report)
        left -= f["impact_us_per_step"]
    return found


def build_findings(report: Report, warn: Callable[[str], None] | None = None) -> list[Finding]:
    """All findings, biggest share of the step first (a hang always first). From the job's step ledger
    when the document has one (:mod:`traceread.build.findings.ledger`), else from the detectors."""
    from traceread.build.findings.ledger import ledger_findings

    found: list[Finding] = []
    if report.get("ledger"):
        try:
            found = hang(report) + ledger_findings(report)
        except Exception as exc:
            if warn:
                warn(f"ledger findings skipped: {type(exc).__name__}: {exc}")
            found = _legacy_findings(report, warn)
    else:
        found = _legacy_findings(report, warn)
    keep = [f for f in found if f["id"] in ("hang", "slow_steps") or f["id"].startswith("nccl_")
            or (f.get("impact_pct") or 0.0) >= MIN_IMPACT_PCT
            or (f.get("impact_pct") is None and f["impact_us_per_step"] > 0)]
    keep.sort(key=lambda f: (f["id"] != "hang", -f["impact_us_per_step"]))
    return keep
