"""Which GPU kernels and host operators are communication: one classifier for every analysis.

A kernel is communication when its **name** says so or when the **operator that launched it** is a
communication operator. Communication kernels move data between GPUs; they are sized to the link,
not to the SMs (NCCL runs a handful of blocks by design), so they are counted as communication in
the time breakdown, the step ledger, the step timeline and the Perfetto export, and never judged as
compute: no SM efficiency, wave quantisation, "SM time lost" or roofline verdicts.

Rules are written on the *structure* of a name, not on one library's spelling, so forks and
in-house builds that rename the namespace are still recognised. Families (``comm_kind``), by kernel
name (case-insensitive), first match wins:

* ``nccl`` — NCCL, RCCL (``ncclDevKernel_*``, ``ncclKernel_*``, RCCL's ``ncclDevKernel_Generic_*``),
  HCCL, and any name containing ``rccl``.
* ``msccl`` — MSCCL / MSCCL++ kernels.
* ``symm_mem`` — symmetric-memory collectives: NVLS ``multimem`` kernels, ``symm_mem`` /
  ``symmetric_memory`` kernels, one-shot / two-shot all-reduce, all-gather and reduce-scatter
  written with underscores (torch's ``one_shot_all_reduce_kernel``).
* ``custom_allreduce`` — inference engines' own all-reduce, whatever the namespace:
  ``cross_device_reduce*`` (vLLM, SGLang, aiter), ``custom_all_reduce``, ``quick_reduce``,
  TensorRT-LLM / FlashInfer ``oneShotAllReduce`` / ``twoShotAllReduce`` / ``allreduce_fusion*``,
  Lamport all-reduce.
* ``ep`` — expert-parallel token exchange (DeepEP and its forks): a kernel whose leaf function is
  ``dispatch`` / ``combine`` (optionally ``notify_`` / ``cached_`` / ``ll_`` / ``low_latency_``
  prefixed, ``_kernel`` / ``_impl`` suffixed) or ``cached_notify`` / ``clean_low_latency_buffer``,
  inside a transport namespace — any of ``intranode``, ``internode``, ``internode_ll``, ``ll``,
  ``low_latency``, ``ep``, ``a2a``, ``all_to_all`` anywhere in its qualified name
  (``<ns>::ep::internode::dispatch<...>``, ``deep_ep::intranode::combine``); and camel-case
  ``EpDispatchIntraNode`` / ``EpCombineInterNode`` / ``…LowLatency`` kernels. DeepEP's
  ``get_dispatch_layout`` only counts tokens: compute. A ``combine`` in a ``moe::`` namespace
  alone (the local weighted sum of expert outputs) is compute.
* ``nvshmem`` — NVSHMEM kernels.

By launching operator (the innermost ``cpu_op`` holding the launch, ``gpu.op_row``), family ``op``:
``record_param_comms``, ``nccl:*``, ``gloo:*``, ``ucc:*``, ``mpi:*``, ``c10d::*``,
``_c10d_functional::*``, ``symm_mem::*``, ``_C_custom_ar::*``, and any operator of any namespace
other than ``aten`` / ``prim`` whose last name component contains a collective verb
(``all_reduce``, ``allreduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``): vLLM's
``vllm::all_reduce``, SGLang's, TensorRT-LLM's and in-house ``<ns>::fused_allreduce_rmsnorm`` alike.
Only the innermost operator counts: a copy kernel launched by ``aten::copy_`` inside
``c10d::allgather_`` (unflattening the output) is compute.

gloo collectives have no GPU kernel: their CPU spans (``gloo:*``) are read by
:func:`traceread.analysis.comm.collectives.comm_events`; :func:`is_comm_op_name` recognises them.
Memcpy and memset are never communication here (memcpy is its own class, memset is compute).

Every GPU row is in one of three classes (:func:`gpu_classes`): ``comm`` as above, ``memcpy``
(``kind == "memcpy"``) and ``comp`` — every other kernel, plus memsets (they occupy the engine the
same way a small kernel does, as in HTA's and TraceLens' breakdowns). Analyses that have the host
table use :func:`gpu_classes` / :func:`comm_mask` (name *and* launching operator); the name-only
:func:`gpu_class_expr` is for callers that have no host table.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import polars as pl

_EP_LEAF = (r"(?:(?:ll_|low_latency_|fused_)?(?:cached_)?(?:notify_)?(?:dispatch|combine)"
            r"(?:_(?:send|recv|intranode|internode|ll|low_latency))?(?:_?kernel|_?impl)?"
            r"|cached_notify|clean_low_latency_buffer)")
_EP_TRANSPORT = r"(?:intranode|internode|internode_ll|ll|low_latency|ep|a2a|all_?to_?all)"
#: Expert-parallel token exchange (module docstring): a dispatch/combine/notify leaf inside a
#: transport namespace, or a camel-case EpDispatchIntraNode-style kernel.
EP_KERNEL = (rf"(?:^|[^\w]){_EP_TRANSPORT}::(?:\w+::)*{_EP_LEAF}\s*(?:<|\(|$)"
             r"|ep_?(?:dispatch|combine)_?(?:intra_?node|inter_?node|low_?latency|ll)")

#: (family, regex on the kernel name), checked in order; the first match names the family.
KERNEL_FAMILIES: tuple[tuple[str, str], ...] = (
    ("nccl", r"nccl|rccl|hccl"),
    ("msccl", r"mscclpp|msccl"),
    ("symm_mem", r"multimem|symm_?mem|symmetric_?memory|(?:one|two)_shot_(?:all_?reduce|all_?gather|reduce_?scatter)"),
    ("custom_allreduce", r"cross_?device_?reduce|custom_?all_?reduce|quick_?reduce|(?:one|two)_?shot_?all_?reduce"
                         r"|all_?reduce_?fusion|lamport.*all_?reduce|all_?reduce.*lamport"),
    ("ep", EP_KERNEL),
    ("nvshmem", r"nvshmem"),
)
#: Names that look like communication but only compute (DeepEP's token counting).
NOT_COMM_KERNEL = r"(?i)get_dispatch_layout"
COMM_KERNEL_PATTERN = "(?i)" + "|".join(f"(?:{p})" for _f, p in KERNEL_FAMILIES)

_COLLECTIVE_VERB = r"(?:all_?reduce|all_?gather|reduce_?scatter|all_?to_?all)"
#: Launching operators that are communication (innermost ``cpu_op`` of a kernel launch), less
#: :data:`NOT_COMM_OP` (written as two patterns: polars' regex engine has no look-ahead).
COMM_OP_PATTERN = (
    r"(?i)^(?:record_param_comms$|nccl:|gloo:|ucc:|mpi:|c10d::|_?c10d_functional::|symm_mem::|_c_custom_ar::"
    r"|[\w.]+::(?:\w+::)*\w*" + _COLLECTIVE_VERB + r"\w*$)"
)
#: Namespaces whose operators are never communication even with a collective verb in the name.
NOT_COMM_OP = r"(?i)^(?:aten|prim|profiler|inductor)::"

_FAMILY_RE = [(f, re.compile(p, re.IGNORECASE)) for f, p in KERNEL_FAMILIES]
_NOT_COMM_RE = re.compile(NOT_COMM_KERNEL)
_OP_RE = re.compile(COMM_OP_PATTERN)
_NOT_OP_RE = re.compile(NOT_COMM_OP)

#: Collective family of kernels that carry no ``Collective name`` (non-NCCL implementations).
_KERNEL_COLLECTIVE: tuple[tuple[str, str], ...] = (
    (r"all_?gather", "allgather"),
    (r"reduce_?scatter", "reducescatter"),
    (r"cross_?device_?reduce|all_?reduce|quick_?reduce|multimem_one_shot_reduce", "allreduce"),
    (r"dispatch|combine|notify|all_?to_?all", "alltoall"),
)


@functools.lru_cache(maxsize=1 << 16)
def comm_kind_of_name(name: str | None) -> str | None:
    """The communication family a kernel name belongs to, None for compute kernels. Cached: a
    rank's summary asks about the same few thousand names several times (ledger, classes, links)."""
    if not name or _NOT_COMM_RE.search(name):
        return None
    for family, rx in _FAMILY_RE:
        if rx.search(name):
            return family
    return None


def is_comm_kernel_name(name: str) -> bool:
    """True when a kernel name alone marks it as communication."""
    return comm_kind_of_name(name) is not None


def is_comm_op_name(name: str | None) -> bool:
    """True when a host operator is a communication operator (launches or runs a collective)."""
    return bool(name and _OP_RE.search(name) and not _NOT_OP_RE.search(name))


def comm_op_expr() -> pl.Expr:
    """True for host rows that are communication operators or spans (see :data:`COMM_OP_PATTERN`)."""
    name = pl.col("name").fill_null("")
    return name.str.contains(COMM_OP_PATTERN) & ~name.str.contains(NOT_COMM_OP)


def is_comm_kernel_row(row: Mapping[str, Any]) -> bool:
    """True for a kernel-table row (``report["kernels"]``) that is communication: its ``comm_kind``
    (name or launching operator, set by the map) or, in older documents, its name."""
    return bool(row.get("comm_kind")) or is_comm_kernel_name(str(row.get("name") or ""))


def collective_of_kernel(name: str | None) -> str | None:
    """Collective family of a non-NCCL communication kernel by its name (None when not telling)."""
    if comm_kind_of_name(name) is None:
        return None
    low = str(name).lower()
    for pat, op in _KERNEL_COLLECTIVE:
        if re.search(pat, low):
            return op
    return None


def comm_kind_expr() -> pl.Expr:
    """Per GPU row, the family its *name* gives (null for compute, memcpy and memset)."""
    expr: pl.Expr = pl.lit(None, dtype=pl.Utf8)
    for family, pattern in reversed(KERNEL_FAMILIES):
        expr = pl.when(pl.col("name").str.contains("(?i)" + pattern)).then(pl.lit(family)).otherwise(expr)
    is_kernel = (pl.col("kind") == "kernel") & ~pl.col("name").fill_null("").str.contains(NOT_COMM_KERNEL)
    return pl.when(is_kernel).then(expr).otherwise(pl.lit(None, dtype=pl.Utf8))


def _comm_op_rows(gpu: pl.DataFrame, host: pl.DataFrame | None) -> np.ndarray:
    """Sorted host rows (among the kernels' ``op_row``) that are communication operators."""
    if host is None or host.height == 0 or "op_row" not in gpu.columns or gpu.height == 0:
        return np.zeros(0, np.int64)
    rows = gpu["op_row"].drop_nulls().unique()
    rows = rows.filter((rows >= 0) & (rows < host.height))
    if rows.len() == 0:
        return np.zeros(0, np.int64)
    names = host["name"].gather(rows).fill_null("")
    hit = names.str.contains(COMM_OP_PATTERN) & ~names.str.contains(NOT_COMM_OP)
    return np.sort(rows.filter(hit).to_numpy().astype(np.int64))


def _kinds_by_name(gpu: pl.DataFrame) -> pl.Series:
    """:func:`comm_kind_of_name` of every row, computed once per distinct name (a trace repeats a
    few thousand names millions of times); null for memcpys and memsets."""
    if gpu.height == 0:
        return pl.Series("comm_kind", [], dtype=pl.Utf8)
    names = gpu["name"].fill_null("")
    mapping = {n: comm_kind_of_name(n) for n in names.unique().to_list()}
    kinds = names.replace_strict(mapping, default=None, return_dtype=pl.Utf8)
    return gpu.select(pl.when(pl.col("kind") == "kernel").then(kinds).otherwise(pl.lit(None, pl.Utf8))
                      .alias("comm_kind"))["comm_kind"]


def comm_kinds(gpu: pl.DataFrame, host: pl.DataFrame | None = None) -> pl.Series:
    """``comm_kind`` of every row of ``gpu`` (a ``RankTrace.gpu`` table or a filter of it): the
    family by name, else ``"op"`` for a kernel launched by a communication operator of ``host``,
    else null."""
    kinds = _kinds_by_name(gpu)
    op_rows = _comm_op_rows(gpu, host)
    if op_rows.size == 0:
        return kinds
    op_row = gpu["op_row"].fill_null(-1).to_numpy()
    by_op = np.isin(op_row, op_rows) & (gpu["kind"] == "kernel").to_numpy()
    by_op &= ~gpu["name"].fill_null("").str.contains(NOT_COMM_KERNEL).to_numpy()
    return _fill_op(kinds, by_op)


def _fill_op(kinds: pl.Series, by_op: np.ndarray) -> pl.Series:
    """``kinds`` with ``"op"`` where the name gave nothing but the launching operator is communication."""
    fill = pl.Series("_op", by_op, dtype=pl.Boolean) & kinds.is_null()
    return kinds.to_frame().with_columns(
        pl.when(fill).then(pl.lit("op")).otherwise(pl.col("comm_kind")).alias("comm_kind"))["comm_kind"]


def comm_mask(gpu: pl.DataFrame, host: pl.DataFrame | None = None) -> pl.Series:
    """True for the rows of ``gpu`` that are communication kernels (see the module docstring)."""
    return comm_kinds(gpu, host).is_not_null().alias("is_comm")


def gpu_classes(gpu: pl.DataFrame, host: pl.DataFrame | None = None) -> pl.Series:
    """``"comm" | "memcpy" | "comp"`` for every row of ``gpu`` (memsets are compute, as in HTA)."""
    is_comm = comm_mask(gpu, host)
    return gpu.select(
        pl.when(pl.col("kind") == "memcpy").then(pl.lit("memcpy"))
        .when(is_comm).then(pl.lit("comm")).otherwise(pl.lit("comp")).alias("gpu_class"))["gpu_class"]


def gpu_class_expr() -> pl.Expr:
    """Polars expression giving ``"comm" | "memcpy" | "comp"`` for each row of ``RankTrace.gpu``, by
    name alone (use :func:`traceread.analysis.kinds.gpu_classes` when the host table is known)."""
    return (
        pl.when(pl.col("kind") == "memcpy")
        .then(pl.lit("memcpy"))
        .when(comm_kind_expr().is_not_null())
        .then(pl.lit("comm"))
        .otherwise(pl.lit("comp"))
        .alias("gpu_class")
    )


#: The process-group columns a communication kernel takes from its launching operator.
_PG_COLUMNS = ("coll_name", "in_nelems", "out_nelems", "group_size", "dtype", "pg_name", "pg_desc", "pg_ranks",
               "seq", "comms_id", "src_rank", "dst_rank")


def fill_launch_comm_args(gpu: pl.DataFrame, host: pl.DataFrame | None) -> pl.DataFrame:
    """``gpu`` where each communication kernel that carries no process group (older torch writes the
    comm args only on ``record_param_comms``, not on the kernel) takes them from the nearest
    ancestor of its launching operator that has them. The step ledger, the collectives and the
    layout then agree on which group a kernel ran on."""
    if host is None or host.height == 0 or gpu.height == 0 or "pg_name" not in gpu.columns:
        return gpu
    need = comm_mask(gpu, host) & gpu["pg_name"].is_null() & gpu["op_row"].is_not_null()
    idx = np.flatnonzero(need.to_numpy())
    if idx.size == 0 or host["pg_name"].null_count() == host.height:
        return gpu
    parents = host["parent"].fill_null(-1).to_numpy().astype(np.int64)
    has = host["pg_name"].is_not_null().to_numpy()
    n = host.height
    rows = gpu["op_row"].to_numpy()[idx].astype(np.int64)
    src = np.full(idx.size, -1, np.int64)
    cur = rows.copy()
    for _ in range(64):  # climb all open chains one level at a time
        live = (src < 0) & (cur >= 0) & (cur < n)
        if not live.any():
            break
        hit = live & has[np.clip(cur, 0, n - 1)]
        src[hit] = cur[hit]
        cur = np.where(live & ~hit, parents[np.clip(cur, 0, n - 1)], -1)
    ok = src >= 0
    if not ok.any():
        return gpu
    take = host.select(list(_PG_COLUMNS))[pl.Series(src[ok])]
    gi = idx[ok]
    cols = []
    for c in _PG_COLUMNS:
        mine = gpu[c].gather(gi)
        merged = pl.DataFrame({"a": mine, "b": take[c].cast(gpu.schema[c])}).select(pl.coalesce("a", "b"))["a"]
        cols.append(gpu[c].clone().scatter(gi, merged))
    return gpu.with_columns(cols)
