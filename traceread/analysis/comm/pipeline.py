"""Pipeline parallelism: stages, microbatches, schedule and the bubble it costs.

Recognition (from matched point-to-point transfers, :mod:`collectives`): ranks that exchange
send/recv form an undirected graph. A pipeline replica is a connected component that is a **chain**
(stages 0..P−1) or, with interleaved virtual stages, a **ring** whose lightest edge is the
wrap-around (last → first stage carries ``(v−1)·M`` transfers per step, other edges ``v·M``); a
ring whose edges all carry the same traffic (ring attention / context parallelism) is not a pipeline.
Stage 0 is the chain end that launches the first send. Several components = data-parallel replicas
(the first is analysed in detail).

* **P** = stages in the chain; **M** (microbatches) = median over steps of the forward sends
  (stage 0 → stage 1) per step, ÷ v for interleaved schedules; **v** = sends on a normal edge ÷ M.
* **schedule**, in launch order on every stage but the last: ``gpipe`` when each stage launches all
  its forward sends before its first gradient receive (all-forward then all-backward), ``1f1b`` when
  some stage receives a gradient before its last forward send, ``interleaved`` for a ring. With
  M = 1 the two cannot be told apart (reported ``gpipe``).
* **pipeline span** of a step = first compute-kernel start .. last compute-kernel end over all
  stages (clock-aligned), optimizer kernels (launched inside ``Optimizer.*`` spans) excluded: the
  schedule the theory describes, without data loading and the optimizer step.
* **bubble** of a stage in a step = span − |∪ its compute kernels in the span| (time the stage
  computes nothing), split into ``p2p_wait_us`` = |∪ p2p kernels − ∪ compute| and ``idle_us`` = the
  rest. ``bubble_pct`` = bubble ÷ span × 100, mean over steps; the job's ``bubble_pct`` is the
  mean over stages. **theory** = ``(P−1)/v ÷ ((P−1)/v + M) × 100`` (GPipe/1F1B: v = 1).
* **unbalanced** when per-stage compute differs by more than 10 % (max/min − 1).
* **timeline** (chart only): compute blocks labelled ``fwd``/``bwd`` by launching thread (the
  autograd engine launches backward kernels from its own thread), ``p2p`` blocks; ``compute`` when
  the thread cannot be told.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from traceread import intervals as iv
from traceread.analysis.comm.collectives import Matched
from traceread.analysis.kinds import comm_mask
from traceread.model import RankTrace, as_float
from traceread.report_schema import PipelineEntry

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

UNBALANCED_FRACTION = 0.10
MAX_TIMELINE_BLOCKS = 4000

#: Columns of :func:`stage_activity`: merged compute / p2p intervals per step of one rank.
ACTIVITY_SCHEMA: dict[str, PolarsDataType] = {
    "rank": pl.Int64, "step": pl.Int64, "kind": pl.Utf8, "start": pl.Float64, "end": pl.Float64,
}
#: Per step totals of :func:`stage_activity` (rows with kind == "window" hold the step window).


def _p2p_pairs(matched: Matched) -> pl.DataFrame:
    """Per p2p instance: sender, receiver, step, and the launch/GPU start of each side."""
    ev = matched.events.filter(pl.col("op").is_in(["send", "recv"]))
    if ev.height == 0:
        return pl.DataFrame(schema={"instance": pl.Int64, "sender": pl.Int64, "receiver": pl.Int64,
                                    "step": pl.Int64})
    return (
        ev.with_columns(
            pl.when(pl.col("op") == "send").then(pl.col("rank")).otherwise(
                pl.when(pl.col("src_rank").is_not_null() & (pl.col("src_rank") != pl.col("rank")))
                .then(pl.col("src_rank")).otherwise(pl.col("dst_rank"))).alias("sender"),
            pl.when(pl.col("op") == "recv").then(pl.col("rank")).otherwise(
                pl.when(pl.col("dst_rank").is_not_null() & (pl.col("dst_rank") != pl.col("rank")))
                .then(pl.col("dst_rank")).otherwise(pl.col("src_rank"))).alias("receiver"),
        )
        .filter(pl.col("sender").is_not_null() & pl.col("receiver").is_not_null())
    )


def pipeline_chains(matched: Matched) -> tuple[list[list[int]], bool]:
    """Stage-ordered rank chains (one per pipeline replica) and whether they are rings (interleaved)."""
    p = _p2p_pairs(matched)
    if p.height == 0:
        return [], False
    sends = p.filter(pl.col("op") == "send") if (p["op"] == "send").any() else p
    edges = sends.group_by(["sender", "receiver"]).agg(pl.len().alias("n"),
                                                       pl.col("launch_ts").min().alias("first"))
    und: dict[tuple[int, int], int] = {}
    first_send: dict[int, float] = {}
    for s, r, n, f in edges.iter_rows():
        key = (min(s, r), max(s, r))
        und[key] = und.get(key, 0) + n
        if f is not None:
            first_send[s] = min(first_send.get(s, np.inf), f)
    adj: dict[int, set[int]] = {}
    for a, b in und:
        adj.setdefault(a, set()).add(b)
        adj.setdefault(b, set()).add(a)
    seen: set[int] = set()
    chains: list[list[int]] = []
    ring = False
    for start in sorted(adj):
        if start in seen:
            continue
        comp, stack = set(), [start]
        while stack:
            x = stack.pop()
            if x in comp:
                continue
            comp.add(x)
            stack.extend(adj[x] - comp)
        seen |= comp
        degs = [len(adj[x]) for x in comp]
        if len(comp) < 2 or max(degs) > 2:
            continue
        sub = {k: v for k, v in und.items() if k[0] in comp}
        is_ring = all(d == 2 for d in degs) and len(comp) > 2
        if is_ring:
            cut = min(sub, key=lambda k: sub[k])  # wrap-around edge carries the fewest transfers
            if sub[cut] >= float(np.median([v for k, v in sub.items() if k != cut])):
                continue  # a ring with even traffic (ring attention, custom all-to-all): not a pipeline
            ring = True
        else:
            cut = None
        # Walk the path from one end.
        ends = [cut[0], cut[1]] if cut else [x for x in comp if len(adj[x]) == 1]
        a0 = min(ends, key=lambda x: first_send.get(x, np.inf))
        order, prev = [a0], None
        while len(order) < len(comp):
            nxt = [y for y in adj[order[-1]] if y != prev and y not in order
                   and not (cut and {order[-1], y} == set(cut))]
            if not nxt:
                break
            prev = order[-1]
            order.append(nxt[0])
        if len(order) == len(comp):
            chains.append(order)
    chains.sort(key=min)
    return chains, ring


def _optimizer_launch_mask(rt: RankTrace, gpu: pl.DataFrame) -> np.ndarray:
    """True for kernels launched inside an ``Optimizer.*`` span (torch names optimizer steps
    ``Optimizer.step#AdamW.step``): they run after the pipeline schedule, not in it."""
    mask = np.zeros(gpu.height, dtype=bool)
    host = rt.host
    if host.height == 0 or gpu.height == 0:
        return mask
    opt = host.filter(pl.col("name").str.starts_with("Optimizer."))
    if opt.height == 0:
        return mask
    rows = gpu["launch_row"].to_numpy(allow_copy=True)
    ok = ~np.isnan(rows.astype(np.float64))
    idx = np.where(ok, rows, 0).astype(np.int64)
    lts = host["ts"].to_numpy()[idx]
    ltid = host["tid"].to_numpy()[idx]
    for tid, ts, end in opt.select("tid", "ts", "end").iter_rows():
        mask |= ok & (ltid == tid) & (lts >= ts) & (lts < end)
    return mask


def _launched_off_main_thread(rt: RankTrace, kernels: pl.DataFrame) -> np.ndarray | None:
    """True for kernels launched from a thread other than the one holding ``ProfilerStep`` (the
    autograd engine runs CUDA backward on its own device thread); None when that cannot be told."""
    if rt.steps.height == 0 or rt.host.height == 0 or kernels.height == 0 or rt.steps["tid"].null_count():
        return None
    main = int(rt.steps["tid"].mode()[0])
    rows = kernels["launch_row"].to_numpy(allow_copy=True).astype(np.float64)
    ok = ~np.isnan(rows)
    if not ok.any():
        return None
    tids = rt.host["tid"].to_numpy()[np.where(ok, rows, 0).astype(np.int64)]
    return ok & (tids != main)


def stage_activity(rt: RankTrace, step_windows: Any) -> pl.DataFrame:
    """Small per-rank extract for the bubble: per step, merged compute kernels (optimizer excluded)
    and p2p kernels (kind "compute" | "p2p"), the step window itself (kind "window"), and for the
    chart the compute split by launching thread (kind "fwd" | "bwd") when the trace allows."""
    table = step_windows.table if hasattr(step_windows, "table") else step_windows
    gpu = rt.gpu.filter(pl.col("kind") != "memcpy")
    is_comm = comm_mask(gpu, rt.host).to_numpy()
    opt = _optimizer_launch_mask(rt, gpu)
    comp = gpu.filter(pl.Series(~is_comm & ~opt))
    comm = gpu.filter(pl.Series(is_comm))
    p2p_like = comm["coll_name"].fill_null("").str.contains("(?i)send|recv") | (
        comm["coll_name"].is_null() & comm["name"].str.contains("(?i)sendrecv"))
    comm = comm.filter(p2p_like)
    cs, ce = iv.merge(comp["ts"].to_numpy(), comp["end"].to_numpy())
    ps, pe = iv.merge(comm["ts"].to_numpy(), comm["end"].to_numpy())
    sets: list[tuple[str, iv.Intervals]] = [("compute", (cs, ce)), ("p2p", (ps, pe))]
    bwd = _launched_off_main_thread(rt, comp)
    if bwd is not None:  # chart labels: forward on the main thread, backward on autograd's thread
        f, b = comp.filter(pl.Series(~bwd)), comp.filter(pl.Series(bwd))
        sets += [("fwd", iv.merge(f["ts"].to_numpy(), f["end"].to_numpy())),
                 ("bwd", iv.merge(b["ts"].to_numpy(), b["end"].to_numpy()))]
    rows: list[tuple[int, int, str, float, float]] = []
    for step, start, end in table.select("step", "start", "end").iter_rows():
        rows.append((rt.rank, step, "window", start, end))
        for kind, (s, e) in sets:
            s2, e2 = iv.clip_sorted((s, e), start, end)
            rows.extend((rt.rank, step, kind, float(a), float(b)) for a, b in zip(s2, e2))
    return pl.DataFrame(rows, schema=ACTIVITY_SCHEMA, orient="row")


def _pipeline_spans(
    chain: list[int], act: dict[int, pl.DataFrame], offsets: dict[int, float]
) -> dict[int, tuple[float, float]]:
    """Per step: (first compute start, last compute end) over all stages, on the reference clock."""
    spans: dict[int, tuple[float, float]] = {}
    for r in chain:
        c = act[r].filter(pl.col("kind") == "compute").group_by("step").agg(
            pl.col("start").min(), pl.col("end").max())
        off = offsets.get(r, 0.0)
        for step, lo, hi in c.iter_rows():
            a, b = spans.get(step, (np.inf, -np.inf))
            spans[step] = (min(a, lo - off), max(b, hi - off))
    return spans


def _stage_numbers(act: pl.DataFrame, spans: dict[int, tuple[float, float]], off: float) -> pl.DataFrame:
    """Per step of one stage, on the pipeline span: compute, p2p wait, idle and bubble (µs)."""
    out = []
    for (step,), g in act.group_by(["step"], maintain_order=True):
        if step not in spans:
            continue
        lo, hi = spans[step][0] + off, spans[step][1] + off
        window = hi - lo
        if window <= 0:
            continue
        c = g.filter(pl.col("kind") == "compute")
        p = g.filter(pl.col("kind") == "p2p")
        cset = iv.clip((c["start"].to_numpy(), c["end"].to_numpy()), lo, hi)
        pset = iv.clip((p["start"].to_numpy(), p["end"].to_numpy()), lo, hi)
        compute = iv.length(cset)
        p2p_wait = iv.length(iv.subtract(pset, cset))
        bubble = window - compute
        out.append({"step": step, "window_us": window, "compute_us": compute,
                    "p2p_wait_us": p2p_wait, "idle_us": bubble - p2p_wait, "bubble_us": bubble})
    return pl.DataFrame(out)


def detect_pipeline(
    matched: Matched,
    activity_by_rank: dict[int, pl.DataFrame] | None = None,
    offsets_us: dict[int, float] | None = None,
) -> PipelineEntry | None:
    """The report's ``pipeline`` entry, or None when no send/recv chain is found.

    ``activity_by_rank``: :func:`stage_activity` of (at least) the ranks of the first chain; without
    it stages, microbatches and schedule are still given, the bubble fields are left out.
    """
    chains, ring = pipeline_chains(matched)
    if not chains:
        return None
    chain = chains[0]
    P = len(chain)
    stage_of = {r: i for i, r in enumerate(chain)}
    p = _p2p_pairs(matched).filter(pl.col("sender").is_in(chain) & pl.col("receiver").is_in(chain))
    sends = p.filter(pl.col("op") == "send") if (p["op"] == "send").any() else p
    fwd = sends.filter(pl.col("sender") == chain[0]).filter(pl.col("receiver") == chain[1])
    per_step = fwd.group_by("step").agg(pl.len().alias("n"))["n"].to_numpy()
    f = float(np.median(per_step)) if per_step.size else 0.0
    v = 1
    if ring:
        wrap = sends.filter((pl.col("sender") == chain[-1]) & (pl.col("receiver") == chain[0]))
        w_steps = wrap.group_by("step").agg(pl.len().alias("n"))["n"].to_numpy()
        w = float(np.median(w_steps)) if w_steps.size else 0.0
        m = max(f - w, 1.0)
        v = max(int(round(f / m)), 1)
        M = int(round(m))
    else:
        M = int(round(f))
    schedule = "interleaved" if ring and v > 1 else _schedule(p, chain)
    theory = ((P - 1) / v) / ((P - 1) / v + M) * 100.0 if M > 0 else None
    entry: PipelineEntry = {
        "stages": P, "microbatches": M, "schedule": schedule,
        "theory_bubble_pct": theory,
    }
    entry["per_stage"] = [{"rank": r, "stage": stage_of[r]} for r in chain]
    if not activity_by_rank or not all(r in activity_by_rank for r in chain):
        entry["bubble_pct"] = None
        return entry
    per_stage = []
    offsets = offsets_us or {}
    spans = _pipeline_spans(chain, activity_by_rank, offsets)
    for r in chain:
        nums = _stage_numbers(activity_by_rank[r], spans, offsets.get(r, 0.0))
        if nums.height == 0:
            continue
        per_stage.append({
            "rank": r, "stage": stage_of[r],
            "bubble_pct": as_float((nums["bubble_us"] / nums["window_us"]).mean()) * 100.0,
            "idle_us": as_float(nums["idle_us"].mean()), "p2p_wait_us": as_float(nums["p2p_wait_us"].mean()),
            "compute_us": as_float(nums["compute_us"].mean()),
        })
    entry["per_stage"] = per_stage
    bubble = float(np.mean([s["bubble_pct"] for s in per_stage])) if per_stage else None
    entry["bubble_pct"] = bubble
    comps = [s["compute_us"] for s in per_stage if s["compute_us"] > 0]
    entry["unbalanced"] = bool(comps) and (max(comps) / min(comps) - 1.0) > UNBALANCED_FRACTION
    entry["timeline"] = _timeline(chain, activity_by_rank, offsets_us or {}, p)
    return entry


def _schedule(p: pl.DataFrame, chain: list[int]) -> str:
    """gpipe / 1f1b from the launch order of forward sends and gradient receives.

    On every stage but the last, per step: does a gradient receive (from the next stage) get
    launched before the stage's last forward send? 1F1B does so on every stage with fewer warm-up
    forwards than microbatches (stage i warms up with P−i−1), GPipe never. Stage 0 alone is not
    enough: with M ≤ P−1 its 1F1B order is all-forward-then-all-backward.
    """
    if len(chain) < 2:
        return "unknown"
    t = pl.coalesce(pl.col("launch_ts"), pl.col("ts"))
    seen, interleaved = 0, 0
    for i in range(len(chain) - 1):
        me, nxt = chain[i], chain[i + 1]
        mine = p.filter(pl.col("rank") == me)
        for _, g in mine.group_by(["step"]):
            f = g.filter((pl.col("sender") == me) & (pl.col("receiver") == nxt)).select(t.alias("t"))["t"]
            b = g.filter((pl.col("sender") == nxt) & (pl.col("receiver") == me)).select(t.alias("t"))["t"]
            if f.len() == 0 or b.len() == 0:
                continue
            seen += 1
            interleaved += int(as_float(b.min()) < as_float(f.max()))
    if not seen:
        return "unknown"
    return "1f1b" if interleaved else "gpipe"


def _timeline(
    chain: list[int], act: dict[int, pl.DataFrame], offsets: dict[int, float], p: pl.DataFrame
) -> list[dict[str, Any]]:
    """Blocks of stage 0's median-length step for the schedule chart, µs from the step's start.

    ``fwd``/``bwd`` come from the launching thread (:func:`stage_activity`); traces where that
    cannot be told give ``compute`` blocks. Labels only feed the chart, no number.
    """
    del p
    a0 = act[chain[0]]
    wins = a0.filter(pl.col("kind") == "window").with_columns((pl.col("end") - pl.col("start")).alias("d"))
    if wins.height == 0:
        return []
    step = int(wins.sort("d")["step"][wins.height // 2])
    starts = [
        float(w) - offsets.get(r, 0.0)
        for r in chain
        for w in act[r].filter((pl.col("kind") == "window") & (pl.col("step") == step))["start"].to_list()
    ]
    if not starts:
        return []
    t0 = min(starts)
    blocks: list[dict[str, Any]] = []
    for i, r in enumerate(chain):
        off = offsets.get(r, 0.0)
        g = act[r].filter(pl.col("step") == step)
        split = g.filter(pl.col("kind").is_in(["fwd", "bwd"])).height > 0
        keep = ["fwd", "bwd", "p2p"] if split else ["compute", "p2p"]
        for kind, s, e in g.filter(pl.col("kind").is_in(keep)).select("kind", "start", "end").iter_rows():
            blocks.append({"stage": i, "start_us": s - off - t0, "end_us": e - off - t0, "kind": kind})
    blocks.sort(key=lambda b: (b["stage"], b["start_us"]))
    return blocks[:MAX_TIMELINE_BLOCKS]
