"""Findings as shares of the job's step ledger: each µs of the step is in at most one finding.

The job ledger (``report["ledger"]``, :mod:`traceread.analysis.ledger.job`) partitions the
critical rank's median step into parts ``{category, role, rank, us}``. Findings are built from it:

* **straggler** — the parts attributed to a rank other than the critical one, except its
  communication: the critical path ran through that rank's own work (compute, host, idle) while the
  others waited for it in a collective (category ``comm_wait``, the role of the collective waited
  in, rank = the late rank). A late rank's communication (e.g. its slow cross-node TP transfer)
  belongs to the finding of that communication's role. Its what-if
  (``predicted_saving_us``, the straggler analysis' step time saved) is shown beside it, capped by
  the share.
* **straggler** when the late rank is the critical rank itself (its own slow work sets the step, the
  others wait for it): the straggler analysis' step time saved, claimed out of its compute (category
  of the compute it claims first, the role the others wait in).
* one finding per recoverable (category, role), over the critical rank and (communication only)
  the late ranks the critical path followed, rank = the rank holding most of it: ``bubble`` (pp),
  ``comm_transfer`` and ``comm_wait`` per role, ``host_bound``, ``memory_bound``,
  ``exposed_memcpy``, ``dependency``. Useful compute (``compute_bound``, ``compute_other``) and the
  step's tail (``idle_other``) are not findings, except that kernels too small for the GPU claim
  their SM time lost out of ``compute_other``.
* layout causes (a tensor-parallel group spanning nodes, :mod:`traceread.build.findings.layout`)
  claim the share they explain (tp ``comm_transfer``) before the generic finding sees it.
* NCCL transport problems claim their estimated loss out of the ``comm_transfer`` shares (so the
  exposed-communication finding keeps only the rest).
* slow steps are not part of the median step: they are reported with impact 0 (their cost averaged
  over all steps is in the title).

``impact_us_per_step`` is the share; the findings therefore never add up to more than the step, and
``coverage = {explained_us, step_us}`` says how much of it they explain.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, cast

from traceread.build import explain
from traceread.build.queries import med, total_steps
from traceread.fmt import ms
from traceread.report_schema import Coverage, Finding, Ledger, Report, StragglerEntry

#: Ledger categories that are time to recover (a finding each), with the finding id.
RECOVERABLE: dict[str, str] = {
    "bubble": "pipeline_bubble", "comm_transfer": "exposed_comm", "comm_wait": "comm_wait",
    "host_bound": "host_bound", "memory_bound": "memory_bound", "exposed_memcpy": "exposed_memcpy",
    "dependency": "dependency_wait",
}

#: Communication categories: on a late peer they are communication (the role's finding), not the
#: peer's own slowness (the straggler finding).
COMM_CATEGORIES = frozenset({"comm_transfer", "comm_wait", "bubble"})


class _Budget:
    """Remaining µs of each ledger share; claims never exceed them."""

    def __init__(self, shares: dict[tuple[str, str | None, int], float]) -> None:
        self.left = dict(shares)

    def claim(self, keys: list[tuple[str, str | None, int]], want: float | None = None) -> float:
        got = 0.0
        for k in keys:
            take = self.left.get(k, 0.0) if want is None else min(self.left.get(k, 0.0), max(want - got, 0.0))
            self.left[k] = self.left.get(k, 0.0) - take
            got += take
        return got


def _finding(id_: str, title: str, impact: float, step: float, category: str, role: str | None,
             rank: int | None, explanation: str, evidence: list[str], suggestions: list[str],
             predicted: float | None = None, **extra: Any) -> Finding:
    f: dict[str, Any] = {
        "id": id_, "title": title, "impact_us_per_step": float(max(impact, 0.0)), "explanation": explanation,
        "impact_pct": (100.0 * impact / step if step else None), "evidence": evidence, "suggestions": suggestions,
        "category": category, "role": role, "rank": rank,
    }
    if predicted is not None:
        f["predicted_saving_us"] = float(min(max(predicted, 0.0), f["impact_us_per_step"]))
    f.update(extra)
    return cast(Finding, f)  # the keys above plus a kind's extras (blame_us_per_step, key, ...)


def _rank_evidence(report: Report, category: str, role: str | None, top: int = 4) -> list[str]:
    """The ranks with the most of (category, role) in their own ledger of the same step."""
    vals = []
    for r in report.get("ranks") or []:
        led = r.get("ledger") or {}
        us = sum(float(p["us"]) for p in led.get("parts") or []
                 if p["category"] == category and p.get("role") == role)
        if us > 0:
            vals.append((us, int(r["rank"])))
    vals.sort(reverse=True)
    return [f"rank {rk}: {ms(us)} of its own step {(report.get('ledger') or {}).get('step')}" for us, rk in vals[:top]]


def _straggler_findings(report: Report, led: Ledger, budget: _Budget, step: float) -> list[Finding]:
    crit = int(led["critical_rank"])
    by_peer: dict[int, list[tuple[str, str | None, int]]] = defaultdict(list)
    for p in led.get("parts") or []:
        if int(p["rank"]) != crit and p["category"] not in COMM_CATEGORIES:
            by_peer[int(p["rank"])].append((p["category"], p.get("role"), int(p["rank"])))
    roles: dict[int, str | None] = {}
    for w in led.get("waited_on") or []:
        roles.setdefault(int(w["rank"]), w.get("role"))
    entries = {int(s["rank"]): s for s in report.get("stragglers") or [] if isinstance(s.get("rank"), int)}
    out = []
    for peer, keys in by_peer.items():
        share = budget.claim(keys)
        e = entries.get(peer, {})
        cause = str(e.get("cause") or "unknown")
        role = roles.get(peer)
        what = ", ".join(f"{ms(budget_us)} {cat}" for cat, budget_us in _peer_mix(led, peer)[:3])
        title = (f"Rank {peer} is a straggler: the critical rank {crit} waited {ms(share)} per step for it in "
                 f"{role or 'a'} communication ({cause})")
        ev = [f"on the critical path rank {peer} spent that time in: {what}"]
        if e.get("evidence"):
            ev.append(str(e["evidence"]))
        predicted = e.get("impact_us_per_step")
        if predicted is not None:
            title += f"; steps would be about {ms(min(float(predicted), share))} shorter if it were on time"
        advice, _upper = explain.advice(role, "comm_wait", {"share_us": share, "rank": peer, "cause": cause})
        sugg = [advice]
        what_if = min(float(predicted), share) if predicted is not None else share
        out.append(_finding("straggler", title, share, step, "comm_wait", role, peer,
                            explain.straggler(peer, what_if, cause, step, e.get("blame_us_per_step")), ev, sugg,
                            predicted=predicted, blame_us_per_step=e.get("blame_us_per_step")))
    return out + _critical_straggler(report, led, budget, step, crit, entries)


def _wait_role(report: Report, crit: int) -> str | None:
    """The role in which the other ranks wait most (their own ledgers' comm_wait)."""
    acc: dict[str | None, float] = defaultdict(float)
    for r in report.get("ranks") or []:
        if r.get("rank") != crit:
            for p in (r.get("ledger") or {}).get("parts") or []:
                if p["category"] == "comm_wait":
                    acc[p.get("role")] += float(p["us"])
    return max(acc, key=lambda k: acc[k]) if acc else None


def _critical_straggler(report: Report, led: Ledger, budget: _Budget, step: float, crit: int,
                        entries: dict[int, StragglerEntry]) -> list[Finding]:
    """The straggler *is* the critical rank (its own slow work sets the step; the others wait for it):
    the part of its compute that makes it late — the straggler analysis' step time saved if it were
    on time — is its share, claimed from its compute (compute-bound first)."""
    e = entries.get(crit)
    if not e or not e.get("root", True) or not e.get("impact_us_per_step"):
        return []
    keys: list[tuple[str, str | None, int]] = [(c, None, crit) for c in ("compute_bound", "compute_other", "memory_bound")]
    first = max(keys, key=lambda k: budget.left.get(k, 0.0))[0]
    share = budget.claim(keys, float(e["impact_us_per_step"]))
    if share <= 0:
        return []
    cause, role = str(e.get("cause") or "unknown"), _wait_role(report, crit)
    title = (f"Rank {crit} is a straggler: the other ranks wait for it in {role or 'a'} communication; steps "
             f"would be {ms(share)} shorter if it were on time ({cause})")
    ev = [f"rank {crit} has the longest step ({ms(step)}): the critical path runs through its own work"]
    if e.get("evidence"):
        ev.append(str(e["evidence"]))
    advice, _upper = explain.advice(role, "comm_wait", {"share_us": share, "rank": crit, "cause": cause})
    return [_finding("straggler", title, share, step, first, role, crit,
                     explain.straggler(crit, share, cause, step, e.get("blame_us_per_step")), ev, [advice],
                     predicted=float(e["impact_us_per_step"]), blame_us_per_step=e.get("blame_us_per_step"))]


def _peer_mix(led: Ledger, peer: int) -> list[tuple[str, float]]:
    mix: dict[str, float] = defaultdict(float)
    for p in led.get("parts") or []:
        if int(p["rank"]) == peer and p["category"] not in COMM_CATEGORIES:  # its comm is its role's finding
            mix[p["category"]] += float(p["us"])
    return sorted(mix.items(), key=lambda kv: -kv[1])


def _layout_findings(report: Report, budget: _Budget, step: float, crit: int) -> list[Finding]:
    """Layout causes (reports.layout_findings: a TP group across nodes) claim the share they explain
    (tensor-parallel comm transfer) before the generic exposed-communication finding sees it."""
    from traceread.build.findings.layout import tp_across_nodes

    out = []
    for f in tp_across_nodes(report):
        keys = [k for k in list(budget.left) if k[0] == f["category"] and k[1] == f["role"]]
        if f.get("rank") is None:  # the rank holding most of the share
            f["rank"] = max(keys, key=lambda k: budget.left[k])[2] if keys else crit
        got = budget.claim(keys)
        if f.get("predicted_saving_us") is not None and f["impact_us_per_step"] > 0:
            # the cost model's saving is proportional to the share it was computed for
            scaled = float(f["predicted_saving_us"]) * got / float(f["impact_us_per_step"])
            f["predicted_saving_us"] = min(scaled, got)
        f["impact_us_per_step"] = got
        f["impact_pct"] = 100.0 * got / step if step else None
        out.append(f)
    return out


def _nccl_findings(report: Report, led: Ledger, budget: _Budget, step: float) -> list[Finding]:
    n = report.get("nccl") or {}
    diags = [d for d in n.get("diagnoses") or [] if isinstance(d, dict)]
    if not diags:
        return []
    from traceread.build.queries import network_loss_us

    _net, lost = network_loss_us(report)
    keys = sorted((k for k in budget.left if k[0] == "comm_transfer"), key=lambda k: -budget.left[k])
    out = []
    for d in diags[:3]:
        got = budget.claim(keys, lost)
        msg = str(d.get("message") or d.get("id") or "NCCL problem")
        ev = [str(e) for e in (d.get("evidence") or [])][:5]
        sugg = [str(d["suggestion"])] if d.get("suggestion") else []
        out.append(_finding("nccl_" + str(d.get("id") or "diagnosis"), f"NCCL: {msg}", got, step, "comm_transfer",
                            keys[0][1] if keys else None, keys[0][2] if keys else None,
                            "The NCCL log shows how each pair of ranks is connected. " + msg, ev, sugg))
    return out


def _sm_efficiency(report: Report, budget: _Budget, step: float, crit: int) -> list[Finding]:
    from traceread.analysis.kinds import is_comm_kernel_name

    kernels = [k for k in report.get("kernels") or []
               if k.get("sm_time_lost_us") and not is_comm_kernel_name(str(k.get("name")))]
    if not kernels:
        return []
    steps, nr = total_steps(report), max(1, len(report.get("ranks") or []))
    lost = sum(float(k["sm_time_lost_us"]) / max(int(k.get("ranks") or nr), 1) / steps for k in kernels)
    got = budget.claim([("compute_other", None, crit)], lost)
    worst = max(kernels, key=lambda k: float(k["sm_time_lost_us"]))
    ranks = report.get("ranks") or []
    expl = explain.sm_efficiency(med(r.get("sm_efficiency_pct") for r in ranks),
                                 med(r.get("achieved_occupancy_pct") for r in ranks), (ranks or [{}])[0].get("num_sms"))
    return [_finding("low_sm_efficiency", f"Kernels too small for the GPU waste {ms(got)} per step (worst: {worst['name']})",
                     got, step, "compute_other", None, crit, expl,
                     [f"SM time lost per step and rank, all small kernels: {ms(lost)} (the share is capped by the "
                      "compute time no roofline class covers)"],
                     ["Batch small launches together: larger micro-batch, fused kernels (torch.compile), "
                      "foreach/fused optimizers."], kernel=worst["name"])]


def _numbers(report: Report, role: str | None, share: float, step: float) -> dict[str, Any]:
    """The job's numbers the guide's cost models need (explain.advice), for a share of ``role``."""
    p = report.get("pipeline") or {}
    layout = report.get("layout")
    groups = [g for g in (layout.get("groups") if layout else None) or [] if g.get("role") == role]
    n: dict[str, Any] = {"share_us": share, "step_us": step, "stages": p.get("stages"),
                         "microbatches": p.get("microbatches"),
                         "virtual": 2 if p.get("schedule") == "interleaved" else 1}
    if groups:
        from traceread.build.findings.layout import role_numbers

        n.update(role_numbers(report, role))  # nodes, group size, GPUs per node, measured busbw, NVLink peak
    return n


def _category_finding(report: Report, category: str, role: str | None, rank: int, share: float,
                      step: float) -> Finding:
    """The finding for one recoverable (category, role) share of the critical rank."""
    fid = RECOVERABLE[category]
    ev = _rank_evidence(report, category, role)
    advice, predicted = explain.advice(role, category, _numbers(report, role, share, step))
    sugg = [advice]
    if category == "bubble":
        p = report.get("pipeline") or {}
        stages, mb = int(p.get("stages") or 0), int(p.get("microbatches") or 0)
        title = f"Pipeline bubble: {ms(share)} per step of stages waiting for their neighbours"
        if stages >= 2 and mb >= 1:
            title += f" (P={stages} stages, M={mb} micro-batches, {p.get('schedule')})"
        expl = explain.pipeline(p, step) if p else (
            "Pipeline stages sat idle waiting for the neighbouring stage's activations or gradients.")
    elif category in ("comm_transfer", "comm_wait"):
        what = "moving data" if category == "comm_transfer" else "waiting inside the collective for a peer"
        groups = f"{role.upper()} groups" if role and role != "other" else "unclassified process groups"
        title = f"Exposed communication on {groups}: {ms(share)} per step {what} with no compute to hide it (rank {rank})"
        expl = explain.exposed_comm(share, step, None)
    elif category == "host_bound":
        title = f"GPU idle waiting for the CPU to launch work: {ms(share)} per step (rank {rank})"
        expl = explain.host_bound(share, step)
    elif category == "memory_bound":
        title = f"Memory-bound operators take {ms(share)} per step (rank {rank})"
        expl = explain.roofline(report.get("roofline") or {})
        sugg = ["Fuse chains of element-wise ops (torch.compile) so intermediate tensors never go to memory.",
                "Use bf16 activations where fp32 is not needed: half the bytes, half the time for these ops."]
    elif category == "exposed_memcpy":
        title = f"Exposed memory copies: {ms(share)} per step with nothing else running (rank {rank})"
        expl = ("Host↔device copies ran while no kernel did: the GPU waited for data to arrive.")
        sugg = ["Use pin_memory=True and non_blocking=True copies on a side stream, prefetching the next batch."]
    else:  # dependency
        title = f"GPU idle with work already launched, waiting on a dependency: {ms(share)} per step (rank {rank})"
        expl = ("The next kernel had been launched but could not start: it waited for an event, another stream or "
                "a synchronisation. This is not the CPU being slow.")
        sugg = ["Look for cross-stream waits and synchronisations (cudaStreamWaitEvent, torch.cuda.synchronize) "
                "inside the step; overlap the work they wait for."]
    return _finding(fid, title, share, step, category, role, rank, expl, ev, sugg, predicted=predicted)


def _slow_steps(report: Report, step: float) -> list[Finding]:
    slow = [s for s in report.get("slow_steps") or [] if (s.get("excess_us") or 0) > 0]
    if not slow:
        return []
    steps = total_steps(report)
    avg = sum(float(s["excess_us"]) for s in slow) / steps
    cause = str(slow[0].get("cause") or "unknown")
    category = {"host": "host_bound", "exposed_comm": "comm_transfer", "compute": "compute_other"}.get(cause, "idle_other")
    title = (f"{len(slow)} slow step(s) outside the median step: +{ms(slow[0]['excess_us'])} at step {slow[0]['step']} "
             f"({ms(avg)} per step averaged over {steps}; cause {cause})")
    ev = [f"step {s['step']}: {ms(s.get('duration_us'))} vs median {ms(s.get('median_us'))}, cause {s.get('cause')}"
          + (f" — {s['detail']}" if s.get("detail") else "") for s in slow[:6]]
    expl = ("These steps are not the median step the ledger splits, so their cost is not a share of it (impact 0 "
            "here); periodic slow steps usually come from checkpointing, evaluation, garbage collection or "
            "data-loader stalls.")
    sugg = ["Check what runs on that step's schedule (checkpoint, eval, logging every N steps) and make it asynchronous."]
    return [_finding("slow_steps", title, 0.0, step, category, None, slow[0].get("rank"), expl, ev, sugg,
                     excess_us_per_step=avg)]


def ledger_findings(report: Report) -> list[Finding]:
    """Findings from the job ledger (module docstring); biggest share first, slow steps last."""
    led = report.get("ledger") or {}
    step = float(led["step_us"])
    crit = int(led["critical_rank"])
    shares: dict[tuple[str, str | None, int], float] = defaultdict(float)
    for p in led.get("parts") or []:
        shares[(p["category"], p.get("role"), int(p["rank"]))] += float(p["us"])
    budget = _Budget(shares)
    out = _straggler_findings(report, led, budget, step)
    out += _layout_findings(report, budget, step, crit)
    out += _nccl_findings(report, led, budget, step)
    out += _sm_efficiency(report, budget, step, crit)
    groups: dict[tuple[str, str | None], list[tuple[str, str | None, int]]] = defaultdict(list)
    for key in shares:
        category, role, rank = key
        if category in RECOVERABLE and (rank == crit or category in COMM_CATEGORIES):
            groups[(category, role)].append(key)
    for (category, role), keys in groups.items():
        rank = max(keys, key=lambda k: budget.left.get(k, 0.0))[2]
        left = budget.claim(keys)
        if left > 0:
            out.append(_category_finding(report, category, role, rank, left, step))
    out.sort(key=lambda f: -f["impact_us_per_step"])
    return out + _slow_steps(report, step)


def coverage(findings: list[Finding], step_us: float | None) -> Coverage | None:
    """How much of the step the findings explain (the hang finding is not a share and is left out)."""
    if not step_us:
        return None
    explained = sum(float(f["impact_us_per_step"]) for f in findings if f["id"] != "hang")
    return {"explained_us": min(explained, float(step_us)), "step_us": float(step_us)}
