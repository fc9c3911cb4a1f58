"""Roofline per operator: how close each op's kernels came to the GPU's compute or memory ceiling.

For every *leaf* operator whose FLOPs and bytes :mod:`traceread.analysis.compute.flops` can compute:

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
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from traceread import intervals
from traceread.analysis.compute.flops import (
    OpCost,
    attention_causal_flag,
    is_attention_backward,
    is_supported,
    op_cost,
)
from traceread.analysis.hardware import DeviceSpec
from traceread.analysis.kinds import comm_mask
from traceread.model import RankTrace

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

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

OP_TABLE_SCHEMA: dict[str, PolarsDataType] = {
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


_COST_KEYS = ["name", "input_dims", "input_types", "concrete_inputs", "_hint"]


def _cost_index(host: pl.DataFrame) -> tuple[np.ndarray, np.ndarray, list[OpCost | None]]:
    """``(rows, idx, costs)``: host rows that have a cost and, per row, its index into ``costs``.

    :func:`op_cost` runs once per distinct (name, args, causal hint): a trace repeats the same
    calls every step, so this is a few thousand formula evaluations for 10⁵ rows.
    """
    empty: tuple[np.ndarray, np.ndarray, list[OpCost | None]] = (np.zeros(0, np.int64), np.zeros(0, np.int64), [])
    cand = host.filter((pl.col("cat") == "cpu_op") & pl.col("input_dims").is_not_null()).select(
        "row", "name", "input_dims", "input_types", "concrete_inputs"
    )
    if cand.height == 0:
        return empty
    supported = [n for n in cand["name"].unique().to_list() if is_supported(n)]
    cand = cand.filter(pl.col("name").is_in(supported))
    if cand.height == 0:
        return empty
    hints = _causal_hints(host, cand)
    if hints:
        cand = cand.with_columns(pl.col("row").replace_strict(
            list(hints.keys()), list(hints.values()), default=None, return_dtype=pl.Boolean).alias("_hint"))
    else:
        cand = cand.with_columns(pl.lit(None, pl.Boolean).alias("_hint"))
    groups = cand.group_by(_COST_KEYS, maintain_order=True).agg(pl.col("row"))
    costs = [op_cost(n, d, t, c, causal_hint=h) for n, d, t, c, h in groups.select(_COST_KEYS).iter_rows()]
    ok = [i for i, c in enumerate(costs) if c is not None]
    if not ok:
        return empty
    flat = (groups.select("row").with_row_index("_g").filter(pl.col("_g").is_in(ok))
            .explode("row").sort("row"))
    return (flat["row"].to_numpy().astype(np.int64), flat["_g"].to_numpy().astype(np.int64), costs)


def op_costs(host: pl.DataFrame) -> dict[int, OpCost]:
    """Cost of every ``cpu_op`` row that has a formula and readable shapes (memoised by args)."""
    rows, idx, costs = _cost_index(host)
    return {int(r): costs[i] for r, i in zip(rows.tolist(), idx.tolist())}


def _causal_hints(host: pl.DataFrame, cand: pl.DataFrame) -> dict[int, bool]:
    """Causal flag for attention backward rows that did not record one, from the forward call.

    The autograd node that runs the backward (e.g. ``ScaledDotProductFlashAttentionBackward0``)
    carries the forward op's ``Sequence number``; the forward attention op with that number says
    whether it was causal (TraceLens links forward and backward the same way).
    """
    bwd_names = [n for n in cand["name"].unique().to_list() if is_attention_backward(n)]
    if not bwd_names:
        return {}
    sub = cand.filter(pl.col("name").is_in(bwd_names))
    bwd = [r for r, n, c in zip(sub["row"].to_list(), sub["name"].to_list(), sub["concrete_inputs"].to_list())
           if attention_causal_flag(n, c) is None]
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


def _owner_rows(rt: RankTrace, cost_rows: np.ndarray) -> np.ndarray:
    """For every host row, the row of the nearest op (itself or an ancestor) that has a cost."""
    n = rt.host.height
    own = np.full(n, -1, dtype=np.int64)
    if cost_rows.size:
        own[cost_rows] = cost_rows
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
        & ~comm_mask(g, rt.host)
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


def _null_unless(values: np.ndarray, keep: np.ndarray, name: str) -> pl.Series:
    """Float64 series of ``values`` with null where ``keep`` is False."""
    out = pl.Series(name, values, dtype=pl.Float64)
    return out if keep.all() else pl.select(pl.when(pl.Series(keep)).then(out).otherwise(None)).to_series().alias(name)


def operator_table(rt: RankTrace, device: DeviceSpec | None) -> pl.DataFrame:
    """One row per leaf op with known FLOPs/bytes and measured kernel time (columns: OP_TABLE_SCHEMA).

    The metrics are :func:`roof_metrics`, evaluated column-wise (same IEEE operations, same order).
    """
    if rt.host.height == 0 or rt.gpu.height == 0:
        return pl.DataFrame(schema=OP_TABLE_SCHEMA)
    cost_rows, cost_idx, costs = _cost_index(rt.host)
    if cost_rows.size == 0:
        return pl.DataFrame(schema=OP_TABLE_SCHEMA)
    owner = _owner_rows(rt, cost_rows)
    busy = _busy_per_owner(_kernel_groups(rt, owner)).filter(pl.col("kernel_time_us") > 0)
    if busy.height == 0:
        return pl.DataFrame(schema=OP_TABLE_SCHEMA)
    ci_of_row = np.full(rt.host.height, -1, dtype=np.int64)
    ci_of_row[cost_rows] = cost_idx
    b_owner = busy["owner"].to_numpy().astype(np.int64)
    b_ci = ci_of_row[b_owner]
    b_tf32 = busy["tf32"].fill_null(False).to_numpy().astype(bool)
    time_us = busy["kernel_time_us"].to_numpy().astype(np.float64)
    # The per-op constants depend only on (cost, any TF32 kernel): resolve each combination once.
    combos, inv = np.unique(b_ci * 2 + b_tf32.astype(np.int64), return_inverse=True)
    inv = inv.reshape(-1)
    bw = device.hbm_bytes_per_s if device else None
    cols: dict[str, list[Any]] = {k: [] for k in ("precision", "peak", "ceiling")}
    for combo in combos.tolist():
        c = costs[combo // 2]
        assert c is not None
        precision = c.precision
        if precision == "fp32" and combo % 2 and c.unit == "matrix":
            precision = "tf32"
        op_peak = None
        ceiling = None
        if device is not None:
            got = ceiling_for(device, c.unit, precision)
            if got is not None:
                op_peak, ceiling = got[1], got[2]
                if c.unit == "matrix":
                    precision = got[0]
        cols["precision"].append(precision)
        cols["peak"].append(op_peak)
        cols["ceiling"].append(ceiling)
    ucost = [costs[combo // 2] for combo in combos.tolist()]
    idx = pl.Series(inv, dtype=pl.UInt32)

    def per_op(name: str, values: list[Any], dtype: PolarsDataType) -> pl.Series:
        return pl.Series(name, values, dtype=dtype).gather(idx)

    flops = np.array([float(c.flops) for c in ucost], dtype=np.float64)[inv]
    nbytes = np.array([float(c.bytes) for c in ucost], dtype=np.float64)[inv]
    peak_u = [p if p else None for p in cols["peak"]]
    has_peak = np.array([p is not None for p in peak_u], dtype=bool)[inv]
    peak = np.array([p if p is not None else np.nan for p in peak_u], dtype=np.float64)[inv]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        t = time_us * 1e-6
        pos = t > 0
        achieved_tflops = flops / t / 1e12
        achieved_gbps = nbytes / t / 1e9
        intensity = flops / nbytes
        roof = has_peak & bool(bw) & pos & ((flops > 0) | (nbytes > 0))
        t_compute = flops / peak
        t_mem = nbytes / bw if bw else np.full(flops.size, np.nan)
        pct = 100.0 * np.where(t_mem > t_compute, t_mem, t_compute) / t
        compute = (t_compute >= t_mem) & (flops > 0)
    bound = pl.select(pl.when(pl.Series(roof)).then(
        pl.when(pl.Series(compute)).then(pl.lit("compute")).otherwise(pl.lit("memory"))
    ).otherwise(None)).to_series()
    host = rt.host
    gather = pl.Series(b_owner)
    out = pl.DataFrame([
        pl.Series("row", b_owner, dtype=pl.Int64),
        host["name"].gather(gather).alias("name").cast(pl.Utf8),
        per_op("shapes", [c.shapes for c in ucost], pl.Utf8),
        per_op("dtype", [c.dtype for c in ucost], pl.Utf8),
        per_op("precision", cols["precision"], pl.Utf8),
        per_op("family", [c.family for c in ucost], pl.Utf8),
        per_op("unit", [c.unit for c in ucost], pl.Utf8),
        host["ts"].gather(gather).alias("ts").cast(pl.Float64),
        host["tid"].gather(gather).alias("tid").cast(pl.Int64),
        pl.Series("flops", flops, dtype=pl.Float64),
        per_op("model_flops", [float(c.model_flops) for c in ucost], pl.Float64),
        pl.Series("bytes", nbytes, dtype=pl.Float64),
        busy["kernels"].cast(pl.Int64).alias("kernels"),
        pl.Series("kernel_time_us", time_us, dtype=pl.Float64),
        _null_unless(achieved_tflops, pos, "achieved_tflops"),
        _null_unless(achieved_gbps, pos, "achieved_gbps"),
        _null_unless(intensity, nbytes > 0, "intensity"),
        bound.alias("bound").cast(pl.Utf8),
        _null_unless(pct, roof, "pct_of_roof"),
        _null_unless(peak / 1e12, has_peak, "peak_tflops"),
        per_op("ceiling", cols["ceiling"], pl.Utf8),
    ])
    return out.sort("ts")


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
    g = rt.gpu.filter(pl.col("kind").is_in(["kernel", "memset"]) & ~comm_mask(rt.gpu, rt.host))
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
