"""Scenarios whose parallel layout must be read from behaviour the usual scenarios do not show:
a context-parallel ring, expert-parallel token exchange in an in-house library, and an inference
engine serving requests (iterations instead of training steps).

* ``cp`` — DP × CP: every attention layer splits the sequence over the CP group's ranks and rotates
  keys/values one way around the ring (send to the next rank, receive from the previous,
  ``cp − 1`` times), in forward and again in backward; gradients are all-reduced over the DP group.
* ``ep_renamed`` — the ``moe`` scenario with the token exchange done by a DeepEP fork under another
  namespace (``acme::ep::intranode::notify_dispatch`` / ``dispatch`` / ``combine``), launched from
  Python bindings: no ``c10d`` operator, no ``record_param_comms``, no comm args on the kernels.
* ``serving`` — a vLLM-style engine with tensor parallelism: each engine iteration is a
  ``execute_<tokens>_context_<prefill requests>(…)_generation_<decode requests>(…)`` annotation (no
  ``ProfilerStep``), one prefill iteration then decodes; each layer's two all-reduces are a custom
  all-reduce kernel (``cross_device_reduce_1stage<__nv_bfloat16, TP>``) under ``vllm::all_reduce`` >
  ``_C_custom_ar::all_reduce``, with no process group recorded (the engine's own communicator).
"""

from __future__ import annotations

from traceread.simulate.comm import BPE, DTYPE, ProcessGroup, busbw_gbs, collective, p2p
from traceread.simulate.layers import COMPUTE_STREAM, Emitter
from traceread.simulate.scenarios import (
    STREAM_DP,
    STREAM_EP,
    STREAM_TP,
    Built,
    Knobs,
    _adamw_after,
    _apply_gpu_stragglers,
    _last_compute,
    _moe_program,
    _new_sim,
    _profiled_steps,
    _step_close,
    build,
    layer_params,
    layer_seqs,
    ln_qkv,
    mlp,
    qkv_ln_backward,
)
from traceread.simulate.schedule import CommInfo, GpuOp, KernelSpec, Program, RankCtx, Simulation, comms_id

CP_SEND, CP_RECV = 41, 45  # streams of the ring's send and receive (batched isend/irecv)
CP_EVIDENCE = "keys/values rotate one way around the ring in every attention layer, forward and backward"


def _unrecorded(ctx: RankCtx, pg: ProcessGroup, name: str, coll: str, nelems: int, transfer: int,
                waits: list[GpuOp], grid: int) -> GpuOp:
    """One rank's kernel of a collective that torch's c10d never saw (an engine's or library's own
    communicator): synchronised across the group like any collective, but written without comm args."""
    seq = ctx.next_coll_seq(pg.name)
    info = CommInfo(key=("coll", pg.name, seq), members=len(pg.ranks), pg_name=pg.name, pg_desc=pg.desc,
                    pg_ranks=list(pg.ranks), coll_name=coll, in_nelems=nelems, out_nelems=nelems, dtype=DTYPE,
                    seq=seq, comms_id=comms_id(pg.name, "coll", seq), transfer_ns=transfer, nbytes=nelems * BPE,
                    recorded=False)
    spec = KernelSpec(name, transfer, (grid, 1, 1), (512, 1, 1), 64, 0, cls="comm")
    return ctx.launch(spec, pg.stream, waits=waits, comm=info, phase="comm")


# ---- context parallel ---------------------------------------------------------------------------------


def _cp_groups(k: Knobs) -> tuple[ProcessGroup, dict[int, ProcessGroup], dict[int, ProcessGroup]]:
    world = ProcessGroup("0", "default_pg", tuple(range(k.ranks)), STREAM_DP)
    ncp = k.ranks // k.cp
    cp_of: dict[int, ProcessGroup] = {}
    dp_of: dict[int, ProcessGroup] = {}
    for g in range(ncp):
        pg = ProcessGroup(str(1 + g), "undefined", tuple(range(g * k.cp, (g + 1) * k.cp)), STREAM_TP, "cp",
                          CP_EVIDENCE)
        cp_of.update({r: pg for r in pg.ranks})
    for j in range(k.cp):
        pg = ProcessGroup(str(1 + ncp + j), "undefined", tuple(range(j, k.ranks, k.cp)), STREAM_DP + 2, "dp",
                          "one gradient all-reduce per layer in backward")
        dp_of.update({r: pg for r in pg.ranks})
    return world, cp_of, dp_of


def _ring_attention(ctx: RankCtx, em: Emitter, k: Knobs, cp: ProcessGroup, layer: int, backward: bool,
                    seq: int) -> GpuOp:
    """Blockwise attention over the ring: compute on the keys/values held, pass them on, repeat."""
    n = len(cp.ranks)
    me = cp.ranks.index(ctx.rank)
    nxt, prv = cp.ranks[(me + 1) % n], cp.ranks[(me - 1) % n]
    s = k.seq_len // n
    kv = 2 * k.batch * s * k.hidden * (2 if backward else 1)  # K and V (and their gradients in backward)
    tag = "dkv" if backward else "kv"
    out: GpuOp | None = None
    for i in range(n):
        incoming = None
        if i < n - 1:
            p2p(ctx, cp, "send", nxt, kv, tag, (layer, i), waits=[_last_compute(ctx)], stream=CP_SEND)
            incoming = p2p(ctx, cp, "recv", prv, kv, tag, (layer, i), waits=[], stream=CP_RECV)
        if backward:
            out = em.sdpa_backward(k.batch, k.heads, s, k.hidden // k.heads, causal=(i == 0), seq=seq)
        else:
            out = em.sdpa(k.batch, k.heads, s, k.hidden // k.heads, causal=(i == 0), seq=seq)
        if incoming is not None:
            out.waits.append(incoming)
    assert out is not None
    return out


def _cp_program(ctx: RankCtx, k: Knobs, cp: ProcessGroup, dp: ProcessGroup) -> Program:
    em = Emitter(ctx)
    h = k.hidden
    m = k.batch * (k.seq_len // len(cp.ranks))
    params_layer = layer_params(h)
    for h2d in _profiled_steps(ctx, k):
        seqs: list[dict[str, int]] = []
        for layer in range(k.layers):
            s = layer_seqs(ctx, ("ln", "qkv", "attn", "proj", "ln2", "fc1", "gelu", "fc2"))
            seqs.append(s)
            ln_qkv(em, m, h, s, [h2d] if layer == 0 else [])
            _ring_attention(ctx, em, k, cp, layer, False, s["attn"])
            em.linear(m, h, h, bias=True, seq=s["proj"])
            em.add_(m, h)
            mlp(em, m, h, s)
            em.add_(m, h)
        loss_seq = ctx.next_seq()
        em.loss(m, h, seq=loss_seq)
        grads: list[GpuOp] = []
        with ctx.thread(ctx.autograd_tid):
            em.loss_backward(m, h, seq=loss_seq)
            for layer in reversed(range(k.layers)):
                s = seqs[layer]
                em.linear_backward(m, 4 * h, h, bias=True, seq=s["fc2"])
                em.gelu_backward(m, 4 * h, seq=s["gelu"])
                em.linear_backward(m, h, 4 * h, bias=True, seq=s["fc1"])
                em.layer_norm_backward(m, h, seq=s["ln2"])
                em.linear_backward(m, h, h, bias=True, seq=s["proj"])
                _ring_attention(ctx, em, k, cp, layer, True, s["attn"])
                qkv_ln_backward(em, m, h, s)
                if len(dp.ranks) > 1:
                    grads.append(collective(ctx, dp, "allreduce", params_layer, waits=[_last_compute(ctx)]))
        if k.optimizer:
            _adamw_after(ctx, em, params_layer * k.layers, k.layers * 8, grads)
        elif grads:
            _last_compute(ctx).waits.extend(grads)
        yield from _step_close(ctx, k)


def build_cp(k: Knobs) -> Built:
    sim = _new_sim(k)
    world, cp_of, dp_of = _cp_groups(k)

    def programs(s: Simulation) -> list[Program]:
        return [_cp_program(c, k, cp_of[c.rank], dp_of[c.rank]) for c in s.ranks]

    _apply_gpu_stragglers(sim, k, programs)
    sim.run(programs(sim))
    return Built(sim, [[world, cp_of[r], dp_of[r]] for r in range(k.ranks)], k, "cp", layer_params(k.hidden))


# ---- expert parallel in an in-house library -------------------------------------------------------------

#: An in-house fork of DeepEP: same kernels, another namespace (no name of them is in any pattern).
EP_NS = "acme::ep::intranode"


def _renamed_exchange(ctx: RankCtx, ep: ProcessGroup, nelems: int, waits: list[GpuOp], kind: str) -> GpuOp:
    """DeepEP-style token exchange: a tiny ``notify_dispatch`` (token counts) before each dispatch,
    then the dispatch or combine kernel, both launched by the library's Python binding."""
    n = len(ep.ranks)
    bw, lat = busbw_gbs(ctx, ep.ranks)
    if kind == "dispatch":
        waits = [_unrecorded(ctx, ep, f"void {EP_NS}::notify_dispatch<{n}>(int const*, int*, int, int*, int**, int)",
                             "alltoall", n * n, lat // 2, waits, 1)]
    transfer = lat + int(nelems * BPE * (n - 1) / n / bw)
    name = (f"void {EP_NS}::{kind}<{n}, 768, 8192>(int4*, float*, int*, long*, int4 const*, float const*, "
            "long const*, int*, int**, int, int, int)")
    return _unrecorded(ctx, ep, name, "alltoall", nelems, transfer, waits, 24)


def build_ep_renamed(k: Knobs) -> Built:
    sim = _new_sim(k)
    dp = ProcessGroup("0", "default_pg", tuple(range(k.ranks)), STREAM_DP, "dp",
                      "one all-reduce of the dense (attention) gradients per layer in backward")
    ep = ProcessGroup("1", "undefined", tuple(range(k.ranks)), STREAM_EP, "ep",
                      "token dispatch and combine kernels of an EP library around every MoE layer")

    def programs(s: Simulation) -> list[Program]:
        return [_moe_program(c, k, dp, ep, _renamed_exchange) for c in s.ranks]

    _apply_gpu_stragglers(sim, k, programs)
    sim.run(programs(sim))
    return Built(sim, [[dp, ep] for _ in range(k.ranks)], k, "ep_renamed", 4 * k.hidden * k.hidden)


# ---- an inference engine serving requests ---------------------------------------------------------------


def _engine_allreduce(ctx: RankCtx, tp: ProcessGroup, nelems: int, waits: list[GpuOp]) -> GpuOp:
    """vLLM's custom all-reduce: ``vllm::all_reduce`` > ``_C_custom_ar::all_reduce`` > one-shot kernel."""
    n = len(tp.ranks)
    bw, _lat = busbw_gbs(ctx, tp.ranks)
    transfer = 6_000 + int(nelems * BPE * (n - 1) / n / bw)
    with ctx.op("vllm::all_reduce", dims=[[nelems], []], types=["c10::BFloat16", ""], pre=5_000, post=3_000):
        with ctx.op("_C_custom_ar::all_reduce", dims=[[nelems], [nelems], [], [], []],
                    types=["c10::BFloat16", "c10::BFloat16", "Scalar", "Scalar", "Scalar"], pre=3_000):
            name = (f"void vllm::cross_device_reduce_1stage<__nv_bfloat16, {n}>(vllm::RankData*, vllm::RankSignals, "
                    "vllm::Signal*, __nv_bfloat16*, int, int)")
            return _unrecorded(ctx, tp, name, "allreduce", nelems, transfer, waits, ctx.dev.num_sms)


def iteration_plan(k: Knobs) -> list[tuple[str, int, int]]:
    """(kind, tokens, requests) per engine iteration: one prefill of ``batch`` prompts of ``seq_len``
    tokens, then decodes of one token per request."""
    return [("prefill", k.batch * k.seq_len, k.batch)] + [("decode", k.batch, k.batch)] * (k.steps - 1)


def iteration_name(kind: str, tokens: int, requests: int, k: Knobs, context: int) -> str:
    """The engine's annotation of one iteration (TraceLens' vLLM traces name them this way)."""
    if kind == "prefill":
        return f"execute_{tokens}_context_{requests}(sq{tokens}sk{tokens})_generation_0(sq0sk0)"
    return f"execute_{tokens}_context_0(sq0sk0)_generation_{requests}(sq{requests}sk{context})"


def _serving_program(ctx: RankCtx, k: Knobs, tp: ProcessGroup) -> Program:
    em = Emitter(ctx)
    h, t = k.hidden, len(tp.ranks)
    context = k.seq_len
    for it, (kind, tokens, requests) in enumerate(iteration_plan(k)):
        ctx.step = k.first_step + it
        with ctx.op(iteration_name(kind, tokens, requests, k, context), cat="user_annotation", pre=30_000,
                    post=10_000) as ev:
            ctx.iteration_events.append((ev, k.first_step + it))
            last: GpuOp | None = None
            s_q = k.seq_len if kind == "prefill" else 1
            for _layer in range(k.layers):
                s = layer_seqs(ctx, ("ln", "qkv", "attn", "proj", "ln2", "fc1", "gelu", "fc2"))
                ln_qkv(em, tokens, h, s, [last] if last is not None else [], t)
                em.sdpa(requests, k.heads // t, s_q, h // k.heads, causal=(kind == "prefill"), seq=s["attn"])
                proj = em.linear(tokens, h // t, h, bias=True, seq=s["proj"])
                ar = _engine_allreduce(ctx, tp, tokens * h, [proj])
                em.add_(tokens, h).waits.append(ar)
                fc2 = mlp(em, tokens, h, s, t)
                ar = _engine_allreduce(ctx, tp, tokens * h, [fc2])
                last = em.add_(tokens, h)
                last.waits.append(ar)
            with ctx.op("aten::copy_", dims=[[requests], [requests], []], types=["long int", "long int", "Scalar"]):
                ctx.memcpy("DtoH", 8 * requests, COMPUTE_STREAM, phase="io")  # sampled token ids to the host
                yield ctx.sync("cudaStreamSynchronize")
            context += 1 if kind == "decode" else 0


def build_serving(k: Knobs) -> Built:
    sim = _new_sim(k)
    world = tuple(range(k.ranks))
    default = ProcessGroup("0", "default_pg", world, STREAM_DP)
    # vLLM's GroupCoordinators: a device (NCCL) group for the world and for TP, all 'undefined'; the
    # TP traffic itself goes through the engine's custom all-reduce, which torch never sees
    groups = [default] + [ProcessGroup(str(i), "undefined", world, STREAM_DP + i) for i in (1, 2)]
    tp = ProcessGroup("3", "undefined", tuple(range(k.tp)), STREAM_TP, "tp",
                      "custom all-reduce after attention and MLP of every layer, in every engine iteration")
    sim.run([_serving_program(c, k, tp) for c in sim.ranks])
    return Built(sim, [groups + [tp] for _ in range(k.ranks)], k, "serving", layer_params(k.hidden, k.tp))


def build_scenario(scenario: str, k: Knobs) -> Built:
    """Any scenario: the ones above here, the others by :func:`traceread.simulate.scenarios.build`."""
    if scenario not in ("cp", "ep_renamed", "serving"):
        return build(scenario, k)
    k.validate(scenario)
    if scenario == "cp":
        return build_cp(k)
    if scenario == "ep_renamed":
        return build_ep_renamed(k)
    return build_serving(k)
