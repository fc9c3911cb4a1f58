"""The simulated caching allocator: every allocation and free a rank makes, with exact totals.

A scenario asks for memory with ``ctx.alloc_next(handle)`` (the next kernel or copy the rank launches
allocates it, inside the operator that launches it, as PyTorch allocates an op's output) or
``ctx.alloc_now`` / ``ctx.free`` (at the host's current time, in whatever operator is open). Each
call becomes one :class:`MemEvent` with the running totals after it, exactly what Kineto writes as a
``[memory]`` instant event with ``profile_memory=True``.

Model (deterministic, simple, enough for exact truth):

* the training state (weights, gradients, optimizer state) is allocated before the profiling window,
  so the window starts with it allocated and no event for it;
* allocated = the sum of live blocks; reserved never shrinks and grows, when an allocation would
  exceed it, by the shortfall rounded up to :data:`SEGMENT_BYTES` (the caching allocator asking the
  device for a new segment);
* addresses come from a bump pointer (never reused), :data:`ALIGN`-byte aligned.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SEGMENT_BYTES = 2 << 20
ALIGN = 512
ADDR_BASE = 0x7F3A_0000_0000


def frame(filename: str, line: int, name: str) -> dict[str, Any]:
    """One stack frame as ``torch.cuda.memory._snapshot`` writes it."""
    return {"filename": filename, "line": line, "name": name}


#: Library frames a training step's allocations pass through (torch's own code, not the user's).
LIB = "/opt/conda/lib/python3.11/site-packages/torch"
MODULE_CALL = frame(f"{LIB}/nn/modules/module.py", 1751, "_call_impl")
AUTOGRAD = frame(f"{LIB}/autograd/graph.py", 825, "_engine_run_backward")
FSDP_UNSHARD = frame(f"{LIB}/distributed/fsdp/_fully_shard/_fsdp_param_group.py", 311, "unshard")
FSDP_REDUCE = frame(f"{LIB}/distributed/fsdp/_fully_shard/_fsdp_collectives.py", 394, "foreach_reduce")
ADAMW = frame(f"{LIB}/optim/adamw.py", 134, "_init_group")

#: The user's code: model.py (the model) and train.py (the loop).
TRAIN_STEP_FWD = frame("/workspace/train.py", 88, "train_step")  # loss = model(batch)
TRAIN_STEP_BWD = frame("/workspace/train.py", 95, "train_step")  # loss.backward()
TRAIN_BATCH = frame("/workspace/train.py", 84, "train_step")  # batch = batch.to(device)
TRAIN_LEAK = frame("/workspace/train.py", 92, "train_step")  # losses.append(loss): keeps every step's loss
TRAIN_OPT = frame("/workspace/train.py", 97, "train_step")  # opt.step()
TRAIN_INIT = frame("/workspace/train.py", 40, "main")  # model = build_model().cuda()
MODEL_BLOCK = frame("/workspace/model.py", 22, "forward")  # Block.forward: layer norms
MODEL_ATTN = frame("/workspace/model.py", 41, "forward")  # Attention.forward
MODEL_MLP = frame("/workspace/model.py", 63, "forward")  # MLP.forward


@dataclass(eq=False)
class Handle:
    """One block: what it is for and the stack that allocates it (innermost frame first)."""

    nbytes: int
    frames: list[dict[str, Any]]
    tag: str  # weights | gradients | optimizer_state | activation | backward_temp | gathered_params | ...
    addr: int | None = None
    alloc_event: MemEvent | None = None


@dataclass
class MemEvent:
    """One allocation (``nbytes`` > 0) or free (< 0) and the device's totals after it."""

    ts: int  # true-clock ns on the host
    tid: int
    nbytes: int
    addr: int
    allocated: int
    reserved: int
    step: int
    handle: Handle
    stack: tuple[tuple[str, str], ...]  # (cat, name) of the host events open then, outermost first


@dataclass
class Allocator:
    """One rank's device memory (see the module docstring)."""

    device_id: int
    live: dict[int, Handle] = field(default_factory=dict)
    events: list[MemEvent] = field(default_factory=list)
    allocated: int = 0
    reserved: int = 0
    start_allocated: int = 0
    start_reserved: int = 0
    persistent: list[Handle] = field(default_factory=list)
    _cursor: int = ADDR_BASE

    def preallocate(self, handles: list[Handle]) -> None:
        """The training state, allocated before the profiling window (no events)."""
        for h in handles:
            h.addr = self._next(h.nbytes)
            self.live[h.addr] = h
            self.allocated += h.nbytes
        self.persistent.extend(handles)
        self._grow()
        self.start_allocated, self.start_reserved = self.allocated, self.reserved

    def _next(self, nbytes: int) -> int:
        addr = self._cursor
        self._cursor += -(-max(nbytes, 1) // ALIGN) * ALIGN
        return addr

    def _grow(self) -> None:
        if self.allocated > self.reserved:
            short = self.allocated - self.reserved
            self.reserved += -(-short // SEGMENT_BYTES) * SEGMENT_BYTES

    def alloc(self, h: Handle, ts: int, tid: int, step: int, stack: tuple[tuple[str, str], ...]) -> MemEvent:
        h.addr = self._next(h.nbytes)
        self.live[h.addr] = h
        self.allocated += h.nbytes
        self._grow()
        ev = MemEvent(ts, tid, h.nbytes, h.addr, self.allocated, self.reserved, step, h, stack)
        h.alloc_event = ev
        self.events.append(ev)
        return ev

    def free(self, h: Handle, ts: int, tid: int, step: int, stack: tuple[tuple[str, str], ...]) -> MemEvent:
        assert h.addr is not None and h.addr in self.live, "free of a block that is not live"
        del self.live[h.addr]
        self.allocated -= h.nbytes
        ev = MemEvent(ts, tid, -h.nbytes, h.addr, self.allocated, self.reserved, step, h, stack)
        self.events.append(ev)
        return ev


def memory_event_json(ev: MemEvent, pid: int, device_id: int, ts_us: float, idx: int) -> dict[str, Any]:
    """The ``[memory]`` instant event Kineto writes for one allocator call (torch 2.x field names)."""
    return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": pid, "tid": ev.tid,
            "ts": ts_us, "args": {"Total Reserved": ev.reserved, "Total Allocated": ev.allocated, "Bytes": ev.nbytes,
                                  "Device Id": device_id, "Device Type": 1, "Addr": ev.addr, "finished": True,
                                  "Ev Idx": idx}}


def snapshot_dict(alloc: Allocator) -> dict[str, Any]:
    """The allocator at the end of the window in ``torch.cuda.memory._snapshot``'s format: one segment
    spanning the addresses handed out (live blocks ``active_allocated``, the gaps ``inactive``) and the
    window's history (``alloc``, ``free_requested``, ``free_completed`` with their frames) as
    ``device_traces[device]``."""
    blocks: list[dict[str, Any]] = []
    cursor = ADDR_BASE
    for addr in sorted(alloc.live):
        h = alloc.live[addr]
        if addr > cursor:
            blocks.append({"address": cursor, "size": addr - cursor, "requested_size": 0, "state": "inactive",
                           "frames": []})
        size = -(-max(h.nbytes, 1) // ALIGN) * ALIGN
        blocks.append({"address": addr, "size": h.nbytes, "requested_size": h.nbytes, "state": "active_allocated",
                       "frames": h.frames})
        cursor = addr + size
    end = alloc._cursor
    if end > cursor:
        blocks.append({"address": cursor, "size": end - cursor, "requested_size": 0, "state": "inactive", "frames": []})
    segment = {"device": alloc.device_id, "address": ADDR_BASE, "total_size": end - ADDR_BASE, "stream": 0,
               "segment_type": "large", "segment_pool_id": (0, 0), "allocated_size": alloc.allocated,
               "active_size": alloc.allocated, "requested_size": alloc.allocated, "blocks": blocks}
    trace: list[dict[str, Any]] = []
    for ev in alloc.events:
        common = {"addr": ev.addr, "size": abs(ev.nbytes), "stream": 0, "frames": ev.handle.frames,
                  "time_us": ev.ts // 1000}
        if ev.nbytes > 0:
            trace.append({"action": "alloc", **common})
        else:
            trace.append({"action": "free_requested", **common})
            trace.append({"action": "free_completed", **common})
    traces: list[list[dict[str, Any]]] = [[] for _ in range(alloc.device_id + 1)]
    traces[alloc.device_id] = trace
    return {"segments": [segment], "device_traces": traces,
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": None, "max_split_size": -1}}


def write_snapshot(path: Path, alloc: Allocator) -> None:
    """What ``torch.cuda.memory._dump_snapshot`` writes at the end of the window: the pickled dict."""
    path.write_bytes(pickle.dumps(snapshot_dict(alloc)))
