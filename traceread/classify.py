"""Which GPU activity counts as communication, memcpy or compute (one definition for all analyses).

COMM: communication kernels as :mod:`traceread.analysis.commkind` defines them — by kernel name
(NCCL/RCCL, MSCCL++, symmetric memory, inference engines' custom all-reduce, NVSHMEM/DeepEP) and,
where the host table is at hand, by the communication operator that launched the kernel.

MEMCPY: ``kind == "memcpy"``. COMP: every other kernel, plus memsets (they occupy the engine the
same way a small kernel does, as in HTA's and TraceLens' breakdowns).
"""

from __future__ import annotations

import polars as pl

from traceread.analysis.commkind import COMM_KERNEL_PATTERN, comm_kind_expr, is_comm_kernel_name

__all__ = ["COMM_KERNEL_PATTERN", "gpu_class_expr", "is_comm_kernel_name"]


def gpu_class_expr() -> pl.Expr:
    """Polars expression giving ``"comm" | "memcpy" | "comp"`` for each row of ``RankTrace.gpu``, by
    name alone (use :func:`traceread.analysis.commkind.gpu_classes` when the host table is known)."""
    return (
        pl.when(pl.col("kind") == "memcpy")
        .then(pl.lit("memcpy"))
        .when(comm_kind_expr().is_not_null())
        .then(pl.lit("comm"))
        .otherwise(pl.lit("comp"))
        .alias("gpu_class")
    )
