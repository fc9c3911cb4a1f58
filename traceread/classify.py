"""Which GPU activity counts as communication, memcpy or compute (one definition for all analyses).

COMM: kernels whose names mark them as collectives or point-to-point transfers. The list is
deliberately short and documented; a kernel is only called communication when its name says so:

* ``nccl`` — NCCL kernels (``ncclKernel_*``, ``ncclDevKernel_*``); RCCL uses the same names.
* ``rccl`` — RCCL-specific kernel names on ROCm.

MEMCPY: ``kind == "memcpy"``. COMP: every other kernel, plus memsets (they occupy the engine the
same way a small kernel does, as in HTA's and TraceLens' breakdowns).
"""

from __future__ import annotations

import re

import polars as pl

COMM_KERNEL_MARKERS: tuple[str, ...] = ("nccl", "rccl")
COMM_KERNEL_PATTERN = "(?i)" + "|".join(re.escape(m) for m in COMM_KERNEL_MARKERS)


def is_comm_kernel_name(name: str) -> bool:
    """True when a kernel name marks it as a collective or point-to-point transfer."""
    lowered = name.lower()
    return any(marker in lowered for marker in COMM_KERNEL_MARKERS)


def gpu_class_expr() -> pl.Expr:
    """Polars expression giving ``"comm" | "memcpy" | "comp"`` for each row of ``RankTrace.gpu``."""
    return (
        pl.when(pl.col("kind") == "memcpy")
        .then(pl.lit("memcpy"))
        .when((pl.col("kind") == "kernel") & pl.col("name").str.contains(COMM_KERNEL_PATTERN))
        .then(pl.lit("comm"))
        .otherwise(pl.lit("comp"))
        .alias("gpu_class")
    )
