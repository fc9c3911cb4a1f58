"""The tables every analysis reads: one :class:`RankTrace` per rank, columns fixed here.

This module is the contract between the reader and the analyses. Times are microseconds as float64
on the trace's own clock (Chrome trace format: ``ts``/``dur`` are µs even when
``displayTimeUnit`` is ``ns``); nothing is rounded. Columns that a trace does not carry are null,
never invented.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import polars as pl

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

#: Bumped whenever a column or its meaning changes; part of the parse-cache key.
# 2: an event touching the end of the open one is its sibling (read.nesting.TOUCH_US);
# 3: a boolean int arg is 1/0 (read.columns.to_int)
READER_VERSION = "3"

# Columns copied from ``record_param_comms`` onto NCCL kernels (torch >= 2.1) and present on the
# ``record_param_comms`` cpu_op itself. Trace arg name -> column name.
COMM_ARGS: dict[str, str] = {
    "Collective name": "coll_name",
    "In msg nelems": "in_nelems",
    "Out msg nelems": "out_nelems",
    "Group size": "group_size",
    "dtype": "dtype",
    "Process Group Name": "pg_name",
    "Process Group Description": "pg_desc",
    "Process Group Ranks": "pg_ranks",
    "Seq": "seq",
    "Comms Id": "comms_id",
    "Src Rank": "src_rank",
    "Dst Rank": "dst_rank",
}

COMM_SCHEMA: dict[str, PolarsDataType] = {
    "coll_name": pl.Utf8,
    "in_nelems": pl.Int64,
    "out_nelems": pl.Int64,
    "group_size": pl.Int64,
    "dtype": pl.Utf8,
    "pg_name": pl.Utf8,
    "pg_desc": pl.Utf8,
    "pg_ranks": pl.Utf8,  # as written in the trace, e.g. "[0, 1]" (may be truncated by torch)
    "seq": pl.Int64,
    "comms_id": pl.Utf8,  # a 64-bit hash; kept as text so unsigned values survive
    "src_rank": pl.Int64,
    "dst_rank": pl.Int64,
}

#: GPU activity: one row per kernel, memcpy or memset (``ph == "X"``), sorted by ``ts``.
GPU_SCHEMA: dict[str, PolarsDataType] = {
    "kind": pl.Utf8,  # "kernel" | "memcpy" | "memset"
    "name": pl.Utf8,
    "device": pl.Int64,
    "stream": pl.Int64,
    "ts": pl.Float64,
    "dur": pl.Float64,
    "end": pl.Float64,  # ts + dur
    "correlation": pl.Int64,
    "external_id": pl.Int64,
    "grid_x": pl.Int64,
    "grid_y": pl.Int64,
    "grid_z": pl.Int64,
    "block_x": pl.Int64,
    "block_y": pl.Int64,
    "block_z": pl.Int64,
    "registers": pl.Int64,  # "registers per thread"
    "shared_memory": pl.Int64,  # bytes, "shared memory"
    "blocks_per_sm": pl.Float64,  # as recorded by Kineto; null on ROCm
    "warps_per_sm": pl.Float64,
    "occupancy_pct": pl.Float64,  # "est. achieved occupancy %"
    "bytes": pl.Int64,  # memcpy / memset size
    **COMM_SCHEMA,
    "launch_row": pl.Int64,  # row in RankTrace.host of the runtime call that launched it (correlation)
    "op_row": pl.Int64,  # row in RankTrace.host of the innermost cpu_op that caused it
}

#: Host activity: one row per host-side complete event (``ph == "X"``), in file order of ``ts``.
#: ``row`` equals the row position and is what ``parent``, ``launch_row`` and ``op_row`` point to.
HOST_SCHEMA: dict[str, PolarsDataType] = {
    "row": pl.Int64,
    # Normalised category: cpu_op, user_annotation, gpu_user_annotation, python_function,
    # cuda_runtime, cuda_driver, cuda_sync, cpu_instant_event, Trace, ... Legacy 2021 names are
    # mapped (Operator -> cpu_op, Runtime -> cuda_runtime).
    "cat": pl.Utf8,
    "name": pl.Utf8,
    "pid": pl.Int64,  # null when the trace uses a string pid ("Spans")
    "tid": pl.Int64,
    "ts": pl.Float64,
    "dur": pl.Float64,
    "end": pl.Float64,
    "depth": pl.Int64,  # nesting depth on its (pid, tid) among cpu_op/user_annotation/python_function
    "parent": pl.Int64,  # row of the enclosing event on the same thread, null at top level
    "external_id": pl.Int64,
    "correlation": pl.Int64,
    "input_dims": pl.Utf8,  # JSON text of "Input Dims" exactly as recorded
    "input_types": pl.Utf8,  # JSON text of "Input type"
    "input_strides": pl.Utf8,  # JSON text of "Input Strides"
    "concrete_inputs": pl.Utf8,  # JSON text of "Concrete Inputs"
    "seq_num": pl.Int64,  # autograd "Sequence number" (not the collective Seq)
    "fwd_tid": pl.Int64,  # "Fwd thread id"
    **COMM_SCHEMA,
}

#: ``ProfilerStep#N`` windows as the host recorded them (one row per step, host copy only).
STEP_SCHEMA: dict[str, PolarsDataType] = {
    "step": pl.Int64,
    "ts": pl.Float64,
    "dur": pl.Float64,
    "end": pl.Float64,
    "tid": pl.Int64,
}

#: Flow arrows: ``ac2g`` (CPU launch -> GPU activity) and ``fwdbwd`` (forward op -> backward op).
FLOW_SCHEMA: dict[str, PolarsDataType] = {
    "kind": pl.Utf8,  # "ac2g" | "fwdbwd" | other flow category
    "id": pl.Int64,
    "src_ts": pl.Float64,
    "src_pid": pl.Int64,
    "src_tid": pl.Int64,
    "dst_ts": pl.Float64,
    "dst_pid": pl.Int64,
    "dst_tid": pl.Int64,
}


def as_float(value: object) -> float:
    """A numeric column's aggregate (``min``, ``max``, ``mean``, ``median``, ``item``) as a float.

    polars types an aggregate as any Python literal; on the numeric columns fixed here it is a
    number, and ``None`` only on an empty or all-null column, which callers rule out first (a
    ``None`` still raises ``TypeError``, as ``float(None)`` would).
    """
    if not isinstance(value, (int, float)):
        raise TypeError(f"expected a number, got {type(value).__name__}")
    return float(value)


#: ``[memory]`` instant events (``profile_memory=True``), one row per allocation or free, sorted by ``ts``
#: (file order on ties). A small side table: only traces recorded with memory profiling have rows.
MEMORY_SCHEMA: dict[str, PolarsDataType] = {
    "ts": pl.Float64,  # host clock, when the allocator call returned
    "pid": pl.Int64,
    "tid": pl.Int64,  # the host thread that allocated or freed
    "device_type": pl.Int64,  # c10::DeviceType: 0 CPU, 1 CUDA, 6 HIP (ROCm), ...
    "device_id": pl.Int64,  # device index (-1 for the CPU)
    "bytes": pl.Int64,  # > 0 allocation, < 0 free
    "total_allocated": pl.Int64,  # bytes allocated on the device after this event (null in 2021 traces)
    "total_reserved": pl.Int64,  # bytes the caching allocator holds from the device after it (0 on the CPU)
    "addr": pl.Int64,  # the block's address: an allocation and its free share it
}


def empty_frame(schema: dict[str, PolarsDataType]) -> pl.DataFrame:
    """An empty table with the given columns, so analyses never special-case missing tables."""
    return pl.DataFrame(schema=schema)


@dataclass
class RankMeta:
    """What a trace says about itself and its job, outside the event list."""

    rank: int | None
    world_size: int | None = None
    backend: str | None = None  # "nccl", "gloo", ...
    nccl_version: str | None = None
    pg_config: list[dict[str, Any]] = field(default_factory=list)  # distributedInfo.pg_config
    distributed_info: dict[str, Any] | None = None  # raw, as recorded
    devices: list[dict[str, Any]] = field(default_factory=list)  # raw deviceProperties
    device_id: int | None = None  # the device this rank's kernels ran on (most common)
    device_name: str | None = None  # name of that device ("" in some vLLM traces -> None)
    num_sms: int | None = None  # numSms of that device (AMD: compute units)
    base_time_ns: int | None = None  # baseTimeNanoseconds: absolute epoch ns = base + ts*1000
    display_time_unit: str | None = None
    schema_version: int | None = None
    trace_name: str | None = None
    top_level_keys: list[str] = field(default_factory=list)  # which torch/kineto fields exist
    rank_source: str = "unknown"  # "distributedInfo" | "filename" | "unknown"
    event_counts: dict[str, int] = field(default_factory=dict)  # raw count per (normalised) category


@dataclass
class RankTrace:
    """One rank's trace as typed tables. Build with :func:`traceread.engine.jobs.read_rank`."""

    rank: int
    file: str
    meta: RankMeta
    gpu: pl.DataFrame  # GPU_SCHEMA
    host: pl.DataFrame  # HOST_SCHEMA
    steps: pl.DataFrame  # STEP_SCHEMA
    flows: pl.DataFrame  # FLOW_SCHEMA
    memory: pl.DataFrame = field(default_factory=lambda: empty_frame(MEMORY_SCHEMA))  # MEMORY_SCHEMA


@dataclass
class ReadFailure:
    """A file that could not be read; the others are analysed anyway."""

    file: str
    reason: str  # one line, e.g. "truncated gzip stream at byte 1048576"
    rank: int | None = None  # when the rank could still be told from the file name


@dataclass
class TraceSet:
    """Every rank of one job, sorted by rank, plus what went wrong reading it."""

    ranks: list[RankTrace]
    failures: list[ReadFailure] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)  # the paths the user gave
    run_info: dict[str, Any] | None = None  # run.json written by `traceread collect`, if any
