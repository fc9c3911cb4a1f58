"""Link GPU work back to the host: kernel -> runtime call (correlation) -> innermost cpu_op.

``launch_row``: the ``cuda_runtime`` (or ``cuda_driver``) row with the kernel's correlation id. A
CUDA-graph launch has one correlation for all kernels of the graph, so they all point at the one
``cudaGraphLaunch`` row. ``op_row``: the innermost ``cpu_op`` enclosing that launch on the same
thread; when the launch is missing or sits outside any op (e.g. launched from a thread without
op events), the ``cpu_op`` whose ``External id`` equals the kernel's external id, as HTA does.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from traceread.read.columns import cheap_nulls

#: Host categories whose events launch device work and carry the correlation id.
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver", "privateuse1_runtime", "xpu_runtime")


def link(gpu: pl.DataFrame, host: pl.DataFrame, op_anc: np.ndarray) -> pl.DataFrame:
    """Fill ``launch_row`` and ``op_row`` of the GPU table (rows of ``host``)."""
    if gpu.height == 0:
        return gpu
    # Each lookup selects its few columns before filtering: a filter of the whole host table
    # would copy every column of the matching rows (hundreds of MB on a 1 GB rank).
    launches = (
        host.select("cat", "correlation", "row")
        .filter(pl.col("cat").is_in(LAUNCH_CATEGORIES) & pl.col("correlation").is_not_null())
        # Prefer the runtime call over the driver call it wraps when both carry the id.
        .sort([pl.col("cat") != "cuda_runtime", "row"])
        .unique("correlation", keep="first", maintain_order=True)
        .select("correlation", launch_row=pl.col("row"))
    )
    # Joins run on narrow key frames only; the wide GPU table is never gathered (its many
    # all-null columns stay unmaterialised).
    keys = gpu.select("correlation", "external_id").with_row_index("_i")
    g = keys.join(launches, on="correlation", how="left").sort("_i")
    launch = g["launch_row"]
    op = np.full(g.height, -1, dtype=np.int64)
    has = launch.is_not_null().to_numpy()
    if has.any() and op_anc.size:
        op[has] = op_anc[launch.to_numpy()[has].astype(np.int64)]
    g = g.with_columns(pl.Series("op_row", op, dtype=pl.Int64).replace(-1, None))
    missing = g["op_row"].is_null() & g["external_id"].is_not_null()
    if missing.any():
        by_ext = (
            host.select("cat", "external_id", "row")
            .filter((pl.col("cat") == "cpu_op") & pl.col("external_id").is_not_null())
            .unique("external_id", keep="first", maintain_order=True)
            .select("external_id", _ext_op=pl.col("row"))
        )
        g = (
            g.join(by_ext, on="external_id", how="left")
            .sort("_i")
            .with_columns(pl.coalesce("op_row", "_ext_op").alias("op_row"))
        )
    return gpu.with_columns(
        cheap_nulls(g.select("launch_row", "op_row")).get_columns()
    ).select(gpu.columns)
