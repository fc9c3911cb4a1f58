"""The schedule model: host threads launch work onto GPU streams; collectives couple the ranks.

Everything is integer nanoseconds on the TRUE clock (clock skew is applied only when writing).
Each rank runs a *program*: a Python generator that drives a :class:`RankCtx` (open cpu ops,
launch kernels, copy memory) and ``yield``s a :class:`SyncRequest` where the real program would
block on the GPU (``loss.item()``, ``cudaDeviceSynchronize``). :class:`Simulation` interleaves the
programs and resolves GPU times with these rules:

* a GPU op is *ready* 1.5 µs after its launch call returns;
* it starts at ``max(ready, end of the previous op on its stream, end of every op it waits on)``;
* a collective kernel's start is its rank's *arrival*; every member of one instance ends at
  ``max(arrivals) + transfer`` (nobody leaves a ring before the last rank has joined);
* a p2p send and its matching recv form a two-member instance with the same rule;
* a host-side (gloo) collective blocks its host from its arrival until ``max(arrivals) + transfer``.

Because times are exact integers, the truth computed from these ops is exact too.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from traceread.simulate.devices import Device, LaunchStats, launch_stats
from traceread.simulate.memory import Allocator, Handle

GPU_READY_NS = 1_500  # launch-call return -> earliest kernel start
MAX_GPUS_PER_MACHINE = 8


@dataclass(eq=False)
class HostEvent:
    """A host-side complete event (cpu_op, user_annotation, cuda_runtime)."""

    cat: str
    name: str
    tid: int
    ts: int
    dur: int = 0
    args: dict[str, Any] = field(default_factory=dict)


@dataclass
class CommInfo:
    """What ``record_param_comms`` says about one rank's part in a collective or p2p op."""

    key: tuple[Any, ...]  # instance key, equal on every member
    members: int
    pg_name: str
    pg_desc: str
    pg_ranks: list[int]
    coll_name: str  # allreduce, _reduce_scatter_base, _allgather_base, send, recv
    in_nelems: int
    out_nelems: int
    dtype: str  # torch's name, e.g. "BFloat16"
    seq: int
    comms_id: int
    transfer_ns: int
    nbytes: int  # message size used for the transfer time
    src_rank: int | None = None
    dst_rank: int | None = None
    recorded: bool = True  # False: launched outside torch's c10d (an engine's or EP library's own kernel),
    #                        so the kernel carries no comm args and no record_param_comms surrounds it


@dataclass(eq=False)
class GpuOp:
    """One kernel or memcpy on one rank's GPU."""

    rank: int
    kind: str  # "kernel" | "memcpy"
    name: str
    cls: str  # "comp" | "comm" | "memcpy"
    stream: int
    dur_ns: int  # own duration (compute/memcpy) or transfer time (comm)
    ready: int
    correlation: int
    ext_id: int
    step: int
    phase: str  # fwd | bwd | opt | comm | io | loss ... (pipeline truth uses fwd/bwd)
    waits: list[GpuOp] = field(default_factory=list)
    grid: tuple[int, int, int] = (1, 1, 1)
    block: tuple[int, int, int] = (1, 1, 1)
    regs: int = 0
    smem: int = 0
    stats: LaunchStats | None = None
    nbytes: int = 0  # memcpy size
    comm: CommInfo | None = None
    launch: HostEvent | None = None
    arrival: int | None = None
    start: int | None = None
    end: int | None = None

    # Truth and the trace writer read a schedule only after it placed every op: these say so once.
    @property
    def placed_arrival(self) -> int:
        assert self.arrival is not None, "op read before the schedule placed it"
        return self.arrival

    @property
    def placed_start(self) -> int:
        assert self.start is not None, "op read before the schedule placed it"
        return self.start

    @property
    def placed_end(self) -> int:
        assert self.end is not None, "op read before the schedule placed it"
        return self.end


@dataclass(eq=False)
class OpRecord:
    """A leaf cpu_op with exact FLOPs/bytes from its recorded shapes, and the kernels it launched."""

    rank: int
    step: int
    name: str
    input_dims: list[list[int]]
    dtype: str
    flops: int
    nbytes: int
    matmul: bool  # counted in model FLOPs / MFU (matmul-class: GEMMs and attention)
    formula: str
    kernels: list[GpuOp] = field(default_factory=list)
    shapes_in_trace: bool = True  # False: the trace records no input shapes (TensorList), so no roofline


@dataclass(eq=False)
class SyncRequest:
    """Yielded by a program where the host blocks until all of its GPU work is done."""

    name: str
    ts: int
    event: HostEvent | None = None


@dataclass(eq=False)
class HostCollective:
    """Yielded where the host runs a CPU-side collective (gloo) and waits for it: every member ends at
    ``max(arrivals) + transfer``; ``span`` is the ``gloo:*`` annotation on the rank's gloo worker thread."""

    key: tuple[Any, ...]
    members: int
    rank: int
    pg_name: str
    transfer_ns: int
    arrival: int
    span: HostEvent
    step: int = -1
    end: int | None = None


@dataclass(frozen=True)
class KernelSpec:
    """A kernel before launch: name, own duration and launch configuration."""

    name: str
    dur_ns: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    regs: int
    smem: int
    cls: str = "comp"


def comms_id(*parts: object) -> int:
    """A stable 63-bit id for one collective instance (same on every member, like torch's)."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") >> 1


class RankCtx:
    """One rank's host: a clock, an op stack, and the events and GPU ops it produced."""

    def __init__(self, sim: Simulation, rank: int, pid: int, main_tid: int, device_id: int, seed: int) -> None:
        self.sim = sim
        self.rank = rank
        self.dev: Device = sim.dev
        self.pid = pid
        self.main_tid = main_tid
        self.autograd_tid = main_tid + 7
        self.device_id = device_id
        self.rng = random.Random(seed * 1_000_003 + rank)
        self.now = 0
        self.tid = main_tid
        self.step = -1
        self.events: list[HostEvent] = []
        self.gpu: list[GpuOp] = []
        self.ops: list[OpRecord] = []
        self.streams: dict[int, list[GpuOp]] = {}
        self.stream_pos: dict[int, int] = {}
        self.flows: list[tuple[int, HostEvent, HostEvent]] = []  # fwdbwd (id, fwd op, bwd op)
        self._fwd_by_seq: dict[int, HostEvent] = {}
        self._stack: list[HostEvent] = []
        self._ext = 0
        self._corr = rank * 0 + 1000
        self._rf = 0
        self._seq = 0
        self._p2p_seq: dict[str, int] = {}
        self._coll_seq: dict[str, int] = {}
        #: iteration annotations a program used as its steps instead of ``ProfilerStep#N`` (serving
        #: engines): (the host event, the iteration number the analysis should give it)
        self.iteration_events: list[tuple[HostEvent, int]] = []
        self.jitter = sim.jitter
        self.slow_factor = 1.0  # GPU straggler: compute kernels take this much longer
        self.host_ns = sim.host_ns
        self.mem: Allocator | None = None  # set by scenarios that record memory (--memory)
        self._mem_pending: list[Handle] = []

    # ---- host clock and events ---------------------------------------------------------------
    def advance(self, ns: int) -> None:
        self.now += max(0, int(ns))

    def host_cost(self, base_ns: int) -> int:
        """A host-side duration with +-10% seeded noise (CPU time is never perfectly regular)."""
        return max(200, int(base_ns * self.host_ns * (0.9 + 0.2 * self.rng.random())))

    def _next_ext(self) -> int:
        self._ext += 1
        return self._ext

    @contextmanager
    def thread(self, tid: int) -> Iterator[None]:
        old = self.tid
        self.tid = tid
        try:
            yield
        finally:
            self.tid = old

    @contextmanager
    def op(
        self,
        name: str,
        cat: str = "cpu_op",
        *,
        dims: list[Any] | None = None,
        types: list[str] | None = None,
        strides: list[Any] | None = None,
        concrete: list[str] | None = None,
        seq: int | None = None,
        fwd_tid: int | None = None,
        extra: dict[str, Any] | None = None,
        pre: int = 2_000,
        post: int = 1_000,
    ) -> Iterator[HostEvent]:
        """Open a cpu_op/user_annotation; nested ops and launches inside get its External id."""
        self._rf += 1
        args: dict[str, Any] = {"External id": self._next_ext(), "Record function id": self._rf}
        if dims is not None:
            args["Input Dims"] = dims
            args["Input type"] = types if types is not None else [""] * len(dims)
            args["Input Strides"] = strides if strides is not None else [_contig(d) for d in dims]
            args["Concrete Inputs"] = concrete if concrete is not None else [""] * len(dims)
        if extra:
            args.update(extra)
        if fwd_tid is not None:
            args["Fwd thread id"] = fwd_tid
        if seq is not None:
            args["Sequence number"] = seq
        ev = HostEvent(cat, name, self.tid, self.now, 0, args)
        self.events.append(ev)
        if seq is not None:
            if fwd_tid is None and cat == "cpu_op":
                self._fwd_by_seq.setdefault(seq, ev)
            elif fwd_tid is not None and name.startswith("autograd::engine::evaluate_function") and seq in self._fwd_by_seq:
                self.flows.append((len(self.flows) + 1, self._fwd_by_seq[seq], ev))
        self._stack.append(ev)
        self.advance(self.host_cost(pre))
        try:
            yield ev
        finally:
            self.advance(self.host_cost(post))
            ev.dur = self.now - ev.ts
            self._stack.pop()

    def next_seq(self) -> int:
        """A new autograd sequence number (forward op <-> its backward)."""
        self._seq += 1
        return self._seq

    def runtime(self, name: str, cbid: int, base_ns: int = 2_000, correlation: int | None = None) -> HostEvent:
        """A CUDA runtime call on the current thread."""
        if correlation is None:
            self._corr += 1
            correlation = self._corr
        ext = self._stack[-1].args["External id"] if self._stack else 0
        ev = HostEvent("cuda_runtime", name, self.tid, self.now, self.host_cost(base_ns),
                       {"External id": ext, "cbid": cbid, "correlation": correlation})
        self.events.append(ev)
        self.now += ev.dur
        return ev

    # ---- memory (only with an allocator) ----------------------------------------------------------
    MEM_CALL_NS = 300  # host time one allocator call takes

    def _stack_names(self) -> tuple[tuple[str, str], ...]:
        return tuple((e.cat, e.name) for e in self._stack)

    def alloc_next(self, h: Handle) -> Handle:
        """``h`` is allocated by the next kernel or copy this rank launches, inside its operator."""
        if self.mem is not None:
            self._mem_pending.append(h)
        return h

    def alloc_now(self, h: Handle) -> Handle:
        if self.mem is not None:
            self.mem.alloc(h, self.now, self.tid, self.step, self._stack_names())
            self.advance(self.MEM_CALL_NS)
        return h

    def free(self, *handles: Handle | None) -> None:
        """Free blocks now (those never allocated, e.g. without an allocator, are skipped)."""
        if self.mem is None:
            return
        for h in handles:
            if h is not None and h.addr is not None and h.addr in self.mem.live and self.mem.live[h.addr] is h:
                self.mem.free(h, self.now, self.tid, self.step, self._stack_names())
                self.advance(self.MEM_CALL_NS)

    def _alloc_pending(self) -> None:
        pending, self._mem_pending = self._mem_pending, []
        for h in pending:
            self.alloc_now(h)

    # ---- GPU work ------------------------------------------------------------------------------
    def _enqueue(self, op: GpuOp) -> GpuOp:
        self.gpu.append(op)
        self.streams.setdefault(op.stream, []).append(op)
        self.stream_pos.setdefault(op.stream, 0)
        if op.comm is not None:
            self.sim.instances.setdefault(op.comm.key, []).append(op)
        return op

    def kernel_duration(self, spec: KernelSpec) -> int:
        """Spec duration with seeded jitter and this rank's straggler slowdown (compute only)."""
        if spec.cls != "comp":
            return spec.dur_ns
        noise = 1.0 + self.jitter * self.rng.gauss(0.0, 1.0) if self.jitter else 1.0
        return max(1_000, int(round(spec.dur_ns * max(0.5, noise) * self.slow_factor)))

    def launch(
        self,
        spec: KernelSpec,
        stream: int,
        *,
        waits: list[GpuOp] | None = None,
        comm: CommInfo | None = None,
        rec: OpRecord | None = None,
        phase: str = "fwd",
    ) -> GpuOp:
        """``cudaLaunchKernel`` now on the current thread; the kernel joins ``stream``'s queue."""
        self._alloc_pending()
        rt = self.runtime("cudaLaunchKernel", 211, 4_500)
        op = GpuOp(
            rank=self.rank,
            kind="kernel",
            name=spec.name,
            cls="comm" if comm is not None else spec.cls,
            stream=stream,
            dur_ns=comm.transfer_ns if comm is not None else self.kernel_duration(spec),
            ready=rt.ts + rt.dur + GPU_READY_NS,
            correlation=rt.args["correlation"],
            ext_id=rt.args["External id"],
            step=self.step,
            phase=phase,
            waits=list(waits or []),
            grid=spec.grid,
            block=spec.block,
            regs=spec.regs,
            smem=spec.smem,
            stats=launch_stats(self.dev, spec.grid, spec.block, spec.regs, spec.smem),
            comm=comm,
            launch=rt,
        )
        if rec is not None:
            rec.kernels.append(op)
        return self._enqueue(op)

    def memcpy(self, direction: str, nbytes: int, stream: int, *, phase: str = "io", waits: list[GpuOp] | None = None) -> GpuOp:
        """``cudaMemcpyAsync`` of ``nbytes``: HtoD from pinned memory or DtoH to pageable memory."""
        self._alloc_pending()
        rt = self.runtime("cudaMemcpyAsync", 51, 3_500)
        names = {"HtoD": "Memcpy HtoD (Pinned -> Device)", "DtoH": "Memcpy DtoH (Device -> Pageable)",
                 "DtoD": "Memcpy DtoD (Device -> Device)"}
        gbs = {"HtoD": 24.0, "DtoH": 12.0, "DtoD": self.dev.mem_bw_gbs * 0.4}[direction]
        dur = 1_200 + int(nbytes / gbs)  # bytes / (GB/s) = ns
        op = GpuOp(self.rank, "memcpy", names[direction], "memcpy", stream, dur,
                   rt.ts + rt.dur + GPU_READY_NS, rt.args["correlation"], rt.args["External id"],
                   self.step, phase, list(waits or []), nbytes=nbytes, launch=rt)
        return self._enqueue(op)

    def sync(self, name: str = "cudaStreamSynchronize") -> SyncRequest:
        """To be yielded: the host blocks here until its GPU work has finished."""
        return SyncRequest(name, self.now)

    def complete_sync(self, req: SyncRequest) -> None:
        gpu_end = max((o.end for o in self.gpu if o.end is not None), default=req.ts)
        self.now = max(self.now, gpu_end) + self.host_cost(3_000)
        ext = self._stack[-1].args["External id"] if self._stack else 0
        self._corr += 1
        cbid = {"cudaStreamSynchronize": 131, "cudaDeviceSynchronize": 165}.get(req.name, 131)
        req.event = HostEvent("cuda_runtime", req.name, self.tid, req.ts, self.now - req.ts,
                              {"External id": ext, "cbid": cbid, "correlation": self._corr})
        self.events.append(req.event)

    def host_collective(self, key: tuple[Any, ...], members: int, pg_name: str, name: str, transfer_ns: int,
                        worker_tid: int) -> HostCollective:
        """To be yielded: this rank's host joins a CPU-side collective now (its gloo worker thread
        runs it from now until every member has joined, plus the transfer)."""
        span = HostEvent("user_annotation", name, worker_tid, self.now, 0, {"External id": self._next_ext()})
        self.events.append(span)
        req = HostCollective(key, members, self.rank, pg_name, transfer_ns, self.now, span, self.step)
        self.sim.host_instances.setdefault(key, []).append(req)
        return req

    def complete_host_collective(self, req: HostCollective) -> None:
        assert req.end is not None
        req.span.dur = req.end - req.arrival
        self.now = max(self.now, req.end) + self.host_cost(4_000)

    def all_resolved(self) -> bool:
        return all(self.stream_pos[s] == len(q) for s, q in self.streams.items())

    # ---- communication ---------------------------------------------------------------------------
    def next_coll_seq(self, pg_name: str) -> int:
        self._coll_seq[pg_name] = self._coll_seq.get(pg_name, 0) + 1
        return self._coll_seq[pg_name]

    def next_p2p_seq(self, pg_name: str) -> int:
        self._p2p_seq[pg_name] = self._p2p_seq.get(pg_name, 0) + 1
        return self._p2p_seq[pg_name]


Program = Generator[SyncRequest | HostCollective, None, None]


class Simulation:
    """Interleaves the rank programs and resolves every GPU op's start and end."""

    def __init__(self, dev: Device, world: int, *, seed: int, jitter: float, host_ns: float = 1.0,
                 gpus_per_host: int = 8) -> None:
        self.dev = dev
        self.world = world
        self.seed = seed
        self.jitter = jitter
        self.host_ns = host_ns
        self.instances: dict[tuple[Any, ...], list[GpuOp]] = {}
        self.host_instances: dict[tuple[Any, ...], list[HostCollective]] = {}
        self.gpus_per_host = gpus_per_host
        self.ranks: list[RankCtx] = []
        for r in range(world):
            host = r // gpus_per_host
            local = r % gpus_per_host
            pid = 41_000 + 1_117 * host + 13 * local
            # a machine has at most 8 GPUs: larger "hosts" (one clock, one NVLink domain) wrap around
            self.ranks.append(RankCtx(self, r, pid, pid, local % MAX_GPUS_PER_MACHINE, seed))

    def host_of(self, rank: int) -> int:
        return rank // self.gpus_per_host

    def run(self, programs: list[Program]) -> None:
        waiting: dict[int, SyncRequest | HostCollective | None] = {r: None for r in range(self.world)}
        done: set[int] = set()
        while len(done) < self.world:
            progress = False
            for r, gen in enumerate(programs):
                if r in done:
                    continue
                req = waiting[r]
                ctx = self.ranks[r]
                if isinstance(req, HostCollective):
                    inst = self.host_instances[req.key]
                    if len(inst) < req.members:
                        continue
                    last = max(m.arrival for m in inst)
                    for m in inst:
                        m.end = last + req.transfer_ns
                    ctx.complete_host_collective(req)
                    waiting[r] = None
                elif req is not None:
                    if not ctx.all_resolved():
                        continue
                    ctx.complete_sync(req)
                    waiting[r] = None
                try:
                    waiting[r] = next(gen)
                except StopIteration:
                    done.add(r)
                progress = True
            if self._resolve():
                progress = True
            if not progress:
                raise RuntimeError("simulated schedule deadlocked (collective order differs between ranks)")
        self._resolve()
        for ctx in self.ranks:
            if not ctx.all_resolved():
                raise RuntimeError(f"rank {ctx.rank}: GPU work never completed (unmatched collective)")

    def _resolve(self) -> bool:
        progress = False
        changed = True
        while changed:
            changed = False
            for ctx in self.ranks:
                for s, q in ctx.streams.items():
                    i = ctx.stream_pos[s]
                    while i < len(q):
                        op = q[i]
                        if op.end is None:
                            if op.arrival is None:
                                if any(w.end is None for w in op.waits):
                                    break
                                prev_end = q[i - 1].end if i > 0 else 0
                                op.arrival = max([op.ready, prev_end or 0] + [w.end or 0 for w in op.waits])
                                changed = True
                            if op.comm is None:
                                op.start = op.arrival
                                op.end = op.start + op.dur_ns
                            else:
                                inst = self.instances[op.comm.key]
                                if len(inst) > op.comm.members:
                                    raise RuntimeError(f"collective {op.comm.key} joined by {len(inst)} ops")
                                if len(inst) < op.comm.members or any(m.arrival is None for m in inst):
                                    break
                                last = max(m.placed_arrival for m in inst)
                                for m in inst:
                                    m.start = m.arrival
                                    m.end = last + op.comm.transfer_ns
                        i += 1
                        changed = True
                    ctx.stream_pos[s] = i
            progress = progress or changed
        return progress


def _contig(dims: Any) -> Any:
    """Contiguous strides for a shape (``[]`` for scalars / non-tensors)."""
    if not isinstance(dims, list) or not dims or not all(isinstance(d, int) for d in dims):
        return []
    strides = [1] * len(dims)
    for i in range(len(dims) - 2, -1, -1):
        strides[i] = strides[i + 1] * dims[i + 1]
    return strides
