"""Roofline per operator: how close each op's kernels came to the GPU's compute or memory ceiling.

For every *leaf* operator whose FLOPs and bytes :mod:`traceread.analysis.flops` can compute:

* **kernel_time_us** — length of the union of the GPU kernels (and memsets) the op caused, on all
  streams (TraceLens' "busy time" of the op's subtree). A kernel belongs to the innermost
  ``cpu_op`` that caused it (``gpu.op_row``); when that op has no formula (``aten::index_select``
  under ``aten::embedding``, ``aten::empty`` under an attention op, ...) the kernel goes to the
  nearest enclosing op that has one. Each kernel is counted for exactly one op. Memcpys are left
  out (they are bound by PCIe/NVLink, not HBM) and so are communication kernels.
* **achieved_tflops** = flops ÷ kernel time; **achieved_gbps** = bytes ÷ kernel time (1 GB = 1e9 B).
* **intensity** = flops ÷ bytes (FLOP/byte).
* **ceiling**: matrix ops (GEMM, conv, attention) use the dense peak of their precision (bf16, fp16,
  tf32 when the kernel names or ``allow_tf32`` say so, fp32, fp8, ...); vector ops (elementwise,
  reductions, norms, softmax, embedding) use the FP32 vector rate. **ridge** = peak ÷ HBM bandwidth.
* **bound** = ``"compute"`` when intensity ≥ ridge, else ``"memory"``.
* **pct_of_roof** = 100 × achieved ÷ attainable, attainable = min(peak, intensity × bandwidth).
  Equivalently 100 × max(flops ÷ peak, bytes ÷ bandwidth) ÷ kernel time (TraceLens "Pct Roofline"),
  which also covers zero-FLOP ops (copies): their roof is the bandwidth.

Ops with zero kernel time are left out (nothing measured). Ceilings are datasheet peaks, not
"achievable" ones (TraceLens' MAF numbers are about half the MI300X datasheet), so 60–80 % of roof is
already good for a large GEMM.
"""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import polars as pl

from traceread import intervals
from traceread.analysis.devices import DeviceSpec
from traceread.analysis.flops import (
    OpCost,
    attention_causal_flag,
    is_attention_backward,
    is_supported,
    op_cost,
)
from traceread.classify import COMM_KERNEL_PATTERN
from traceread.model import RankTrace

#: Maximum number of aggregated ops kept in the report document.
MAX_REPORT_OPS = 200

#: Kernel-name fragments of TF32 tensor-core GEMM/conv kernels (cuBLAS/cutlass ``tf32``/``s1688``/
#: ``s16816``, rocBLAS/hipBLASLt ``xf32``): an fp32 op running them is held to the tf32 ceiling.
TF32_KERNEL_PATTERN = re.compile(r"tf32|xf32|s1688|s16816", re.IGNORECASE)

#: Where a precision the GPU lacks falls back to (e.g. bf16 on V100 runs on the FP32 units).
PRECISION_FALLBACK: dict[str, tuple[str, ...]] = {
    "bf16": ("fp32",),
    "fp16": ("fp32",),
    "tf32": ("fp32",),
    "fp8": ("bf16", "fp16", "fp32"),
    "int8": ("fp16", "fp32"),
    "fp32": (),
    "fp64": (),
}

OP_TABLE_SCHEMA: dict[str, pl.DataType] = {
    "row": pl.Int64,  # host row of the op
    "name": pl.Utf8,
    "shapes": pl.Utf8,
    "dtype": pl.Utf8,
    "precision": pl.Utf8,  # bf16/fp16/fp32/tf32/fp8/...: matrix ops: the ceiling's (after TF32 and fallback)
    "family": pl.Utf8,
    "unit": pl.Utf8,  # "matrix" | "vector"
    "ts": pl.Float64,  # host start of the op (µs)
    "tid": pl.Int64,
    "flops": pl.Float64,
    "model_flops": pl.Float64,
    "bytes": pl.Float64,
    "kernels": pl.Int64,
    "kernel_time_us": pl.Float64,
    "achieved_tflops": pl.Float64,
    "achieved_gbps": pl.Float64,
    "intensity": pl.Float64,
    "bound": pl.Utf8,
    "pct_of_roof": pl.Float64,
    "peak_tflops": pl.Float64,
    "ceiling": pl.Utf8,
}


def _parents(host: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """``parent`` (−1 at top level) and ``depth`` (−1 when not nested) as numpy arrays."""
    parent = host["parent"].fill_null(-1).to_numpy().astype(np.int64)
    depth = host["depth"].fill_null(-1).to_numpy().astype(np.int64)
    return parent, depth


def propagate_down(parent: np.ndarray, depth: np.ndarray, own: np.ndarray) -> np.ndarray:
    """For every row, ``own[row]`` if it is ≥ 0, else the value of its parent (already propagated).

    Rows are visited level by level (depth 0, 1, ...), so a parent is always settled before its
    children; a row with ``own ≥ 0`` stops the inheritance for its subtree.
    """
    out = own.copy()
    if out.size == 0:
        return out
    max_depth = int(depth.max()) if depth.size else -1
    for d in range(1, max_depth + 1):
        rows = np.nonzero(depth == d)[0]
        if rows.size == 0:
            continue
        par = parent[rows]
        take = (out[rows] < 0) & (par >= 0)
        sel = rows[take]
        out[sel] = out[parent[sel]]
    return out


def op_costs(host: pl.DataFrame) -> dict[int, OpCost]:
    """Cost of every ``cpu_op`` row that has a formula and readable shapes (memoised by args)."""
    cand = host.filter((pl.col("cat") == "cpu_op") & pl.col("input_dims").is_not_null()).select(
        "row", "name", "input_dims", "input_types", "concrete_inputs"
    )
    names = cand["name"].to_list()
    keep = [is_supported(n) for n in names]
    cand = cand.filter(pl.Series(keep, dtype=pl.Boolean)) if cand.height else cand
    hints = _causal_hints(host, cand)
    out: dict[int, OpCost] = {}
    memo: dict[tuple[Any, ...], OpCost | None] = {}
    for row, name, dims, types, conc in cand.iter_rows():
        hint = hints.get(int(row))
        key = (name, dims, types, conc, hint)
        if key not in memo:
            memo[key] = op_cost(name, dims, types, conc, causal_hint=hint)
        c = memo[key]
        if c is not None:
            out[int(row)] = c
    return out


def _causal_hints(host: pl.DataFrame, cand: pl.DataFrame) -> dict[int, bool]:
    """Causal flag for attention backward rows that did not record one, from the forward call.

    The autograd node that runs the backward (e.g. ``ScaledDotProductFlashAttentionBackward0``)
    carries the forward op's ``Sequence number``; the forward attention op with that number says
    whether it was causal (TraceLens links forward and backward the same way).
    """
    bwd = [r for r, n, c in zip(cand["row"].to_list(), cand["name"].to_list(), cand["concrete_inputs"].to_list())
           if is_attention_backward(n) and attention_causal_flag(n, c) is None]
    if not bwd:
        return {}
    names = host["name"].to_list()
    conc = host["concrete_inputs"].to_list()
    seqs = host["seq_num"].to_list()
    ftid = host["fwd_tid"].to_list()
    parents = host["parent"].to_list()
    fwd_flag: dict[int, bool] = {}
    for i, (n, c, sq) in enumerate(zip(names, conc, seqs)):
        if sq is None or (ftid[i] or 0) != 0:
            continue
        flag = attention_causal_flag(n, c)
        if flag is not None and not is_attention_backward(n):
            fwd_flag.setdefault(int(sq), flag)
    out: dict[int, bool] = {}
    for r in bwd:
        p = parents[r]
        for _ in range(8):  # the backward node is a few levels up
            if p is None:
                break
            if seqs[p] is not None and (ftid[p] or 0) != 0 and int(seqs[p]) in fwd_flag:
                out[int(r)] = fwd_flag[int(seqs[p])]
                break
            p = parents[p]
    return out


def _owner_rows(rt: RankTrace, costs: dict[int, OpCost]) -> np.ndarray:
    """For every host row, the row of the nearest op (itself or an ancestor) that has a cost."""
    n = rt.host.height
    own = np.full(n, -1, dtype=np.int64)
    if costs:
        idx = np.fromiter(costs.keys(), dtype=np.int64, count=len(costs))
        own[idx] = idx
    parent, depth = _parents(rt.host)
    return propagate_down(parent, depth, own)


def _kernel_groups(rt: RankTrace, owner: np.ndarray) -> pl.DataFrame:
    """GPU kernels/memsets with the op that owns them (``owner``), comm kernels excluded."""
    g = rt.gpu
    if g.height == 0 or owner.size == 0:
        return pl.DataFrame(schema={"owner": pl.Int64, "ts": pl.Float64, "end": pl.Float64, "dur": pl.Float64,
                                    "name": pl.Utf8})
    g = g.filter(
        pl.col("kind").is_in(["kernel", "memset"])
        & pl.col("op_row").is_not_null()
        & ~((pl.col("kind") == "kernel") & pl.col("name").str.contains(COMM_KERNEL_PATTERN))
    ).select("op_row", "ts", "end", "dur", "name")
    op_rows = g["op_row"].to_numpy()
    valid = (op_rows >= 0) & (op_rows < owner.size)
    own = np.full(op_rows.size, -1, dtype=np.int64)
    own[valid] = owner[op_rows[valid]]
    return g.with_columns(pl.Series("owner", own, dtype=pl.Int64)).filter(pl.col("owner") >= 0)


def _busy_per_owner(k: pl.DataFrame) -> pl.DataFrame:
    """owner -> kernels, kernel_time_us (union length), any TF32 kernel name."""
    if k.height == 0:
        return pl.DataFrame(schema={"owner": pl.Int64, "kernels": pl.Int64, "kernel_time_us": pl.Float64,
                                    "tf32": pl.Boolean})
    agg = k.group_by("owner").agg(
        pl.len().cast(pl.Int64).alias("kernels"),
        # one kernel: its recorded ``dur`` exactly (``end − ts`` loses bits at epoch-µs magnitudes)
        pl.col("dur").clip(lower_bound=0).sum().alias("sum_dur"),
        pl.col("name").str.contains("(?i)" + TF32_KERNEL_PATTERN.pattern).any().alias("tf32"),
    )
    multi = agg.filter(pl.col("kernels") > 1)["owner"].to_list()
    busy: dict[int, float] = {}
    if multi:
        sub = k.filter(pl.col("owner").is_in(multi)).sort("owner", "ts")
        owners = sub["owner"].to_numpy()
        ts = sub["ts"].to_numpy()
        ends = sub["end"].to_numpy()
        bounds = np.flatnonzero(np.diff(owners)) + 1
        for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, owners.size]):
            busy[int(owners[lo])] = intervals.length(intervals.merge(ts[lo:hi], ends[lo:hi]))
    union = [busy.get(o, s) for o, s in zip(agg["owner"].to_list(), agg["sum_dur"].to_list())]
    return agg.with_columns(pl.Series("kernel_time_us", union, dtype=pl.Float64)).drop("sum_dur")


def ceiling_for(device: DeviceSpec, unit: str, precision: str) -> tuple[str, float, str] | None:
    """``(precision used, peak FLOP/s, description)`` of the compute ceiling for an op."""
    if unit == "vector":
        if device.vector_flops is None:
            return None
        what = "CUDA cores" if device.vendor == "nvidia" else "vector ALUs"
        return "fp32", device.vector_flops, f"fp32 vector ({what}) {device.vector_flops / 1e12:.4g} TFLOP/s"
    for p in (precision, *PRECISION_FALLBACK.get(precision, ())):
        peak = device.peak(p)
        if peak is not None:
            unit_name = device.unit_name(p)
            dense = "" if p == "fp32" and device.vendor == "nvidia" else "dense "
            text = f"{p} {dense}{unit_name} {peak / 1e12:.4g} TFLOP/s"
            if p != precision:
                text += f" (no {precision} units on {device.label})"
            return p, peak, text
    return None


def roof_metrics(flops: float, nbytes: float, time_us: float, peak: float | None, bw: float | None
                 ) -> dict[str, Any]:
    """achieved_tflops, achieved_gbps, intensity, bound, pct_of_roof for one op (see module doc)."""
    t = time_us * 1e-6
    out: dict[str, Any] = {
        "achieved_tflops": flops / t / 1e12 if t > 0 else None,
        "achieved_gbps": nbytes / t / 1e9 if t > 0 else None,
        "intensity": flops / nbytes if nbytes > 0 else None,
        "bound": None,
        "pct_of_roof": None,
    }
    if peak and bw and t > 0 and (flops > 0 or nbytes > 0):
        t_compute, t_mem = flops / peak, nbytes / bw
        out["bound"] = "compute" if t_compute >= t_mem and flops > 0 else "memory"
        out["pct_of_roof"] = 100.0 * max(t_compute, t_mem) / t
    return out


def operator_table(rt: RankTrace, device: DeviceSpec | None) -> pl.DataFrame:
    """One row per leaf op with known FLOPs/bytes and measured kernel time (columns: OP_TABLE_SCHEMA)."""
    if rt.host.height == 0 or rt.gpu.height == 0:
        return pl.DataFrame(schema=OP_TABLE_SCHEMA)
    costs = op_costs(rt.host)
    if not costs:
        return pl.DataFrame(schema=OP_TABLE_SCHEMA)
    owner = _owner_rows(rt, costs)
    busy = _busy_per_owner(_kernel_groups(rt, owner)).filter(pl.col("kernel_time_us") > 0)
    if busy.height == 0:
        return pl.DataFrame(schema=OP_TABLE_SCHEMA)
    host_name = rt.host["name"]
    host_ts = rt.host["ts"]
    host_tid = rt.host["tid"]
    rows: list[dict[str, Any]] = []
    bw = device.hbm_bytes_per_s if device else None
    for owner_row, kernels, tf32, time_us in busy.select("owner", "kernels", "tf32", "kernel_time_us").iter_rows():
        c = costs[owner_row]
        precision = c.precision
        if precision == "fp32" and tf32 and c.unit == "matrix":
            precision = "tf32"
        peak = None
        ceiling = None
        if device is not None:
            got = ceiling_for(device, c.unit, precision)
            if got is not None:
                peak, ceiling = got[1], got[2]
                if c.unit == "matrix":
                    precision = got[0]
        m = roof_metrics(c.flops, c.bytes, time_us, peak, bw)
        rows.append({
            "row": owner_row, "name": host_name[owner_row], "shapes": c.shapes, "dtype": c.dtype,
            "precision": precision, "family": c.family, "unit": c.unit, "ts": host_ts[owner_row],
            "tid": host_tid[owner_row], "flops": c.flops, "model_flops": c.model_flops, "bytes": c.bytes,
            "kernels": kernels, "kernel_time_us": time_us, **m,
            "peak_tflops": peak / 1e12 if peak else None, "ceiling": ceiling,
        })
    return pl.DataFrame(rows, schema=OP_TABLE_SCHEMA).sort("ts")


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def dominant_precision(ops: pl.DataFrame) -> str | None:
    """Precision of the matrix ops with the most kernel time (the MFU/roofline headline precision)."""
    mat = ops.filter(pl.col("unit") == "matrix")
    if mat.height == 0:
        return None
    agg = mat.group_by("precision").agg(pl.col("kernel_time_us").sum()).sort(
        ["kernel_time_us", "precision"], descending=[True, False])
    return str(agg["precision"][0])


def aggregate_ops(ops: pl.DataFrame, device: DeviceSpec | None, top: int = MAX_REPORT_OPS) -> list[dict[str, Any]]:
    """Ops grouped by (name, shapes, dtype, precision), sorted by total kernel time, at most ``top``.

    Per group: calls, flops/model_flops/bytes/kernel_time_us summed, and the roofline metrics of the
    sums (every call of a group has the same shapes, so these equal the per-call values).
    """
    if ops.height == 0:
        return []
    agg = (
        ops.group_by("name", "shapes", "dtype", "precision", "family", "unit")
        .agg(
            pl.len().cast(pl.Int64).alias("calls"),
            pl.col("flops").sum(), pl.col("model_flops").sum(), pl.col("bytes").sum(),
            pl.col("kernels").sum(), pl.col("kernel_time_us").sum(),
            pl.col("peak_tflops").first(), pl.col("ceiling").first(),
        )
        .sort(["kernel_time_us", "name", "shapes"], descending=[True, False, False])
        .head(top)
    )
    bw = device.hbm_bytes_per_s if device else None
    out = []
    for r in agg.iter_rows(named=True):
        peak = r["peak_tflops"] * 1e12 if r["peak_tflops"] else None
        m = roof_metrics(r["flops"], r["bytes"], r["kernel_time_us"], peak, bw)
        out.append({k: _clean(v) for k, v in {**r, **m}.items()})
    return out


def roofline_summary(rt: RankTrace, device: DeviceSpec | None, *, device_reason: str | None = None,
                     ops: pl.DataFrame | None = None, top: int = MAX_REPORT_OPS) -> dict[str, Any]:
    """The ``Report["roofline"]`` piece for one rank.

    Keys: ``device`` (label or None), ``precision`` (dominant matrix precision), ``peak_tflops``,
    ``peak_gbps``, ``ridge_flop_per_byte`` (= peak ÷ bandwidth), ``ceiling`` (description of that
    peak), ``ops`` (aggregated, ≤ ``top``), plus extras: ``rank``, ``device_reason``,
    ``modelled_time_us`` (union of the kernels of all modelled ops), ``gpu_compute_time_us`` (union of
    all non-comm kernels and memsets), ``coverage_pct`` (their ratio), ``families``
    (:func:`family_totals`), ``note``.
    """
    if ops is None:
        ops = operator_table(rt, device)
    prec = dominant_precision(ops) or ("fp32" if ops.height else None)
    peak = bw = None
    ceiling = None
    if device is not None and prec is not None:
        got = ceiling_for(device, "matrix" if dominant_precision(ops) else "vector", prec)
        if got is not None:
            prec, peak, ceiling = got
        bw = device.hbm_bytes_per_s
    covered, total = _coverage(rt, ops)
    note = None
    if ops.height == 0:
        note = ("no operator with recorded shapes launched GPU work: record with "
                "torch.profiler.profile(record_shapes=True) to get per-op FLOPs")
    elif device is None:
        note = "unknown device: achieved rates only; pass --device-spec for ceilings"
    return {
        "rank": rt.rank,
        "device": device.label if device else None,
        "device_reason": device_reason,
        "precision": prec,
        "peak_tflops": peak / 1e12 if peak else None,
        "peak_gbps": bw / 1e9 if bw else None,
        "ridge_flop_per_byte": peak / bw if peak and bw else None,
        "ceiling": ceiling,
        "modelled_time_us": covered,
        "gpu_compute_time_us": total,
        "coverage_pct": 100.0 * covered / total if total else None,
        "ops": aggregate_ops(ops, device, top),
        "families": family_totals(ops, device),
        "note": note,
    }


def family_totals(ops: pl.DataFrame, device: DeviceSpec | None) -> list[dict[str, Any]]:
    """Per op family (gemm, attention, conv, norm, elementwise, ...): calls, summed flops, bytes and
    kernel time, achieved rates of the sums, and ``pct_of_roof`` = 100 × Σ roofline time ÷ Σ kernel
    time (each op held to its own ceiling). Sorted by kernel time."""
    if ops.height == 0:
        return []
    bw = device.hbm_bytes_per_s if device else None
    with_roof = ops.with_columns(
        (pl.col("pct_of_roof") * pl.col("kernel_time_us") / 100.0).alias("_roof_us")
    )
    agg = (
        with_roof.group_by("family")
        .agg(pl.len().cast(pl.Int64).alias("calls"), pl.col("flops").sum(), pl.col("bytes").sum(),
             pl.col("kernel_time_us").sum(), pl.col("_roof_us").sum(), pl.col("_roof_us").is_null().any().alias("_nr"))
        .sort(["kernel_time_us", "family"], descending=[True, False])
    )
    out = []
    for r in agg.iter_rows(named=True):
        t = r["kernel_time_us"] * 1e-6
        out.append({
            "family": r["family"], "calls": r["calls"], "flops": r["flops"], "bytes": r["bytes"],
            "kernel_time_us": r["kernel_time_us"],
            "achieved_tflops": r["flops"] / t / 1e12 if t > 0 else None,
            "achieved_gbps": r["bytes"] / t / 1e9 if t > 0 else None,
            "pct_of_roof": (100.0 * r["_roof_us"] / r["kernel_time_us"]
                            if bw and not r["_nr"] and r["kernel_time_us"] > 0 else None),
        })
    return out


def _coverage(rt: RankTrace, ops: pl.DataFrame) -> tuple[float, float]:
    """Union of the modelled ops' kernels, and union of all compute kernels + memsets (µs)."""
    g = rt.gpu.filter(
        pl.col("kind").is_in(["kernel", "memset"])
        & ~((pl.col("kind") == "kernel") & pl.col("name").str.contains(COMM_KERNEL_PATTERN))
    )
    total = intervals.length(intervals.merge(g["ts"].to_numpy(), g["end"].to_numpy())) if g.height else 0.0
    if ops.height == 0 or g.height == 0:
        return 0.0, total
    costs_rows = set(ops["row"].to_list())
    own = np.full(rt.host.height, -1, dtype=np.int64)
    idx = np.fromiter(costs_rows, dtype=np.int64, count=len(costs_rows))
    own[idx] = idx
    parent, depth = _parents(rt.host)
    owner = propagate_down(parent, depth, own)
    k = _kernel_groups(rt, owner)
    covered = intervals.length(intervals.merge(k["ts"].to_numpy(), k["end"].to_numpy())) if k.height else 0.0
    return covered, total


__all__ = [
    "MAX_REPORT_OPS",
    "OP_TABLE_SCHEMA",
    "aggregate_ops",
    "ceiling_for",
    "dominant_precision",
    "family_totals",
    "op_costs",
    "operator_table",
    "propagate_down",
    "roof_metrics",
    "roofline_summary",
]
