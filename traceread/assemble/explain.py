"""Short explanations of the concepts behind each number, written around the job's own measurements.

A reader at 3 a.m. should not need a textbook: each function takes the measured values and returns a
paragraph that says what the concept is, what the formula predicts for *this* job, and what a
change would buy. All functions return plain text (renderers escape it).
"""

from __future__ import annotations

from typing import Any

from traceread.fmt import ms, nbytes, pct
from traceread.report_schema import CollectiveEntry, PipelineEntry


#: Bytes each rank must move per byte of payload, by collective (nccl-tests "bus bandwidth" factors).
def bus_factor(name: str, n: int) -> float:
    """Link traffic per rank divided by the payload size S, for a ring/tree implementation."""
    n = max(int(n), 1)
    lowered = name.lower().replace("_", "")
    if n == 1:
        return 1.0
    if "allreduce" in lowered:
        return 2.0 * (n - 1) / n
    if any(k in lowered for k in ("allgather", "reducescatter", "alltoall", "all2all")):
        return (n - 1) / n
    return 1.0


def bubble_fraction(stages: int, microbatches: int, virtual: int = 1) -> float:
    """Idle share of a pipeline flush: (P−1)/(P−1+v·M) for P stages, M micro-batches, v chunks per rank."""
    p, m, v = max(int(stages), 1), max(int(microbatches), 1), max(int(virtual), 1)
    return (p - 1) / (p - 1 + v * m)


P2P_NAMES = ("send", "recv", "sendrecv", "isend", "irecv")


def is_p2p(name: str | None) -> bool:
    """True for point-to-point transfers (one sender, one receiver: never a ring)."""
    return str(name or "").lower().replace("_", "") in P2P_NAMES


def point_to_point(coll: CollectiveEntry) -> str:
    """Cost model of a send/recv: S bytes over the one link between the two ranks."""
    size, lat = coll.get("bytes"), coll.get("latency_us")
    peak, busbw = coll.get("link_peak_gbps"), coll.get("busbw_gbps")
    name = str(coll.get("name") or "send/recv")
    if not size:
        return f"{name}: a point-to-point transfer between two ranks; the trace does not record its size."
    text = (f"{name} is a point-to-point transfer: one rank sends {nbytes(size)} to one other rank over the link "
            "between them, with no ring and no reduction, so it costs S / link bandwidth plus latency. ")
    if peak:
        text += f"At the {peak:.0f} GB/s link peak that is at least {ms(size / (peak * 1e3), 2)}"
        if lat:
            text += f"; it took {ms(lat, 2)} (median)"
            if busbw:
                text += f", {busbw:.1f} GB/s = {100.0 * busbw / peak:.0f}% of the link"
        text += ". "
    elif busbw:
        text += f"Measured: {busbw:.1f} GB/s. "
    text += ("In a pipeline most of the time around a send/recv is the receiver waiting for the sender's stage "
             "to finish (the bubble), not the transfer itself.")
    return text


def ring_allreduce(coll: CollectiveEntry) -> str:
    """Cost model of one collective next to its measured latency and bandwidth (a ring for all-reduce,
    all-gather and reduce-scatter; pairwise exchange for all-to-all; a single link for send/recv)."""
    n = int(coll.get("group_size") or 0)
    name = str(coll.get("name") or "collective")
    if is_p2p(name):
        return point_to_point(coll)
    size = coll.get("bytes")
    lat = coll.get("latency_us")
    peak = coll.get("link_peak_gbps")
    busbw = coll.get("busbw_gbps")
    if not n or not size:
        return (f"{name}: the trace does not record the group size or message size, so its bandwidth "
                "cannot be compared with the link.")
    f = bus_factor(name, n)
    if "alltoall" in name.lower().replace("_", ""):
        text = (f"In an all-to-all each of the {n} ranks sends a different (N−1)/N = {f:.2f} share of its "
                f"{nbytes(size)} to every other rank directly (pairwise exchange, no ring)")
    else:
        text = (f"In a ring, each of the {n} ranks of {name} pushes {f:.2f}× the message "
                f"({nbytes(size)} → {nbytes(size * f)} per rank) through its link")
    if "allreduce" in name.lower().replace("_", ""):
        text += f", because reduce-scatter and all-gather each take N−1 = {n - 1} hops of S/N bytes, i.e. 2(N−1)/N = {f:.2f}"
    text += ". "
    if peak:
        floor_us = size * f / (peak * 1e3)
        text += f"At the {peak:.0f} GB/s link peak that is at least {ms(floor_us, 2)}"
        if lat:
            text += f"; it took {ms(lat, 2)} (median), "
            if busbw:
                text += f"a bus bandwidth of {busbw:.1f} GB/s = {100.0 * busbw / peak:.0f}% of the link."
            else:
                text += "bandwidth unknown."
        else:
            text += "."
    elif busbw:
        text += f"Measured bus bandwidth: {busbw:.1f} GB/s (link peak unknown)."
    return text


def link_cliff(collectives: list[CollectiveEntry]) -> str | None:
    """The NVLink → network bandwidth drop, when the job has collectives on both kinds of link."""
    nv = [c for c in collectives if c.get("link") == "nvlink" and c.get("busbw_gbps")]
    net = [c for c in collectives if c.get("link") == "network" and c.get("busbw_gbps")]
    if not nv or not net:
        return None
    bw_nv = max(c.get("busbw_gbps") or 0.0 for c in nv)  # every one is known and non-zero (above)
    bw_net = max(c.get("busbw_gbps") or 0.0 for c in net)
    peak_nv = max((c.get("link_peak_gbps") or 0) for c in nv) or None
    peak_net = max((c.get("link_peak_gbps") or 0) for c in net) or None
    ratio = bw_nv / bw_net if bw_net else None
    text = (f"Collectives inside a node reached {bw_nv:.0f} GB/s over NVLink but only {bw_net:.0f} GB/s "
            "once they crossed the network")
    if ratio:
        text += f" — {ratio:.0f}× slower"
    if peak_nv and peak_net:
        text += f" (link peaks {peak_nv:.0f} vs {peak_net:.0f} GB/s per GPU)"
    text += (". Put the chattiest groups (tensor parallel, FSDP shards) inside a node and let only the "
             "once-per-step gradient reduction cross nodes.")
    return text


def exposed_comm(exposed_us: float, step_us: float | None, overlap_pct: float | None) -> str:
    """What exposed communication is and how much of this job's step it costs."""
    share = f" ({pct(100.0 * exposed_us / step_us)} of a {ms(step_us)} step)" if step_us else ""
    text = (f"Communication is only free while kernels run beside it. Here {ms(exposed_us)} per step of "
            f"collective time had no compute kernel running at the same time{share}: the GPU sat waiting "
            "for the network.")
    if overlap_pct is not None:
        text += (f" {pct(overlap_pct, 0)} of communication time was hidden under compute; the rest is exposed."
                 " Exposed time includes waiting for a late rank, so fix stragglers first.")
    return text


def pipeline(p: PipelineEntry, step_us: float | None) -> str:
    """Measured pipeline bubble against (P−1)/(P−1+M) and what more micro-batches or interleaving give."""
    stages, mb = int(p.get("stages") or 0), int(p.get("microbatches") or 0)
    measured = p.get("bubble_pct")
    if stages < 2 or mb < 1:
        return "A pipeline was detected but its stage or micro-batch count could not be read from the trace."
    theory = 100.0 * bubble_fraction(stages, mb)
    text = (f"With P = {stages} stages and M = {mb} micro-batches, each stage must wait for the pipeline to "
            f"fill and drain: (P−1)/(P−1+M) = {stages - 1}/{stages - 1 + mb} = {theory:.1f}% of the step is idle "
            f"even with perfect balance. Measured: {pct(measured)}")
    if measured is not None and step_us:
        text += f" ≈ {ms(measured / 100.0 * step_us)} per step"
    text += ". "
    if measured is not None and measured > theory + 5:
        text += (f"The extra {measured - theory:.1f} points over theory come from unequal stages or slow "
                 "point-to-point transfers, not from the schedule. ")
    m2 = 100.0 * bubble_fraction(stages, 2 * mb)
    m4 = 100.0 * bubble_fraction(stages, 4 * mb)
    v2 = 100.0 * bubble_fraction(stages, mb, virtual=2)
    text += (f"Doubling M to {2 * mb} would shrink the theoretical bubble to {m2:.1f}% ({4 * mb}: {m4:.1f}%); "
             f"an interleaved schedule with 2 model chunks per rank would give {v2:.1f}% at the same M, "
             "at the cost of more point-to-point messages.")
    return text


def roofline(r: dict[str, Any]) -> str:
    """The ridge point of this device and where the hot operators sit relative to it."""
    peak, bw, ridge = r.get("peak_tflops"), r.get("peak_gbps"), r.get("ridge_flop_per_byte")
    if not peak or not bw:
        return "The device's peak FLOP/s or memory bandwidth is unknown, so no roofline can be drawn."
    ridge = ridge or peak * 1e12 / (bw * 1e9)
    ops = r.get("ops") or []
    mem = [o for o in ops if o.get("bound") == "memory"]
    mem_time = sum(float(o.get("time_us") or 0) for o in mem)
    all_time = sum(float(o.get("time_us") or 0) for o in ops)
    text = (f"{r.get('device') or 'This GPU'} can do {peak:.0f} TFLOP/s ({r.get('precision') or 'dense'}) but "
            f"read only {bw:.0f} GB/s from memory, so an operator needs at least {ridge:.0f} FLOPs per byte "
            "(the ridge point) before compute, not memory, limits it.")
    if ops and all_time:
        text += (f" {len(mem)} of the {len(ops)} operators with known FLOPs sit left of the ridge; they take "
                 f"{pct(100.0 * mem_time / all_time, 0)} of that operator time. Speeding them up means moving fewer "
                 "bytes (fusion, lower precision), not faster math.")
    return text


def sm_efficiency(value: float | None, occupancy: float | None, num_sms: int | None) -> str:
    """SM efficiency and occupancy, and why small grids waste the GPU."""
    sms = f"{num_sms} SMs" if num_sms else "its SMs"
    text = (f"SM efficiency is the share of time {sms} had at least one block to run; a kernel with fewer "
            "blocks than SMs leaves the rest empty however long it runs. ")
    if value is not None:
        text += f"Measured: {pct(value)}. "
    if occupancy is not None:
        text += (f"Achieved occupancy ({pct(occupancy)}) is how full each busy SM was with warps; low occupancy "
                 "hurts only memory-bound kernels that need many warps in flight to hide latency.")
    return text


def host_bound(host_us: float, step_us: float | None) -> str:
    share = f" ({pct(100.0 * host_us / step_us)} of the step)" if step_us else ""
    return (f"The GPU was idle for {ms(host_us)} per step{share} because the next kernel had not been launched "
            "yet: Python and the CPU side of PyTorch could not issue work as fast as the GPU finished it. "
            "Fewer, larger kernels (torch.compile, CUDA graphs, a bigger batch) or a faster input pipeline fix this.")


#: Why a CPU-only rank whose own operators took longer was late (cause ``cpu_ops``).
CPU_OPS_WHY = ("its own operators took longer on its CPU: more work on that rank (a larger batch or sequence, "
               "an uneven shard) or a slower or busier CPU")


def straggler(rank: int, impact_us: float, cause: str, step_us: float | None, blame_us: float | None = None) -> str:
    """Why one late rank slows everyone, and the two numbers: waiting caused (blame) vs step time saved (impact)."""
    share = f" ({pct(100.0 * impact_us / step_us)} of the step)" if step_us else ""
    why = {"gpu": "its own GPU work took longer (slower or throttled GPU, or more work on that rank)",
           "host": "its CPU launched work late (data loading, Python overhead, another process on the host)",
           "cpu_ops": CPU_OPS_WHY}.get(
        cause, "the trace does not say whether its GPU or its host was slow")
    text = (f"A collective finishes only when its last member arrives, so every other rank waits for rank "
            f"{rank}. If it were on time, each step would be about {ms(impact_us)} shorter{share}. "
            f"Rank {rank} arrived late because {why}.")
    if blame_us is not None and blame_us > impact_us * 1.05:
        text += (f" The time the others spent waiting on it is larger, {ms(blame_us)} per step, because the same "
                 "delay is waited out again at every collective it carries into (e.g. each gradient bucket while "
                 "its GPU keeps computing through backward); the step gains each delay only once.")
    return text


def mfu(value: float | None, device: str | None) -> str:
    if value is None:
        return ("MFU (model FLOPs per step ÷ (peak FLOP/s × step time)) needs the model's FLOPs: pass --params "
                "and --tokens-per-step, or record shapes so operator FLOPs can be counted.")
    return (f"Model FLOPs utilisation: the model's useful arithmetic per step divided by what "
            f"{device or 'the GPU'} could do at peak in that time = {pct(value)}. Large dense training runs "
            "typically land between 35% and 55%; the findings above say where the rest went.")


# ------------------------------------------------------------------------------------------------
# advice by role and cause, with the saving the guide's cost models predict from the job's numbers

#: Share of a 1F1B bubble a zero-bubble schedule keeps: ZB-H1 splits backward into input- and
#: weight-gradient work and fills about two thirds of the bubble with the latter (ZB-H2 nearly all of
#: it, at the cost of more activation memory). The conservative ZB-H1 figure is used.
ZERO_BUBBLE_KEEP = 1.0 / 3.0


def _f(numbers: dict[str, Any], key: str) -> float | None:
    v = numbers.get(key)
    try:
        return float(v) if v is not None else None
    except (TypeError, ValueError):
        return None


def _i(numbers: dict[str, Any], key: str) -> int | None:
    v = _f(numbers, key)
    return int(v) if v is not None else None


def advice(role: str | None, category: str, numbers: dict[str, Any] | None = None) -> tuple[str, float | None]:
    """What to change for a ledger share of ``category`` on a process group of ``role``, and the
    saving per step the guide's cost models predict (µs, never above the share; None when the model
    has no number for it).

    ``numbers`` (all optional): ``share_us`` (the ledger share), ``step_us``; pipeline ``stages``,
    ``microbatches``, ``virtual``; the group's ``group_size``, ``nodes`` (nodes it spans),
    ``gpus_per_node``, ``busbw_gbps`` (measured), ``nvlink_gbps`` (intra-node link peak or measured),
    ``network_gbps``; ``accumulation`` (micro-steps per optimizer step); ``rank`` and ``cause`` of a
    straggler.
    """
    n = dict(numbers or {})
    share = _f(n, "share_us") or 0.0
    role = role or "other"
    if category == "comm_wait" and n.get("rank") is not None and role != "pp":
        return _straggler_advice(n, share)
    if category == "bubble" or role == "pp":
        return _pp_advice(n, share)
    if category == "host_bound":
        return _host_advice(share)
    if category in ("comm_transfer", "comm_wait"):
        fn = {"tp": _tp_advice, "dp": _dp_advice, "fsdp": _fsdp_advice, "ep": _ep_advice, "cp": _cp_advice}.get(role)
        if fn is not None:
            return fn(n, share, category)
    return ("Let communication start earlier or overlap it with compute, and keep bandwidth-heavy groups on "
            "NVLink (compare busbw with the link peak in the collectives table).", None)


def _capped(saving: float | None, share: float) -> float | None:
    return None if saving is None else max(0.0, min(saving, share))


def _pp_advice(n: dict[str, Any], share: float) -> tuple[str, float | None]:
    p, m, v = _i(n, "stages"), _i(n, "microbatches"), _i(n, "virtual") or 1
    if not p or p < 2 or not m:
        return ("Pipeline bubble: raise the number of micro-batches per step (the fill/drain share is "
                "(P−1)/(P−1+M)), use an interleaved schedule (v model chunks per rank divide it by v), or a "
                "zero-bubble schedule that fills it with weight-gradient work.", None)
    now = bubble_fraction(p, m, v)
    at2, at4 = bubble_fraction(p, 2 * m, v), bubble_fraction(p, 4 * m, v)
    inter = bubble_fraction(p, m, 2 * v)
    save2 = share * (1.0 - at2 / now) if now else None
    text = (f"With P = {p} stages and M = {m} micro-batches the bubble is (P−1)/(P−1+M) = {pct(100 * now)} of the "
            f"pipeline time. M = {2 * m}: {pct(100 * at2)}, saving about {ms(save2 or 0.0)} per step; "
            f"M = {4 * m}: {pct(100 * at4)}, saving about {ms(share * (1.0 - at4 / now) if now else 0.0)}. "
            f"An interleaved schedule with {2 * v} chunks per rank: {pct(100 * inter)} at the same M "
            f"(about {ms(share * (1.0 - inter / now) if now else 0.0)} saved, more send/recv). A zero-bubble "
            f"schedule (ZB-H1) fills about two thirds of it with weight-gradient work "
            f"(about {ms(share * (1.0 - ZERO_BUBBLE_KEEP))} saved).")
    return text, _capped(save2, share)


def _tp_advice(n: dict[str, Any], share: float, category: str) -> tuple[str, float | None]:
    nodes = _i(n, "nodes") or 1
    busbw, nv = _f(n, "busbw_gbps"), _f(n, "nvlink_gbps")
    if nodes > 1:
        text = (f"The tensor-parallel group spans {nodes} nodes, so its per-layer collectives run at network speed "
                "(the NVLink → InfiniBand cliff: ~900 vs ~50 GB/s per GPU on H100, 18×). Keep every TP group inside "
                "one NVLink domain: make TP ≤ GPUs per node and put data or pipeline parallelism across nodes.")
        saving = None
        if busbw and nv and nv > busbw:
            saving = share * (1.0 - busbw / nv)
            text += (f" Measured {busbw:.1f} GB/s against {nv:.0f} GB/s inside a node: the same bytes over NVLink "
                     f"would take {pct(100 * busbw / nv)} of the time, about {ms(saving)} less per step.")
        return text, _capped(saving, share)
    return ("Tensor-parallel collectives run on the critical path of every layer. Sequence parallelism replaces "
            "each all-reduce by reduce-scatter + all-gather around the norms (same bytes, less activation memory "
            "and no redundant norm/dropout work); asynchronous / overlapped TP (symmetric-memory all-gather-matmul, "
            "TransformerEngine comm-GEMM overlap) hides it under the GEMMs.", None)


def _hsdp_saving(n: dict[str, Any], share: float) -> tuple[str, float | None]:
    nodes, g = _i(n, "nodes") or 1, _i(n, "gpus_per_node")
    if nodes < 2:
        return "", None
    text = (f" The group spans {nodes} nodes: HSDP (shard inside a node, replicate across) sends only the "
            "already-reduced shard across the network")
    if g and g > 1:
        text += f", 1/{g} of the bytes per GPU, so the network-bound part shrinks about {g}×"
        return text + ".", share * (1.0 - 1.0 / g)
    return text + ".", None


def _dp_advice(n: dict[str, Any], share: float, category: str) -> tuple[str, float | None]:
    k = _i(n, "accumulation")
    text = ("Gradient all-reduce left exposed after backward. Smaller DDP buckets (bucket_cap_mb) start the "
            "first reduction earlier so more of it overlaps with the remaining backward; gradient_as_bucket_view "
            "avoids the copies.")
    saving = None
    if k and k > 1:
        saving = share * (1.0 - 1.0 / k)
        text += (f" With {k} accumulation micro-steps per optimizer step, model.no_sync() on all but the last "
                 f"skips {k - 1} of {k} all-reduces: about {ms(saving)} per step.")
    else:
        text += " With gradient accumulation, model.no_sync() on all but the last micro-step skips the others."
    extra, hsdp = _hsdp_saving(n, share)
    text += extra
    if saving is None:
        saving = hsdp
    return text, _capped(saving, share)


def _fsdp_advice(n: dict[str, Any], share: float, category: str) -> tuple[str, float | None]:
    text = ("FSDP all-gathers each unit's parameters before use and reduce-scatters its gradients after: exposed "
            "time means the next gather was not issued early enough. Prefetch (backward_prefetch=BACKWARD_PRE, "
            "forward_prefetch=True; FSDP2: set_modules_to_forward_prefetch), and reshard_after_forward=False for "
            "the last units (one all-gather fewer per unit, more memory).")
    extra, hsdp = _hsdp_saving(n, share)
    return text + extra, _capped(hsdp, share)


def _ep_advice(n: dict[str, Any], share: float, category: str) -> tuple[str, float | None]:
    if category == "comm_wait":
        return ("Ranks wait inside the all-to-all for the most loaded expert rank: balance the experts (router "
                "load-balancing loss, a lower capacity factor that drops overflow tokens, expert placement). A "
                f"balanced dispatch removes this wait, up to {ms(share)} per step.", share)
    return ("All-to-all token exchange (dispatch/combine) exposed: overlap it with the shared expert or attention "
            "compute, keep EP inside the NVLink domain, and send fewer bytes (fp8 dispatch).", None)


def _cp_advice(n: dict[str, Any], share: float, category: str) -> tuple[str, float | None]:
    return ("Context-parallel K/V exchange exposed: overlap each ring step's send/recv of the next K/V chunk with "
            "the attention on the current one (ring attention), or all-gather K/V once when the sequence is short.",
            None)


def _straggler_advice(n: dict[str, Any], share: float) -> tuple[str, float | None]:
    rank, cause = n.get("rank"), str(n.get("cause") or "unknown")
    why = {"gpu": "its own GPU work took longer (check its clocks/thermals, or an uneven share of the work)",
           "host": "its CPU launched work late (data loader, Python, another process on that host)",
           "cpu_ops": CPU_OPS_WHY}.get(
        cause, "the trace does not say whether its GPU or its host was slow")
    return (f"Every member of the collective waited for rank {rank}: {why}. Fixing that rank saves up to "
            f"{ms(share)} per step; compare it with a healthy rank (traceread diff).", share)


def _host_advice(share: float) -> tuple[str, float | None]:
    return ("The GPU waited for the CPU to launch the next kernel. CUDA graphs (torch.compile "
            "mode='reduce-overhead') remove per-kernel launch cost; torch.compile fuses small kernels; more data "
            "loader workers with pin_memory=True keep the input ready; avoid .item()/.cpu() inside the step. "
            f"Up to {ms(share)} per step is recoverable.", None)


#: What to change when host time was inside a span of this family (analysis/time/host_spans.py).
SPAN_ADVICE: dict[str, str] = {
    "data_loading": ("Feed the step from background workers: DataLoader(num_workers>0, prefetch_factor, "
                     "persistent_workers=True, pin_memory=True); then see where the time goes inside the dataset's "
                     "__getitem__ and collate_fn (record them with with_stack=True, or time them alone) — decoding, "
                     "tokenising or reading files on one rank stops every rank at the next collective."),
    "sync": ("Each .item()/.cpu()/print of a GPU tensor waits for the GPU: log fewer scalars (every N steps), keep "
             "running sums on the GPU and read them once, and avoid data-dependent shapes (nonzero, boolean masks) "
             "inside the step."),
    "checkpoint": ("Take saving off the critical rank's step: asynchronous checkpointing "
                   "(torch.distributed.checkpoint.async_save) or sharded saves from every rank, less often, and "
                   "never from one rank while the others wait for it at the next collective."),
    "gc": ("Keep Python's garbage collector out of the step: gc.freeze() after start-up (model and optimizer built), "
           "then gc.disable() and gc.collect() at a fixed step interval on every rank together."),
    "optimizer": ("Use the fused or foreach optimizer (torch.optim.AdamW(fused=True)) and keep host work (gradient "
                  "clipping norms read with .item(), learning-rate logic) out of it."),
    "logging": "Log less often (every N steps) and without reading GPU tensors on the host inside the step.",
    "model_forward": ("Host time inside the model's forward with no operator running: Python in the forward "
                      "(data-dependent control flow, tensors built on the CPU, .item() on a GPU tensor) or the "
                      "garbage collector pausing there. Record stacks (with_stack=True) to see which; gc.freeze() "
                      "after start-up removes most collector pauses; torch.compile removes Python between operators."),
    "evaluation": "Run evaluation less often, or on fewer batches, or outside the timed training steps.",
    "framework_step": ("The time is in the framework's own hook: see which callback or hook runs there "
                       "(its spans in the timeline, traceread export) and move its host work off the step."),
    "annotation": ("The time is inside your own annotated region: profile that code alone (with_stack=True) and "
                   "move its host work off the step or onto a background thread."),
    "python": "The time is in that Python function: profile it (py-spy, with_stack=True) and take it off the step.",
    "operator": ("An operator ran on the CPU while the GPU waited: move that work onto the GPU or ahead of the step "
                 "(prefetch), or make it cheaper."),
}


def span_advice(family: str | None) -> str | None:
    """Advice that fits the family of the span host time was in; None for time no span covers."""
    return SPAN_ADVICE.get(family or "") if family else None
