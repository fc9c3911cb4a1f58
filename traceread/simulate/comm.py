"""NCCL collectives and p2p transfers as torch 2.x records them (``record_param_comms``).

Host side: ``c10d::allreduce_`` > ``record_param_comms`` (with the comm metadata) >
``cudaLaunchKernel``; the NCCL kernel on the process group's stream carries the same metadata
(the profiler copies it onto the kernel). Transfer time uses the nccl-tests bus-bandwidth model:
``t = latency + S·factor / busbw`` with factor 2(n−1)/n for all-reduce, (n−1)/n for
all-gather / reduce-scatter (S = full tensor) and 1 for send/recv.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from traceread.simulate.devices import INTER_NODE_BUSBW_GBS
from traceread.simulate.schedule import CommInfo, GpuOp, HostCollective, KernelSpec, RankCtx, comms_id

DTYPE = "BFloat16"
BPE = 2


@dataclass(frozen=True)
class ProcessGroup:
    """One NCCL process group as ``distributedInfo.pg_config`` lists it, plus its CUDA stream."""

    name: str
    desc: str
    ranks: tuple[int, ...]
    stream: int
    role: str = "other"  # layout truth: what the scenario uses the group for (dp, fsdp, tp, pp, ep, ...)
    evidence: str = ""  # layout truth: how the group behaves (what an analysis can see)
    backend: str = "cuda:nccl"  # distributedInfo backend_config ("cpu:gloo,cuda:gloo": collectives on the host)

    def config(self) -> dict[str, object]:
        return {"pg_name": self.name, "pg_desc": self.desc, "backend_config": self.backend,
                "pg_size": len(self.ranks), "ranks": list(self.ranks)}

    def group_rank(self, rank: int) -> int:
        return self.ranks.index(rank)


_OPS = {
    "allreduce": ("c10d::allreduce_", "AllReduce_Sum_bf16", 2.0),
    "_allgather_base": ("c10d::_allgather_base_", "AllGather", 1.0),
    "_reduce_scatter_base": ("c10d::_reduce_scatter_base_", "ReduceScatter_Sum_bf16", 1.0),
    "broadcast": ("c10d::broadcast_", "Broadcast", 1.0),
}


def _channels(ctx: RankCtx) -> int:
    return {"ampere": 16, "hopper": 24, "blackwell": 32}[ctx.dev.arch]


def busbw_gbs(ctx: RankCtx, ranks: tuple[int, ...]) -> tuple[float, int]:
    """(bus bandwidth GB/s, latency ns): NVLink inside one host, InfiniBand when the group spans hosts."""
    hosts = {ctx.sim.host_of(r) for r in ranks}
    if len(hosts) > 1:
        return INTER_NODE_BUSBW_GBS, 30_000
    return ctx.dev.nvlink_busbw_gbs, 12_000


#: Non-NCCL all-reduce kernels (launched under the same ``c10d::allreduce_`` > ``record_param_comms``):
#: torch symmetric-memory NVLS one-shot all-reduce and vLLM's custom one-stage all-reduce.
CUSTOM_ALLREDUCE_KERNELS = {
    "multimem": "void c10d::symmetric_memory::multimem_one_shot_all_reduce_kernel<c10::BFloat16, 16, 8>"
                "(c10::BFloat16*, c10::BFloat16*, unsigned long, unsigned long, unsigned int**, unsigned long)",
    "vllm": "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, "
            "vllm::Signal*, __nv_bfloat16*, int, int)",
}


def collective(ctx: RankCtx, pg: ProcessGroup, coll: str, nelems: int, *, waits: list[GpuOp], phase: str = "comm",
               kernel: str = "nccl") -> GpuOp:
    """Launch one collective on ``pg`` for this rank. ``nelems`` is the FULL tensor (unsharded) size.

    ``kernel``: ``nccl`` (``ncclDevKernel_*``), or for all-reduce a non-NCCL kernel of
    :data:`CUSTOM_ALLREDUCE_KERNELS` (one-shot over NVLink: every rank reads its peers' buffers).
    """
    op_name, kname, factor = _OPS[coll]
    n = len(pg.ranks)
    if coll in ("allreduce", "broadcast"):
        in_n = out_n = nelems
    elif coll == "_allgather_base":
        in_n, out_n = nelems // n, nelems
    else:
        in_n, out_n = nelems, nelems // n
    full_bytes = nelems * BPE
    bw, lat = busbw_gbs(ctx, pg.ranks)
    if kernel != "nccl":
        factor, lat = 1.0, 6_000  # one shot: each rank reads (n-1)/n of the data once, no ring steps
    scale = factor * (n - 1) / n
    transfer = lat + int(full_bytes * scale / bw)  # bytes / (GB/s) = ns
    seq = ctx.next_coll_seq(pg.name)
    info = CommInfo(
        key=("coll", pg.name, seq), members=n, pg_name=pg.name, pg_desc=pg.desc, pg_ranks=list(pg.ranks),
        coll_name=coll, in_nelems=in_n, out_nelems=out_n, dtype=DTYPE, seq=seq,
        comms_id=comms_id(pg.name, "coll", seq), transfer_ns=transfer, nbytes=full_bytes,
    )
    # NCCL >= 2.19 compiles one generic kernel per collective/op/type that runs every protocol, so
    # the name ends in RING_LL whatever the message size (the protocol is chosen at run time).
    name = f"ncclDevKernel_{kname}_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
    spec = KernelSpec(name, transfer, (_channels(ctx), 1, 1), (544, 1, 1), 96, 87_568, cls="comm")
    if kernel != "nccl":
        spec = KernelSpec(CUSTOM_ALLREDUCE_KERNELS[kernel], transfer, (ctx.dev.num_sms, 1, 1), (512, 1, 1), 40, 0,
                          cls="comm")
    return _launch(ctx, op_name, pg, info, spec, waits, phase, dims=[[nelems if coll == "allreduce" else in_n]])


def all_to_all(ctx: RankCtx, pg: ProcessGroup, nelems: int, *, waits: list[GpuOp], phase: str = "comm") -> GpuOp:
    """``all_to_all_single`` of ``nelems`` per rank (MoE token dispatch / combine): NCCL runs it as grouped
    send/recv, so the kernel is ``ncclDevKernel_SendRecv``; ``Collective name`` is ``all_to_allv``."""
    n = len(pg.ranks)
    nbytes = nelems * BPE
    bw, lat = busbw_gbs(ctx, pg.ranks)
    transfer = lat + int(nbytes * (n - 1) / n / bw)
    seq = ctx.next_coll_seq(pg.name)
    info = CommInfo(
        key=("coll", pg.name, seq), members=n, pg_name=pg.name, pg_desc=pg.desc, pg_ranks=list(pg.ranks),
        coll_name="all_to_allv", in_nelems=nelems, out_nelems=nelems, dtype=DTYPE, seq=seq,
        comms_id=comms_id(pg.name, "coll", seq), transfer_ns=transfer, nbytes=nbytes,
    )
    spec = KernelSpec("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", transfer, (_channels(ctx), 1, 1),
                      (544, 1, 1), 96, 87_568, cls="comm")
    return _launch(ctx, "c10d::alltoall_base_", pg, info, spec, waits, phase, dims=[[nelems], [nelems]])


def p2p(ctx: RankCtx, pg: ProcessGroup, kind: str, peer: int, nelems: int, tag: str, index: object, *,
        waits: list[GpuOp], stream: int, transfer_us: float | None = None, phase: str = "comm") -> GpuOp:
    """One side of a send/recv pair; the pair is matched by (src, dst, tag, index)."""
    src, dst = (ctx.rank, peer) if kind == "send" else (peer, ctx.rank)
    nbytes = nelems * BPE
    if transfer_us is None:
        bw, lat = busbw_gbs(ctx, (src, dst))
        transfer = lat + int(nbytes / bw)
    else:
        transfer = int(round(transfer_us * 1000))
    seq = ctx.next_p2p_seq(pg.name)
    info = CommInfo(
        key=("p2p", pg.name, src, dst, tag, ctx.step, index), members=2, pg_name=pg.name, pg_desc=pg.desc,
        pg_ranks=list(pg.ranks), coll_name=kind, in_nelems=nelems, out_nelems=nelems, dtype=DTYPE, seq=seq,
        comms_id=comms_id(pg.name, "p2p", src, dst, tag, ctx.step, index), transfer_ns=transfer, nbytes=nbytes,
        src_rank=src, dst_rank=dst,
    )
    spec = KernelSpec("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", transfer, (2, 1, 1), (544, 1, 1),
                      96, 87_568, cls="comm")
    op_name = "c10d::send" if kind == "send" else "c10d::recv_"
    pg_s = replace(pg, stream=stream)
    return _launch(ctx, op_name, pg_s, info, spec, waits, phase, dims=[[nelems]])


def _launch(ctx: RankCtx, op_name: str, pg: ProcessGroup, info: CommInfo, spec: KernelSpec, waits: list[GpuOp],
            phase: str, dims: list[list[int]]) -> GpuOp:
    args = comm_args(info, ctx.rank)
    types = ["c10::BFloat16"] * len(dims) + ["ScalarList", "Int"]
    with ctx.op(op_name, dims=dims + [[], []], types=types, pre=6_000, post=4_000):
        if waits:
            ctx.runtime("cudaEventRecord", 135, 1_500)
            ctx.runtime("cudaStreamWaitEvent", 147, 1_500)
        with ctx.op("record_param_comms", dims=[[], [], [], [], [], [], []],
                    types=["TensorList", "Scalar", "Scalar", "Scalar", "", "", ""], extra=args, pre=5_000,
                    post=3_000):
            return ctx.launch(spec, pg.stream, waits=waits, comm=info, phase=phase)


def comm_args(info: CommInfo, rank: int) -> dict[str, object]:
    """The ``record_param_comms`` args (also copied onto the NCCL kernel)."""
    ranks = info.pg_ranks
    # p2p ops record the other side's group rank; collectives this rank's own
    other = info.dst_rank if info.src_rank == rank else info.src_rank
    peer = rank if info.src_rank is None or other is None else other
    args: dict[str, object] = {
        "Collective name": info.coll_name,
        "dtype": info.dtype,
        "In msg nelems": info.in_nelems,
        "Out msg nelems": info.out_nelems,
        "Group size": len(ranks),
        "In split size": "[]",
        "Out split size": "[]",
        "Global rank start": ranks[0],
        "Global rank stride": (ranks[1] - ranks[0]) if len(ranks) > 1 else 0,
        "Process Group Name": info.pg_name,
        "Process Group Description": info.pg_desc,
        "Process Group Ranks": "[" + ", ".join(map(str, ranks)) + "]",
        "Rank": ranks.index(peer),
        "Seq": info.seq,
        "Comms Id": info.comms_id,
        "Is asynchronized op": False,
    }
    if info.coll_name == "all_to_allv":
        split = "[" + ", ".join([str(info.in_nelems // len(ranks))] * len(ranks)) + "]"
        args["In split size"] = args["Out split size"] = split
    if info.src_rank is not None:
        args["Src Rank"] = info.src_rank
        args["Dst Rank"] = info.dst_rank
    return args



#: Host-side all-reduce bandwidth of gloo over TCP (GB/s, bytes / ns): far below NVLink.
GLOO_GBS = 2.0


def gloo_allreduce(ctx: RankCtx, pg: ProcessGroup, nelems: int) -> HostCollective:
    """``dist.all_reduce`` on a gloo group (tensor on the host): ``c10d::allreduce_`` issued on the
    current thread, the ring run by a gloo worker thread (a ``gloo:all_reduce`` annotation); to be
    yielded, the host waits for it (``work.wait()``). Transfer ``2(n−1)/n · S / GLOO_GBS``."""
    n = len(pg.ranks)
    seq = ctx.next_coll_seq(pg.name)
    transfer = 50_000 + int(nelems * BPE * 2.0 * (n - 1) / n / GLOO_GBS)
    with ctx.op("c10d::allreduce_", dims=[[nelems], [], []], types=["c10::BFloat16", "", "Int"], pre=8_000,
                post=4_000):
        pass
    return ctx.host_collective(("gloo", pg.name, seq), n, pg.name, "gloo:all_reduce", transfer, ctx.main_tid + 11)
