"""Model FLOPs utilisation (MFU) and hardware FLOPs utilisation (HFU), from the trace or a formula.

**Trace-based** (:func:`trace_mfu`), per rank (one GPU)::

    MFU = Σ model FLOPs of the leaf ops of a step ÷ (step duration × dense peak[precision])
    HFU = Σ hardware FLOPs of the leaf ops of a step ÷ (step duration × dense peak[precision])

* The leaf ops and their FLOPs are :func:`traceread.analysis.compute.roofline.operator_table`'s (ops with a
  formula that launched GPU work; each kernel counted once), restricted to the matrix-unit ones:
  GEMMs, convolutions and attention. Elementwise/norm/softmax FLOPs are left out, as in the papers'
  6·N·D (only matmuls), and because they cannot run at the tensor-core peak of the denominator
  (they are < 1 % of a transformer step's FLOPs anyway).
* An op belongs to step N when its host start lies inside the host ``ProfilerStep#N`` window (the
  device-aligned window can start after ops the host already launched for that step); the
  denominator is the device-aligned duration from :func:`traceread.analysis.time.steps.device_steps`.
  Without host step markers the step windows themselves are used. Whole-run numbers are Σ FLOPs ÷
  Σ durations over the kept steps; ``model_flops_per_step`` is the mean over steps.
* ``precision`` is the precision of the matrix ops with the most kernel time; its dense datasheet
  peak is the denominator (mixed-precision steps are held to that one peak, as in the papers).
* **Recomputation** is excluded from MFU and included in HFU. Two kinds:
  activation checkpointing — a forward op (one with an autograd ``Sequence number`` and ``Fwd
  thread id`` 0, i.e. recorded by the forward pass) running inside ``autograd::engine::
  evaluate_function:`` (non-reentrant checkpoint re-runs the forward from a saved-tensor hook in
  backward), or anything under ``CheckpointFunctionBackward`` (reentrant checkpoint) or a
  ``torch/utils/checkpoint.py`` ``recompute_fn``/``unpack_hook`` python frame, except nested backward
  nodes; and the flash-attention backward's recompute of QKᵀ (hardware FLOPs 2.5×, model 2× the
  forward, see :func:`traceread.analysis.compute.flops.attention_flops`). ``recompute_detected`` reports the
  first kind; ``hfu_pct`` is None when hardware and model FLOPs are equal (nothing recomputed).
  A ``create_graph=True`` backward (gradient penalties) also runs recorded forward ops inside
  backward and would be counted as recompute.

**Formula-based** (:func:`formula_mfu`), the PaLM / torchtitan convention::

    FLOPs per step = 6·N·D  (+ 12·L·s·d·D when layers L, sequence length s, width d are given)
    MFU = FLOPs per step ÷ (step time × n_gpus × dense peak[precision])

N = parameters (exclude embeddings for the usual convention), D = tokens per step across the
``n_gpus`` counted. The attention term is not halved for causal masks (convention), whereas the
trace-based count only credits the query-key pairs a causal kernel computes — expect the trace MFU
to be a little below the formula MFU for causal LMs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from traceread.analysis.compute.roofline import dominant_precision, operator_table, propagate_down
from traceread.analysis.hardware import DeviceSpec
from traceread.model import RankTrace

_EVAL_PREFIX = "autograd::engine::evaluate_function:"
_AUTOGRAD_NODE = re.compile(r"^autograd::|^torch::autograd::|Backward\d*$|^CheckpointFunction")
_CKPT_PY = re.compile(r"checkpoint\.py.*(recompute_fn|unpack_hook)")


@dataclass
class MfuResult:
    """Trace-based utilisation of one rank; None fields mean the trace cannot support the value."""

    mfu_pct: float | None
    hfu_pct: float | None
    model_flops_per_step: float | None
    hardware_flops_per_step: float | None
    precision: str | None
    recompute_detected: bool
    note: str | None
    peak_tflops: float | None = None
    recompute_flops_per_step: float | None = None  # activation-checkpointing FLOPs only
    # per step: step, duration_us, model_flops, hardware_flops, mfu_pct, hfu_pct
    steps: list[dict[str, Any]] = field(default_factory=list)


def recompute_mask(host: pl.DataFrame) -> np.ndarray:
    """Boolean per host row: the row is (inside) an activation-checkpointing recompute.

    See the module docstring for the rule. Nested backward nodes (``evaluate_function``) reset the
    flag, so the real backward work of a reentrant checkpoint is not counted as recompute.
    """
    n = host.height
    if n == 0:
        return np.zeros(0, dtype=bool)
    names = host["name"].fill_null("")
    is_eval = names.str.starts_with(_EVAL_PREFIX).to_numpy()
    cpu = (host["cat"] == "cpu_op").fill_null(False).to_numpy()
    seq = host["seq_num"].is_not_null().to_numpy()
    ftid = host["fwd_tid"].fill_null(0).to_numpy()
    node = names.str.contains(_AUTOGRAD_NODE.pattern).to_numpy()
    fwd_op = cpu & seq & (ftid == 0) & ~node
    ckpt_root = (names.str.contains("CheckpointFunctionBackward").to_numpy() & ~is_eval) | (
        (host["cat"] == "python_function").fill_null(False).to_numpy() & names.str.contains(_CKPT_PY.pattern).to_numpy()
    )
    parent = host["parent"].fill_null(-1).to_numpy().astype(np.int64)
    depth = host["depth"].fill_null(-1).to_numpy().astype(np.int64)
    # under[r] == 1: r or one of its ancestors is an evaluate_function (we are in backward).
    under = propagate_down(parent, depth, np.where(is_eval, 1, -1).astype(np.int64))
    par_under = np.where(parent >= 0, under[np.clip(parent, 0, None)], -1)
    # own state: 1 starts a recompute, 0 resets (a backward node), -1 inherits from the parent.
    own = np.full(n, -1, dtype=np.int64)
    own[ckpt_root] = 1
    own[fwd_op & (par_under == 1)] = 1
    own[is_eval] = 0
    state = propagate_down(parent, depth, own)
    return state == 1


def _assign_steps(rt: RankTrace, ops: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """ops with a ``step`` column (null when the op is outside every step)."""
    host_steps = rt.steps
    use_host = host_steps.height > 0 and set(windows["step"].to_list()) <= set(host_steps["step"].to_list())
    src = (host_steps.select("step", pl.col("ts").alias("s"), pl.col("end").alias("e")) if use_host
           else windows.select("step", pl.col("start").alias("s"), pl.col("end").alias("e")))
    src = src.filter(pl.col("step").is_in(windows["step"].to_list())).sort("s")
    ts = ops["ts"].to_numpy()
    starts = src["s"].to_numpy()
    ends = src["e"].to_numpy()
    steps = src["step"].to_list()
    idx = np.searchsorted(starts, ts, side="right") - 1
    col: list[int | None] = [
        steps[i] if i >= 0 and t < ends[i] else None for i, t in zip(idx.tolist(), ts.tolist())
    ]
    return ops.with_columns(pl.Series("step", col, dtype=pl.Int64))

def trace_mfu(rt: RankTrace, step_windows: pl.DataFrame, device: DeviceSpec | None, *,
              ops: pl.DataFrame | None = None) -> MfuResult:
    """Trace-based MFU/HFU of one rank over its (device-aligned) step windows. See module docstring."""
    if ops is None:
        ops = operator_table(rt, device)
    if ops.height == 0:
        return MfuResult(None, None, None, None, None, False,
                         "no operator with recorded shapes launched GPU work (record_shapes=True needed)")
    if step_windows.height == 0:
        return MfuResult(None, None, None, None, dominant_precision(ops), False, "no complete step to measure")
    ops = ops.filter(pl.col("unit") == "matrix")
    if ops.height == 0:
        return MfuResult(None, None, None, None, None, False,
                         "no GEMM/convolution/attention with recorded shapes launched GPU work")
    rc = recompute_mask(rt.host)
    rows = ops["row"].to_numpy()
    ops = ops.with_columns(pl.Series("recompute", rc[rows] if rc.size else np.zeros(rows.size, bool)))
    ops = _assign_steps(rt, ops, step_windows)
    per = (
        ops.filter(pl.col("step").is_not_null())
        .group_by("step")
        .agg(
            pl.when(~pl.col("recompute")).then(pl.col("model_flops")).otherwise(0.0).sum().alias("model_flops"),
            pl.col("flops").sum().alias("hardware_flops"),
            pl.when(pl.col("recompute")).then(pl.col("flops")).otherwise(0.0).sum().alias("recompute_flops"),
        )
    )
    table = step_windows.select("step", "duration").join(per, on="step", how="left").fill_null(0.0).sort("step")
    precision = dominant_precision(ops)
    peak = device.peak(precision) if (device is not None and precision is not None) else None
    detected = bool(ops["recompute"].any())
    n_steps = table.height
    dur_total_us = float(table["duration"].sum())
    model_total = float(table["model_flops"].sum())
    hw_total = float(table["hardware_flops"].sum())
    rec_total = float(table["recompute_flops"].sum())
    notes = []
    if device is None:
        notes.append("unknown device: pass --device-spec for the peak")
    elif precision is None:
        notes.append("no matrix op (GEMM/conv/attention) with recorded shapes")
    elif peak is None:
        notes.append(f"{device.label} has no {precision} peak in the table")
    has_hfu = hw_total > model_total * (1 + 1e-12)

    def pct(flops: float, dur_us: float) -> float | None:
        if peak is None or dur_us <= 0:
            return None
        return 100.0 * flops / (dur_us * 1e-6 * peak)

    steps = [
        {"step": int(r["step"]), "duration_us": float(r["duration"]), "model_flops": float(r["model_flops"]),
         "hardware_flops": float(r["hardware_flops"]), "mfu_pct": pct(r["model_flops"], r["duration"]),
         "hfu_pct": pct(r["hardware_flops"], r["duration"]) if has_hfu else None}
        for r in table.iter_rows(named=True)
    ]
    if detected:
        notes.append(f"activation recompute detected: {rec_total / max(n_steps, 1) / 1e12:.3g} TFLOP/step "
                     "excluded from MFU, included in HFU")
    return MfuResult(
        mfu_pct=pct(model_total, dur_total_us),
        hfu_pct=pct(hw_total, dur_total_us) if has_hfu else None,
        model_flops_per_step=model_total / n_steps,
        hardware_flops_per_step=hw_total / n_steps,
        precision=precision,
        recompute_detected=detected,
        note="; ".join(notes) or None,
        peak_tflops=peak / 1e12 if peak else None,
        recompute_flops_per_step=rec_total / n_steps,
        steps=steps,
    )


def model_flops_per_step(params: float, tokens_per_step: float, n_layers: int | None = None,
                         seq_len: int | None = None, d_model: int | None = None) -> float:
    """6·N·D, plus the attention term 12·L·s·d·D when all of L, s, d are given (PaLM App. B)."""
    flops = 6.0 * params * tokens_per_step
    if n_layers is not None and seq_len is not None and d_model is not None:
        flops += 12.0 * n_layers * seq_len * d_model * tokens_per_step
    return flops


def formula_mfu(params: float, tokens_per_step: float, step_time_s: float, device: DeviceSpec,
                precision: str = "bf16", n_layers: int | None = None, seq_len: int | None = None,
                d_model: int | None = None, *, n_gpus: int = 1) -> float:
    """MFU in percent: :func:`model_flops_per_step` ÷ (step_time_s × n_gpus × dense peak[precision]).

    ``tokens_per_step`` are the tokens all ``n_gpus`` process in one step (global batch × sequence
    length when ``n_gpus`` is the world size). Raises ValueError for non-positive inputs or a
    precision the device has no peak for.
    """
    if params <= 0 or tokens_per_step <= 0 or step_time_s <= 0 or n_gpus <= 0:
        raise ValueError("params, tokens_per_step, step_time_s and n_gpus must be positive")
    peak = device.peak(precision)
    if peak is None:
        raise ValueError(f"{device.label} has no {precision} peak")
    flops = model_flops_per_step(params, tokens_per_step, n_layers, seq_len, d_model)
    return 100.0 * flops / (step_time_s * n_gpus * peak)


__all__ = ["MfuResult", "formula_mfu", "model_flops_per_step", "recompute_mask", "trace_mfu"]
