"""Ground truth computed from the simulator's own schedule (never from ``traceread.analysis``).

All arithmetic runs on integer nanoseconds of the TRUE clock with a small independent interval
sweep, then is reported in µs on the trace clock of an unskewed rank (``ts`` in the files minus
``clock_offsets_us[rank]``). Definitions (per rank):

* window = first GPU event start .. last GPU event end (kernels and memcpys, all streams);
* COMP = kernels that are not communication; COMM = communication kernels (NCCL, or the non-NCCL
  all-reduce of ``custom_allreduce``); MEMCPY = memcpys (``|X|`` = union length);
* compute = |COMP|; comm = |COMM|; exposed_comm = |COMM − COMP|; memcpy = |MEMCPY|;
  exposed_memcpy = |MEMCPY − COMP − COMM|; gpu_busy = |COMP ∪ COMM ∪ MEMCPY|;
  idle = window − gpu_busy, so compute + exposed_comm + exposed_memcpy + idle == window exactly;
* comm_overlap_pct = 100·|COMM ∩ COMP| / |COMM|;
* sm_efficiency_pct (TensorBoard-plugin definition): at every instant, the sum of ``blocks per SM``
  of the kernels running, clipped to 1; time-integrated over the window and divided by its length;
* achieved_occupancy_pct: mean of ``est. achieved occupancy %`` over kernels, weighted by duration;
* steps: ``ProfilerStep#N`` windows (the host step; each step ends with a stream sync, so it also
  covers all GPU work launched in it); per-step numbers are the same unions clipped to the step;
* model_flops_per_step = model FLOPs of the matrix-unit ops (mm, addmm, flash attention fwd/bwd)
  the rank launched, divided by the number of steps; mfu_pct = 100·model_flops_per_step /
  (mean step duration · dense bf16 peak of the device). hardware_flops_per_step / hfu_pct: the same
  with hardware FLOPs, which add the flash backward's recompute of QKᵀ (None when nothing is
  recomputed). Per-op formulas: :mod:`traceread.simulate.layers` (traceread's FLOP conventions,
  computed by the simulator from its own shapes).

Collectives: arrival of a rank = start of its NCCL kernel; every member ends at
``max(arrivals) + transfer``; wait = max(arrivals) − arrival. Straggler blame: for every instance a
rank joined last, its arrival minus the next-latest arrival; summed per step, averaged over steps.
Straggler cost (what-if): mean job step time minus that of the same simulation without the
stragglers (job step time = a step's duration averaged over ranks: ``step_cost_us``; its longest
rank's, as the window ledger counts steps: ``window_cost_us``).
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from typing import Any

from traceread.simulate.layers import LeafOp
from traceread.simulate.ledger_truth import layout_truth, ledger_truth, node_of, window_truth
from traceread.simulate.memory_truth import memory_truth
from traceread.simulate.scenarios import Built
from traceread.simulate.schedule import GpuOp, RankCtx

Interval = tuple[int, int]


# ---- a tiny independent interval toolkit (integers) ---------------------------------------------------


def union_len(intervals: list[Interval]) -> int:
    """Length of the union of [start, end) intervals."""
    merged: list[list[int]] = []
    for s, e in sorted(i for i in intervals if i[1] > i[0]):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return sum(e - s for s, e in merged)


def clip(intervals: list[Interval], lo: int, hi: int) -> list[Interval]:
    return [(max(s, lo), min(e, hi)) for s, e in intervals if min(e, hi) > max(s, lo)]


def breakdown(comp: list[Interval], comm: list[Interval], mem: list[Interval], window: int) -> dict[str, int]:
    """Exact integer breakdown of one window (|A − B| = |A ∪ B| − |B|)."""
    c = union_len(comp)
    m = union_len(comm)
    cm = union_len(comp + comm)
    allu = union_len(comp + comm + mem)
    return {
        "window": window,
        "compute": c,
        "comm": m,
        "exposed_comm": cm - c,
        "memcpy": union_len(mem),
        "exposed_memcpy": allu - cm,
        "busy": allu,
        "idle": window - allu,
        "overlap": c + m - cm,
    }


def sm_efficiency(kernels: list[tuple[int, int, float]], lo: int, hi: int) -> float:
    """TB-plugin SM efficiency over [lo, hi): sweep of Σ blocks/SM clipped to 1, time-weighted."""
    if hi <= lo:
        return 0.0
    points: dict[int, float] = defaultdict(float)
    for s, e, v in kernels:
        s, e = max(s, lo), min(e, hi)
        if e > s and v > 0:
            points[s] += v
            points[e] -= v
    acc = 0.0
    level = 0.0
    prev = None
    for t in sorted(points):
        if prev is not None and level > 0:
            acc += min(level, 1.0) * (t - prev)
        level += points[t]
        prev = t
    return 100.0 * acc / (hi - lo)


def _us(ns: int | float, base_ns: int = 0) -> float:
    return round((ns + base_ns) / 1000.0, 6)


def _pct(a: float, b: float) -> float:
    return 100.0 * a / b if b else 0.0


#: The parts of a window that truth.json reports for a rank and for each of its steps, in µs.
_WINDOW_PARTS = ("compute", "comm", "exposed_comm", "memcpy", "exposed_memcpy", "idle")


def _breakdown_us(b: dict[str, int]) -> dict[str, float]:
    """``compute_us`` ... ``idle_us`` of one :func:`breakdown`, the same keys for rank and step."""
    return {f"{k}_us": _us(b[k]) for k in _WINDOW_PARTS}


# ---- truth ------------------------------------------------------------------------------------------


def step_windows(ctx: RankCtx) -> dict[int, Interval]:
    """``ProfilerStep#N`` windows, or the engine iterations a serving program marked as its steps."""
    out: dict[int, Interval] = {}
    for ev in ctx.events:
        if ev.cat == "user_annotation" and ev.name.startswith("ProfilerStep#") and ev.tid == ctx.main_tid:
            out[int(ev.name.split("#")[1])] = (ev.ts, ev.ts + ev.dur)
    for ev, it in ctx.iteration_events:
        out[it] = (ev.ts, ev.ts + ev.dur)
    return out


def _classes(ops: list[GpuOp]) -> tuple[list[Interval], list[Interval], list[Interval]]:
    comp = [(o.placed_start, o.placed_end) for o in ops if o.cls == "comp"]
    comm = [(o.placed_start, o.placed_end) for o in ops if o.cls == "comm"]
    mem = [(o.placed_start, o.placed_end) for o in ops if o.cls == "memcpy"]
    return comp, comm, mem


def rank_truth(ctx: RankCtx, built: Built, base_ns: int) -> dict[str, Any]:
    ops = ctx.gpu
    comp, comm, mem = _classes(ops)
    lo = min(o.placed_start for o in ops)
    hi = max(o.placed_end for o in ops)
    b = breakdown(comp, comm, mem, hi - lo)
    kern = [(o.placed_start, o.placed_end, o.stats.blocks_per_sm) for o in ops if o.kind == "kernel" and o.stats]
    occ_num = sum((o.placed_end - o.placed_start) * o.stats.occupancy_pct for o in ops if o.kind == "kernel" and o.stats)
    occ_den = sum((o.placed_end - o.placed_start) for o in ops if o.kind == "kernel" and o.stats)
    steps: list[dict[str, Any]] = []
    windows = step_windows(ctx)
    peak = built.sim.dev.peak_flops
    matmul = [r for r in ctx.ops if isinstance(r, LeafOp) and r.matmul]
    for step in built.knobs.step_numbers():
        s, e = windows[step]
        sb = breakdown(clip(comp, s, e), clip(comm, s, e), clip(mem, s, e), e - s)
        model_step = sum(r.model_flops for r in matmul if r.step == step)
        hw_step = sum(r.flops for r in matmul if r.step == step)
        steps.append({
            "step": step,
            "start_us": _us(s, base_ns),
            "duration_us": _us(e - s),
            **_breakdown_us(sb),
            "sm_efficiency_pct": sm_efficiency(kern, s, e),
            "model_flops": model_step,
            "hardware_flops": hw_step,
            "mfu_pct": 100.0 * model_step / ((e - s) * 1e-9 * peak),
            "hfu_pct": 100.0 * hw_step / ((e - s) * 1e-9 * peak) if hw_step != model_step else None,
        })
    n_steps = len(steps)
    model_flops = sum(r.model_flops for r in matmul) / n_steps
    hw_flops = sum(r.flops for r in matmul) / n_steps
    mean_step_s = statistics.fmean(st["duration_us"] for st in steps) / 1e6
    return {
        "window_us": _us(b["window"]),
        "window_start_us": _us(lo, base_ns),
        **_breakdown_us(b),
        "gpu_busy_us": _us(b["busy"]),
        "comm_overlap_pct": _pct(b["overlap"], b["comm"]),
        "sm_efficiency_pct": sm_efficiency(kern, lo, hi),
        "achieved_occupancy_pct": occ_num / occ_den if occ_den else 0.0,
        "model_flops_per_step": model_flops,
        "mfu_pct": 100.0 * model_flops / (mean_step_s * peak),
        "hardware_flops_per_step": hw_flops,
        "hfu_pct": 100.0 * hw_flops / (mean_step_s * peak) if hw_flops != model_flops else None,
        "kernels": sum(1 for o in ops if o.kind == "kernel"),
        "memcpys": sum(1 for o in ops if o.kind == "memcpy"),
        "nccl_kernels": sum(1 for o in ops if o.cls == "comm" and o.name.startswith("nccl")),
        "comm_kernels": sum(1 for o in ops if o.cls == "comm" and (o.comm is None or o.comm.recorded)),
        "unrecorded_comm_kernels": sum(1 for o in ops if o.comm is not None and not o.comm.recorded),
        "breakdown_ns": b,
        "steps": steps,
    }


def collectives_truth(built: Built, base_ns: int) -> tuple[list[dict[str, Any]], dict[int, dict[int, int]]]:
    """Every collective / p2p instance, plus blame[rank][step] in ns."""
    out: list[dict[str, Any]] = []
    blame: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for key, members in built.sim.instances.items():
        info = members[0].comm
        assert info is not None
        arr = {m.rank: m.placed_arrival for m in members}
        last_t = max(arr.values())
        ordered = sorted(arr.items(), key=lambda kv: (kv[1], kv[0]))
        last_rank = ordered[-1][0]
        if len(ordered) > 1:
            blame[last_rank][members[0].step] += ordered[-1][1] - ordered[-2][1]
        entry: dict[str, Any] = {
            "pg": info.pg_name,
            "pg_desc": info.pg_desc,
            "name": "sendrecv" if key[0] == "p2p" else info.coll_name,
            "seq": info.seq if key[0] == "coll" else next(m.comm.seq for m in members
                                                          if m.comm is not None and m.comm.coll_name == "send"),
            "comms_id": str(info.comms_id),
            "step": members[0].step,
            "bytes": info.nbytes,
            "ranks": sorted(arr),
            "arrivals_us": {str(r): _us(t, base_ns) for r, t in sorted(arr.items())},
            "end_us": _us(members[0].placed_end, base_ns),
            "transfer_us": _us(info.transfer_ns),
            "waits_us": {str(r): _us(last_t - t) for r, t in sorted(arr.items())},
            "last_rank": last_rank,
        }
        if key[0] == "p2p":
            entry["src"], entry["dst"] = info.src_rank, info.dst_rank
        out.append(entry)
    for hosts in built.sim.host_instances.values():  # host-side (gloo) collectives: blame alike
        ordered_h = sorted((h.arrival, h.rank) for h in hosts)
        if len(ordered_h) > 1:
            blame[ordered_h[-1][1]][hosts[0].step] += ordered_h[-1][0] - ordered_h[-2][0]
    out.sort(key=lambda e: (min(e["arrivals_us"].values()), e["pg"], e["seq"]))
    return out, blame


def pipeline_truth(built: Built) -> dict[str, Any] | None:
    """Bubble per stage: idle share of the compute stream between the step's first forward start and
    last backward end across all stages (forward/backward kernels only; optimizer excluded)."""
    if built.scenario != "pp":
        return None
    k = built.knobs
    stages = k.ranks
    chunks = k.chunks if k.schedule == "interleaved" else 1
    per_stage: list[list[float]] = [[] for _ in range(stages)]
    exact = []
    for step in k.step_numbers():
        fb = [[(o.placed_start, o.placed_end) for o in c.gpu if o.step == step and o.cls == "comp" and o.phase in ("fwd", "bwd")]
              for c in built.sim.ranks]
        lo = min(s for st in fb for s, _ in st)
        hi = max(e for st in fb for _, e in st)
        busy = [union_len(st) for st in fb]
        exact.append({"step": step, "span_ns": hi - lo, "busy_ns": busy})
        for p in range(stages):
            per_stage[p].append(_pct(hi - lo - busy[p], hi - lo))
    bubble = [statistics.fmean(v) for v in per_stage]
    return {
        "stages": stages,
        "microbatches": k.microbatches,
        "schedule": k.schedule,
        "bubble_pct_per_stage": bubble,
        "bubble_pct": statistics.fmean(bubble),
        "chunks": chunks,
        "theory_bubble_pct": 100.0 * (stages - 1) / (stages - 1 + chunks * k.microbatches),
        "definition": "per step: span = first forward-kernel start .. last backward-kernel end over all stages; "
                      "bubble(stage) = (span - |forward/backward kernels of the stage|) / span; averaged over steps",
        "exact": exact,
    }


def ops_truth(ctx: RankCtx) -> list[dict[str, Any]]:
    """Leaf ops of one rank grouped by (name, tensor shapes): hardware/model FLOPs and bytes per call, mean
    kernel busy time per call."""
    groups: dict[tuple[str, str], list[Any]] = {}
    for rec in ctx.ops:
        groups.setdefault((rec.name, json.dumps(rec.input_dims)), []).append(rec)
    out = []
    for (name, dims), recs in groups.items():
        times = [union_len([(k.start, k.end) for k in r.kernels]) for r in recs]
        r0 = recs[0]
        out.append({
            "name": name,
            "input_dims": json.loads(dims),
            "dtype": r0.dtype,
            "calls": len(recs),
            "flops": r0.flops,
            "model_flops": r0.model_flops,
            "bytes": r0.nbytes,
            "time_us": _us(sum(times) / len(times)),
            "total_time_us": _us(sum(times)),
            "matmul": r0.matmul,
            "formula": r0.formula,
        })
    out.sort(key=lambda e: -e["total_time_us"])
    return out


def slow_steps_truth(built: Built, ranks: dict[str, Any]) -> list[dict[str, Any]]:
    """Injected slow steps with their excess: the job step time (mean over ranks) minus the median
    job step time of the clean steps."""
    k = built.knobs
    if not k.slow_steps:
        return []
    job = {st: statistics.fmean(r["steps"][i]["duration_us"] for r in ranks.values())
           for i, st in enumerate(k.step_numbers())}
    slow = {s for s, _, _ in k.slow_steps}
    clean = [v for s, v in job.items() if s not in slow] or list(job.values())
    base = statistics.median(clean)
    out = []
    for s, cause, us in sorted(k.slow_steps):
        out.append({"step": s, "cause": cause, "injected_us": us, "excess_us": job[s] - base,
                    "ranks": "all"})
    return out


def job_step_us(built: Built) -> float:
    """Mean over steps of the job step time (each step's duration averaged over ranks), µs."""
    per_step = []
    for step in built.knobs.step_numbers():
        durs = []
        for c in built.sim.ranks:
            s, e = step_windows(c)[step]
            durs.append(e - s)
        per_step.append(statistics.fmean(durs))
    return statistics.fmean(per_step) / 1000.0


def window_step_us(built: Built) -> float:
    """Mean over steps of the job step time as the window ledger counts it: each step's longest rank, µs."""
    per_step = []
    for step in built.knobs.step_numbers():
        per_step.append(max(step_windows(c)[step][1] - step_windows(c)[step][0] for c in built.sim.ranks))
    return statistics.fmean(per_step) / 1000.0


def build_truth(built: Built, base_ns: int, offsets_ns: list[int], baseline: Built | None = None) -> dict[str, Any]:
    k = built.knobs
    ranks = {str(c.rank): rank_truth(c, built, base_ns) for c in built.sim.ranks}
    windows = {c.rank: step_windows(c) for c in built.sim.ranks}
    rank_ledgers, job_ledger, job_by_step = ledger_truth(built, windows)
    for r, rt in ranks.items():
        rt.update(rank_ledgers[int(r)])
        rt["node"] = node_of(built, int(r))
    colls, blame = collectives_truth(built, base_ns)
    n_steps = len(k.step_numbers())
    for r, rt in ranks.items():
        rt["blame_us_per_step"] = _us(sum(blame.get(int(r), {}).values()) / n_steps)
        rt["times_last"] = sum(1 for c in colls if c["last_rank"] == int(r) and len(c["ranks"]) > 1)
    stragglers = []
    cost = job_step_us(built) - job_step_us(baseline) if baseline is not None else None
    window_cost = window_step_us(built) - window_step_us(baseline) if baseline is not None else None
    for rank, delay, cause in k.stragglers:
        stragglers.append({"rank": rank, "blame_us_per_step": ranks[str(rank)]["blame_us_per_step"], "cause": cause,
                           "injected_delay_us": delay, "step_cost_us": cost, "window_cost_us": window_cost})
    return {
        "scenario": built.scenario,
        "device": built.sim.dev.name,
        "device_key": built.sim.dev.key,
        "num_sms": built.sim.dev.num_sms,
        "peak_bf16_tflops": built.sim.dev.peak_bf16_tflops,
        "world_size": k.ranks,
        "hosts": k.node_count(),
        "steps": k.step_numbers(),
        "knobs": _knobs_json(k),
        "ranks": ranks,
        "collectives": colls,
        "stragglers": stragglers,
        "straggler_step_cost_us": cost,
        "pipeline": pipeline_truth(built),
        "slow_steps": slow_steps_truth(built, ranks),
        "ops": ops_truth(built.sim.ranks[0]),
        "ops_rank": 0,
        "clock_offsets_us": {str(r): _us(off) for r, off in enumerate(offsets_ns)},
        "ledger": job_ledger,
        "ledger_by_step": job_by_step,
        "ledger_window": window_truth(job_by_step, job_ledger),
        "layout": layout_truth(built),
        "memory": memory_truth(built.sim.ranks, base_ns),
        "time_base": "µs on the trace clock of an unskewed rank: trace ts - clock_offsets_us[rank]",
    }


def _knobs_json(k: Any) -> dict[str, Any]:
    from dataclasses import asdict

    return json.loads(json.dumps(asdict(k)))
