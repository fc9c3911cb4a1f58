"""FLOPs and bytes of one PyTorch operator, from the shapes the profiler recorded.

Kineto writes no FLOP count into the exported trace (``with_flops`` stays in memory), so traceread
recomputes it from each ``cpu_op``'s ``Input Dims`` / ``Input type`` / ``Concrete Inputs``, the way
TraceLens and ``torch._inductor.analysis.profile_analysis`` do (notes §1.4, §7). Traces must be
recorded with ``record_shapes=True``; anything unparseable gives ``None``, never an exception.

Definitions (``n`` = elements of the output unless said otherwise, ``bpe`` = bytes per element of
the tensor in question, taken from its ``Input type``):

* **FLOPs** count multiply and add separately (a multiply-accumulate is 2 FLOPs).
  ``flops`` is what the hardware executes; ``model_flops`` is what an MFU count credits. They
  differ only for attention backward (the flash recompute of QKᵀ is hardware work, not model work).
* **bytes** is the minimal HBM traffic: every tensor input read once, every output written once.
  Caches, re-reads and workspace are ignored, so achieved bandwidth is a lower bound.

Families (formulas in each function's docstring):

========== ======================================================================================
GEMM       ``aten::mm/_int_mm/addmm/bmm/baddbmm/matmul/linear/_scaled_mm``: 2·M·N·K (·batch). The
           bias add of addmm/linear is *not* counted (``torch.utils.flop_counter`` convention).
conv       ``aten::convolution/_convolution/conv{1,2,3}d/cudnn_convolution[_transpose]/
           miopen_convolution``: 2·N·C_out·(C_in/groups)·∏kernel·∏out_spatial (FlopCounterMode);
           ``convolution_backward``: forward FLOPs once for grad-input and once for grad-weight.
attention  SDPA and its flash / efficient / cudnn kernels, forward 4·B·Hq·P·d (P = attended query-key
           pairs); backward 5 matmuls (2.5× forward, FlopCounterMode and the FlashAttention
           benchmark) as hardware FLOPs, 4 matmuls (2× forward) as model FLOPs.
elementwise k FLOPs per output element (1 for arithmetic, comparisons and activations — a
           transcendental also counts 1, as in TraceLens —, 2 for ``addcmul/addcdiv/lerp``, 0 for
           copies and fills).
reduce     1 FLOP per input element.
norm       per element: LayerNorm/GroupNorm/BatchNorm(train) 5 (+1 per affine tensor), BatchNorm
           eval 2 (+affine), RMSNorm 3 (+1 with weight); backward 2× forward.
softmax    5 FLOPs per element (max, sub, exp, sum, div); backward 4.
embedding  0 FLOPs, bytes = indices + rows read + rows written; dense backward 1 FLOP per gradient
           element.
========== ======================================================================================
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

#: Bytes per element by normalised ``Input type`` (``c10::`` prefix removed, lower case).
DTYPE_BYTES: dict[str, float] = {
    "double": 8, "float": 4, "half": 2, "bfloat16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1, "float8_e8m0fnu": 1,
    "float4_e2m1fn_x2": 1,  # two fp4 values per byte
    "long int": 8, "long": 8, "int64_t": 8, "int": 4, "short int": 2, "short": 2,
    "signed char": 1, "unsigned char": 1, "bool": 1,
    "complex<float>": 8, "complex<double>": 16, "complex<half>": 4,
}

#: Ceiling precision of a tensor dtype (keys of :data:`traceread.analysis.hardware.PRECISIONS`).
DTYPE_PRECISION: dict[str, str] = {
    "double": "fp64", "float": "fp32", "half": "fp16", "bfloat16": "bf16",
    "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "float8_e4m3fnuz": "fp8", "float8_e5m2fnuz": "fp8",
    "float8_e8m0fnu": "fp8", "float4_e2m1fn_x2": "fp8", "signed char": "int8", "unsigned char": "int8",
}

#: ``c10::ScalarType`` codes as they appear in ``Concrete Inputs`` (e.g. ``_to_copy`` dtype, ``out_dtype``).
SCALAR_TYPE_CODES: dict[int, str] = {
    0: "unsigned char", 1: "signed char", 2: "short int", 3: "int", 4: "long int", 5: "half", 6: "float",
    7: "double", 11: "bool", 15: "bfloat16", 23: "float8_e5m2", 24: "float8_e4m3fn", 25: "float8_e5m2fnuz",
    26: "float8_e4m3fnuz",
}


def normalise_dtype(t: Any) -> str | None:
    """``"c10::BFloat16"`` -> ``"bfloat16"``; None for non-tensor entries (``Scalar``, ``''``, ...)."""
    if not isinstance(t, str) or not t:
        return None
    s = t.strip()
    if s.startswith("c10::"):
        s = s[5:]
    s = s.lower()
    return s if s in DTYPE_BYTES else None


@dataclass(frozen=True)
class OpCost:
    """What one operator call costs, by the formulas in this module's docstring."""

    flops: float  # executed by the hardware
    model_flops: float  # credited by MFU (no recompute)
    bytes: float  # minimal HBM traffic
    family: str  # gemm | conv | attention | elementwise | reduce | norm | softmax | embedding
    unit: str  # "matrix" (tensor/matrix cores) | "vector" (FP32 CUDA cores / SIMD)
    precision: str  # ceiling precision: bf16, fp16, fp32, tf32, fp8, fp64, int8
    dtype: str  # dtype of the first tensor input, normalised
    shapes: str  # tensor input dims, e.g. "[8, 64], [64, 64]"


class _Args:
    """Positional view of a recorded call: which inputs are tensors, their shapes and dtypes."""

    def __init__(self, dims: list[Any], types: list[Any], concrete: list[Any]) -> None:
        self.dims = dims
        self.types = types
        self.concrete = concrete

    def tensor(self, i: int) -> tuple[list[int], str] | None:
        """Shape and dtype of input ``i`` when it is a (non-list) tensor."""
        if i >= len(self.dims) or i >= len(self.types):
            return None
        dt = normalise_dtype(self.types[i])
        shape = self.dims[i]
        if dt is None or not isinstance(shape, list) or not all(_is_int(x) for x in shape):
            return None
        if any(x < 0 for x in shape):
            return None
        return [int(x) for x in shape], dt

    def tensors(self) -> list[tuple[int, list[int], str]]:
        out = []
        for i in range(min(len(self.dims), len(self.types))):
            t = self.tensor(i)
            if t is not None:
                out.append((i, t[0], t[1]))
        return out

    def text(self, i: int) -> str | None:
        if i >= len(self.concrete):
            return None
        v = self.concrete[i]
        return v.strip() if isinstance(v, str) and v.strip() != "" else None

    def flag(self, i: int) -> bool | None:
        v = self.text(i)
        if v in ("True", "true", "1"):
            return True
        if v in ("False", "false", "0"):
            return False
        return None

    def int_list(self, i: int) -> list[int] | None:
        v = self.text(i)
        if v is None:
            return None
        try:
            parsed = json.loads(v)
        except (json.JSONDecodeError, ValueError):
            return None
        if _is_int(parsed):
            return [int(parsed)]
        if isinstance(parsed, list) and all(_is_int(x) for x in parsed):
            return [int(x) for x in parsed]
        return None

    def bool_list(self, i: int) -> list[bool] | None:
        v = self.text(i)
        if v is None:
            return None
        items = [x.strip() for x in v.strip("[]() ").split(",") if x.strip()]
        if not items or any(x not in ("True", "False", "true", "false") for x in items):
            return None
        return [x in ("True", "true") for x in items]

    def integer(self, i: int) -> int | None:
        v = self.text(i)
        if v is None:
            return None
        try:
            return int(v)
        except ValueError:
            return None


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def parse_json_list(value: Any) -> list[Any] | None:
    """A recorded arg list from its JSON text (or the list itself); None when unreadable."""
    if value is None:
        return None
    if isinstance(value, list):
        return value
    if not isinstance(value, str) or not value:
        return None
    try:
        out = json.loads(value)
    except (json.JSONDecodeError, ValueError):
        return None
    return out if isinstance(out, list) else None


def _numel(shape: list[int]) -> int:
    return math.prod(shape) if shape else 1


def _fmt_shapes(args: _Args) -> str:
    return ", ".join("[" + ", ".join(str(x) for x in s) + "]" for _, s, _ in args.tensors())


def _broadcast(shapes: list[list[int]]) -> list[int] | None:
    nd = max((len(s) for s in shapes), default=0)
    out = [1] * nd
    for s in shapes:
        padded = [1] * (nd - len(s)) + list(s)
        for j, d in enumerate(padded):
            if d == out[j] or d == 1:
                continue
            if out[j] == 1:
                out[j] = d
            else:
                return None
    return out


def _prec(dtype: str) -> str:
    return DTYPE_PRECISION.get(dtype, "fp32")


# ------------------------------------------------------------------------------------------------
# GEMM


def gemm_flops(m: int, n: int, k: int, batch: int = 1) -> float:
    """2·batch·M·N·K: one multiply and one add per multiply-accumulate (TraceLens, FlopCounterMode)."""
    return 2.0 * batch * m * n * k


def _gemm(name: str, a: _Args) -> OpCost | None:
    """mm/addmm/bmm/baddbmm/matmul/linear/_scaled_mm/_int_mm.

    bytes = A + B (+ bias/self of addmm/baddbmm/linear) + output, each at its own dtype; the output
    takes A's dtype (``_scaled_mm``: ``out_dtype`` when recorded).
    """
    extra_bytes = 0.0
    out_dtype: str | None = None
    if name in ("mm", "_int_mm", "_scaled_mm"):
        ta, tb = a.tensor(0), a.tensor(1)
        if ta is None or tb is None or len(ta[0]) != 2 or len(tb[0]) != 2:
            return None
        (m, k), (k2, n) = ta[0], tb[0]
        batch = 1
        if name == "_scaled_mm":
            code = a.integer(6)
            out_dtype = SCALAR_TYPE_CODES.get(code) if code is not None else None
            for j in (2, 3, 4):  # scales and bias
                t = a.tensor(j)
                if t is not None:
                    extra_bytes += _numel(t[0]) * DTYPE_BYTES[t[1]]
    elif name in ("addmm", "baddbmm"):
        ta, tb = a.tensor(1), a.tensor(2)
        want = 2 if name == "addmm" else 3
        if ta is None or tb is None or len(ta[0]) != want or len(tb[0]) != want:
            return None
        if name == "addmm":
            (m, k), (k2, n) = ta[0], tb[0]
            batch = 1
        else:
            (b1, m, k), (b2, k2, n) = ta[0], tb[0]
            if b1 != b2:
                return None
            batch = b1
        bias = a.tensor(0)
        if bias is not None:
            extra_bytes += _numel(bias[0]) * DTYPE_BYTES[bias[1]]
    elif name == "bmm":
        ta, tb = a.tensor(0), a.tensor(1)
        if ta is None or tb is None or len(ta[0]) != 3 or len(tb[0]) != 3:
            return None
        (b1, m, k), (b2, k2, n) = ta[0], tb[0]
        if b1 != b2:
            return None
        batch = b1
    elif name == "matmul":
        ta, tb = a.tensor(0), a.tensor(1)
        if ta is None or tb is None or not ta[0] or not tb[0]:
            return None
        sa = [1] + ta[0] if len(ta[0]) == 1 else ta[0]
        sb = tb[0] + [1] if len(tb[0]) == 1 else tb[0]
        m, k = sa[-2], sa[-1]
        k2, n = sb[-2], sb[-1]
        bshape = _broadcast([sa[:-2], sb[:-2]])
        if bshape is None:
            return None
        batch = _numel(bshape)
    elif name == "linear":
        ta, tw = a.tensor(0), a.tensor(1)
        if ta is None or tw is None or not ta[0] or len(tw[0]) != 2:
            return None
        k = ta[0][-1]
        n, k2 = tw[0]
        m = _numel(ta[0][:-1])
        batch = 1
        tb = tw
        bias = a.tensor(2)
        if bias is not None:
            extra_bytes += _numel(bias[0]) * DTYPE_BYTES[bias[1]]
    else:
        return None
    if k != k2:
        return None
    da, db = ta[1], tb[1]
    out_dtype = out_dtype or da
    flops = gemm_flops(m, n, k, batch)
    nbytes = (batch * m * k * DTYPE_BYTES[da] + (batch if name in ("bmm", "baddbmm") else 1) * k * n * DTYPE_BYTES[db]
              + batch * m * n * DTYPE_BYTES.get(out_dtype, DTYPE_BYTES[da]) + extra_bytes)
    if name == "matmul":  # B's own batch size, not the broadcast one
        nbytes = (_numel(ta[0]) * DTYPE_BYTES[da] + _numel(tb[0]) * DTYPE_BYTES[db]
                  + batch * m * n * DTYPE_BYTES[da])
    prec = "int8" if name == "_int_mm" else ("fp8" if name == "_scaled_mm" else _prec(da))
    return OpCost(flops, flops, nbytes, "gemm", "matrix", prec, da, _fmt_shapes(a))


# ------------------------------------------------------------------------------------------------
# Convolution

# name -> (x, w, bias, stride, padding, dilation, transposed, output_padding, groups, allow_tf32)
# an int is an argument position, a bool/None a fixed value.
_CONV_ARGS: dict[str, tuple[Any, ...]] = {
    "convolution": (0, 1, 2, 3, 4, 5, 6, 7, 8, None),
    "_convolution": (0, 1, 2, 3, 4, 5, 6, 7, 8, 12),
    "conv1d": (0, 1, 2, 3, 4, 5, False, None, 6, None),
    "conv2d": (0, 1, 2, 3, 4, 5, False, None, 6, None),
    "conv3d": (0, 1, 2, 3, 4, 5, False, None, 6, None),
    "cudnn_convolution": (0, 1, None, 3, 2, 4, False, None, 5, 8),
    "cudnn_convolution_transpose": (0, 1, None, 4, 2, 5, True, 3, 6, 9),
    "miopen_convolution": (0, 1, 2, 4, 3, 5, False, None, 6, None),
}


def conv_flops(batch: int, w_shape: list[int], conv_spatial: list[int]) -> float:
    """2·batch·w[0]·w[1]·∏kernel·∏conv_spatial (``torch.utils.flop_counter.conv_flop_count``).

    ``w[1]`` is already C_in/groups. ``conv_spatial`` is the output's spatial size, or the input's
    for a transposed convolution.
    """
    return 2.0 * batch * w_shape[0] * w_shape[1] * _numel(w_shape[2:]) * _numel(conv_spatial)


def _conv_out(in_sp: list[int], k: list[int], stride: list[int], pad: list[int], dil: list[int],
              transposed: bool, out_pad: list[int]) -> list[int] | None:
    nd = len(in_sp)
    def fit(v: list[int], default: int) -> list[int] | None:
        if not v:
            return [default] * nd
        if len(v) == 1:
            return v * nd
        return v if len(v) == nd else None
    s, p, d, op = fit(stride, 1), fit(pad, 0), fit(dil, 1), fit(out_pad, 0)
    if s is None or p is None or d is None or op is None:
        return None
    if transposed:
        out = [(i - 1) * s_ - 2 * p_ + d_ * (k_ - 1) + o_ + 1 for i, k_, s_, p_, d_, o_ in zip(in_sp, k, s, p, d, op)]
    else:
        out = [(i + 2 * p_ - d_ * (k_ - 1) - 1) // s_ + 1 for i, k_, s_, p_, d_ in zip(in_sp, k, s, p, d)]
    return out if all(o > 0 for o in out) else None


def _conv(name: str, a: _Args) -> OpCost | None:
    """Forward convolution. bytes = input + weight + bias + output."""
    spec = _CONV_ARGS[name]
    xi, wi, bi, si, pi, di, tr, opi, gi, tfi = spec
    x, w = a.tensor(xi), a.tensor(wi)
    if x is None or w is None or len(x[0]) < 3 or len(w[0]) != len(x[0]):
        return None
    transposed = tr if isinstance(tr, bool) else a.flag(tr)
    if transposed is None:
        return None
    stride = a.int_list(si)
    pad_text = a.text(pi)
    if pad_text in ("same", "'same'", '"same"'):
        padding: list[int] | None = None
    elif pad_text in ("valid", "'valid'", '"valid"'):
        padding = [0]
    else:
        padding = a.int_list(pi)
    dil = a.int_list(di) if a.text(di) is not None else []
    out_pad = a.int_list(opi) if isinstance(opi, int) and a.text(opi) is not None else []
    if stride is None or dil is None or out_pad is None:
        return None
    in_sp, k = x[0][2:], w[0][2:]
    if padding is None:  # 'same' (stride 1): output = input
        out_sp = list(in_sp)
    else:
        got = _conv_out(in_sp, k, stride, padding, dil, transposed, out_pad)
        if got is None:
            return None
        out_sp = got
    groups = a.integer(gi) if isinstance(gi, int) else 1
    groups = groups or 1
    c_out = w[0][1] * groups if transposed else w[0][0]
    flops = conv_flops(x[0][0], w[0], in_sp if transposed else out_sp)
    bpe = DTYPE_BYTES[x[1]]
    nbytes = _numel(x[0]) * bpe + _numel(w[0]) * DTYPE_BYTES[w[1]] + x[0][0] * c_out * _numel(out_sp) * bpe
    if isinstance(bi, int):
        b = a.tensor(bi)
        if b is not None:
            nbytes += _numel(b[0]) * DTYPE_BYTES[b[1]]
    prec = _prec(x[1])
    if prec == "fp32" and isinstance(tfi, int) and a.flag(tfi):
        prec = "tf32"
    return OpCost(flops, flops, nbytes, "conv", "matrix", prec, x[1], _fmt_shapes(a))


def _conv_backward(a: _Args) -> OpCost | None:
    """``aten::convolution_backward``: FLOPs = forward FLOPs × (grad-input? + grad-weight?).

    The forward geometry is exact here: ``grad_output`` carries the output shape. The bias gradient
    (a reduction) is not counted, as in FlopCounterMode. bytes = grad_output + input + weight read,
    grad_input / grad_weight / grad_bias written as ``output_mask`` asks.
    """
    g, x, w = a.tensor(0), a.tensor(1), a.tensor(2)
    if g is None or x is None or w is None or len(x[0]) < 3 or len(w[0]) != len(x[0]) or len(g[0]) != len(x[0]):
        return None
    transposed = a.flag(7)
    transposed = bool(transposed)
    mask = a.bool_list(10) or [True, True, True]
    mask = (mask + [False, False, False])[:3]
    fwd = conv_flops(x[0][0], w[0], x[0][2:] if transposed else g[0][2:])
    flops = fwd * (int(mask[0]) + int(mask[1]))
    bpe = DTYPE_BYTES[x[1]]
    nbytes = (_numel(g[0]) * DTYPE_BYTES[g[1]] + _numel(x[0]) * bpe + _numel(w[0]) * DTYPE_BYTES[w[1]]
              + (_numel(x[0]) * bpe if mask[0] else 0) + (_numel(w[0]) * DTYPE_BYTES[w[1]] if mask[1] else 0)
              + (g[0][1] * DTYPE_BYTES[g[1]] if mask[2] else 0))
    return OpCost(flops, flops, nbytes, "conv", "matrix", _prec(x[1]), x[1], _fmt_shapes(a))


# ------------------------------------------------------------------------------------------------
# Attention

# name -> (layout, first q index, causal arg index or None, mask-type arg index or None,
#          causal alignment, backward?)
_ATTN: dict[str, tuple[str, int, int | None, int | None, str, bool]] = {
    "scaled_dot_product_attention": ("BHND", 0, 5, None, "top_left", False),
    "_scaled_dot_product_flash_attention": ("BHND", 0, 4, None, "bottom_right", False),
    "_scaled_dot_product_flash_attention_for_cpu": ("BHND", 0, 4, None, "top_left", False),
    "_scaled_dot_product_efficient_attention": ("BHND", 0, 6, None, "top_left", False),
    "_scaled_dot_product_cudnn_attention": ("BHND", 0, 6, None, "top_left", False),
    "_scaled_dot_product_fused_attention_overrideable": ("BHND", 0, 5, None, "top_left", False),
    "_flash_attention_forward": ("BNHD", 0, 8, None, "bottom_right", False),
    "_efficient_attention_forward": ("BNHD", 0, None, 9, "top_left", False),
    "_scaled_dot_product_flash_attention_backward": ("BHND", 1, 11, None, "bottom_right", True),
    "_scaled_dot_product_flash_attention_for_cpu_backward": ("BHND", 1, 7, None, "top_left", True),
    "_flash_attention_backward": ("BNHD", 1, 11, None, "bottom_right", True),
    "_scaled_dot_product_efficient_attention_backward": ("BHND", 1, 11, None, "top_left", True),
    "_efficient_attention_backward": ("BNHD", 1, None, 14, "top_left", True),
    "_scaled_dot_product_cudnn_attention_backward": ("BHND", 1, 14, None, "top_left", True),
}


def attention_pairs(n_q: int, n_kv: int, causal: bool, alignment: str = "bottom_right") -> int:
    """Number of (query, key) pairs a kernel computes for one batch element and head.

    Non-causal: ``n_q·n_kv``. Causal, ``bottom_right`` (FlashAttention ≥ 2.1, xformers
    ``CausalFromBottomRight``): query ``i`` sees keys ``j ≤ i + n_kv − n_q``, which gives
    ``n_q·n_kv − n_q(n_q−1)/2`` pairs when ``n_q ≤ n_kv`` and ``n_kv(n_kv+1)/2`` otherwise (the first
    ``n_q − n_kv`` queries see nothing). Causal, ``top_left`` (``torch.nn.functional.
    scaled_dot_product_attention(is_causal=True)``, documented upper-left aligned): query ``i``
    sees keys ``j ≤ i``: ``n_q(n_q+1)/2`` when ``n_q ≤ n_kv``, else ``n_kv(n_kv+1)/2 + (n_q−n_kv)·n_kv``.
    With ``n_q = n_kv = N`` both give ``N(N+1)/2`` ≈ half of ``N²``.
    """
    if not causal:
        return n_q * n_kv
    if alignment == "bottom_right":
        if n_q <= n_kv:
            return n_q * n_kv - n_q * (n_q - 1) // 2
        return n_kv * (n_kv + 1) // 2
    if n_q <= n_kv:
        return n_q * (n_q + 1) // 2
    return n_kv * (n_kv + 1) // 2 + (n_q - n_kv) * n_kv


def attention_flops(batch: int, heads_q: int, pairs: int, d_qk: int, d_v: int, backward: bool = False
                    ) -> tuple[float, float]:
    """``(hardware, model)`` FLOPs of one attention call (softmax ignored, as everywhere).

    Forward: QKᵀ (2·P·d_qk) + PV (2·P·d_v) per head, P = :func:`attention_pairs`; with d_qk = d_v = d
    that is 4·B·H·P·d. Backward: the flash kernels recompute QKᵀ then run dV, dP, dQ, dK, so
    hardware = 2·P·(3·d_qk + 2·d_v) = 2.5× forward (``torch.utils.flop_counter`` and the
    FlashAttention benchmark); model FLOPs leave the recompute out: 2·P·(2·d_qk + 2·d_v) = 2× forward
    (the "4 backward matmuls" of the PaLM/torchtitan 12·L·H·Q·T term).
    """
    p = float(batch) * heads_q * pairs
    if not backward:
        f = 2.0 * p * (d_qk + d_v)
        return f, f
    return 2.0 * p * (3 * d_qk + 2 * d_v), 2.0 * p * (2 * d_qk + 2 * d_v)


def _attention(name: str, a: _Args, causal_hint: bool | None = None) -> OpCost | None:
    """SDPA family. bytes: forward Q+K+V read, O written; backward dO+Q+K+V+O+logsumexp(fp32)
    read, dQ+dK+dV written. An explicit ``attn_mask`` tensor disables causal skipping.
    ``causal_hint`` is used when the call itself did not record its causal flag."""
    layout, q0, ci, mi, align, backward = _ATTN[name]
    q, k, v = a.tensor(q0), a.tensor(q0 + 1), a.tensor(q0 + 2)
    if q is None or k is None or v is None or len(q[0]) != 4 or len(k[0]) != 4 or len(v[0]) != 4:
        return None  # varlen (3-D packed) inputs: per-sequence lengths are not recorded
    if layout == "BHND":
        b, hq, nq, dqk = q[0]
        _, hkv, nkv, _ = k[0]
        dv = v[0][3]
    else:
        b, nq, hq, dqk = q[0]
        _, nkv, hkv, _ = k[0]
        dv = v[0][3]
    if k[0][0] != b or v[0][0] != b or hkv <= 0 or hq % hkv != 0:
        return None
    causal = False
    if ci is not None:
        flag = a.flag(ci)
        causal = bool(flag) if flag is not None else bool(causal_hint)
    if mi is not None:
        mt = a.integer(mi)
        if mt == 1:
            causal, align = True, "top_left"
        elif mt == 2:
            causal, align = True, "bottom_right"
    if name == "scaled_dot_product_attention" and a.tensor(3) is not None:
        causal = False
    pairs = attention_pairs(nq, nkv, causal, align)
    hw, model = attention_flops(b, hq, pairs, dqk, dv, backward)
    bpe = DTYPE_BYTES[q[1]]
    qn, kn, vn = _numel(q[0]), _numel(k[0]), _numel(v[0])
    on = b * hq * nq * dv
    if backward:
        nbytes = (2 * on + qn + kn + vn) * bpe + b * hq * nq * 4 + (qn + kn + vn) * bpe
    else:
        nbytes = (qn + kn + vn + on) * bpe
    return OpCost(hw, model, nbytes, "attention", "matrix", _prec(q[1]), q[1], _fmt_shapes(a))


# ------------------------------------------------------------------------------------------------
# Elementwise, reductions, norms, softmax, embedding

#: FLOPs per output element of elementwise ops (in-place ``name_`` variants share the entry).
ELEMENTWISE_K: dict[str, int] = {
    **{n: 1 for n in (
        "add", "sub", "mul", "div", "rsub", "neg", "abs", "relu", "clamp", "clamp_min", "clamp_max",
        "threshold", "threshold_backward", "hardtanh", "hardtanh_backward", "leaky_relu",
        "leaky_relu_backward", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge", "where",
        "masked_fill", "sign", "reciprocal", "sqrt", "rsqrt", "exp", "log", "sin", "cos", "tanh", "sigmoid",
        "erf", "pow", "square", "gelu", "silu", "gelu_backward", "silu_backward", "sigmoid_backward",
        "tanh_backward", "nan_to_num", "logical_and", "logical_or", "logical_not", "bitwise_and",
        "bitwise_or", "bitwise_not", "floor", "ceil", "round", "mish", "softplus", "elu", "hardswish",
        "native_dropout_backward", "native_dropout")},
    **{n: 2 for n in ("addcmul", "addcdiv", "lerp")},
    **{n: 0 for n in ("copy_", "clone", "_to_copy", "fill_", "zero_")},
}
_COMPARE = {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not"}
_WRITE_ONLY = {"fill_", "zero_"}


def _elementwise(base: str, inplace: bool, a: _Args) -> OpCost | None:
    """FLOPs = k·n_out; bytes = Σ tensor inputs + output (``fill_``/``zero_``: output only;
    ``copy_``: source + destination). Output shape = broadcast of the tensor inputs (in-place: self);
    dtype = bool for comparisons, else the widest input (``_to_copy``: its recorded dtype)."""
    k = ELEMENTWISE_K[base]
    ts = a.tensors()
    if not ts:
        return None
    first = ts[0]
    out_shape: list[int] | None
    if inplace or base in ("copy_", "fill_", "zero_"):
        out_shape = first[1]
        out_dt = first[2]
    else:
        out_shape = _broadcast([s for _, s, _ in ts])
        if out_shape is None:
            return None
        out_dt = max((dt for _, _, dt in ts), key=lambda d: DTYPE_BYTES[d])
        if base in _COMPARE:
            out_dt = "bool"
        if base == "_to_copy":
            code = a.integer(1)
            out_dt = SCALAR_TYPE_CODES.get(code, first[2]) if code is not None else first[2]
    n_out = _numel(out_shape)
    if base in _WRITE_ONLY:
        reads = 0.0
    elif base == "copy_":
        src = a.tensor(1)
        reads = _numel(src[0]) * DTYPE_BYTES[src[1]] if src else 0.0
    else:
        reads = sum(_numel(s) * DTYPE_BYTES[dt] for _, s, dt in ts)
    writes = n_out * DTYPE_BYTES[out_dt]
    if base == "native_dropout":
        writes += n_out  # the bool mask
    flops = float(k * n_out)
    return OpCost(flops, flops, reads + writes, "elementwise", "vector", _prec(first[2]), first[2], _fmt_shapes(a))


#: Reductions and the argument position of their ``dim`` list (None: always a full reduction;
#: -1: output as large as the input, e.g. cumsum).
REDUCTIONS: dict[str, int | None] = {
    "sum": 1, "mean": 1, "amax": 1, "amin": 1, "max": 1, "min": 1, "prod": 1, "var": 1, "std": 1,
    "var_mean": 1, "std_mean": 1, "logsumexp": 1, "argmax": 1, "argmin": 1, "any": 1, "all": 1,
    "norm": 2, "linalg_vector_norm": 2, "cumsum": -1, "cumprod": -1,
}


def _reduce(base: str, a: _Args) -> OpCost | None:
    """FLOPs = n_in; bytes = input + output. The output size follows the recorded ``dim`` list
    (missing or empty: everything is reduced to one element)."""
    t = a.tensor(0)
    if t is None:
        return None
    shape, dt = t
    n_in = _numel(shape)
    where = REDUCTIONS[base]
    if where == -1:
        n_out = n_in
    else:
        dims = a.int_list(where) if where is not None else None
        if dims and shape:
            try:
                n_out = n_in // max(1, _numel([shape[d] for d in dims]))
            except IndexError:
                return None
        else:
            n_out = 1
    out_bpe = 8 if base in ("argmax", "argmin") else (1 if base in ("any", "all") else DTYPE_BYTES[dt])
    flops = float(n_in)
    return OpCost(flops, flops, n_in * DTYPE_BYTES[dt] + n_out * out_bpe, "reduce", "vector", _prec(dt), dt,
                  _fmt_shapes(a))


# name -> (kind, input index, affine tensor indices, normalized_shape index or None, backward?)
_NORMS: dict[str, tuple[str, int, tuple[int, ...], int | None, bool]] = {
    "layer_norm": ("layer", 0, (2, 3), 1, False),
    "native_layer_norm": ("layer", 0, (2, 3), 1, False),
    "rms_norm": ("rms", 0, (2,), 1, False),
    "_fused_rms_norm": ("rms", 0, (2,), 1, False),
    "group_norm": ("group", 0, (2, 3), None, False),
    "native_group_norm": ("group", 0, (1, 2), None, False),
    "batch_norm": ("batch", 0, (1, 2), None, False),
    "native_batch_norm": ("batch", 0, (1, 2), None, False),
    "_native_batch_norm_legit": ("batch", 0, (1, 2), None, False),
    "_native_batch_norm_legit_no_training": ("batch_eval", 0, (1, 2), None, False),
    "cudnn_batch_norm": ("batch", 0, (1, 2), None, False),
    "miopen_batch_norm": ("batch", 0, (1, 2), None, False),
    "native_layer_norm_backward": ("layer", 1, (5, 6), 2, True),
    "_fused_rms_norm_backward": ("rms", 1, (4,), 2, True),
    "native_group_norm_backward": ("group", 1, (4,), None, True),
    "native_batch_norm_backward": ("batch", 1, (2,), None, True),
    "cudnn_batch_norm_backward": ("batch", 0, (2,), None, True),
    "miopen_batch_norm_backward": ("batch", 0, (2,), None, True),
}
_BN_TRAINING_ARG = {"batch_norm": 5, "native_batch_norm": 5, "_native_batch_norm_legit": 5, "cudnn_batch_norm": 5,
                    "miopen_batch_norm": 5}


def _norm(base: str, a: _Args) -> OpCost | None:
    """FLOPs per element: 5 for layer/group/batch(train) norm (mean 1, centre 1, square 1, sum 1,
    scale by rstd 1), 2 for batch norm in eval (centre, scale), 3 for RMSNorm (square, sum, scale);
    +1 per affine tensor present (weight mul, bias add). Backward = 2× forward.
    bytes: forward input + affine params read, output written (+ fp32 mean/rstd per normalised row
    for layer/RMS norm in training); backward grad_out + input + weight read, grad_input +
    grad_weight (+ grad_bias) written."""
    kind, xi, affine, nsi, backward = _NORMS[base]
    x = a.tensor(xi)
    if x is None or not x[0]:
        return None
    shape, dt = x
    n = _numel(shape)
    if kind == "batch" and base in _BN_TRAINING_ARG and a.flag(_BN_TRAINING_ARG[base]) is False:
        kind = "batch_eval"
    per = {"layer": 5, "group": 5, "batch": 5, "batch_eval": 2, "rms": 3}[kind]
    params = [a.tensor(i) for i in affine]
    params_present = [p for p in params if p is not None]
    per += len(params_present)
    param_bytes = sum(_numel(p[0]) * DTYPE_BYTES[p[1]] for p in params_present)
    bpe = DTYPE_BYTES[dt]
    rows = 0
    if nsi is not None:
        ns = a.int_list(nsi)
        if ns is not None and len(ns) <= len(shape):
            rows = n // max(1, _numel(shape[len(shape) - len(ns):]))
    if backward:
        g = a.tensor(0) if xi == 1 else a.tensor(1)
        gbytes = _numel(g[0]) * DTYPE_BYTES[g[1]] if g else n * bpe
        nbytes = gbytes + n * bpe + param_bytes + n * bpe + param_bytes + rows * 8
        flops = 2.0 * per * n
    else:
        nbytes = n * bpe + param_bytes + n * bpe + rows * (4 if kind == "rms" else 8)
        flops = float(per * n)
    return OpCost(flops, flops, nbytes, "norm", "vector", _prec(dt), dt, _fmt_shapes(a))


_SOFTMAX_FWD = {"softmax", "_softmax", "log_softmax", "_log_softmax", "_safe_softmax"}
_SOFTMAX_BWD = {"_softmax_backward_data", "_log_softmax_backward_data"}


def _softmax(base: str, a: _Args) -> OpCost | None:
    """Forward: 5 FLOPs per element (max, subtract, exp, sum, divide/log); bytes = input + output
    (output fp32 when ``half_to_float``). Backward: 4 per element; bytes = grad + output + grad_input."""
    t = a.tensor(0)
    if t is None:
        return None
    shape, dt = t
    n = _numel(shape)
    bpe = DTYPE_BYTES[dt]
    if base in _SOFTMAX_BWD:
        o = a.tensor(1)
        obpe = DTYPE_BYTES[o[1]] if o else bpe
        return OpCost(4.0 * n, 4.0 * n, n * (2 * bpe + obpe), "softmax", "vector", _prec(dt), dt, _fmt_shapes(a))
    out_bpe = 4 if base in ("_softmax", "_log_softmax") and a.flag(2) else bpe
    return OpCost(5.0 * n, 5.0 * n, n * (bpe + out_bpe), "softmax", "vector", _prec(dt), dt, _fmt_shapes(a))


def _embedding(base: str, a: _Args) -> OpCost | None:
    """``embedding(weight[V, D], indices)``: 0 FLOPs; bytes = indices + rows read + rows written
    (2·n_idx·D·bpe). ``embedding_(dense_)backward(grad[..., D], indices, num_weights)``: 1 FLOP per
    gradient element (scatter-add); bytes = grad + indices read, grad_weight (num_weights·D) written."""
    if base == "embedding":
        w, idx = a.tensor(0), a.tensor(1)
        if w is None or idx is None or len(w[0]) != 2:
            return None
        d = w[0][1]
        n_idx = _numel(idx[0])
        nbytes = n_idx * DTYPE_BYTES[idx[1]] + 2.0 * n_idx * d * DTYPE_BYTES[w[1]]
        return OpCost(0.0, 0.0, nbytes, "embedding", "vector", _prec(w[1]), w[1], _fmt_shapes(a))
    g, idx = a.tensor(0), a.tensor(1)
    if g is None or idx is None or not g[0]:
        return None
    n_g = _numel(g[0])
    nw = a.integer(2)
    bpe = DTYPE_BYTES[g[1]]
    nbytes = n_g * bpe + _numel(idx[0]) * DTYPE_BYTES[idx[1]] + (nw * g[0][-1] * bpe if nw else 0)
    return OpCost(float(n_g), float(n_g), nbytes, "embedding", "vector", _prec(g[1]), g[1], _fmt_shapes(a))


# ------------------------------------------------------------------------------------------------
# Dispatch

_GEMM = {"mm", "_int_mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "_scaled_mm"}
_EMBED = {"embedding", "embedding_backward", "embedding_dense_backward"}


def is_supported(name: str) -> bool:
    """True when :func:`op_cost` has a formula for this operator name."""
    if not isinstance(name, str) or not name.startswith("aten::"):
        return False
    base = name[6:]
    if base in _GEMM or base in _CONV_ARGS or base == "convolution_backward" or base in _ATTN:
        return True
    if base in _NORMS or base in _SOFTMAX_FWD or base in _SOFTMAX_BWD or base in _EMBED or base in REDUCTIONS:
        return True
    if base in ELEMENTWISE_K:
        return True
    return base.endswith("_") and base[:-1] in ELEMENTWISE_K


def attention_causal_flag(name: str, concrete_inputs: Any) -> bool | None:
    """The recorded ``is_causal`` of an attention call (None when not an attention op or not recorded)."""
    if not isinstance(name, str) or not name.startswith("aten::") or name[6:] not in _ATTN:
        return None
    _, _, ci, mi, _, _ = _ATTN[name[6:]]
    a = _Args([], [], parse_json_list(concrete_inputs) or [])
    if ci is not None:
        return a.flag(ci)
    mt = a.integer(mi) if mi is not None else None
    return None if mt is None else mt in (1, 2)


def is_attention_backward(name: str) -> bool:
    """True for the attention backward ops (whose causal flag may come from the forward call)."""
    return isinstance(name, str) and name.startswith("aten::") and name[6:] in _ATTN and _ATTN[name[6:]][5]


def op_cost(name: str, input_dims: Any, input_types: Any, concrete_inputs: Any = None, *,
            causal_hint: bool | None = None) -> OpCost | None:
    """FLOPs/bytes of one call of ``name`` from its recorded args (JSON text or lists).

    ``causal_hint``: the causal flag of the matching forward call, for attention backward ops
    recorded without their own ``Concrete Inputs``.

    Returns None for operators without a formula and for shapes that do not fit the formula
    (missing dims, mismatched K, unknown dtype, varlen attention, conv without stride/padding).
    """
    if not is_supported(name):
        return None
    dims = parse_json_list(input_dims)
    types = parse_json_list(input_types)
    if dims is None or types is None:
        return None
    concrete = parse_json_list(concrete_inputs) or []
    a = _Args(dims, types, concrete)
    base = name[6:]
    try:
        if base in _GEMM:
            return _gemm(base, a)
        if base in _CONV_ARGS:
            return _conv(base, a)
        if base == "convolution_backward":
            return _conv_backward(a)
        if base in _ATTN:
            return _attention(base, a, causal_hint)
        if base in _NORMS:
            return _norm(base, a)
        if base in _SOFTMAX_FWD or base in _SOFTMAX_BWD:
            return _softmax(base, a)
        if base in _EMBED:
            return _embedding(base, a)
        if base in REDUCTIONS:
            return _reduce(base, a)
        if base in ELEMENTWISE_K:
            return _elementwise(base, False, a)
        if base.endswith("_") and base[:-1] in ELEMENTWISE_K:
            return _elementwise(base[:-1], True, a)
    except (TypeError, ValueError, KeyError, IndexError, ZeroDivisionError, OverflowError):
        return None
    return None


__all__ = [
    "DTYPE_BYTES",
    "DTYPE_PRECISION",
    "ELEMENTWISE_K",
    "OpCost",
    "attention_flops",
    "attention_causal_flag",
    "attention_pairs",
    "is_attention_backward",
    "conv_flops",
    "gemm_flops",
    "is_supported",
    "normalise_dtype",
    "op_cost",
    "parse_json_list",
]
