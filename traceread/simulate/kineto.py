"""Write a simulated rank as a torch 2.x Kineto trace (``rank{r}.pt.trace.json.gz``).

Layout and field names follow real traces (``shared/traces/hta_nccl_parser_config``,
``param_dlrm_8rank``): top-level ``schemaVersion``, ``deviceProperties``, ``distributedInfo``
(written first among the metadata so HTA's ``"rank": N`` scan finds it), ``record_shapes``,
``traceEvents``, ``traceName``, ``displayTimeUnit``, ``baseTimeNanoseconds``. ``ts``/``dur`` are µs
with ns precision. Output is deterministic: fixed key order, gzip ``mtime=0``.
"""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path
from typing import Any

from traceread.simulate.comm import ProcessGroup, comm_args
from traceread.simulate.memory import memory_event_json
from traceread.simulate.schedule import MAX_GPUS_PER_MACHINE, GpuOp, HostEvent, RankCtx

#: ``baseTimeNanoseconds`` (a trimonth boundary, as Kineto floors it) and the trace-clock origin
#: of the simulated job: ts = (true ns + T0_NS + clock offset) / 1000.
BASE_TIME_NS = 1_762_128_000_000_000_000
T0_NS = 2_614_523_117_000
NCCL_VERSION = "2.26.2"


def _t(ns: int) -> float:
    return round(ns / 1000.0, 3)


def _host(ev: HostEvent, pid: int, off: int) -> dict[str, Any]:
    return {"ph": "X", "cat": ev.cat, "name": ev.name, "pid": pid, "tid": ev.tid, "ts": _t(ev.ts + off),
            "dur": _t(ev.dur), "args": ev.args}


def _gpu(op: GpuOp, device: int, off: int) -> dict[str, Any]:
    assert op.start is not None and op.end is not None
    args: dict[str, Any] = {"External id": op.ext_id}
    if op.kind == "kernel":
        assert op.stats is not None
        args.update({
            "queued": 0, "device": device, "context": 1, "stream": op.stream, "correlation": op.correlation,
            "registers per thread": op.regs, "shared memory": op.smem,
            "blocks per SM": op.stats.blocks_per_sm, "warps per SM": op.stats.warps_per_sm,
            "grid": list(op.grid), "block": list(op.block),
            "est. achieved occupancy %": op.stats.occupancy_pct,
        })
        if op.comm is not None and op.comm.recorded:
            args.update(comm_args(op.comm, op.rank))
        cat = "kernel"
    else:
        dur_s = (op.end - op.start) / 1e9
        args.update({"device": device, "context": 1, "stream": op.stream, "correlation": op.correlation,
                     "bytes": op.nbytes, "memory bandwidth (GB/s)": op.nbytes / dur_s / 1e9 if dur_s else 0.0})
        cat = "gpu_memcpy"
    return {"ph": "X", "cat": cat, "name": op.name, "pid": device, "tid": op.stream, "ts": _t(op.start + off),
            "dur": _t(op.end - op.start), "args": args}


def trace_dict(ctx: RankCtx, pgs: list[ProcessGroup], world: int, gpus_per_host: int, offset_ns: int) -> dict[str, Any]:
    """The whole JSON document of one rank."""
    off = T0_NS + offset_ns
    gpus_per_host = min(gpus_per_host, MAX_GPUS_PER_MACHINE)
    dev = ctx.dev
    pid, dev_id = ctx.pid, ctx.device_id
    first = min(min(e.ts for e in ctx.events), min(o.placed_start for o in ctx.gpu))
    last = max(max(e.ts + e.dur for e in ctx.events), max(o.placed_end for o in ctx.gpu))
    meta_ts = _t(first + off - 50_000)
    events: list[dict[str, Any]] = []
    host = sorted(ctx.events, key=lambda e: (e.ts, -e.dur))
    events += [_host(e, pid, off) for e in host]
    if ctx.mem is not None:  # --memory: the allocator's instant events (profile_memory=True)
        events += [memory_event_json(ev, pid, dev_id, _t(ev.ts + off), i) for i, ev in enumerate(ctx.mem.events)]
    gpu = sorted(ctx.gpu, key=lambda o: (o.start, o.stream))
    events += [_gpu(o, dev_id, off) for o in gpu]
    flows: list[dict[str, Any]] = []
    for o in gpu:
        if o.launch is None:
            continue
        flows.append({"ph": "s", "id": o.correlation, "pid": pid, "tid": o.launch.tid, "ts": _t(o.launch.ts + off),
                      "cat": "ac2g", "name": "ac2g"})
        flows.append({"ph": "f", "id": o.correlation, "pid": dev_id, "tid": o.stream, "ts": _t(o.placed_start + off),
                      "cat": "ac2g", "name": "ac2g", "bp": "e"})
    for fid, fwd, bwd in ctx.flows:
        flows.append({"ph": "s", "id": fid, "pid": pid, "tid": fwd.tid, "ts": _t(fwd.ts + off), "cat": "fwdbwd",
                      "name": "fwdbwd"})
        flows.append({"ph": "f", "id": fid, "pid": pid, "tid": bwd.tid, "ts": _t(bwd.ts + off), "cat": "fwdbwd",
                      "name": "fwdbwd", "bp": "e"})
    meta: list[dict[str, Any]] = []
    for name, args in (("process_name", {"name": "python3"}), ("process_labels", {"labels": "CPU"}),
                       ("process_sort_index", {"sort_index": pid})):
        meta.append({"name": name, "ph": "M", "ts": meta_ts, "pid": pid, "tid": 0, "args": args})
    for d in range(gpus_per_host):
        for name, args in (("process_name", {"name": "python3"}), ("process_labels", {"labels": f"GPU {d}"}),
                           ("process_sort_index", {"sort_index": 16777216 + d})):
            meta.append({"name": name, "ph": "M", "ts": meta_ts, "pid": d, "tid": 0, "args": args})
    for s in sorted(ctx.streams):
        meta.append({"name": "thread_name", "ph": "M", "ts": meta_ts, "pid": dev_id, "tid": s,
                     "args": {"name": f"stream {s} "}})
        meta.append({"name": "thread_sort_index", "ph": "M", "ts": meta_ts, "pid": dev_id, "tid": s,
                     "args": {"sort_index": s}})
    for tid, label in ((ctx.main_tid, "pt_main_thread"), (ctx.autograd_tid, "pt_autograd_0")):
        meta.append({"name": "thread_name", "ph": "M", "ts": meta_ts, "pid": pid, "tid": tid,
                     "args": {"name": f"thread {tid} ({label})"}})
        meta.append({"name": "thread_sort_index", "ph": "M", "ts": meta_ts, "pid": pid, "tid": tid,
                     "args": {"sort_index": tid}})
    tail = [
        {"name": "process_sort_index", "ph": "M", "ts": meta_ts, "pid": "Spans", "tid": 0,
         "args": {"sort_index": 536870912}},
        {"ph": "X", "cat": "Trace", "ts": meta_ts, "dur": _t(last - first + 100_000), "pid": "Spans",
         "tid": "PyTorch Profiler", "name": "PyTorch Profiler (0)", "args": {"Op count": 0}},
        {"name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g", "pid": "Traces",
         "tid": "Trace PyTorch Profiler", "ts": meta_ts},
        {"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "", "ts": _t(last + off + 50_000)},
    ]
    return {
        "schemaVersion": 1,
        "deviceProperties": [dev.properties(d) for d in range(gpus_per_host)],
        "distributedInfo": {
            "backend": "gloo" if pgs and all("gloo" in pg.backend for pg in pgs) else "nccl",
            "rank": ctx.rank, "world_size": world, "pg_count": len(pgs),
            "pg_config": [pg.config() for pg in pgs], "nccl_version": NCCL_VERSION,
        },
        "record_shapes": 1,
        **({"profile_memory": 1} if ctx.mem is not None else {}),
        "traceEvents": meta + events + flows + tail,
        "traceName": f"rank{ctx.rank}.pt.trace.json",
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": BASE_TIME_NS,
    }


def write_gz_json(path: Path, doc: Any, *, indent: int | None = None) -> None:
    """Deterministic gzip: no file name, mtime 0, fixed key order."""
    raw = json.dumps(doc, indent=indent).encode()
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, mtime=0, compresslevel=9) as gz:
        gz.write(raw)
    path.write_bytes(buf.getvalue())


def write_rank(path: Path, ctx: RankCtx, pgs: list[ProcessGroup], world: int, gpus_per_host: int,
               offset_ns: int) -> None:
    write_gz_json(path, trace_dict(ctx, pgs, world, gpus_per_host, offset_ns))
