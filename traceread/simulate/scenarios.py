"""The simulated training jobs: DDP/FSDP, tensor parallel, pipeline parallel, slow steps.

Each scenario builds one host *program* per rank (see :mod:`traceread.simulate.schedule`) and
returns the finished :class:`~traceread.simulate.schedule.Simulation` plus the process groups each
rank knows. The model is a GPT-style decoder block repeated ``layers`` times (LN, QKV, causal flash
attention, out-proj, residual add, LN, MLP with GELU, residual add) on bf16 activations
``[batch·seq_len, hidden]``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

from traceread.simulate import memory as mem
from traceread.simulate.comm import ProcessGroup, all_to_all, collective, gloo_allreduce, p2p
from traceread.simulate.devices import get_device
from traceread.simulate.layers import COMPUTE_STREAM, Emitter
from traceread.simulate.memory import Allocator, Handle
from traceread.simulate.schedule import GpuOp, Program, RankCtx, Simulation

SCENARIOS: dict[str, str] = {
    "ddp": "Data parallel (DDP bucketed all-reduce, or --comm fsdp: all-gather/reduce-scatter) overlapping "
           "backward on a separate NCCL stream; optional straggler ranks (slow GPU or late host).",
    "tp": "Tensor parallel all-reduce per transformer block inside TP groups, plus DP gradient all-reduce "
          "across TP groups (two process groups besides the default one).",
    "pp": "Pipeline parallel: P stages x M microbatches, GPipe, 1F1B or interleaved 1F1B schedule, send/recv between adjacent "
          "stages, optional unequal stage times; truth carries the bubble and its theory.",
    "slow_steps": "DDP where chosen steps suffer a data-loader stall, a GC pause or a checkpoint write.",
    "3d": "DP x TP x PP (default 2 x 4 x 2 = 16 ranks, 6 GPUs per node, so one TP group spans two nodes and "
          "its per-layer all-reduces run over InfiniBand); generic process-group descriptions ('undefined').",
    "fsdp_exposed": "FSDP without prefetch: each layer's parameter all-gather starts only after the previous "
                    "layer's compute, so it is exposed on the critical path.",
    "moe": "Mixture of experts: expert-parallel all-to-all dispatch/combine around the expert MLP; one "
           "overloaded expert rank (--hot-rank, --hot-factor) makes the others wait in the all-to-all.",
    "custom_allreduce": "Tensor parallel whose per-layer all-reduce is a non-NCCL kernel (torch symmetric-memory "
                        "multimem one-shot, or vLLM cross_device_reduce_1stage) under c10d::allreduce_.",
    "host_bound": "DDP with a slow data loader on every step: the GPU idles before each step's first kernel "
                  "because the CPU launches it late.",
    "ddp_buffers": "DDP with broadcast_buffers: a buffer broadcast on the gradient group at the start of every "
                   "forward, so the group's calls span the whole step although it only reduces gradients.",
    "tp_sp": "Tensor parallel with sequence parallelism (all-gather before and reduce-scatter after each TP "
             "region, forward and backward) x DP; generic process-group descriptions ('undefined').",
    "cp": "Context parallel ring attention: keys/values rotate one way around each CP group (send to the next "
          "rank, receive from the previous) in every attention layer, forward and backward, x DP; generic "
          "descriptions.",
    "ep_renamed": "Mixture of experts whose token exchange runs in an in-house DeepEP fork "
                  "(acme::ep::intranode::notify_dispatch / dispatch / combine kernels, no c10d op, no comm args).",
    "serving": "An inference engine serving requests with tensor parallelism: engine iterations (vLLM-style "
               "'execute_…_context_…_generation_…' annotations, no ProfilerStep), one prefill then decodes, "
               "per-layer custom all-reduce under vllm::all_reduce with no process group recorded.",
    "gloo_host": "DDP over gloo on CUDA tensors: after backward each gradient bucket is copied to the host and "
                 "all-reduced there (gloo:all_reduce on a worker thread) while the GPU idles.",
}

#: Knob defaults of each scenario (the user's knobs win).
SCENARIO_DEFAULTS: dict[str, dict[str, object]] = {
    "3d": {"ranks": 16, "tp": 4, "pp": 2, "gpus_per_node": 6, "microbatches": 4, "batch": 1, "layers": 2,
           "hidden": 2048, "heads": 16},
    "fsdp_exposed": {"comm": "fsdp", "prefetch": False, "ranks": 8},
    "moe": {"ranks": 8, "layers": 2, "hot_factor": 3.0, "seq_len": 1024},
    "custom_allreduce": {"ranks": 8, "tp": 4, "allreduce_kernel": "multimem"},
    "host_bound": {"ranks": 4, "layers": 2, "hidden": 2048, "heads": 16, "seq_len": 1024, "loader_us": 6000.0},
    "ddp_buffers": {"ranks": 4, "layers": 2, "broadcast_buffers": True},
    "tp_sp": {"ranks": 8, "tp": 4, "layers": 2, "sequence_parallel": True},
    "cp": {"ranks": 8, "cp": 4, "layers": 2, "seq_len": 4096},
    "ep_renamed": {"ranks": 8, "layers": 2, "hot_factor": 1.0, "seq_len": 1024, "ep_kernels": "renamed"},
    "serving": {"ranks": 2, "tp": 2, "layers": 2, "steps": 6, "batch": 8, "seq_len": 512, "first_step": 0},
    "gloo_host": {"ranks": 2, "layers": 2, "hidden": 1024, "heads": 16, "seq_len": 512, "buckets": 2},
}

#: Scenarios that can record memory (``--memory``): the data-parallel program (DDP or FSDP).
MEMORY_SCENARIOS = ("ddp", "slow_steps", "fsdp_exposed", "host_bound")

STREAM_DP = 13  # NCCL stream of the data-parallel / default group
STREAM_TP = 17
STREAM_EP = 19
P2P_STREAMS = {"recv_act": 21, "send_act": 25, "recv_grad": 29, "send_grad": 33}
SLOW_CAUSES = ("dataloader", "gc", "checkpoint")
#: ``host_spans`` kinds: ``loader`` (inside the DataLoader span, half of it inside a ``dataset/decode``
#: annotation), ``annotation`` (a ``record_function``), ``nested`` (an annotation, its second half inside
#: an inner annotation), ``sync`` (an annotation, its second half inside ``aten::item`` →
#: ``aten::_local_scalar_dense``), ``checkpoint`` (``checkpoint.save``), ``gc`` (a Python GC event),
#: ``bare`` (no span at all: only ``ProfilerStep#N`` covers it).
HOST_SPAN_KINDS = ("loader", "annotation", "nested", "sync", "checkpoint", "gc", "bare")
TP_EVIDENCE = "activation all-reduce after attention and MLP of every layer, forward and backward"
DP_EVIDENCE = "one gradient all-reduce per layer in backward, overlapping it"
PP_EVIDENCE = "send/recv of activations and gradients between adjacent pipeline stages"


@dataclass
class Knobs:
    """Every scenario knob, with the defaults of the sample traces."""

    ranks: int = 8
    steps: int = 3
    device: str = "H100"
    seed: int = 0
    jitter: float = 0.01  # relative sd of compute-kernel durations (0 = perfectly regular)
    host_speed: float = 1.0  # multiplier on every host-side duration
    layers: int = 4
    hidden: int = 4096
    heads: int = 32
    seq_len: int = 2048
    batch: int = 2
    first_step: int = 10
    buckets: int = 4
    comm: str = "allreduce"  # ddp: allreduce | fsdp
    stragglers: list[tuple[int, float, str]] = field(default_factory=list)  # (rank, delay_us, gpu|host)
    tp: int = 2
    microbatches: int = 4
    schedule: str = "1f1b"  # gpipe | 1f1b | interleaved
    chunks: int = 2  # interleaved: model chunks (virtual stages) per pipeline rank
    p2p_us: float | None = None  # fixed send/recv transfer time; None = bandwidth model
    stage_factors: list[float] | None = None  # per-stage compute-time multipliers (pp)
    optimizer: bool = True
    slow_steps: list[tuple[int, str, float]] = field(default_factory=list)  # (step number, cause, us)
    hosts: int = 1
    skew_us: float = 0.0
    gpus_per_node: int | None = None  # ranks per node (consecutive); None = ranks / hosts
    pp: int = 2  # 3d: pipeline stages (dp = ranks / (tp * pp))
    prefetch: bool = True  # fsdp: all-gather the next layer's parameters ahead of its compute
    hot_rank: int | None = None  # moe: the overloaded expert rank (None: rank min(3, ranks - 1))
    hot_factor: float = 3.0  # moe: tokens routed to the hot rank's expert, x the fair share
    allreduce_kernel: str = "nccl"  # tp/custom_allreduce TP all-reduce: nccl | multimem | vllm
    loader_us: float = 0.0  # every step: extra data-loader time on the host before the batch is copied
    memory: bool = False  # ddp family: record [memory] events (profile_memory) and write a memory snapshot per rank
    leak_bytes: int = 0  # memory: bytes each step keeps alive for good (losses.append(loss))
    act_factors: list[tuple[int, float]] = field(default_factory=list)  # memory: (rank, x activation bytes)
    broadcast_buffers: bool = False  # ddp: DDP broadcasts buffers (e.g. BatchNorm statistics) at forward start
    sequence_parallel: bool = False  # tp: reduce-scatter/all-gather around TP regions instead of all-reduce
    cp: int = 4  # cp: ranks per context-parallel ring
    ep_kernels: str = "nccl"  # moe: nccl (all_to_all_single) | renamed (an in-house DeepEP fork's kernels)
    host_jitter_us: float = 0.0  # every rank and step: a random host delay, uniform in [0, this) (noise, no straggler)
    # host work inside recorded spans, at the start of a step (before the batch is copied, so the GPU waits):
    # (rank, step (-1: every step), kind, µs); kinds in HOST_SPAN_KINDS (span_truth.py names what each records)
    host_spans: list[tuple[int, int, str, float]] = field(default_factory=list)

    def per_node(self) -> int:
        """Ranks per node (consecutive blocks)."""
        return self.gpus_per_node or self.ranks // self.hosts

    def node_count(self) -> int:
        return -(-self.ranks // self.per_node())

    def step_numbers(self) -> list[int]:
        return list(range(self.first_step, self.first_step + self.steps))

    def validate(self, scenario: str) -> None:
        if scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {scenario!r}; choose one of {', '.join(SCENARIOS)}")
        get_device(self.device)
        if self.ranks < 1 or self.steps < 1:
            raise ValueError("ranks and steps must be >= 1")
        if self.hosts < 1 or self.ranks % self.hosts:
            raise ValueError(f"--hosts {self.hosts} must divide --ranks {self.ranks}")
        if self.hidden % self.heads:
            raise ValueError("hidden must be a multiple of heads")
        for r, _, cause in self.stragglers:  # (rank, delay_us, cause)
            if not 0 <= r < self.ranks:
                raise ValueError(f"straggler rank {r} outside 0..{self.ranks - 1}")
            if cause not in ("gpu", "host"):
                raise ValueError(f"straggler cause {cause!r} must be gpu or host")
            if _ < 0:
                raise ValueError("--straggler-delay-us must be >= 0")
        for s, cause, _ in self.slow_steps:
            if s not in self.step_numbers():
                raise ValueError(f"slow step {s} is not one of the simulated steps {self.step_numbers()}")
            if cause not in SLOW_CAUSES:
                raise ValueError(f"slow-step cause {cause!r} must be one of {', '.join(SLOW_CAUSES)}")
        if scenario in ("tp", "pp", "3d", "moe", "custom_allreduce", "tp_sp", "cp", "ep_renamed", "serving") and any(
                c != "dataloader" for _, c, _ in self.slow_steps):
            raise ValueError("tp/pp support only dataloader slow steps; use ddp or slow_steps for gc/checkpoint")
        if scenario in ("tp", "custom_allreduce") and (self.ranks % self.tp or self.heads % self.tp):
            raise ValueError(f"--tp {self.tp} must divide --ranks {self.ranks} and the head count {self.heads}")
        if scenario == "pp":
            if self.ranks < 2:
                raise ValueError("pp needs at least 2 ranks (stages)")
            if self.schedule not in ("gpipe", "1f1b", "interleaved"):
                raise ValueError("--schedule must be gpipe, 1f1b or interleaved")
            if self.schedule == "interleaved" and (self.chunks < 1 or self.microbatches % self.ranks):
                raise ValueError(f"interleaved needs --chunks >= 1 and --microbatches a multiple of --ranks {self.ranks}")
            if self.stage_factors is not None and len(self.stage_factors) != self.ranks:
                raise ValueError(f"--stage-factors needs {self.ranks} values (one per stage)")
        if self.comm not in ("allreduce", "fsdp"):
            raise ValueError("--comm must be allreduce or fsdp")
        if self.gpus_per_node is not None and (self.gpus_per_node < 1 or self.hosts != 1):
            raise ValueError("--gpus-per-node must be >= 1 and cannot be combined with --hosts")
        if scenario == "3d" and (self.ranks % (self.tp * self.pp) or self.heads % self.tp or self.pp < 2
                                 or self.schedule == "interleaved"):
            raise ValueError(f"3d needs --tp x --pp dividing --ranks {self.ranks}, --tp dividing the heads, "
                             "--pp >= 2 and a gpipe or 1f1b schedule")
        if scenario == "moe" and self.hot_rank is not None and not 0 <= self.hot_rank < self.ranks:
            raise ValueError(f"--hot-rank {self.hot_rank} outside 0..{self.ranks - 1}")
        if self.allreduce_kernel not in ("nccl", "multimem", "vllm"):
            raise ValueError("--allreduce-kernel must be nccl, multimem or vllm")
        if self.loader_us < 0:
            raise ValueError("--loader-us must be >= 0")
        if (self.memory or self.leak_bytes or self.act_factors) and scenario not in MEMORY_SCENARIOS:
            raise ValueError(f"--memory is simulated for {', '.join(MEMORY_SCENARIOS)} (data parallel / FSDP)")
        if (self.leak_bytes or self.act_factors) and not self.memory:
            raise ValueError("--leak-bytes and --activation-factor need --memory")
        if self.leak_bytes < 0:
            raise ValueError("--leak-bytes must be >= 0")
        for r, f in self.act_factors:
            if not 0 <= r < self.ranks or f <= 0:
                raise ValueError(f"--activation-factor {r}:{f}: rank outside 0..{self.ranks - 1} or factor <= 0")
        if self.memory and self.comm == "fsdp" and (layer_params(self.hidden) % self.ranks):
            raise ValueError(f"--memory with --comm fsdp: --ranks {self.ranks} must divide a layer's parameters")
        if scenario == "cp" and (self.cp < 2 or self.ranks % self.cp or self.seq_len % self.cp):
            raise ValueError(f"cp needs --cp >= 2 dividing --ranks {self.ranks} and --seq-len {self.seq_len}")
        if scenario == "tp_sp" and (self.ranks % self.tp or self.heads % self.tp):
            raise ValueError(f"--tp {self.tp} must divide --ranks {self.ranks} and the head count {self.heads}")
        if scenario == "serving" and (self.ranks != self.tp or self.heads % self.tp):
            raise ValueError(f"serving: --tp {self.tp} must equal --ranks {self.ranks} and divide the head count")
        if self.ep_kernels not in ("nccl", "renamed"):
            raise ValueError("--ep-kernels must be nccl or renamed")
        if self.host_jitter_us < 0:
            raise ValueError("--host-jitter-us must be >= 0")
        for r, st, kind, us in self.host_spans:
            if not 0 <= r < self.ranks or (st != -1 and st not in self.step_numbers()) or us < 0:
                raise ValueError(f"host span ({r}, {st}, {kind}, {us}): rank outside 0..{self.ranks - 1}, step not "
                                 f"-1 or one of {self.step_numbers()}, or negative time")
            if kind not in HOST_SPAN_KINDS:
                raise ValueError(f"host span kind {kind!r} must be one of {', '.join(HOST_SPAN_KINDS)}")


@dataclass
class Built:
    """A finished simulation and what the writer/truth need to know about it."""

    sim: Simulation
    pgs: list[list[ProcessGroup]]  # per rank: the groups in its distributedInfo.pg_config
    knobs: Knobs
    scenario: str
    layer_params: int


def layer_params(h: int, tp: int = 1) -> int:
    """Parameters of one decoder block on one TP rank: QKV (no bias), out-proj, fc1, fc2 (+biases), 2 LNs."""
    return (3 * h * h + h * h + h + 4 * h * h + 4 * h + 4 * h * h + h) // tp + 4 * h


# ---- shared pieces of a training step ----------------------------------------------------------------


def _step_open(ctx: RankCtx, k: Knobs, step: int, host_extra_ns: int, dl_extra_ns: int) -> GpuOp:
    """Data loader, any host-side delay, and the H2D copy of the token batch (int64 [B, S])."""
    mine = [(kind, int(us * 1000)) for r, st, kind, us in k.host_spans if r == ctx.rank and st in (-1, step)]
    with ctx.op("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", cat="user_annotation",
                pre=60_000, post=20_000):
        ctx.advance(dl_extra_ns + host_extra_ns)
        for kind, ns in mine:
            if kind == "loader":  # the dataset's own work: half bare, half inside its annotation
                ctx.advance(ns // 2)
                with ctx.op("dataset/decode", cat="user_annotation", pre=1_000, post=1_000):
                    ctx.advance(ns - ns // 2)
    _host_span_work(ctx, [(kind, ns) for kind, ns in mine if kind != "loader"])
    with ctx.op("aten::to", dims=[[k.batch, k.seq_len], [], [], [], []], types=["long int", "", "", "", ""],
                concrete=["", "", "", "True", "False"], pre=3_000):
        with ctx.op("aten::_to_copy", dims=[[k.batch, k.seq_len], [], [], [], [], [], []],
                    types=["long int", "", "", "", "", "", ""], pre=3_000):
            with ctx.op("aten::copy_", dims=[[k.batch, k.seq_len], [k.batch, k.seq_len], []],
                        types=["long int", "long int", "Scalar"], pre=2_000):
                return ctx.memcpy("HtoD", 8 * k.batch * k.seq_len, COMPUTE_STREAM)


def _host_span_work(ctx: RankCtx, work: list[tuple[str, int]]) -> None:
    """The ``host_spans`` knob's host work of this rank and step (kinds: :data:`HOST_SPAN_KINDS`)."""
    for kind, ns in work:
        if kind == "annotation":
            with ctx.op("train/user_block", cat="user_annotation", pre=1_000, post=1_000):
                ctx.advance(ns)
        elif kind in ("nested", "sync"):
            with ctx.op("train/outer_block" if kind == "nested" else "train/report", cat="user_annotation",
                        pre=1_000, post=1_000):
                ctx.advance(ns // 2)
                if kind == "nested":
                    with ctx.op("train/inner_block", cat="user_annotation", pre=1_000, post=1_000):
                        ctx.advance(ns - ns // 2)
                else:
                    with ctx.op("aten::item", dims=[[]], types=["float"], pre=1_000, post=1_000):
                        with ctx.op("aten::_local_scalar_dense", dims=[[]], types=["float"], pre=1_000, post=1_000):
                            ctx.advance(ns - ns // 2)
        elif kind == "checkpoint":
            with ctx.op("checkpoint.save", cat="user_annotation", pre=1_000, post=1_000):
                ctx.advance(ns)
        elif kind == "gc":
            with ctx.op("Python GC", cat="python_function", pre=1_000, post=1_000):
                ctx.advance(ns)
        else:  # bare: Python with nothing recorded
            ctx.advance(ns)


def _step_close(ctx: RankCtx, k: Knobs, loss_on_this_rank: bool = True) -> Program:
    """``loss.item()`` (DtoH copy + stream sync) closing the step: the host waits for its GPU here."""
    if loss_on_this_rank:
        with ctx.op("aten::item", dims=[[]], types=["float"], pre=2_000):
            with ctx.op("aten::_local_scalar_dense", dims=[[]], types=["float"], pre=2_000):
                ctx.memcpy("DtoH", 4, COMPUTE_STREAM, phase="io")
                yield ctx.sync("cudaStreamSynchronize")
    else:
        yield ctx.sync("cudaDeviceSynchronize")


def _profiled_steps(ctx: RankCtx, k: Knobs) -> Iterator[GpuOp]:
    """The steps of a training program that opens each the same way: inside ``ProfilerStep#N``, the
    data loader, host delays and the batch's H2D copy, which is yielded (the first layer waits for it);
    the caller's step body runs while the step's annotation is open."""
    for step in k.step_numbers():
        ctx.step = step
        host_extra, dl, _, _ = _host_delays(k, ctx.rank, step)
        with ctx.op(f"ProfilerStep#{step}", cat="user_annotation", pre=15_000, post=10_000):
            yield _step_open(ctx, k, step, host_extra, dl)


def _adamw_after(ctx: RankCtx, em: Emitter, params: int, tensors: int, grads: list[GpuOp]) -> None:
    """The optimizer step: the compute stream waits for the gradient collectives, then fused AdamW."""
    ctx.runtime("cudaStreamWaitEvent", 147, 1_500)
    em.adamw(params, tensors=tensors)[0].waits.extend(grads)


def layer_seqs(ctx: RankCtx, names: tuple[str, ...]) -> dict[str, int]:
    """One sequence number per op of a layer, in order (backward ops reuse their forward's)."""
    return {n: ctx.next_seq() for n in names}


def ln_qkv(em: Emitter, m: int, h: int, s: dict[str, int], waits: list[GpuOp], tp: int = 1) -> None:
    """A layer's LayerNorm (waiting for ``waits``) and fused QKV projection (no bias; 1/tp of the heads)."""
    em.layer_norm(m, h, seq=s["ln"]).waits.extend(waits)
    em.linear(m, h, 3 * h // tp, bias=False, seq=s["qkv"])


def qkv_ln_backward(em: Emitter, m: int, h: int, s: dict[str, int]) -> None:
    """The backward of :func:`ln_qkv` (tp = 1)."""
    em.linear_backward(m, h, 3 * h, bias=False, seq=s["qkv"])
    em.layer_norm_backward(m, h, seq=s["ln"])


def mlp(em: Emitter, m: int, h: int, s: dict[str, int], tp: int = 1) -> GpuOp:
    """A layer's second LayerNorm and dense MLP (fc1 4h/tp, GELU, fc2); the fc2 GEMM."""
    em.layer_norm(m, h, seq=s["ln2"])
    em.linear(m, h, 4 * h // tp, bias=True, seq=s["fc1"])
    em.gelu(m, 4 * h // tp, seq=s["gelu"])
    return em.linear(m, 4 * h // tp, h, bias=True, seq=s["fc2"])


class Block:
    """Forward and backward of one decoder block on one rank (optionally tensor-parallel)."""

    def __init__(self, em: Emitter, k: Knobs, m: int, batch: int, tp: int = 1,
                 tp_pg: ProcessGroup | None = None, act_factor: float = 1.0) -> None:
        self.em, self.k, self.m, self.batch, self.tp, self.tp_pg = em, k, m, batch, tp, tp_pg
        self.seqs: dict[str, int] = {}
        self.act_factor = act_factor
        self.saved: list[Handle] = []  # activations saved for backward (memory scenarios)
        self.temps: list[Handle] = []

    def _act(self, width: int, where: dict[str, object]) -> None:
        """The next op's output [m, width] in bf16, saved for backward (allocated only with an allocator)."""
        if self.em.ctx.mem is None:
            return
        n = int(round(2 * self.m * width * self.act_factor))
        self.saved.append(self.em.ctx.alloc_next(Handle(n, [where, mem.MODULE_CALL, mem.TRAIN_STEP_FWD], "activation")))

    def _temp(self, width: int) -> None:
        """A gradient buffer [m, width] the next backward op allocates, freed when the layer's backward ends."""
        if self.em.ctx.mem is None:
            return
        n = int(round(2 * self.m * width * self.act_factor))
        self.temps.append(self.em.ctx.alloc_next(Handle(n, [mem.AUTOGRAD, mem.TRAIN_STEP_BWD], "backward_temp")))

    def _tp_allreduce(self, last: GpuOp, phase: str) -> GpuOp:
        """After a row-parallel linear: all-reduce of the activations, or with sequence parallelism a
        reduce-scatter of them along the sequence."""
        assert self.tp_pg is not None
        if self.k.sequence_parallel:
            return collective(self.em.ctx, self.tp_pg, "_reduce_scatter_base", self.m * self.k.hidden, waits=[last],
                              phase=phase)
        return collective(self.em.ctx, self.tp_pg, "allreduce", self.m * self.k.hidden, waits=[last], phase=phase,
                          kernel=self.k.allreduce_kernel)

    def _sp_gather(self, gemm: Callable[[], GpuOp]) -> None:
        """Run ``gemm`` (a linear); with sequence parallelism, first all-gather the sequence-sharded
        activations (forward, before a column-parallel linear) or gradient (backward, before a
        row-parallel one): the GEMM waits for the gather, which waits for the work before it."""
        ctx = self.em.ctx
        before = ctx.streams[COMPUTE_STREAM][-1] if ctx.streams.get(COMPUTE_STREAM) else None
        op = gemm()
        if self.tp > 1 and self.k.sequence_parallel:
            assert self.tp_pg is not None
            op.waits.append(collective(ctx, self.tp_pg, "_allgather_base", self.m * self.k.hidden,
                                       waits=[before] if before is not None else [], phase="comm"))

    def forward(self, first_waits: list[GpuOp] | None = None, phase: str = "fwd") -> GpuOp:
        em, k, m, tp = self.em, self.k, self.m, self.tp
        h, ctx = k.hidden, self.em.ctx
        s = {n: ctx.next_seq() for n in ("ln1", "qkv", "attn", "proj", "add1", "ln2", "fc1", "gelu", "fc2", "add2")}
        self.seqs = s
        self._act(h, mem.MODEL_BLOCK)
        first = em.layer_norm(m, h, seq=s["ln1"], phase=phase)
        if first_waits:
            first.waits.extend(first_waits)
        self._act(3 * h // tp, mem.MODEL_ATTN)
        self._sp_gather(lambda: em.linear(m, h, 3 * h // tp, bias=False, seq=s["qkv"], phase=phase))
        self._act(h // tp, mem.MODEL_ATTN)
        em.sdpa(self.batch, k.heads // tp, k.seq_len, h // k.heads, causal=True, seq=s["attn"], phase=phase)
        self._act(h, mem.MODEL_ATTN)
        last = em.linear(m, h // tp, h, bias=True, seq=s["proj"], phase=phase)
        waits = [self._tp_allreduce(last, "comm")] if tp > 1 else None
        add = em.add_(m, h, phase=phase)
        if waits:
            add.waits.extend(waits)
        self._act(h, mem.MODEL_BLOCK)
        em.layer_norm(m, h, seq=s["ln2"], phase=phase)
        self._act(4 * h // tp, mem.MODEL_MLP)
        self._sp_gather(lambda: em.linear(m, h, 4 * h // tp, bias=True, seq=s["fc1"], phase=phase))
        self._act(4 * h // tp, mem.MODEL_MLP)
        em.gelu(m, 4 * h // tp, seq=s["gelu"], phase=phase)
        self._act(h, mem.MODEL_MLP)
        last = em.linear(m, 4 * h // tp, h, bias=True, seq=s["fc2"], phase=phase)
        waits = [self._tp_allreduce(last, "comm")] if tp > 1 else None
        out = em.add_(m, h, phase=phase)
        if waits:
            out.waits.extend(waits)
        return out

    def backward(self, first_waits: list[GpuOp] | None = None, phase: str = "bwd") -> GpuOp:
        em, k, m, tp, s = self.em, self.k, self.m, self.tp, self.seqs
        h = k.hidden
        self._temp(h)
        first = em.add_backward(m, h, seq=s["add2"], phase=phase)
        if first_waits:
            first.waits.extend(first_waits)
        self._temp(4 * h // tp)
        self._sp_gather(lambda: em.linear_backward(m, 4 * h // tp, h, bias=True, seq=s["fc2"], phase=phase)[0])
        em.gelu_backward(m, 4 * h // tp, seq=s["gelu"], phase=phase)
        last = em.linear_backward(m, h, 4 * h // tp, bias=True, seq=s["fc1"], phase=phase)[0]
        waits = [self._tp_allreduce(last, "comm")] if tp > 1 else None
        ln = em.layer_norm_backward(m, h, seq=s["ln2"], phase=phase)
        if waits:
            ln.waits.extend(waits)
        em.add_backward(m, h, seq=s["add1"], phase=phase)
        self._sp_gather(lambda: em.linear_backward(m, h // tp, h, bias=True, seq=s["proj"], phase=phase)[0])
        em.sdpa_backward(self.batch, k.heads // tp, k.seq_len, h // k.heads, causal=True, seq=s["attn"], phase=phase)
        last = em.linear_backward(m, h, 3 * h // tp, bias=False, seq=s["qkv"], phase=phase)[0]
        waits = [self._tp_allreduce(last, "comm")] if tp > 1 else None
        out = em.layer_norm_backward(m, h, seq=s["ln1"], phase=phase)
        if waits:
            out.waits.extend(waits)
        em.ctx.free(*self.temps, *reversed(self.saved))  # the layer's gradient buffers and saved activations
        self.temps, self.saved = [], []
        return out


def _last_compute(ctx: RankCtx) -> GpuOp:
    return ctx.streams[COMPUTE_STREAM][-1]


def _stream_order(ctx: RankCtx) -> list[GpuOp]:
    """c10d orders a NCCL op after the work already queued on the current stream (``syncStream``): a recv
    cannot start before the compute launched before it has run."""
    return [_last_compute(ctx)] if ctx.streams.get(COMPUTE_STREAM) else []


def _no_prefetch_waits(ctx: RankCtx, k: Knobs) -> list[GpuOp]:
    """FSDP without prefetch: the all-gather is issued from the layer's pre-hook on the compute stream's
    order, so it cannot start before the compute launched so far has finished (it is exposed)."""
    if k.prefetch or COMPUTE_STREAM not in ctx.streams:
        return []
    return [_last_compute(ctx)]


def _host_delays(k: Knobs, rank: int, step: int) -> tuple[int, int, int, int]:
    """(host straggler ns, data-loader stall ns, GC pause ns, checkpoint ns) for this rank and step."""
    host = sum(int(d * 1000) for r, d, c in k.stragglers if r == rank and c == "host")
    if k.host_jitter_us:  # its own generator: the other draws (kernel jitter, host costs) stay the same
        host += int(random.Random(f"{k.seed}:{rank}:{step}").uniform(0.0, k.host_jitter_us) * 1000)
    dl = int(k.loader_us * 1000)
    gc = ck = 0
    for s, cause, us in k.slow_steps:
        if s == step:
            if cause == "dataloader":
                dl += int(us * 1000)
            elif cause == "gc":
                gc += int(us * 1000)
            else:
                ck += int(us * 1000)
    return host, dl, gc, ck


def _checkpoint(ctx: RankCtx, k: Knobs, ns: int, params: int) -> Program:
    """``torch.save`` of the model: a DtoH copy of the weights, then the host writing the file."""
    nbytes = min(2 * params, int(ns * 12.0 * 0.5))  # half of the pause is the copy at 12 GB/s
    with ctx.op("aten::copy_", dims=[[params], [params], []], types=["c10::BFloat16", "c10::BFloat16", "Scalar"]):
        ctx.memcpy("DtoH", nbytes, COMPUTE_STREAM, phase="ckpt")
        yield ctx.sync("cudaStreamSynchronize")
    with ctx.op("checkpoint.save", cat="user_annotation", pre=10_000, post=5_000):
        ctx.advance(max(0, ns - int(nbytes / 12.0)))


# ---- data parallel ------------------------------------------------------------------------------------


def act_factor(k: Knobs, rank: int) -> float:
    """``--activation-factor`` of a rank (1 when not given): its activations are that much larger."""
    return next((f for r, f in reversed(k.act_factors) if r == rank), 1.0)


def training_state(k: Knobs, ranks: int) -> list[Handle]:
    """Weights, gradients and AdamW's two moments of every layer on one rank, allocated before the
    window: bf16 weights and gradients (2 bytes per parameter each) and fp32 moments (4 + 4), sharded
    over the ranks with FSDP (``--comm fsdp``, ZeRO-3), whole with DDP."""
    shard = ranks if k.comm == "fsdp" else 1
    p = layer_params(k.hidden) // shard
    out: list[Handle] = []
    for _ in range(k.layers):
        out.append(Handle(2 * p, [mem.TRAIN_INIT], "weights"))
        out.append(Handle(2 * p, [mem.AUTOGRAD, mem.TRAIN_STEP_BWD], "gradients"))
        if k.optimizer:
            out += [Handle(4 * p, [mem.ADAMW, mem.TRAIN_OPT], "optimizer_state") for _ in range(2)]
    return out


def _ddp_program(ctx: RankCtx, k: Knobs, dp: ProcessGroup) -> Program:
    em = Emitter(ctx)
    m = k.batch * k.seq_len
    params_layer = layer_params(k.hidden)
    n = len(dp.ranks)
    af = act_factor(k, ctx.rank)

    def gathered(phase_frame: dict[str, object]) -> Handle:
        """FSDP: the layer's whole bf16 parameters, all-gathered for its forward or backward."""
        return ctx.alloc_next(Handle(2 * params_layer, [mem.FSDP_UNSHARD, mem.MODULE_CALL, phase_frame],
                                     "gathered_params"))
    nb = max(1, min(k.buckets, k.layers))
    # bucket b holds the layers whose gradients become ready b-th (backward runs last layer first)
    order = list(reversed(range(k.layers)))
    bucket_of = {layer: min(i * nb // k.layers, nb - 1) for i, layer in enumerate(order)}
    for step in k.step_numbers():
        ctx.step = step
        host_extra, dl, gc, ck = _host_delays(k, ctx.rank, step)
        with ctx.op(f"ProfilerStep#{step}", cat="user_annotation", pre=15_000, post=10_000):
            batch = ctx.alloc_next(Handle(8 * k.batch * k.seq_len, [mem.TRAIN_BATCH], "batch"))
            h2d = _step_open(ctx, k, step, host_extra, dl)
            blocks = [Block(em, k, m, k.batch, act_factor=af) for _ in range(k.layers)]
            ag: dict[int, GpuOp] = {}
            ag_mem: dict[int, Handle] = {}
            with ctx.op("DistributedDataParallel.forward" if k.comm == "allreduce" else "FSDP::pre_forward",
                        cat="user_annotation", pre=20_000):
                bcast = None
                if k.broadcast_buffers:  # DDP._sync_buffers: rank 0's buffers to everyone, before the forward
                    bcast = collective(ctx, dp, "broadcast", 4 * k.hidden * k.layers, waits=[h2d], phase="comm")
                for i, blk in enumerate(blocks):
                    waits: list[GpuOp] = [h2d] if i == 0 else []
                    if i == 0 and bcast is not None:
                        waits.append(bcast)
                    if k.comm == "fsdp":
                        for j in (i, i + 1) if k.prefetch else (i,):
                            if j < k.layers and j not in ag:
                                ag_mem[j] = gathered(mem.TRAIN_STEP_FWD)
                                ag[j] = collective(ctx, dp, "_allgather_base", params_layer,
                                                   waits=_no_prefetch_waits(ctx, k), phase="comm")
                        waits.append(ag[i])
                    if gc and i == 0:
                        ctx.advance(gc)  # gc.collect() on the host, no op recorded: nothing is launched meanwhile
                    blk.forward(waits)
                    ctx.free(ag_mem.pop(i, None))  # FSDP reshards after the layer's forward
                loss_seq = ctx.next_seq()
                if k.leak_bytes:
                    ctx.alloc_next(Handle(k.leak_bytes, [mem.TRAIN_LEAK], "leak"))  # never freed
                em.loss(m, k.hidden, seq=loss_seq)
            with ctx.thread(ctx.autograd_tid):
                em.loss_backward(m, k.hidden, seq=loss_seq)
                pending: list[int] = []
                comm_ops: list[GpuOp] = []
                ag_b: dict[int, GpuOp] = {}
                for idx, layer in enumerate(order):
                    waits = []
                    if k.comm == "fsdp":
                        for j in (layer, layer - 1) if k.prefetch else (layer,):
                            if j >= 0 and j not in ag_b:
                                ag_mem[j] = gathered(mem.TRAIN_STEP_BWD)
                                ag_b[j] = collective(ctx, dp, "_allgather_base", params_layer,
                                                     waits=_no_prefetch_waits(ctx, k), phase="comm")
                        waits.append(ag_b[layer])
                    blocks[layer].backward(waits)
                    if k.comm == "fsdp":
                        ctx.free(ag_mem.pop(layer, None))
                        unsharded = ctx.alloc_next(Handle(2 * params_layer, [mem.FSDP_REDUCE, mem.AUTOGRAD,
                                                                             mem.TRAIN_STEP_BWD], "unsharded_grads"))
                        comm_ops.append(collective(ctx, dp, "_reduce_scatter_base", params_layer,
                                                   waits=[_last_compute(ctx)], phase="comm"))
                        ctx.free(unsharded)
                        continue
                    pending.append(layer)
                    next_bucket = bucket_of[order[idx + 1]] if idx + 1 < len(order) else None
                    if next_bucket != bucket_of[layer]:
                        numel = params_layer * len(pending)
                        comm_ops.append(collective(ctx, dp, "allreduce", numel, waits=[_last_compute(ctx)],
                                                   phase="comm"))
                        pending = []
            if k.optimizer:
                shard = params_layer * k.layers // (n if k.comm == "fsdp" else 1)
                _adamw_after(ctx, em, shard, k.layers * 8, comm_ops)
            elif comm_ops:
                _last_compute(ctx).waits.extend(comm_ops)
            yield from _step_close(ctx, k)
            ctx.free(batch)
            if ck:
                yield from _checkpoint(ctx, k, ck, params_layer * k.layers)


def _with_memory(sim: Simulation, k: Knobs) -> None:
    """``--memory``: an allocator per rank, the training state allocated before the window."""
    if not k.memory:
        return
    for ctx in sim.ranks:
        ctx.mem = Allocator(ctx.device_id)
        ctx.mem.preallocate(training_state(k, k.ranks))


def _gloo_ddp_program(ctx: RankCtx, k: Knobs, dp: ProcessGroup) -> Program:
    """DDP whose process group is gloo while the model is on the GPU: after backward, each bucket is
    copied to the host (the host waits for the copy), all-reduced by gloo on the host, and copied back."""
    em = Emitter(ctx)
    m = k.batch * k.seq_len
    params_layer = layer_params(k.hidden)
    nb = max(1, min(k.buckets, k.layers))
    per_bucket = params_layer * k.layers // nb
    for h2d in _profiled_steps(ctx, k):
        blocks = [Block(em, k, m, k.batch) for _ in range(k.layers)]
        with ctx.op("DistributedDataParallel.forward", cat="user_annotation", pre=20_000):
            for i, blk in enumerate(blocks):
                blk.forward([h2d] if i == 0 else [])
            loss_seq = ctx.next_seq()
            em.loss(m, k.hidden, seq=loss_seq)
        with ctx.thread(ctx.autograd_tid):
            em.loss_backward(m, k.hidden, seq=loss_seq)
            for layer in reversed(range(k.layers)):
                blocks[layer].backward()
        back: list[GpuOp] = []
        for _ in range(nb):
            with ctx.op("aten::copy_", dims=[[per_bucket], [per_bucket], []],
                        types=["c10::BFloat16", "c10::BFloat16", "Scalar"]):
                ctx.memcpy("DtoH", 2 * per_bucket, COMPUTE_STREAM, phase="comm")
                yield ctx.sync("cudaStreamSynchronize")
            yield gloo_allreduce(ctx, dp, per_bucket)
            with ctx.op("aten::copy_", dims=[[per_bucket], [per_bucket], []],
                        types=["c10::BFloat16", "c10::BFloat16", "Scalar"]):
                back.append(ctx.memcpy("HtoD", 2 * per_bucket, COMPUTE_STREAM, phase="comm"))
        if k.optimizer:
            _adamw_after(ctx, em, params_layer * k.layers, k.layers * 8, back)
        yield from _step_close(ctx, k)


def build_gloo_host(k: Knobs) -> Built:
    sim = _new_sim(k)
    dp = ProcessGroup("0", "default_pg", tuple(range(k.ranks)), STREAM_DP, "dp",
                      f"{min(k.buckets, k.layers)} gradient all-reduces per step on the host (gloo)",
                      backend="cpu:gloo,cuda:gloo")
    _apply_gpu_stragglers(sim, k, lambda s: [_gloo_ddp_program(c, k, dp) for c in s.ranks])
    sim.run([_gloo_ddp_program(c, k, dp) for c in sim.ranks])
    return Built(sim, [[dp] for _ in range(k.ranks)], k, "gloo_host", layer_params(k.hidden))


def build_ddp(k: Knobs, scenario: str = "ddp") -> Built:
    sim = _new_sim(k)
    _with_memory(sim, k)
    if k.comm == "fsdp":
        dp = ProcessGroup("0", "default_pg", tuple(range(k.ranks)), STREAM_DP, "fsdp",
                          "per-layer parameter all-gather (forward and backward) + gradient reduce-scatter")
    else:
        dp = ProcessGroup("0", "default_pg", tuple(range(k.ranks)), STREAM_DP, "dp",
                          f"{min(k.buckets, k.layers)} gradient all-reduce buckets per step, in backward")
    _apply_gpu_stragglers(sim, k, lambda s: [_ddp_program(c, k, dp) for c in s.ranks])
    sim.run([_ddp_program(c, k, dp) for c in sim.ranks])
    return Built(sim, [[dp] for _ in range(k.ranks)], k, scenario, layer_params(k.hidden))


# ---- tensor parallel ----------------------------------------------------------------------------------


def _tp_groups(k: Knobs) -> tuple[ProcessGroup, list[ProcessGroup], list[ProcessGroup]]:
    world = ProcessGroup("0", "default_pg", tuple(range(k.ranks)), STREAM_DP)
    ntp = k.ranks // k.tp
    tp_groups = [ProcessGroup(str(1 + g), "mesh_tp", tuple(range(g * k.tp, (g + 1) * k.tp)), STREAM_TP, "tp",
                               TP_EVIDENCE) for g in range(ntp)]
    dp_groups = [ProcessGroup(str(1 + ntp + j), "mesh_dp", tuple(range(j, k.ranks, k.tp)), STREAM_DP + 2, "dp",
                              DP_EVIDENCE) for j in range(k.tp)]
    return world, tp_groups, dp_groups


def _tp_program(ctx: RankCtx, k: Knobs, tp_pg: ProcessGroup, dp_pg: ProcessGroup) -> Program:
    em = Emitter(ctx)
    m = k.batch * k.seq_len
    params_layer = layer_params(k.hidden, k.tp)
    dp_n = len(dp_pg.ranks)
    for h2d in _profiled_steps(ctx, k):
        blocks = [Block(em, k, m, k.batch, k.tp, tp_pg) for _ in range(k.layers)]
        for i, blk in enumerate(blocks):
            blk.forward([h2d] if i == 0 else None)
        loss_seq = ctx.next_seq()
        em.loss(m, k.hidden, seq=loss_seq)
        comm_ops: list[GpuOp] = []
        with ctx.thread(ctx.autograd_tid):
            em.loss_backward(m, k.hidden, seq=loss_seq)
            for layer in reversed(range(k.layers)):
                blocks[layer].backward()
                if dp_n > 1:
                    comm_ops.append(collective(ctx, dp_pg, "allreduce", params_layer,
                                               waits=[_last_compute(ctx)], phase="comm"))
        if k.optimizer:
            _adamw_after(ctx, em, params_layer * k.layers, k.layers * 8, comm_ops)
        yield from _step_close(ctx, k)


def build_tp(k: Knobs, scenario: str = "tp") -> Built:
    sim = _new_sim(k)
    world, tps, dps = _tp_groups(k)
    if scenario == "tp_sp":  # new_group without group_desc: roles must come from behaviour
        tps = [replace(g, desc="undefined", evidence="all-gather before and reduce-scatter after attention and MLP "
                                                       "of every layer, forward and backward") for g in tps]
        dps = [replace(g, desc="undefined") for g in dps]

    def programs(s: Simulation) -> list[Program]:
        return [_tp_program(c, k, tps[c.rank // k.tp], dps[c.rank % k.tp]) for c in s.ranks]

    _apply_gpu_stragglers(sim, k, programs)
    sim.run(programs(sim))
    pgs = [[world, tps[r // k.tp], dps[r % k.tp]] for r in range(k.ranks)]
    return Built(sim, pgs, k, scenario, layer_params(k.hidden, k.tp))


# ---- pipeline parallel --------------------------------------------------------------------------------


def pipeline_order(stage: int, stages: int, micro: int, schedule: str, chunks: int = 1) -> list[tuple[str, int, int]]:
    """The order one stage runs forward ('F', chunk, i) and backward ('B', chunk, i) of its microbatches.

    GPipe: all forwards, then all backwards in the same microbatch order. 1F1B (PipeDream-flush):
    ``stages - stage - 1`` warm-up forwards, then alternate one forward / one backward, then the
    remaining backwards. Interleaved 1F1B (Megatron-LM, ``chunks`` model chunks per stage, microbatches
    a multiple of stages): virtual microbatch k runs chunk ``(k // stages) % chunks`` (reversed for
    backward) of microbatch ``(k // (stages·chunks))·stages + k % stages``; warm-up
    ``2·(stages − stage − 1) + (chunks − 1)·stages`` forwards.
    """
    if schedule == "gpipe":
        return [("F", 0, i) for i in range(micro)] + [("B", 0, i) for i in range(micro)]
    if schedule == "1f1b":
        chunks = 1
    total = micro * chunks

    def virt(k: int, forward: bool) -> tuple[int, int]:
        c = (k // stages) % chunks
        i = (k // (stages * chunks)) * stages + k % stages
        return (c if forward else chunks - 1 - c), i

    if chunks == 1:
        warm = min(stages - stage - 1, micro)
    elif micro == stages:
        warm = total
    else:
        warm = min(2 * (stages - stage - 1) + (chunks - 1) * stages, total)
    order = [("F", *virt(k, True)) for k in range(warm)]
    f, b = warm, 0
    while f < total:
        order.append(("F", *virt(f, True)))
        f += 1
        order.append(("B", *virt(b, False)))
        b += 1
    order += [("B", *virt(k, False)) for k in range(b, total)]
    return order


def _pp_program(ctx: RankCtx, k: Knobs, pg: ProcessGroup, stage: int | None = None, stages: int | None = None,
                rank_of: Callable[[int], int] | None = None, tp_pg: ProcessGroup | None = None,
                dp_pg: ProcessGroup | None = None) -> Program:
    """One pipeline stage (``stage`` of ``stages``; ``rank_of(stage)`` = global rank of that stage in this
    rank's pipeline). Optional tensor parallelism inside the stage (``tp_pg``) and a data-parallel gradient
    all-reduce per layer after the last backward (``dp_pg``)."""
    em = Emitter(ctx)
    p = ctx.rank if stage is None else stage
    stages = k.ranks if stages is None else stages
    peer = rank_of or (lambda st: st)
    tp = len(tp_pg.ranks) if tp_pg is not None else 1
    micro = k.microbatches
    v = k.chunks if k.schedule == "interleaved" else 1
    mb = k.batch  # pp: --batch is the microbatch size
    m = mb * k.seq_len
    act = m * k.hidden
    layers_chunk = max(1, k.layers // (stages * v))
    last = stages - 1
    for step in k.step_numbers():
        ctx.step = step
        host_extra, dl, gc, ck = _host_delays(k, ctx.rank, step)
        with ctx.op(f"ProfilerStep#{step}", cat="user_annotation", pre=15_000, post=10_000):
            h2d = _step_open(ctx, k, step, host_extra, dl) if p == 0 else None
            blocks: dict[tuple[int, int], list[Block]] = {}
            for kind, c, i in pipeline_order(p, stages, micro, k.schedule, v):
                if kind == "F":
                    waits: list[GpuOp] = [h2d] if (h2d is not None and i == 0 and c == 0) else []
                    # activations come from the previous stage (same chunk) or, on stage 0, from the
                    # last stage's previous chunk; keys name the sender's (chunk, microbatch)
                    if p > 0 or c > 0:
                        src, sc = (p - 1, c) if p > 0 else (last, c - 1)
                        waits.append(p2p(ctx, pg, "recv", peer(src), act, "act", (sc, i), waits=_stream_order(ctx),
                                         transfer_us=k.p2p_us, stream=P2P_STREAMS["recv_act"]))
                    blocks[(c, i)] = [Block(em, k, m, mb, tp, tp_pg) for _ in range(layers_chunk)]
                    with ctx.op(f"forward_chunk{c}_microbatch_{i}" if v > 1 else f"forward_microbatch_{i}",
                                cat="user_annotation", pre=5_000):
                        for j, blk in enumerate(blocks[(c, i)]):
                            out = blk.forward(waits if j == 0 else None)
                    if p < last or c < v - 1:
                        dst = p + 1 if p < last else 0
                        p2p(ctx, pg, "send", peer(dst), act, "act", (c, i), waits=[out], transfer_us=k.p2p_us,
                            stream=P2P_STREAMS["send_act"])
                else:
                    waits = []
                    if p < last or c < v - 1:
                        src, sc = (p + 1, c) if p < last else (0, c + 1)
                        waits.append(p2p(ctx, pg, "recv", peer(src), act, "grad", (sc, i), waits=_stream_order(ctx),
                                         transfer_us=k.p2p_us, stream=P2P_STREAMS["recv_grad"]))
                    name = f"backward_chunk{c}_microbatch_{i}" if v > 1 else f"backward_microbatch_{i}"
                    with ctx.thread(ctx.autograd_tid), ctx.op(name, cat="user_annotation", pre=5_000):
                        for j, blk in enumerate(reversed(blocks[(c, i)])):
                            out = blk.backward(waits if j == 0 else None)
                    if p > 0 or c > 0:
                        dst = p - 1 if p > 0 else last
                        p2p(ctx, pg, "send", peer(dst), act, "grad", (c, i), waits=[out], transfer_us=k.p2p_us,
                            stream=P2P_STREAMS["send_grad"])
            grads: list[GpuOp] = []
            if dp_pg is not None and len(dp_pg.ranks) > 1:
                with ctx.thread(ctx.autograd_tid):
                    for _ in range(layers_chunk * v):
                        grads.append(collective(ctx, dp_pg, "allreduce", layer_params(k.hidden, tp),
                                                waits=[_last_compute(ctx)], phase="comm"))
            if k.optimizer:
                opt = em.adamw(layer_params(k.hidden, tp) * layers_chunk * v, tensors=layers_chunk * v * 8)
                opt[0].waits.extend(grads)
            elif grads:
                _last_compute(ctx).waits.extend(grads)
            yield from _step_close(ctx, k, loss_on_this_rank=(p == 0))


def build_pp(k: Knobs) -> Built:
    sim = _new_sim(k)
    pg = ProcessGroup("0", "default_pg", tuple(range(k.ranks)), STREAM_DP, "pp", PP_EVIDENCE)
    for ctx in sim.ranks:
        if k.stage_factors is not None:
            ctx.slow_factor = float(k.stage_factors[ctx.rank])
    _apply_gpu_stragglers(sim, k, lambda s: [_pp_program(c, k, pg) for c in s.ranks])
    sim.run([_pp_program(c, k, pg) for c in sim.ranks])
    return Built(sim, [[pg] for _ in range(k.ranks)], k, "pp", layer_params(k.hidden))


# ---- 3D: data x tensor x pipeline parallel ------------------------------------------------------------


def mesh_3d(k: Knobs) -> tuple[int, int, int]:
    """(dp, tp, pp) degrees; rank = stage·(dp·tp) + dp_index·tp + tp_index (Megatron's tp-dp-pp order)."""
    return k.ranks // (k.tp * k.pp), k.tp, k.pp


def _groups_3d(k: Knobs) -> tuple[ProcessGroup, dict[int, ProcessGroup], dict[int, ProcessGroup],
                                  dict[int, ProcessGroup]]:
    """World, and per rank its TP, DP and PP group. Descriptions are torch's generic ones (``new_group``
    without ``group_desc``): roles can only be told from what the groups run."""
    dp, tp, pp = mesh_3d(k)
    world = ProcessGroup("0", "default_pg", tuple(range(k.ranks)), STREAM_DP)
    name = iter(range(1, 10_000))
    tp_of: dict[int, ProcessGroup] = {}
    dp_of: dict[int, ProcessGroup] = {}
    pp_of: dict[int, ProcessGroup] = {}
    for st in range(pp):
        for d in range(dp):
            g = ProcessGroup(str(next(name)), "undefined", tuple(st * dp * tp + d * tp + t for t in range(tp)),
                             STREAM_TP, "tp", TP_EVIDENCE)
            tp_of.update({r: g for r in g.ranks})
    for st in range(pp):
        for t in range(tp):
            g = ProcessGroup(str(next(name)), "undefined", tuple(st * dp * tp + d * tp + t for d in range(dp)),
                             STREAM_DP + 2, "dp", "one gradient all-reduce per layer after the last backward")
            dp_of.update({r: g for r in g.ranks})
    for d in range(dp):
        for t in range(tp):
            g = ProcessGroup(str(next(name)), "undefined", tuple(st * dp * tp + d * tp + t for st in range(pp)),
                             STREAM_DP + 4, "pp", PP_EVIDENCE)
            pp_of.update({r: g for r in g.ranks})
    return world, tp_of, dp_of, pp_of


def build_3d(k: Knobs) -> Built:
    sim = _new_sim(k)
    world, tp_of, dp_of, pp_of = _groups_3d(k)

    def programs(s: Simulation) -> list[Program]:
        out = []
        for c in s.ranks:
            chain = pp_of[c.rank].ranks
            out.append(_pp_program(c, k, pp_of[c.rank], chain.index(c.rank), len(chain), chain.__getitem__,
                                   tp_of[c.rank], dp_of[c.rank]))
        return out

    _apply_gpu_stragglers(sim, k, programs)
    sim.run(programs(sim))
    pgs = [[world, tp_of[r], dp_of[r], pp_of[r]] for r in range(k.ranks)]
    return Built(sim, pgs, k, "3d", layer_params(k.hidden, k.tp))


# ---- mixture of experts ---------------------------------------------------------------------------------


def _nccl_exchange(ctx: RankCtx, ep: ProcessGroup, nelems: int, waits: list[GpuOp], kind: str) -> GpuOp:
    """MoE token exchange as ``all_to_all_single`` (``kind``: dispatch | combine, the same collective)."""
    return all_to_all(ctx, ep, nelems, waits=waits)


def _moe_program(ctx: RankCtx, k: Knobs, dp: ProcessGroup, ep: ProcessGroup,
                 exchange: Callable[[RankCtx, ProcessGroup, int, list[GpuOp], str], GpuOp] = _nccl_exchange) -> Program:
    """Attention (dense, data parallel), then the MoE MLP: router, all-to-all dispatch, this rank's expert
    on the tokens routed to it, all-to-all combine. The hot rank's expert gets ``hot_factor`` x tokens.
    ``exchange`` launches one token exchange (NCCL all-to-all, or an EP library's own kernels)."""
    em = Emitter(ctx)
    h, m = k.hidden, k.batch * k.seq_len
    n_exp = len(ep.ranks)
    hot = k.hot_rank if k.hot_rank is not None else min(3, k.ranks - 1)
    tokens = int(m * (k.hot_factor if ctx.rank == hot else 1.0))
    dense = 4 * h * h + h + 4 * h
    for h2d in _profiled_steps(ctx, k):
        seqs: list[dict[str, int]] = []
        for layer in range(k.layers):
            s = layer_seqs(ctx, ("ln", "qkv", "attn", "proj", "router", "fc1", "gelu", "fc2"))
            seqs.append(s)
            ln_qkv(em, m, h, s, [h2d] if layer == 0 else [])
            em.sdpa(k.batch, k.heads, k.seq_len, h // k.heads, causal=True, seq=s["attn"])
            em.linear(m, h, h, bias=True, seq=s["proj"])
            em.add_(m, h)
            last = em.linear(m, h, n_exp, bias=False, seq=s["router"])
            with ctx.op("moe.dispatch", cat="user_annotation", pre=4_000):
                disp = exchange(ctx, ep, m * h, [last], "dispatch")
            fc1 = em.linear(tokens, h, 4 * h, bias=True, seq=s["fc1"])
            fc1.waits.append(disp)
            em.gelu(tokens, 4 * h, seq=s["gelu"])
            last = em.linear(tokens, 4 * h, h, bias=True, seq=s["fc2"])
            with ctx.op("moe.combine", cat="user_annotation", pre=4_000):
                comb = exchange(ctx, ep, m * h, [last], "combine")
            em.add_(m, h).waits.append(comb)
        loss_seq = ctx.next_seq()
        em.loss(m, h, seq=loss_seq)
        grads: list[GpuOp] = []
        with ctx.thread(ctx.autograd_tid):
            em.loss_backward(m, h, seq=loss_seq)
            for layer in reversed(range(k.layers)):
                s = seqs[layer]
                with ctx.op("moe.combine_backward", cat="user_annotation", pre=4_000):
                    g_comb = exchange(ctx, ep, m * h, [_last_compute(ctx)], "dispatch")
                first = em.linear_backward(tokens, 4 * h, h, bias=True, seq=s["fc2"])[0]
                first.waits.append(g_comb)
                em.gelu_backward(tokens, 4 * h, seq=s["gelu"])
                em.linear_backward(tokens, h, 4 * h, bias=True, seq=s["fc1"])
                with ctx.op("moe.dispatch_backward", cat="user_annotation", pre=4_000):
                    g_disp = exchange(ctx, ep, m * h, [_last_compute(ctx)], "combine")
                em.linear_backward(m, h, n_exp, bias=False, seq=s["router"])[0].waits.append(g_disp)
                em.linear_backward(m, h, h, bias=True, seq=s["proj"])
                em.sdpa_backward(k.batch, k.heads, k.seq_len, h // k.heads, causal=True, seq=s["attn"])
                qkv_ln_backward(em, m, h, s)
                grads.append(collective(ctx, dp, "allreduce", dense, waits=[_last_compute(ctx)]))
        if k.optimizer:
            _adamw_after(ctx, em, (dense + 8 * h * h) * k.layers, k.layers * 10, grads)
        else:
            _last_compute(ctx).waits.extend(grads)
        yield from _step_close(ctx, k)


def build_moe(k: Knobs) -> Built:
    sim = _new_sim(k)
    dp = ProcessGroup("0", "default_pg", tuple(range(k.ranks)), STREAM_DP, "dp",
                      "one all-reduce of the dense (attention) gradients per layer in backward")
    ep = ProcessGroup("1", "undefined", tuple(range(k.ranks)), STREAM_EP, "ep",
                      "all-to-all token dispatch and combine around every MoE layer, forward and backward")
    _apply_gpu_stragglers(sim, k, lambda s: [_moe_program(c, k, dp, ep) for c in s.ranks])
    sim.run([_moe_program(c, k, dp, ep) for c in sim.ranks])
    return Built(sim, [[dp, ep] for _ in range(k.ranks)], k, "moe", 4 * k.hidden * k.hidden)


# ---- plumbing -------------------------------------------------------------------------------------------


def _new_sim(k: Knobs) -> Simulation:
    return Simulation(get_device(k.device), k.ranks, seed=k.seed, jitter=k.jitter, host_ns=k.host_speed,
                      gpus_per_host=k.per_node())


def _apply_gpu_stragglers(sim: Simulation, k: Knobs, programs: Callable[[Simulation], list[Program]]) -> None:
    """Turn ``--straggler-delay-us`` into a compute slowdown: a dry run measures the rank's compute per step."""
    gpu = [(r, d) for r, d, c in k.stragglers if c == "gpu"]
    if not gpu:
        return
    dry = _new_sim(replace(k, stragglers=[]))
    for c_dry, c in zip(dry.ranks, sim.ranks):
        c_dry.slow_factor = c.slow_factor
    dry.run(programs(dry))
    for r, delay_us in gpu:
        comp = sum(o.dur_ns for o in dry.ranks[r].gpu if o.cls == "comp")
        per_step = comp / k.steps
        sim.ranks[r].slow_factor *= 1.0 + delay_us * 1000.0 / per_step


def build(scenario: str, k: Knobs) -> Built:
    """Run one scenario with its knobs."""
    k.validate(scenario)
    if scenario in ("ddp", "slow_steps", "fsdp_exposed", "host_bound", "ddp_buffers"):
        return build_ddp(k, scenario)
    if scenario in ("tp", "custom_allreduce", "tp_sp"):
        return build_tp(k, scenario)
    if scenario in ("cp", "ep_renamed", "serving"):  # traceread.simulate.scenarios_layout.build_scenario
        raise ValueError(f"scenario {scenario!r} is built by traceread.simulate.scenarios_layout")
    if scenario == "3d":
        return build_3d(k)
    if scenario == "moe":
        return build_moe(k)
    if scenario == "gloo_host":
        return build_gloo_host(k)
    return build_pp(k)
