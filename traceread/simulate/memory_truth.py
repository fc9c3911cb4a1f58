"""Memory truth from the simulated allocator's own events (never from ``traceread.analysis``).

Definitions (docs/memory.md), per rank, over the allocator events of the profiled steps:

* peak allocated = the largest total after an event (the first such event); peak reserved likewise;
* the peak's step = the ``ProfilerStep`` host window holding it; offset = its time − the step start;
* phase: backward = first .. last host event of the step that is a backward node (the simulator gives
  those, and only those, a ``Fwd thread id``); optimizer = the ``Optimizer.step#`` annotation;
  forward = step start .. the first of those; else other (the optimizer wins where they overlap);
* operator = the outermost ``cpu_op`` open at the event (step annotations aside), innermost likewise;
* per step: allocated at its start (before its first event) and its peak; growth = (last start −
  first start) ÷ (steps − 1); leak = start rises at every boundary, >= 3 steps, > 1 MiB in all;
* live at the peak: blocks allocated in the window and live after the peak event, summed by the
  operator of their allocation;
* training state: the blocks allocated before the window, by kind (weights, gradients, optimizer state);
* snapshot: the peak over the window start and every event; live blocks then (the training state
  included) summed by their innermost frame outside the library (``site-packages``).
"""

from __future__ import annotations

import statistics
from typing import Any

from traceread.simulate.memory import Allocator, Handle, MemEvent
from traceread.simulate.schedule import RankCtx

LEAK_MIN_BYTES = 1 << 20


def _us(ns: int | float, base_ns: int = 0) -> float:
    return round((ns + base_ns) / 1000.0, 6)


def _steps(ctx: RankCtx) -> list[tuple[int, int, int]]:
    out = [(int(ev.name.split("#")[1]), ev.ts, ev.ts + ev.dur) for ev in ctx.events
           if ev.cat == "user_annotation" and ev.name.startswith("ProfilerStep#") and ev.tid == ctx.main_tid]
    return sorted(out, key=lambda s: s[1])


def _step_of(steps: list[tuple[int, int, int]], ts: int) -> tuple[int, int, int] | None:
    return next((s for s in steps if s[1] <= ts < s[2]), None)


def _phase(ctx: RankCtx, step: tuple[int, int, int], ts: int) -> str:
    _, lo, hi = step
    inside = [e for e in ctx.events if lo <= e.ts < hi]
    bwd = [e for e in inside if e.args.get("Fwd thread id")]
    opt = [e for e in inside if e.name.startswith("Optimizer.step#")]
    spans: dict[str, tuple[int, int]] = {}
    cut = hi
    if bwd:
        spans["backward"] = (min(e.ts for e in bwd), min(max(e.ts + e.dur for e in bwd), hi))
        cut = spans["backward"][0]
    if opt:
        spans["optimizer"] = (min(e.ts for e in opt), min(max(e.ts + e.dur for e in opt), hi))
        cut = min(cut, spans["optimizer"][0])
    spans["forward"] = (lo, cut)
    for name in ("optimizer", "backward", "forward"):
        if name in spans and spans[name][0] <= ts < spans[name][1]:
            return name
    return "other"


def _operators(stack: tuple[tuple[str, str], ...]) -> tuple[str | None, str | None]:
    """(outermost cpu_op, innermost cpu_op) of a stack; the innermost annotation when no cpu_op is open."""
    named = [(c, n) for c, n in stack if c in ("cpu_op", "user_annotation") and not n.startswith("ProfilerStep#")]
    ops = [n for c, n in named if c == "cpu_op"]
    if ops:
        return ops[0], ops[-1]
    return (named[-1][1] if named else None), None


def _user_frame(h: Handle) -> str:
    for f in h.frames:
        if "site-packages" not in f["filename"]:
            return f"{f['filename']}:{f['line']} {f['name']}"
    f = h.frames[0]
    return f"{f['filename']}:{f['line']} {f['name']}"


def _live_after(alloc: Allocator, k: int) -> dict[int, Handle]:
    """Blocks live after event ``k`` (k = -1: at the window start)."""
    live = {h.addr: h for h in alloc.persistent}
    for ev in alloc.events[:k + 1]:
        if ev.nbytes > 0:
            live[ev.addr] = ev.handle
        else:
            live.pop(ev.addr, None)
    return live  # type: ignore[return-value]


def rank_memory_truth(ctx: RankCtx, base_ns: int) -> dict[str, Any]:
    alloc = ctx.mem
    assert alloc is not None
    evs: list[MemEvent] = alloc.events
    steps = _steps(ctx)
    i = max(range(len(evs)), key=lambda j: (evs[j].allocated, -j))
    pk = evs[i]
    st = _step_of(steps, pk.ts)
    outer, inner = _operators(pk.stack)
    per_step = []
    for num, lo, hi in steps:
        idx = [j for j, e in enumerate(evs) if lo <= e.ts < hi]
        if not idx:
            continue
        top = max(idx, key=lambda j: (evs[j].allocated, -j))
        first = evs[idx[0]]
        per_step.append({"step": num, "events": len(idx), "start_allocated_bytes": first.allocated - first.nbytes,
                         "peak_allocated_bytes": evs[top].allocated, "peak_offset_us": _us(evs[top].ts - lo),
                         "peak_reserved_bytes": max(evs[j].reserved for j in idx)})
    levels = [s["start_allocated_bytes"] for s in per_step]
    growth = (levels[-1] - levels[0]) / (len(levels) - 1) if len(levels) >= 2 else None
    leak = (len(levels) >= 3 and all(b > a for a, b in zip(levels, levels[1:]))
            and levels[-1] - levels[0] > LEAK_MIN_BYTES)
    live: dict[str, list[int]] = {}
    for h in _live_after(alloc, i).values():
        if h.alloc_event is None:
            continue  # allocated before the window
        op = _operators(h.alloc_event.stack)[0] or "(no operator recorded)"
        live.setdefault(op, [0, 0])
        live[op][0] += h.nbytes
        live[op][1] += 1
    state: dict[str, int] = {}
    for h in alloc.persistent:
        state[h.tag] = state.get(h.tag, 0) + h.nbytes
    tl = []
    if st is not None:
        tl = [[_us(e.ts - st[1]), e.allocated, e.reserved] for e in evs if st[1] <= e.ts < st[2]]
    return {
        "events": len(evs), "window_start_allocated_bytes": alloc.start_allocated,
        "window_start_reserved_bytes": alloc.start_reserved,
        "peak_allocated_bytes": pk.allocated, "peak_us": _us(pk.ts, base_ns),
        "peak_step": st[0] if st else None, "peak_offset_us": _us(pk.ts - st[1]) if st else None,
        "peak_phase": _phase(ctx, st, pk.ts) if st else None, "peak_operator": outer, "peak_op_innermost": inner,
        "peak_thread": pk.tid, "reserved_at_peak_bytes": pk.reserved, "fragmentation_bytes": pk.reserved - pk.allocated,
        "peak_reserved_bytes": max(e.reserved for e in evs),
        "floor_allocated_bytes": min([alloc.start_allocated] + [e.allocated for e in evs]),
        "steps": per_step, "growth_per_step_bytes": growth, "leak": leak,
        "live_at_peak": {op: {"bytes": b, "allocations": n} for op, (b, n) in live.items()},
        "live_before_window_bytes": alloc.start_allocated,
        "training_state": state, "training_state_bytes": sum(state.values()),
        "timeline": tl, "snapshot": _snapshot_truth(alloc),
    }


def _snapshot_truth(alloc: Allocator) -> dict[str, Any]:
    totals = [alloc.start_allocated] + [e.allocated for e in alloc.events]
    k = max(range(len(totals)), key=lambda j: (totals[j], -j)) - 1  # -1: the window start
    groups: dict[str, list[int]] = {}
    for h in _live_after(alloc, k).values():
        g = groups.setdefault(_user_frame(h), [0, 0])
        g[0] += h.nbytes
        g[1] += 1
    return {"device": alloc.device_id, "peak_allocated_bytes": totals[k + 1],
            "allocated_at_snapshot_bytes": alloc.allocated,
            "frames": {f: {"bytes": b, "blocks": n} for f, (b, n) in groups.items()}}


def memory_truth(ranks: list[RankCtx], base_ns: int) -> dict[str, Any] | None:
    """Per rank and the job's comparison (highest peak, lowest rank on a tie; median; imbalance)."""
    if not ranks or ranks[0].mem is None:
        return None
    per = {str(c.rank): rank_memory_truth(c, base_ns) for c in ranks}
    peaks = {int(r): t["peak_allocated_bytes"] for r, t in per.items()}
    top = max(peaks, key=lambda r: (peaks[r], -r))
    med = float(statistics.median(peaks.values()))
    return {"ranks": per, "peak_rank": top, "peak_allocated_bytes": peaks[top], "median_peak_allocated_bytes": med,
            "imbalance_bytes": peaks[top] - med, "leak_ranks": sorted(int(r) for r, t in per.items() if t["leak"])}
