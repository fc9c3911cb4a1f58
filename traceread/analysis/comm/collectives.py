"""Match each collective instance across ranks, from a small per-rank extract.

Cross-rank analyses (wait, blame, bandwidth, pipeline) need "the same allreduce on every rank".
Keeping whole traces of a 1024-rank job in memory is not possible, so each rank is first reduced to
:func:`comm_events` (one row per communication kernel, a few dozen columns) and only those frames
are matched by :func:`match_collectives`.

Matching keys, first that applies per event (the method is recorded in ``Matched.events.method``):

1. point-to-point (send/recv with ``Src Rank``/``Dst Rank``): the k-th transfer from ``src`` to
   ``dst`` in a process group, in launch order, is matched with the k-th receive on ``dst`` from
   ``src``. ``Seq`` is a per-side p2p counter and ``Comms Id`` hashes it, so neither pairs them;
2. ``Comms Id`` (torch writes a hash of (group, Seq, topology): the same on every member);
3. ``(Process Group Name, Seq)`` for collectives (ProcessGroupNCCL's ``seqCollective_``);
4. ordinal (TraceLens "simplified mode"): ``(pg, collective, ProfilerStep, k-th on that rank)`` —
   aligned by step number so ranks whose profiling windows start at different steps still match.

Mismatches (a rank with fewer instances, sizes/dtypes/ops that differ) are reported as strings in
``Matched.mismatches``; matching never raises on inconsistent input.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from traceread import intervals as iv
from traceread.analysis.comm.context import event_context
from traceread.analysis.kinds import collective_of_kernel, comm_mask
from traceread.model import RankTrace

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

#: Columns of one rank's extract (see :func:`comm_events`). Times are µs on that rank's clock.
EXTRACT_SCHEMA: dict[str, PolarsDataType] = {
    "rank": pl.Int64,
    "backend": pl.Utf8,  # "nccl" (GPU kernel) | "gloo" (CPU span)
    "stream": pl.Int64,
    "kernel": pl.Utf8,  # kernel or span name as recorded
    "op": pl.Utf8,  # normalised collective: allreduce, allgather, reducescatter, alltoall, ...
    "p2p": pl.Boolean,
    "pg": pl.Utf8,  # Process Group Name (null when the trace has none)
    "pg_desc": pl.Utf8,
    "pg_ranks": pl.Utf8,
    "group_size": pl.Int64,
    "dtype": pl.Utf8,
    "in_nelems": pl.Int64,
    "out_nelems": pl.Int64,
    "seq": pl.Int64,
    "comms_id": pl.Utf8,
    "src_rank": pl.Int64,
    "dst_rank": pl.Int64,
    "ts": pl.Float64,  # GPU start (arrival on the device) or CPU span start for gloo
    "end": pl.Float64,
    "launch_ts": pl.Float64,  # host time of the launch call (null when unknown)
    "step": pl.Int64,  # ProfilerStep number the launch belongs to; -1 when there are no steps
    # compute-kernel busy time of this rank's GPU from the trace start to ``ts`` / ``end`` (µs):
    # the difference between two events is how long the GPU computed between them.
    "busy_at_start": pl.Float64,
    "busy_at_end": pl.Float64,
    # where it was launched from (analysis.comm.context): fwd | bwd | post | nobwd, and the framework
    # (ddp, fsdp) or engine operator (vllm::all_reduce, ...) that issued it; null when unknown
    "phase": pl.Utf8,
    "launcher": pl.Utf8,
}

#: Collectives where every member must arrive before any can finish (N x N wait rule).
SYNC_OPS = frozenset({"allreduce", "allgather", "reducescatter", "alltoall", "barrier"})
P2P_OPS = frozenset({"send", "recv", "sendrecv"})

#: Bytes per element of the dtype names written by ``record_param_comms`` (TraceLens' table + torch names).
DTYPE_BYTES: dict[str, int] = {
    "float": 4, "float32": 4, "int": 4, "int32": 4, "long": 8, "int64": 8, "bfloat16": 2,
    "half": 2, "float16": 2, "double": 8, "float64": 8, "byte": 1, "uint8": 1, "char": 1,
    "int8": 1, "short": 2, "int16": 2, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "complexfloat": 8, "complexdouble": 16,
}

# Order matters: longer names that contain shorter ones come first.
_OP_PATTERNS: tuple[tuple[str, str], ...] = (
    ("allreduce", "allreduce"), ("all_reduce", "allreduce"),
    ("reducescatter", "reducescatter"), ("reduce_scatter", "reducescatter"),
    ("allgather", "allgather"), ("all_gather", "allgather"),
    ("alltoall", "alltoall"), ("all_to_all", "alltoall"),
    ("broadcast", "broadcast"), ("barrier", "barrier"),
    ("sendrecv", "sendrecv"), ("send", "send"), ("recv", "recv"),
    ("reduce", "reduce"), ("gather", "gather"), ("scatter", "scatter"),
)


def normalize_op(name: str | None) -> str | None:
    """Collective family of a ``Collective name``, ``nccl:``/``c10d::``/``gloo:`` span or kernel name."""
    if not name:
        return None
    low = name.lower()
    for prefix in ("ncclkernel_", "nccldevkernel_", "nccl:", "c10d::", "gloo:", "rccl"):
        if low.startswith(prefix):
            low = low[len(prefix):]
            break
    low = low.split("(")[0]
    for pat, op in _OP_PATTERNS:
        if pat in low:
            return op
    return None


def _step_of(times: np.ndarray, steps: pl.DataFrame, start_col: str, end_col: str) -> np.ndarray:
    """Step number whose ``[start, end)`` holds each time; -1 when none does (or there are no steps)."""
    out = np.full(times.shape, -1, dtype=np.int64)
    if steps.height == 0:
        return out
    st = steps.sort(start_col)
    s = st[start_col].to_numpy().astype(np.float64)
    e = st[end_col].to_numpy().astype(np.float64)
    n = st["step"].to_numpy()
    idx = np.searchsorted(s, times, side="right") - 1
    ok = (idx >= 0) & ~np.isnan(times)
    idx_c = np.clip(idx, 0, len(s) - 1)
    ok &= times < e[idx_c]
    out[ok] = n[idx_c[ok]]
    return out


def _ancestor_op(host: pl.DataFrame, rows: list[int | None]) -> list[tuple[str | None, int | None, str | None]]:
    """Per row: collective family named by the nearest ``nccl:*``/``c10d::*``/``record_param_comms``
    ancestor, and — for traces without comm args — the element count and dtype of the single
    tensor ``record_param_comms`` was given (its ``Input Dims``/``Input type``)."""
    if host.height == 0:
        return [(None, None, None)] * len(rows)
    n = host.height
    # Only the rows on the walked chains (≤ 64 hops up from each start) are read into Python.
    par = host["parent"].fill_null(-1).to_numpy().astype(np.int64)
    front = np.array([r for r in rows if r is not None], dtype=np.int64)
    seen: list[np.ndarray] = []
    for _ in range(64):
        front = np.unique(front[(front >= 0) & (front < n)])
        if front.size == 0:
            break
        seen.append(front)
        front = par[front]
    idx = np.unique(np.concatenate(seen)) if seen else np.zeros(0, np.int64)
    sub = host.select("name", "parent", "coll_name", "input_dims", "input_types")[pl.Series(idx)]
    keys = idx.tolist()
    names = dict(zip(keys, sub["name"].to_list()))
    parents = dict(zip(keys, sub["parent"].to_list()))
    colls = dict(zip(keys, sub["coll_name"].to_list()))
    dims = dict(zip(keys, sub["input_dims"].to_list()))
    types = dict(zip(keys, sub["input_types"].to_list()))
    out: list[tuple[str | None, int | None, str | None]] = []
    for row in rows:
        found, nelems, dtype = None, None, None
        hops = 0
        while row is not None and 0 <= row < n and hops < 64:
            nm = names[row]
            if nelems is None and nm and (nm == "record_param_comms" or nm.startswith("nccl:")):
                nelems, dtype = _single_tensor(dims[row], types[row])
            if found is None:
                if colls[row]:
                    found = normalize_op(colls[row])
                elif nm and (nm.startswith("nccl:") or nm.startswith("c10d::") or nm.startswith("gloo:")):
                    found = normalize_op(nm)
            if found and (nelems is not None or nm.startswith("c10d::")):
                break
            row = parents[row]
            hops += 1
        out.append((found, nelems, dtype))
    return out


def _single_tensor(dims_text: str | None, types_text: str | None) -> tuple[int | None, str | None]:
    """(elements, dtype) of the first argument when it is one dense tensor, else (None, None)."""
    try:
        dims = json.loads(dims_text) if dims_text else None
        types = json.loads(types_text) if types_text else None
    except ValueError:
        return None, None
    if not dims or not types or not isinstance(dims[0], list) or not dims[0]:
        return None, None
    if types[0] in ("TensorList", "Scalar", "") or not all(isinstance(d, int) for d in dims[0]):
        return None, None
    return int(np.prod(dims[0])), str(types[0]).replace("long int", "long").replace("unsigned char", "byte")


def _busy_function(comp: pl.DataFrame):
    """``B(t)`` = total time before ``t`` covered by the (merged) compute kernels, vectorised."""
    s, e = iv.merge(comp["ts"].to_numpy(), comp["end"].to_numpy()) if comp.height else (np.empty(0), np.empty(0))
    cum = np.concatenate(([0.0], np.cumsum(e - s)))

    def busy(t: np.ndarray) -> np.ndarray:
        if s.size == 0:
            return np.zeros_like(t, dtype=np.float64)
        k = np.searchsorted(s, t, side="right") - 1
        kc = np.clip(k, 0, s.size - 1)
        inside = np.clip(t - s[kc], 0.0, e[kc] - s[kc])
        return np.where(k < 0, 0.0, cum[kc] + inside)

    return busy


def comm_events(rt: RankTrace, step_windows: pl.DataFrame | None = None) -> pl.DataFrame:
    """One rank's communication events, small enough to keep for thousands of ranks.

    GPU traces: every kernel that :mod:`traceread.analysis.kinds` calls communication, with its comm args,
    the host time of its launch (``gpu.launch_row``) and its step. The step is the host
    ``ProfilerStep`` holding the launch (unambiguous even when GPU work spills past the host step),
    else the device window (``step_windows``: columns step, start, end) holding the kernel start.
    CPU-only (gloo) traces: ``gloo:*`` spans (the actual wait + transfer) with the ``c10d::*`` op
    that issued each as its launch, else the ``c10d::*`` ops alone (:func:`_gloo_events`).
    """
    gpu = rt.gpu
    if rt.meta.device_id is not None and gpu.height and gpu["device"].null_count() < gpu.height:
        gpu = gpu.filter(pl.col("device").is_null() | (pl.col("device") == rt.meta.device_id))  # its own GPU
    host = rt.host
    is_comm = comm_mask(gpu, host)
    comm = gpu.filter(is_comm)
    if comm.height:
        launch_rows = comm["launch_row"].to_list()
        host_ts = host["ts"].to_numpy() if host.height else np.empty(0)
        launch_ts = np.array(
            [host_ts[r] if r is not None and 0 <= r < len(host_ts) else np.nan for r in launch_rows],
            dtype=np.float64,
        )
        op_from_args = [normalize_op(c) for c in comm["coll_name"].to_list()]
        in_n = comm["in_nelems"].to_list()
        out_n = comm["out_nelems"].to_list()
        dtypes = comm["dtype"].to_list()
        missing = [i for i, o in enumerate(op_from_args) if o is None]
        if missing:
            starts = [launch_rows[i] if launch_rows[i] is not None else comm["op_row"][i] for i in missing]
            anc = _ancestor_op(host, starts)
            names = comm["name"].to_list()
            for i, (a, n, d) in zip(missing, anc):
                op_from_args[i] = a or collective_of_kernel(names[i]) or normalize_op(names[i]) or "unknown"
                if in_n[i] is None and n is not None and op_from_args[i] in ("allreduce", "broadcast", "reduce",
                                                                              "alltoall"):
                    in_n[i], out_n[i], dtypes[i] = n, n, d
        comm = comm.with_columns(
            pl.Series("in_nelems", in_n, dtype=pl.Int64), pl.Series("out_nelems", out_n, dtype=pl.Int64),
            pl.Series("dtype", dtypes, dtype=pl.Utf8),
        )
        frame = comm.select(
            pl.lit(rt.rank, pl.Int64).alias("rank"),
            pl.lit("nccl").alias("backend"),
            "stream",
            pl.col("name").alias("kernel"),
            pl.Series("op", op_from_args, dtype=pl.Utf8),
            pl.col("pg_name").alias("pg"),
            "pg_desc", "pg_ranks", "group_size", "dtype", "in_nelems", "out_nelems", "seq",
            "comms_id", "src_rank", "dst_rank", "ts", "end",
            pl.Series("launch_ts", launch_ts, dtype=pl.Float64),
        )
        anchor = launch_ts
        if rt.steps.height and not np.all(np.isnan(anchor)):
            step = _step_of(anchor, rt.steps, "ts", "end")
            if step_windows is not None and step_windows.height:
                by_dev = _step_of(frame["ts"].to_numpy(), step_windows, "start", "end")
                step = np.where(step < 0, by_dev, step)
        elif step_windows is not None and step_windows.height:
            step = _step_of(frame["ts"].to_numpy(), step_windows, "start", "end")
        else:
            step = np.full(frame.height, -1, dtype=np.int64)
        comp = gpu.filter((pl.col("kind") != "memcpy") & ~is_comm)
        busy = _busy_function(comp)
        starts = [r if r is not None else o for r, o in zip(launch_rows, comm["op_row"].to_list())]
        phase, launcher = event_context(host, starts, launch_ts.tolist(), rt.steps)
        frame = frame.with_columns(
            pl.Series("step", step, dtype=pl.Int64),
            pl.Series("busy_at_start", busy(frame["ts"].to_numpy()), dtype=pl.Float64),
            pl.Series("busy_at_end", busy(frame["end"].to_numpy()), dtype=pl.Float64),
            pl.Series("phase", phase, dtype=pl.Utf8), pl.Series("launcher", launcher, dtype=pl.Utf8),
        )
    else:
        frame = _gloo_events(rt)
    frame = frame.with_columns(pl.col("op").is_in(list(P2P_OPS)).alias("p2p"))
    return frame.select([pl.col(c).cast(t) for c, t in EXTRACT_SCHEMA.items()]).sort("ts")


def _gloo_events(rt: RankTrace) -> pl.DataFrame:
    """CPU collectives of a gloo trace: ``gloo:*`` spans, else ``c10d::*`` cpu_ops (no comm args).

    Arrival (``ts``) is the start of the ``gloo:*`` span: when a gloo worker thread began running
    the collective — the CPU analogue of the kernel start. ``launch_ts`` is the ``c10d::*`` cpu_op
    that issued it, and ``step`` the ProfilerStep holding that issue (as for NCCL launches).

    ProcessGroupGloo runs its collectives on a *pool* of worker threads (``pt_gloo_runloop``, two
    per group by default) fed by one FIFO queue: which thread runs the k-th collective is a race
    and differs between ranks, but the start order of the spans is the enqueue order. So the spans
    of all worker threads of a group form one ordered lane (``stream``), and the k-th span on each
    rank is the same collective. The trace does not say which pool a thread belongs to: with one
    gloo group in ``distributedInfo.pg_config`` (the usual DDP/FSDP-on-CPU case) its name, ranks and
    size are filled in; with several, all spans share one lane, which matches ranks that issue
    the same sequence of collectives (SPMD).
    """
    host = rt.host
    spans = host.filter(pl.col("name").str.starts_with("gloo:"))
    issued = host.filter((pl.col("cat") == "cpu_op") & pl.col("name").str.starts_with("c10d::"))
    spans_recorded = spans.height > 0
    if not spans_recorded:
        spans = issued  # only the issuing ops: they are both the launch and the arrival
    spans = spans.with_columns(
        pl.col("name").map_elements(normalize_op, return_dtype=pl.Utf8).alias("op")
    ).filter(pl.col("op").is_not_null()).sort("ts")
    launch = _gloo_issue_times(spans, issued) if spans_recorded else spans["ts"].to_numpy().astype(np.float64)
    anchor = np.where(np.isnan(launch), spans["ts"].to_numpy(), launch) if spans.height else np.empty(0)
    step = _step_of(anchor, rt.steps, "ts", "end") if spans.height else np.empty(0, np.int64)
    issue_rows = _rows_at(issued, launch)
    phase, launcher = event_context(host, issue_rows, launch.tolist(), rt.steps) if spans.height else ([], [])
    pg = _single_gloo_group(rt)
    if pg is not None:
        spans = spans.with_columns(
            pl.coalesce("pg_name", pl.lit(pg["pg_name"])).alias("pg_name"),
            pl.coalesce("pg_desc", pl.lit(pg["pg_desc"])).alias("pg_desc"),
            pl.coalesce("pg_ranks", pl.lit(pg["pg_ranks"])).alias("pg_ranks"),
            pl.coalesce("group_size", pl.lit(pg["group_size"], pl.Int64)).alias("group_size"),
        )
    return spans.select(
        pl.lit(rt.rank, pl.Int64).alias("rank"),
        pl.lit("gloo").alias("backend"),
        pl.lit(0, pl.Int64).alias("stream"),
        pl.col("name").alias("kernel"),
        "op",
        "pg_name", "pg_desc", "pg_ranks", "group_size", "dtype", "in_nelems", "out_nelems",
        pl.lit(None, pl.Int64).alias("seq"),
        "comms_id", "src_rank", "dst_rank", "ts", "end",
        pl.Series("launch_ts", launch, dtype=pl.Float64),
        pl.Series("step", step, dtype=pl.Int64),
        pl.lit(None, pl.Float64).alias("busy_at_start"),
        pl.lit(None, pl.Float64).alias("busy_at_end"),
        pl.Series("phase", phase, dtype=pl.Utf8), pl.Series("launcher", launcher, dtype=pl.Utf8),
    ).rename({"pg_name": "pg"})


def _rows_at(issued: pl.DataFrame, times: np.ndarray) -> list[int | None]:
    """Host row of the issuing ``c10d::*`` op that started at each time (None when unpaired)."""
    by_ts = {float(t): int(r) for t, r in zip(issued["ts"].to_list(), issued["row"].to_list())}
    return [by_ts.get(float(t)) if t == t else None for t in times.tolist()]


def _gloo_issue_times(spans: pl.DataFrame, issued: pl.DataFrame) -> np.ndarray:
    """Start of the ``c10d::*`` op that enqueued each gloo span (NaN when not in the trace).

    Per collective family, the earliest not yet paired op that started before the span: the work
    queue is FIFO. A span whose op was issued before the profiler started gets NaN; an op whose
    span had not started when the profiler stopped stays unpaired.
    """
    out = np.full(spans.height, np.nan)
    if spans.height == 0 or issued.height == 0:
        return out
    ops = issued.with_columns(
        pl.col("name").map_elements(normalize_op, return_dtype=pl.Utf8).alias("op")
    ).filter(pl.col("op").is_not_null()).sort("ts")
    queues: dict[str, list[float]] = {}
    for op, t in zip(ops["op"].to_list(), ops["ts"].to_list()):
        queues.setdefault(op, []).append(float(t))
    heads = {op: 0 for op in queues}
    for i, (op, t) in enumerate(zip(spans["op"].to_list(), spans["ts"].to_list())):
        q = queues.get(op)
        if not q:
            continue
        h = heads[op]
        if h < len(q) and q[h] <= t:
            out[i] = q[h]
            heads[op] = h + 1
    return out


def _single_gloo_group(rt: RankTrace) -> dict[str, object] | None:
    """Name, description, ranks and size of the only gloo process group this rank belongs to."""
    groups = []
    for g in rt.meta.pg_config or []:
        if not isinstance(g, dict) or "gloo" not in str(g.get("backend_config", "")):
            continue
        ranks = g.get("ranks")
        if isinstance(ranks, list) and len(ranks) == g.get("pg_size") and rt.rank not in ranks:
            continue
        groups.append(g)
    if len(groups) != 1:
        return None
    g = groups[0]
    ranks = g.get("ranks")
    size = g.get("pg_size")
    complete = isinstance(ranks, list) and all(isinstance(r, int) for r in ranks) and len(ranks) == size
    return {
        "pg_name": str(g["pg_name"]) if g.get("pg_name") is not None else None,
        "pg_desc": str(g["pg_desc"]) if g.get("pg_desc") is not None else None,
        "pg_ranks": json.dumps(ranks) if complete else None,
        "group_size": int(size) if isinstance(size, int) else None,
    }


@dataclass
class Matched:
    """Collective instances matched across ranks.

    ``events``: one row per (instance, rank) with the extract columns plus ``instance`` (int),
    ``key`` and ``method``. ``instances``: one row per instance (``instance, key, method, pg, op,
    step, p2p, n_ranks, expected, complete, bytes, group_size``). ``mismatches``: human-readable
    problems found while matching (never raised).
    """

    events: pl.DataFrame
    instances: pl.DataFrame
    mismatches: list[str] = field(default_factory=list)
    ranks: list[int] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)


def _dtype_bytes(dtype: str | None) -> int | None:
    if not dtype:
        return None
    return DTYPE_BYTES.get(dtype.lower().replace("torch.", "").replace("c10::", "").replace(" ", ""))


def message_bytes(op: str, dtype: str | None, in_nelems: int | None, out_nelems: int | None) -> int | None:
    """nccl-tests message size S: output elements for allgather (total gathered), else input elements."""
    size = _dtype_bytes(dtype)
    n = out_nelems if op in ("allgather", "gather") else in_nelems
    if size is None or n is None:
        return None
    return int(n) * size


def compact_pg_ranks(comm: pl.DataFrame) -> pl.DataFrame:
    """The extract with each complete ``pg_ranks`` list as compact text (``"0-4095"``, ``"3-4095:8"``,
    :func:`traceread.analysis.comm.layout.compact_ranks`). Torch writes every member of the group on every
    collective: at 4,096 ranks that is 47 kB per row, and a rank's summary would grow with the world
    size (O(world²) bytes on the driver). Truncated lists (``...``) are kept as written."""
    if "pg_ranks" not in comm.columns or not comm.height:
        return comm
    mapping = {t: _compact(t) for t in comm["pg_ranks"].drop_nulls().unique().to_list()}
    if all(k == v for k, v in mapping.items()):
        return comm
    return comm.with_columns(pl.col("pg_ranks").replace(mapping))


def _compact(text: str) -> str:
    from traceread.analysis.comm.layout import compact_ranks

    try:
        vals = json.loads(text)
    except (ValueError, TypeError):
        return text
    if isinstance(vals, list) and vals and all(isinstance(v, int) and not isinstance(v, bool) for v in vals):
        return compact_ranks(vals) if len(set(vals)) == len(vals) else text
    return text


def _parse_ranks(text: str | None, group_size: int | None) -> tuple[int, ...] | None:
    """Global ranks of ``Process Group Ranks`` when complete (torch truncates long lists): the JSON
    list torch writes, or the compact text of :func:`compact_pg_ranks`."""
    if not text:
        return None
    if not text.lstrip().startswith("["):
        from traceread.analysis.comm.layout import expand_ranks

        if not re.fullmatch(r"[0-9,:\- ]+", text):
            return None
        vals = expand_ranks(text)
        return tuple(vals) if vals and (group_size is None or len(vals) == group_size) else None
    try:
        vals = json.loads(text)
    except (ValueError, TypeError):
        return None
    if not isinstance(vals, list) or not all(isinstance(v, int) for v in vals):
        return None
    if group_size is not None and len(vals) != group_size:
        return None
    return tuple(vals)


def _fmt_ranks(ranks: Sequence[int]) -> str:
    """``[0-3, 7]`` style compact rank list for messages."""
    rs = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        parts.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ", ".join(parts)


MAX_MISMATCHES = 20


def match_collectives(extracts: Sequence[pl.DataFrame] | pl.DataFrame) -> Matched:
    """Group the ranks' communication events into collective instances (see the module docstring)."""
    if isinstance(extracts, pl.DataFrame):
        ev = extracts
    else:
        frames = [e for e in extracts if e.height]
        ev = pl.concat(frames, how="vertical_relaxed") if frames else pl.DataFrame(schema=EXTRACT_SCHEMA)
    ev = ev.select([pl.col(c).cast(t) for c, t in EXTRACT_SCHEMA.items()])
    ranks = sorted(ev["rank"].unique().to_list())
    # Without a process-group name, gloo spans are grouped by their lane (one per worker pool, see _gloo_events).
    ev = ev.sort(["rank", "ts"]).with_columns(
        pl.col("pg").fill_null(
            pl.when(pl.col("backend") == "gloo").then(pl.format("gloo-lane{}", pl.col("stream"))).otherwise(pl.lit(""))
        ).alias("_pg")
    )

    # Peer-ordered pair for p2p: the sender and the receiver of the transfer.
    peer_send = pl.when(pl.col("dst_rank").is_not_null() & (pl.col("dst_rank") != pl.col("rank"))).then(
        pl.col("dst_rank")).otherwise(pl.col("src_rank"))
    peer_recv = pl.when(pl.col("src_rank").is_not_null() & (pl.col("src_rank") != pl.col("rank"))).then(
        pl.col("src_rank")).otherwise(pl.col("dst_rank"))
    ev = ev.with_columns(
        pl.when(pl.col("op") == "send").then(pl.col("rank")).when(pl.col("op") == "recv").then(peer_recv)
        .alias("_sender"),
        pl.when(pl.col("op") == "send").then(peer_send).when(pl.col("op") == "recv").then(pl.col("rank"))
        .alias("_receiver"),
    )
    is_p2p_pair = pl.col("op").is_in(["send", "recv"]) & pl.col("_sender").is_not_null() & pl.col(
        "_receiver").is_not_null()
    # p2p operations between a pair are posted in the same order on both sides (NCCL requires it):
    # count them in launch order, GPU order when launches are unknown.
    ev = ev.with_columns(
        (pl.coalesce("launch_ts", "ts").rank("ordinal").over(["rank", "_pg", "_sender", "_receiver"]) - 1)
        .cast(pl.Int64).alias("_k_p2p"),
        pl.int_range(pl.len()).over(["rank", "_pg", "op", "step"]).alias("_k_ord"),
    )
    s = pl.col
    # Pairs first: a p2p Comms Id hashes (pg, the side's own p2p Seq), which neither pairs a send
    # with its recv nor differs between two pairs of one group.
    key = (
        pl.when(is_p2p_pair).then(pl.format("p2p|{}|{}|{}|{}", s("_pg"), s("_sender"), s("_receiver"), s("_k_p2p")))
        .when(s("comms_id").is_not_null()).then(pl.lit("id|") + s("comms_id"))
        .when(s("seq").is_not_null() & ~s("p2p")).then(pl.format("seq|{}|{}", s("_pg"), s("seq")))
        .otherwise(pl.format("ord|{}|{}|{}|{}", s("_pg"), s("op"), s("step"), s("_k_ord")))
    )
    method = (
        pl.when(is_p2p_pair).then(pl.lit("p2p"))
        .when(s("comms_id").is_not_null()).then(pl.lit("comms_id"))
        .when(s("seq").is_not_null() & ~s("p2p")).then(pl.lit("seq"))
        .otherwise(pl.lit("ordinal"))
    )
    ev = ev.with_columns(key.alias("key"), method.alias("method"))

    mismatches: list[str] = []
    dup = ev.group_by(["key", "rank"]).agg(pl.len().alias("n")).filter(pl.col("n") > 1)
    if dup.height:
        mismatches.append(
            f"{dup.height} (instance, rank) pairs have several kernels; merged into one span each "
            f"(ranks {_fmt_ranks(dup['rank'].to_list())})")
    # One row per (instance, rank): a collective split into several kernels spans all of them.
    first_cols = [c for c in EXTRACT_SCHEMA if c not in ("rank", "ts", "end", "launch_ts", "busy_at_start",
                                                          "busy_at_end")]
    ev = (
        ev.group_by(["key", "rank"], maintain_order=True)
        .agg(
            *[pl.col(c).first() for c in first_cols + ["method", "_pg"]],
            pl.col("ts").min(), pl.col("end").max(), pl.col("launch_ts").min(),
            pl.col("busy_at_start").min(), pl.col("busy_at_end").max(),
            pl.col("op").n_unique().alias("_n_op"),
        )
    )

    # Instance table.
    inst = (
        ev.group_by("key", maintain_order=True)
        .agg(
            pl.col("method").first(), pl.col("pg").first(), pl.col("_pg").first(),
            pl.col("pg_desc").drop_nulls().first(),
            pl.col("op").first(), pl.col("step").min(), pl.col("p2p").first(),
            pl.len().alias("n_ranks"), pl.col("rank").sort().alias("members"),
            pl.col("group_size").max(), pl.col("pg_ranks").drop_nulls().first(),
            pl.col("dtype").drop_nulls().first(), pl.col("in_nelems").max(), pl.col("out_nelems").max(),
            pl.col("op").n_unique().alias("n_op"), pl.col("dtype").n_unique().alias("n_dtype"),
            pl.col("in_nelems").n_unique().alias("n_in"), pl.col("out_nelems").n_unique().alias("n_out"),
            pl.col("ts").min().alias("first_ts"),
        )
        .with_columns(
            pl.when(pl.col("p2p") & (pl.col("n_op") > 1)).then(pl.lit("sendrecv")).otherwise(pl.col("op")).alias("op"),
            pl.when(pl.col("p2p")).then(pl.lit(1, pl.UInt32)).otherwise(pl.col("n_op")).alias("n_op"),
        )
        .sort(["first_ts"])
        .with_row_index("instance")
        .with_columns(pl.col("instance").cast(pl.Int64))
    )
    # Expected membership: complete Process Group Ranks, else group size, else ranks seen in the pg.
    seen_in_pg = ev.group_by("_pg").agg(pl.col("rank").unique().sort().alias("pg_seen"))
    inst = inst.join(seen_in_pg, on="_pg", how="left")
    expected: list[int] = []
    missing_lists: list[list[int]] = []
    for members, gs, pr, p2p, pg_seen in zip(
        inst["members"].to_list(), inst["group_size"].to_list(), inst["pg_ranks"].to_list(),
        inst["p2p"].to_list(), inst["pg_seen"].to_list()
    ):
        if p2p:
            exp = 2 if len(members) <= 2 else len(members)
            expected.append(exp)
            missing_lists.append([])
            continue
        full = _parse_ranks(pr, gs)
        if full is not None:
            expected.append(len(full))
            missing_lists.append(sorted(set(full) - set(members)))
        elif gs is not None:
            expected.append(int(gs))
            missing_lists.append([])
        else:
            expected.append(len(pg_seen))
            missing_lists.append(sorted(set(pg_seen) - set(members)))
    inst = inst.with_columns(
        pl.Series("expected", expected, dtype=pl.Int64),
        pl.Series("missing", missing_lists, dtype=pl.List(pl.Int64)),
    ).with_columns((pl.col("n_ranks") >= pl.col("expected")).alias("complete"))
    byts = [
        message_bytes(o, d, i, oo)
        for o, d, i, oo in zip(inst["op"].to_list(), inst["dtype"].to_list(), inst["in_nelems"].to_list(),
                               inst["out_nelems"].to_list())
    ]
    inst = inst.with_columns(pl.Series("bytes", byts, dtype=pl.Int64))

    mismatches += _describe_mismatches(ev, inst)
    ev = ev.join(inst.select("key", "instance"), on="key").drop("_pg", "_n_op")
    steps = sorted(x for x in ev["step"].unique().to_list() if x is not None)
    return Matched(
        events=ev.sort(["instance", "rank"]),
        instances=inst.drop("_pg", "pg_seen"),
        mismatches=mismatches[:MAX_MISMATCHES],
        ranks=ranks,
        steps=steps,
    )


def _describe_mismatches(ev: pl.DataFrame, inst: pl.DataFrame) -> list[str]:
    """Count, size, dtype and op disagreements, summarised so a 1024-rank job gives a few lines."""
    out: list[str] = []
    counts = ev.group_by(["_pg", "op", "rank"]).agg(pl.len().alias("n"))
    for (pg, op), grp in counts.group_by(["_pg", "op"], maintain_order=True):
        if op in P2P_OPS:
            continue
        ns = grp["n"].to_numpy()
        if ns.min() == ns.max():
            continue
        common = int(np.median(ns))
        off = grp.filter(pl.col("n") != common)
        detail = "; ".join(
            f"rank {_fmt_ranks(g['rank'].to_list())}: {n}"
            for (n,), g in off.group_by(["n"], maintain_order=True)
        )
        out.append(f"pg '{pg or 'default'}' {op}: most ranks ran {common}, but {detail}")
    incomplete = inst.filter(~pl.col("complete") & ~pl.col("p2p"))
    if incomplete.height:
        given = set(ev["rank"].unique().to_list())
        per = [set(m or []) for m in incomplete["missing"].to_list()]
        absent = [m for m in per if m and not (m & given)]  # only ranks whose traces were not given
        if absent:
            who = sorted(set().union(*absent))
            out.append(f"{len(absent)} collective instance(s) include ranks whose traces were not given "
                       f"({_fmt_ranks(who)}): their side is not analysed")
        rest = [m for m in per if not m or (m & given)]
        if rest:
            miss = sorted({r for m in rest for r in m if r in given})
            out.append(
                f"{len(rest)} collective instance(s) lack ranks"
                + (f" (missing: {_fmt_ranks(miss)})" if miss else "")
                + " — outside the profiled window, or a desync/hang"
            )
    uniform = ~pl.col("op").is_in(["alltoall", "gather", "scatter"])
    for col, what in (("n_op", "collective"), ("n_dtype", "dtype"), ("n_in", "input size"),
                      ("n_out", "output size")):
        bad = inst.filter((pl.col(col) > 1) & (uniform | (pl.lit(col) == "n_op") | (pl.lit(col) == "n_dtype")))
        if bad.height:
            first = bad.row(0, named=True)
            out.append(
                f"{what} differs across ranks in {bad.height} instance(s), first: pg "
                f"'{first['pg'] or 'default'}' {first['op']} ({first['method']} key {first['key']})"
            )
    return out
