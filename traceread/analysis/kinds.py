"""Which GPU kernels are communication: one classifier for every analysis.

A kernel is communication when its **name** says so or when the **operator that launched it** is a
communication operator. Communication kernels move data between GPUs; they are sized to the link,
not to the SMs (NCCL runs a handful of blocks by design), so they are counted as communication in
the time breakdown and never judged as compute: no SM efficiency, wave quantisation, "SM time lost"
or roofline verdicts.

Families (``comm_kind``), by kernel name (case-insensitive):

* ``nccl`` — NCCL and RCCL (``ncclDevKernel_*``, ``ncclKernel_*``; RCCL reuses those names) and any
  name containing ``rccl``.
* ``msccl`` — MSCCL / MSCCL++ kernels (``mscclpp``, ``mscclKernel``).
* ``symm_mem`` — symmetric-memory collectives: NVLS ``multimem`` kernels, torch ``symm_mem``
  one-shot / two-shot all-reduce and all-gather kernels.
* ``custom_allreduce`` — inference engines' own all-reduce: vLLM / SGLang
  ``cross_device_reduce_1stage`` / ``_2stage``, ROCm ``quickreduce``, TensorRT-LLM / FlashInfer
  ``oneShotAllReduceKernel`` / ``twoShotAllReduceKernel`` / ``allreduce_fusion_kernel*``.
* ``nvshmem`` — NVSHMEM kernels and DeepEP's token exchange (``deep_ep::intranode|internode|
  internode_ll::dispatch|combine|notify_*``; ``get_dispatch_layout`` only counts tokens and is compute).

By launching operator (the innermost ``cpu_op`` holding the launch, ``gpu.op_row``):
``record_param_comms``, ``nccl:*``, ``gloo:*``, ``c10d::*``, ``_c10d_functional::*``,
``symm_mem::*``, ``_C_custom_ar::*`` and the collective ops of ``vllm::`` / ``sglang::`` /
``sgl_kernel::`` / ``trtllm::`` (``all_reduce``, ``all_gather``, ``reduce_scatter``, ``all_to_all``)
— family ``op``. Only the innermost operator counts: a copy kernel launched by ``aten::copy_``
inside ``c10d::allgather_`` (unflattening the output) is compute.

gloo collectives have no GPU kernel: their CPU spans (``gloo:*``) are read by
:func:`traceread.analysis.comm.collectives.comm_events`; :func:`is_comm_op_name` recognises them.
Memcpy and memset are never communication here (memcpy is its own class, memset is compute).

Every GPU row is in one of three classes (:func:`gpu_class_expr`): ``comm`` as above, ``memcpy``
(``kind == "memcpy"``) and ``comp`` — every other kernel, plus memsets (they occupy the engine the
same way a small kernel does, as in HTA's and TraceLens' breakdowns).
"""

from __future__ import annotations

import re

import numpy as np
import polars as pl

#: (family, regex on the kernel name), checked in order; the first match names the family.
KERNEL_FAMILIES: tuple[tuple[str, str], ...] = (
    ("nccl", r"nccl|rccl"),
    ("msccl", r"mscclpp|msccl"),
    ("symm_mem", r"multimem|symm_mem|one_shot_all_reduce|two_shot_all_reduce|one_shot_all_gather"),
    ("custom_allreduce", r"cross_device_reduce|custom_?all_?reduce|quickreduce|oneshotallreduce|twoshotallreduce"
                         r"|allreduce_fusion_kernel|lamport.*all_?reduce|all_?reduce.*lamport"),
    ("nvshmem", r"nvshmem|deep_ep::(intranode|internode|internode_ll)::"),
)
#: Names that look like communication but only compute (DeepEP's token counting).
NOT_COMM_KERNEL = r"(?i)get_dispatch_layout"
COMM_KERNEL_PATTERN = "(?i)" + "|".join(f"(?:{p})" for _f, p in KERNEL_FAMILIES)

_ENGINE_COLLECTIVE = r"(all_?reduce|all_?gather|reduce_?scatter|all_?to_?all)"
#: Launching operators that are communication (innermost ``cpu_op`` of a kernel launch).
COMM_OP_PATTERN = (
    r"(?i)^(record_param_comms$|nccl:|gloo:|c10d::|_?c10d_functional::|symm_mem::|_c_custom_ar::"
    r"|(vllm|sglang|sgl_kernel|trtllm|tensorrt_llm)::.*" + _ENGINE_COLLECTIVE + ")"
)

_FAMILY_RE = [(f, re.compile(p, re.IGNORECASE)) for f, p in KERNEL_FAMILIES]
_NOT_COMM_RE = re.compile(NOT_COMM_KERNEL)
_OP_RE = re.compile(COMM_OP_PATTERN)

#: Collective family of kernels that carry no ``Collective name`` (non-NCCL implementations).
_KERNEL_COLLECTIVE: tuple[tuple[str, str], ...] = (
    (r"all_?gather", "allgather"),
    (r"reduce_?scatter", "reducescatter"),
    (r"cross_device_reduce|all_?reduce|quickreduce|multimem_one_shot_reduce", "allreduce"),
    (r"dispatch|combine|all_?to_?all", "alltoall"),
)


def comm_kind_of_name(name: str | None) -> str | None:
    """The communication family a kernel name belongs to, None for compute kernels."""
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
    return bool(name and _OP_RE.search(name))


def comm_op_expr() -> pl.Expr:
    """True for host rows that are communication operators or spans (see :data:`COMM_OP_PATTERN`)."""
    return pl.col("name").fill_null("").str.contains(COMM_OP_PATTERN)


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
    names = host["name"].gather(rows)
    hit = names.fill_null("").str.contains(COMM_OP_PATTERN)
    return np.sort(rows.filter(hit).to_numpy().astype(np.int64))


def comm_kinds(gpu: pl.DataFrame, host: pl.DataFrame | None = None) -> pl.Series:
    """``comm_kind`` of every row of ``gpu`` (a ``RankTrace.gpu`` table or a filter of it): the
    family by name, else ``"op"`` for a kernel launched by a communication operator of ``host``,
    else null."""
    kinds = gpu.select(comm_kind_expr().alias("comm_kind"))["comm_kind"]
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
