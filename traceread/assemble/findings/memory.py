"""Memory findings (docs/memory.md): an out-of-memory error (its snapshot), near out of memory, a leak,
ranks out of balance, fragmentation,
and with ``--params`` the guide's model beside the measurement (which part dominates, what shrinks it).

Memory costs no step time, so these findings carry ``impact_us_per_step`` 0 and ``impact_pct`` null,
``category`` "memory", and the bytes at stake in ``memory_bytes``; they come after the time findings.
Called once from :func:`traceread.assemble.findings.assemble.build_findings`; reads ``report["memory"]``.
"""

from __future__ import annotations

from typing import Any

from traceread.fmt import ms, nbytes, pct
from traceread.report_schema import Finding, Report

#: A rank whose peak leaves less than this share of the device free is near out of memory.
NEAR_OOM_HEADROOM_PCT = 10.0
#: The highest rank's peak this far above the median rank's (share of the highest) is an imbalance.
IMBALANCE_PCT = 10.0
#: Cached but unused bytes at the peak worth acting on: this share of reserved, and at least this much.
FRAGMENTATION_PCT = 25.0
FRAGMENTATION_MIN_BYTES = 1 << 30


def _f(id_: str, title: str, explanation: str, evidence: list[str], suggestions: list[str], rank: int | None,
       memory_bytes: float | None) -> Finding:
    return {"id": id_, "title": title, "impact_us_per_step": 0.0, "impact_us_total": 0.0, "impact_pct": 0.0,
            "explanation": explanation, "category": "memory", "role": None, "rank": rank, "evidence": evidence,
            "suggestions": suggestions, "memory_bytes": memory_bytes}


def _where(r: dict[str, Any]) -> str:
    bits = [f"step {r['peak_step']} +{ms(r.get('peak_offset_us'))}" if r.get("peak_step") is not None else None,
            f"in {r['peak_phase']}" if r.get("peak_phase") else None,
            f"during {r['peak_operator']}" if r.get("peak_operator") else None]
    return " ".join(b for b in bits if b)


def _shrink(m: dict[str, Any]) -> list[str]:
    """What would shrink the peak, with the bytes each saves (the model's what-ifs, else generic advice)."""
    model = m.get("model")
    if model:
        return [f"{w['change']}: saves {nbytes(w['saving_bytes'])} per GPU" + (f" ({w['note']})" if w.get("note") else "")
                if w.get("saving_bytes") is not None else f"{w['change']}: {w.get('note')}"
                for w in model.get("what_if") or []]
    return ["Pass --params (and --zero-stage) to see how much is weights, gradients and optimizer state and what "
            "ZeRO/FSDP, recomputation or a smaller micro-batch would save.",
            "Activation checkpointing (torch.utils.checkpoint) trades recomputation for the activations' memory."]


def oom(m: dict[str, Any]) -> list[Finding]:
    """A snapshot taken after an out-of-memory error: what held the memory then."""
    out: list[Finding] = []
    for snap in [s for s in m.get("snapshots") or [] if s.get("oom")][:3]:
        devs = [d for d in snap.get("devices") or [] if d.get("top_frames")]
        if not devs:
            continue
        d = max(devs, key=lambda x: x["peak_allocated_bytes"])
        who = f"Rank {snap['rank']}" if snap.get("rank") is not None else "A rank"
        named = [f for f in d["top_frames"] if not f["frame"].startswith("(")]  # blocks with a stack first
        top = named[0] if named else d["top_frames"][0]
        ask = f"; the failed request asked for {nbytes(d['oom_request_bytes'])}" if d.get("oom_request_bytes") else ""
        title = (f"{who} ran out of memory: {nbytes(d['peak_allocated_bytes'])} allocated at the peak{ask}; the largest "
                 f"share with a stack came from {top['frame']} ({nbytes(top['bytes'])})")
        ev = [f"{f['frame']}: {nbytes(f['bytes'])} in {f['blocks']} block(s)" + (f" ({f['module']})" if f.get("module") else "")
              for f in d["top_frames"][:6]]
        ev.append(f"snapshot {snap['file']}")
        expl = ("The snapshot taken at the out-of-memory error lists every live block with the Python stack that "
                "allocated it; the groups below are summed by the innermost frame of your code.")
        out.append(_f("memory_oom", title, expl, ev, _shrink(m), snap.get("rank"), float(d["peak_allocated_bytes"])))
    return out


def near_oom(m: dict[str, Any]) -> list[Finding]:
    close = [r for r in m.get("ranks") or [] if r.get("headroom_pct") is not None
             and r["headroom_pct"] < NEAR_OOM_HEADROOM_PCT]
    if not close:
        return []
    r = min(close, key=lambda x: (x["headroom_pct"], x["rank"]))
    used = r["peak_reserved_bytes"] if r.get("peak_reserved_bytes") is not None else r["peak_allocated_bytes"]
    title = (f"Rank {r['rank']} is close to out of memory: {nbytes(used)} of {nbytes(r['capacity_bytes'])} on "
             f"{r['device']} at its peak ({pct(100.0 - r['headroom_pct'], 0)} used), {_where(r)}")
    ev = [f"rank {x['rank']}: headroom {nbytes(x['headroom_bytes'])} ({pct(x['headroom_pct'], 0)})"
          for x in sorted(close, key=lambda x: x["headroom_pct"])[:6]]
    expl = ("The caching allocator holds nearly all of the device at this rank's peak. A longer sequence, a larger "
            "batch or a little fragmentation is enough for an out-of-memory error; the CUDA context and NCCL also "
            "need a few hundred MB outside what the allocator reports.")
    return [_f("memory_near_oom", title, expl, ev, _shrink(m), r["rank"], float(r["headroom_bytes"]))]


def leak(m: dict[str, Any]) -> list[Finding]:
    rows = [r for r in m.get("ranks") or [] if r.get("leak")]
    if not rows:
        return []
    r = max(rows, key=lambda x: (x["growth_per_step_bytes"], -x["rank"]))
    g = float(r["growth_per_step_bytes"])
    steps_left = (f"; at this rate the device is full in about {int(r['headroom_bytes'] // g)} more steps"
                  if r.get("headroom_bytes") is not None and g > 0 else "")
    title = f"Memory grows {nbytes(g)} every step on rank {r['rank']} (a leak){steps_left}"
    levels = ", ".join(f"step {s['step']}: {nbytes(s['start_allocated_bytes'])}" for s in r.get("steps") or [])
    ev = [f"allocated at the start of each step on rank {r['rank']}: {levels}"]
    ev += [f"rank {x['rank']}: +{nbytes(x['growth_per_step_bytes'])}/step" for x in rows[:6] if x is not r]
    expl = ("Memory allocated at the same point of each step rises step after step: something keeps a tensor of every "
            "step alive. The usual causes: accumulating a loss or output that still holds its graph "
            "(losses.append(loss) instead of loss.item() or loss.detach()), caches keyed by step, or hooks that store "
            "tensors.")
    sugg = ["Keep Python numbers, not tensors, across steps (loss.item(), or .detach().cpu()).",
            "Record a memory snapshot (traceread collect --memory-snapshot) and look at the frames of the blocks "
            "allocated once per step and never freed."]
    return [_f("memory_leak", title, expl, ev, sugg, r["rank"], g)]


def imbalance(m: dict[str, Any]) -> list[Finding]:
    rows = m.get("ranks") or []
    if len(rows) < 2 or m.get("imbalance_pct") is None or m["imbalance_pct"] < IMBALANCE_PCT:
        return []
    top = next(r for r in rows if r["rank"] == m["peak_rank"])
    title = (f"Rank {top['rank']} peaks {nbytes(m['imbalance_bytes'])} above the median rank "
             f"({nbytes(top['peak_allocated_bytes'])} vs {nbytes(m['median_peak_allocated_bytes'])}): every rank's "
             "batch must fit it")
    ev = [f"rank {r['rank']}: peak {nbytes(r['peak_allocated_bytes'])}, {_where(r)}"
          for r in sorted(rows, key=lambda x: -x["peak_allocated_bytes"])[:6]]
    expl = ("Ranks of one job run the same batch size, so the one that needs the most memory sets the limit for all; "
            "the others leave the difference unused. Uneven inputs (sequence lengths, MoE routing), an uneven "
            "pipeline split or a rank that does extra work (logging, evaluation on rank 0) are the usual causes.")
    sugg = ["Balance the work: pack sequences to equal token counts, balance experts, move layers off the heavy "
            "pipeline stage, keep rank-0-only work off the training step.",
            "Then raise the micro-batch to use the headroom the other ranks have."]
    return [_f("memory_imbalance", title, expl, ev, sugg, top["rank"], float(m["imbalance_bytes"]))]


def fragmentation(m: dict[str, Any]) -> list[Finding]:
    rows = [r for r in m.get("ranks") or [] if r.get("fragmentation_pct") is not None
            and r["fragmentation_pct"] >= FRAGMENTATION_PCT and r["fragmentation_bytes"] >= FRAGMENTATION_MIN_BYTES]
    if not rows:
        return []
    r = max(rows, key=lambda x: (x["fragmentation_bytes"], -x["rank"]))
    title = (f"Rank {r['rank']} holds {nbytes(r['fragmentation_bytes'])} reserved but unused at its peak "
             f"({pct(r['fragmentation_pct'], 0)} of reserved): fragmentation")
    ev = [f"rank {x['rank']}: {nbytes(x['reserved_at_peak_bytes'])} reserved, {nbytes(x['peak_allocated_bytes'])} "
          f"allocated at the peak" for x in rows[:6]]
    expl = ("The caching allocator keeps freed blocks to reuse them; when the sizes change from one allocation to the "
            "next, cached blocks are too small or split, and it asks the device for more. That memory is unavailable "
            "to this process and counts towards an out-of-memory error.")
    sugg = ["Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segments grow instead of new ones being added).",
            "Keep tensor shapes steady between steps (pad to a few bucketed sequence lengths)."]
    return [_f("memory_fragmentation", title, expl, ev, sugg, r["rank"], float(r["fragmentation_bytes"]))]


def model(m: dict[str, Any]) -> list[Finding]:
    mod = m.get("model")
    if not mod:
        return []
    est = mod["estimate"]
    parts = mod["parts"]
    names = {"weights": "weights", "gradients": "gradients", "optimizer_state": "optimizer state",
             "activations_and_buffers": "activations and buffers"}
    dom = mod["dominant"]
    peak = float(mod["measured_peak_allocated_bytes"])
    title = (f"Memory at the peak (rank {mod['rank']}, {nbytes(peak)}): the largest part is {names[dom]}, "
             f"{nbytes(parts[dom])}; weights, gradients and optimizer state make {nbytes(est['total_bytes'])} "
             f"(ZeRO-{est['zero_stage']})")
    ev = [f"{names[k]}: {nbytes(v)}" for k, v in parts.items()]
    ev.append(f"model: {est['params_total']:.4g} parameters, {est['params_per_gpu']:.4g} per GPU, {est['dtype']}, "
              f"{est['optimizer']}{' + fp32 master weights' if est['master_weights'] else ''}, ZeRO stage "
              f"{est['zero_stage']} ({mod['zero_stage_source']}) over {est['shard_degree']} ranks")
    if mod["activations_and_buffers_bytes"] < 0:
        ev.append(f"the model's training state exceeds the measured peak by {nbytes(-mod['activations_and_buffers_bytes'])}:"
                  " check --params, --zero-stage, --param-dtype and --optimizer")
    if not mod.get("baseline_known"):
        ev.append("this trace counts allocations from the window start only: the training state allocated before it "
                  "is not in the measured peak")
    expl = ("Training keeps, per parameter, its weight and gradient in the training dtype and the optimizer's state "
            "(Adam: two fp32 moments, 8 bytes); ZeRO stage 1 shards the optimizer state over the data-parallel ranks, "
            "stage 2 the gradients too, stage 3 (FSDP) the weights too. What the peak holds beyond that is "
            "activations saved for backward and temporary buffers.")
    return [_f("memory_model", title, expl, ev, _shrink(m), mod["rank"], peak)]


def memory_findings(report: Report) -> list[Finding]:
    """Every memory finding of the document, most urgent first (empty without ``report["memory"]``)."""
    m: dict[str, Any] | None = report.get("memory")  # type: ignore[assignment]
    if not m:
        return []
    out: list[Finding] = []
    for detector in (oom, near_oom, leak, imbalance, model, fragmentation):
        out.extend(detector(m))
    return out
