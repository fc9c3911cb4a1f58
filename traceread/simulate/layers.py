"""Transformer building blocks as a real torch 2.x eager run would record them.

Each emitter opens the cpu_op tree PyTorch records (``aten::linear`` > ``aten::t`` +
``aten::addmm`` > ``cudaLaunchKernel``), launches kernels named like the real cuBLAS/flash/ATen
kernels of the device, and registers a :class:`LeafOp` for the *leaf* op with exact FLOPs and
bytes from the shapes it recorded. The formulas follow the conventions documented in
``traceread.analysis.compute.flops`` (torch's ``FlopCounterMode`` / TraceLens) but are computed here, from
the simulator's own shapes, so that the truth stays independent of the analysis code.
FLOPs count multiply and add separately; bytes are the minimal HBM traffic (every tensor input read
once, every output written once; bf16 = 2 bytes, fp32 statistics = 4). Per op (tensor inputs as
recorded), FLOPs; bytes:

* ``aten::mm`` [M,K] x [K,N]: 2·M·N·K; 2·(M·K + K·N + M·N).
* ``aten::addmm`` bias [N], [M,K] x [K,N]: 2·M·N·K (the bias add is not counted, as in torch's flop
  counter); 2·(M·K + K·N + M·N + N).
* ``aten::_scaled_dot_product_flash_attention`` q, k, v [B,H,N,d]: 4·B·H·P·d (QKᵀ and PV over the
  P attended query-key pairs; causal P = N(N+1)/2, else N²); 2·4·B·H·N·d (Q, K, V read, O written).
* ``aten::_scaled_dot_product_flash_attention_backward`` dO, q, k, v, out [B,H,N,d], logsumexp
  [B,H,N] fp32: hardware 10·B·H·P·d (QKᵀ recompute + dV, dP, dQ, dK), model 8·B·H·P·d (2× forward);
  2·8·B·H·N·d + 4·B·H·N (dO, Q, K, V, O, logsumexp read; dQ, dK, dV written).
* ``aten::native_layer_norm`` x [M,C], γ, β [C]: 7·M·C (5 per element + 1 per affine tensor);
  2·(2·M·C + 2·C) + 8·M (fp32 mean and rstd written per row).
* ``aten::native_layer_norm_backward`` dY, x [M,C], mean, rstd [M,1] fp32, γ, β [C]: 14·M·C
  (2× forward); 2·(3·M·C + 4·C) + 8·M (dY, x, mean, rstd, γ, β read; dx, dγ, dβ written).
* ``aten::add_`` [n] + [n], ``aten::gelu`` [n], ``aten::gelu_backward`` [n], [n], ``aten::div`` [n]:
  n (an activation counts 1 per element, as in TraceLens); 2·3·n, 2·2·n, 2·3·n, 2·2·n.
* ``aten::sum`` [M,N] over dim 0 (bias grad) / ``aten::mean`` [M,C] (loss): 1 per input element;
  2·(M·N + N) / 2·(M·C + 1).
* ``aten::_fused_adamw_`` on P params: 12·P; 16·P (bf16 p, g; fp32 m, v).

Causal attention counts the (query, key) pairs the flash kernel computes: with its bottom-right
aligned mask query i sees keys j ≤ i + N_kv − N_q, N(N+1)/2 pairs when N_q = N_kv = N.

Model FLOPs / MFU count only the matrix-unit ops (mm, addmm, flash attention forward and backward),
as traceread's trace MFU and the 6·N·D convention do; the flash backward's recompute of QKᵀ is
hardware work (HFU), not model work. Elementwise, norm, reduction and optimizer FLOPs are reported
per op but not in MFU. ``aten::_fused_adamw_`` records TensorList inputs without shapes, so its
numbers exist only in the truth (traceread has no formula for it).
Kernel times come from a simple roofline on the hardware FLOPs:
``max(F / (eff_c·peak), B / (eff_m·BW)) + launch tail``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from math import ceil

from traceread.simulate.schedule import GpuOp, KernelSpec, OpRecord, RankCtx

BF16 = "c10::BFloat16"
FP32 = "float"
U64 = "long unsigned int"  # how the profiler names a torch.uint64 tensor (flash rng state)
BPE = 2
COMPUTE_STREAM = 7
LN_EPS = "1.0000000000000001e-05"  # 1e-5 as the profiler prints a double


def _ns(seconds: float) -> int:
    return int(round(seconds * 1e9))


@dataclass(eq=False)
class LeafOp(OpRecord):
    """An :class:`OpRecord` that also knows its model FLOPs (what MFU credits; = ``flops`` except for
    the flash-attention backward, whose recompute of QKᵀ is hardware work only)."""

    model_flops: int = 0


@cache
def causal_pairs(n_q: int, n_kv: int) -> int:
    """(query, key) pairs one head computes under FlashAttention's bottom-right causal mask.

    Counted row by row: query ``i`` sees keys ``0 .. i + n_kv − n_q`` (none when that is negative).
    """
    return sum(min(n_kv, max(0, i + n_kv - n_q + 1)) for i in range(n_q))


def attention_pairs(n_q: int, n_kv: int, causal: bool) -> int:
    return causal_pairs(n_q, n_kv) if causal else n_q * n_kv


def flash_fwd_flops(b: int, h: int, pairs: int, d: int) -> int:
    """QKᵀ and PV: 2 matmuls of 2·P·d FLOPs per head."""
    return 2 * 2 * b * h * pairs * d


def flash_bwd_flops(b: int, h: int, pairs: int, d: int) -> tuple[int, int]:
    """(hardware, model): the kernel recomputes QKᵀ, then dV = PᵀdO, dP = dO·Vᵀ, dQ = dS·K, dK = dSᵀ·Q
    (5 matmuls); the model count leaves the recompute out (4 matmuls, 2× forward)."""
    per_matmul = 2 * b * h * pairs * d
    return 5 * per_matmul, 4 * per_matmul


class Emitter:
    """Emits the host ops and kernels of transformer layers on one rank."""

    def __init__(self, ctx: RankCtx) -> None:
        self.ctx = ctx
        self.dev = ctx.dev

    # ---- kernel specs ------------------------------------------------------------------------
    def _roofline_ns(self, flops: float, nbytes: float, eff_c: float, eff_m: float, tail_ns: int) -> int:
        t = max(flops / (self.dev.peak_flops * eff_c), nbytes / (self.dev.mem_bw_gbs * 1e9 * eff_m))
        return _ns(t) + tail_ns

    def gemm_spec(self, m: int, n: int, k: int, flops: int, nbytes: int, trans: str = "tn") -> KernelSpec:
        arch = self.dev.arch
        if arch == "hopper":
            tm, tn = 128, 256
            name = (f"sm90_xmma_gemm_bf16bf16_bf16f32_f32_{trans}_n_tilesize128x256x64_warpgroupsize2x1x1"
                    "_execute_segment_k_off_kernel__5x_cublas")
            block, regs, smem = (384, 1, 1), 168, 213_248
        elif arch == "blackwell":
            tm, tn = 256, 128
            name = f"nvjet_sm100_tst_256x128_64x4_2x1_2cta_v_bz_{trans.upper()}N"
            block, regs, smem = (384, 1, 1), 168, 200_704
        else:
            tm, tn = 256, 128
            name = f"ampere_bf16_s16816gemm_bf16_256x128_ldg8_f2f_stages_64x3_{trans}"
            block, regs, smem = (256, 1, 1), 232, 98_304
        grid = (ceil(n / tn), ceil(m / tm), 1)
        return KernelSpec(name, self._roofline_ns(flops, nbytes, 0.72, 0.8, 2_500), grid, block, regs, smem)

    def elementwise_spec(self, functor: str, n: int, flops: int, nbytes: int, arity: int = 3) -> KernelSpec:
        name = (f"void at::native::vectorized_elementwise_kernel<4, {functor}, at::detail::Array<char*, {arity}> >"
                f"(int, {functor}, at::detail::Array<char*, {arity}>)")
        grid = (max(1, ceil(n / 512)), 1, 1)
        return KernelSpec(name, self._roofline_ns(flops, nbytes, 0.3, 0.82, 1_800), grid, (128, 1, 1), 26, 0)

    # ---- recording -------------------------------------------------------------------------
    def _rec(self, name: str, dims: list[list[int]], flops: int, nbytes: int, matmul: bool, formula: str,
             model_flops: int | None = None) -> LeafOp:
        """Register a leaf op; ``dims`` are its tensor inputs as recorded (non-tensor args left out)."""
        rec = LeafOp(self.ctx.rank, self.ctx.step, name, dims, "bf16", flops, nbytes, matmul, formula,
                     model_flops=flops if model_flops is None else model_flops)
        self.ctx.ops.append(rec)
        return rec

    # ---- forward ops -------------------------------------------------------------------------
    def linear(self, m: int, k: int, n: int, *, bias: bool, seq: int, waits: list[GpuOp] | None = None,
               phase: str = "fwd") -> GpuOp:
        """``aten::linear`` on a flattened [M,K] activation with weight [N,K]: addmm with bias, mm without."""
        ctx = self.ctx
        dims: list[list[int]] = [[m, k], [n, k]] + ([[n]] if bias else [])
        with ctx.op("aten::linear", dims=dims, types=[BF16] * len(dims), seq=seq, pre=3_000):
            with ctx.op("aten::t", dims=[[n, k]], types=[BF16], strides=[[k, 1]], pre=1_500, post=500):
                with ctx.op("aten::transpose", dims=[[n, k], [], []], types=[BF16, "Scalar", "Scalar"],
                            concrete=["", "0", "1"], pre=800, post=300):
                    with ctx.op("aten::as_strided", dims=[[n, k], [], [], []], types=[BF16, "", "", ""],
                                pre=500, post=200):
                        pass
            flops = 2 * m * n * k
            if bias:
                nbytes = BPE * (m * k + k * n + m * n + n)
                d = [[n], [m, k], [k, n], [], []]
                with ctx.op("aten::addmm", dims=d, types=[BF16, BF16, BF16, "Scalar", "Scalar"],
                            strides=[[1], [k, 1], [1, k], [], []], concrete=["", "", "", "1", "1"]) as _:
                    rec = self._rec("aten::addmm", d[:3], flops, nbytes, True, "2*M*N*K")
                    return ctx.launch(self.gemm_spec(m, n, k, flops, nbytes), COMPUTE_STREAM,
                                      waits=waits, rec=rec, phase=phase)
            nbytes = BPE * (m * k + k * n + m * n)
            d = [[m, k], [k, n]]
            with ctx.op("aten::mm", dims=d, types=[BF16, BF16], strides=[[k, 1], [1, k]]):
                rec = self._rec("aten::mm", d, flops, nbytes, True, "2*M*N*K")
                return ctx.launch(self.gemm_spec(m, n, k, flops, nbytes), COMPUTE_STREAM, waits=waits,
                                  rec=rec, phase=phase)

    def sdpa(self, b: int, h: int, s: int, d: int, *, causal: bool, seq: int, phase: str = "fwd") -> GpuOp:
        """``aten::scaled_dot_product_attention`` (torch ≥ 2.5 records 8 args, ``enable_gqa`` last)
        dispatching to the flash kernel; ``scale`` is left at None as most callers do."""
        ctx = self.ctx
        q = [b, h, s, d]
        flag = "True" if causal else "False"
        with ctx.op("aten::scaled_dot_product_attention", dims=[q, q, q, [], [], [], [], []],
                    types=[BF16, BF16, BF16, "", "Scalar", "Scalar", "", "Scalar"],
                    concrete=["", "", "", "", "0.", flag, "", "False"], seq=seq, pre=4_000):
            # (query, key, value, dropout_p, is_causal, return_debug_mask, *, scale)
            dims = [q, q, q, [], [], [], []]
            with ctx.op("aten::_scaled_dot_product_flash_attention", dims=dims,
                        types=[BF16, BF16, BF16, "Scalar", "Scalar", "Scalar", ""],
                        concrete=["", "", "", "0.", flag, "False", ""], pre=6_000):
                pairs = attention_pairs(s, s, causal)
                flops = flash_fwd_flops(b, h, pairs, d)
                nbytes = BPE * 4 * b * h * s * d
                rec = self._rec("aten::_scaled_dot_product_flash_attention", [q, q, q], flops, nbytes, True,
                                "4*B*H*P*d, P = " + ("N(N+1)/2 (causal)" if causal else "N*N"))
                spec = self._flash_spec(b, h, s, flops, nbytes, bwd=False)
                return ctx.launch(spec, COMPUTE_STREAM, rec=rec, phase=phase)

    def _flash_spec(self, b: int, h: int, s: int, flops: int, nbytes: int, *, bwd: bool) -> KernelSpec:
        if bwd:
            name = ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<128, 64, "
                    "128, 8, 2, 4, 2, false, false, cutlass::bfloat16_t, Flash_kernel_traits<128, 64, 128, 8, "
                    "cutlass::bfloat16_t> >, true, true, false, false, false, false, false>(pytorch_flash::Flash_bwd_params)")
            return KernelSpec(name, self._roofline_ns(flops, nbytes, 0.42, 0.7, 4_000), (ceil(s / 128), b, h),
                              (256, 1, 1), 255, 98_304)
        name = ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
                "cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true, "
                "false, false, true, true, false, false>(pytorch_flash::Flash_fwd_params)")
        return KernelSpec(name, self._roofline_ns(flops, nbytes, 0.55, 0.7, 3_000), (ceil(s / 128), b, h),
                          (128, 1, 1), 255, 49_152)

    def layer_norm(self, m: int, c: int, *, seq: int, phase: str = "fwd") -> GpuOp:
        ctx = self.ctx
        with ctx.op("aten::layer_norm", dims=[[m, c], [], [c], [c], [], []],
                    types=[BF16, "ScalarList", BF16, BF16, "Scalar", "Scalar"],
                    concrete=["", f"[{c}]", "", "", LN_EPS, "True"], seq=seq):
            d = [[m, c], [], [c], [c], []]
            with ctx.op("aten::native_layer_norm", dims=d, types=[BF16, "ScalarList", BF16, BF16, "Scalar"],
                        concrete=["", f"[{c}]", "", "", LN_EPS]):
                # mean, centre, square, sum, scale by rstd + weight mul + bias add; fp32 mean/rstd per row
                flops, nbytes = 7 * m * c, BPE * (2 * m * c + 2 * c) + 8 * m
                rec = self._rec("aten::native_layer_norm", [[m, c], [c], [c]], flops, nbytes, False, "7*M*C")
                name = ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>"
                        "(int, float, c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, "
                        "float*, c10::BFloat16*)")
                spec = KernelSpec(name, self._roofline_ns(flops, nbytes, 0.2, 0.75, 2_000), (m, 1, 1), (32, 4, 1), 38, 0)
                return ctx.launch(spec, COMPUTE_STREAM, rec=rec, phase=phase)

    def add_(self, m: int, c: int, *, phase: str = "fwd") -> GpuOp:
        ctx = self.ctx
        n = m * c
        d = [[m, c], [m, c], []]
        with ctx.op("aten::add_", dims=d, types=[BF16, BF16, "Scalar"], concrete=["", "", "1"]):
            rec = self._rec("aten::add_", [[m, c], [m, c]], n, BPE * 3 * n, False, "n")
            spec = self.elementwise_spec("at::native::CUDAFunctor_add<c10::BFloat16>", n, n, BPE * 3 * n)
            return ctx.launch(spec, COMPUTE_STREAM, rec=rec, phase=phase)

    def gelu(self, m: int, c: int, *, seq: int, phase: str = "fwd") -> GpuOp:
        ctx = self.ctx
        n = m * c
        with ctx.op("aten::gelu", dims=[[m, c], []], types=[BF16, ""], concrete=["", ""], seq=seq):
            rec = self._rec("aten::gelu", [[m, c]], n, BPE * 2 * n, False, "n")
            spec = self.elementwise_spec("at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)"
                                         "::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::"
                                         "{lambda(c10::BFloat16)#1}", n, n, BPE * 2 * n, arity=2)
            return ctx.launch(spec, COMPUTE_STREAM, rec=rec, phase=phase)

    # ---- backward ops (autograd thread) ----------------------------------------------------------
    def _bwd_node(self, node: str, seq: int):
        """``autograd::engine::evaluate_function: X`` > ``X``, linked to the forward op by sequence number."""
        ctx = self.ctx
        return _Nested(ctx, [
            dict(name=f"autograd::engine::evaluate_function: {node}", seq=seq, fwd_tid=1, pre=2_500),
            dict(name=node, seq=seq, fwd_tid=1, pre=2_000),
        ])

    def linear_backward(self, m: int, k: int, n: int, *, bias: bool, seq: int, phase: str = "bwd",
                        need_dx: bool = True) -> list[GpuOp]:
        """dX = dY[M,N] x W[N,K] and dW = dYᵀ[N,M] x X[M,K] (+ bias grad = sum of dY over rows)."""
        ctx = self.ctx
        out: list[GpuOp] = []
        with self._bwd_node("AddmmBackward0" if bias else "MmBackward0", seq):
            if need_dx:
                with ctx.op("aten::mm", dims=[[m, n], [n, k]], types=[BF16, BF16], strides=[[n, 1], [k, 1]]):
                    f, b = 2 * m * k * n, BPE * (m * n + n * k + m * k)
                    rec = self._rec("aten::mm", [[m, n], [n, k]], f, b, True, "2*M*N*K")
                    out.append(ctx.launch(self.gemm_spec(m, k, n, f, b, "nn"), COMPUTE_STREAM, rec=rec, phase=phase))
            with ctx.op("aten::mm", dims=[[n, m], [m, k]], types=[BF16, BF16], strides=[[1, n], [k, 1]]):
                f, b = 2 * n * k * m, BPE * (n * m + m * k + n * k)
                rec = self._rec("aten::mm", [[n, m], [m, k]], f, b, True, "2*M*N*K")
                out.append(ctx.launch(self.gemm_spec(n, k, m, f, b, "nt"), COMPUTE_STREAM, rec=rec, phase=phase))
            if bias:
                with ctx.op("aten::sum", dims=[[m, n], [], [], []], types=[BF16, "ScalarList", "Scalar", ""],
                            concrete=["", "[0]", "True", ""]):
                    f, b = m * n, BPE * (m * n + n)
                    rec = self._rec("aten::sum", [[m, n]], f, b, False, "M*N")
                    name = ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::BFloat16, "
                            "at::native::func_wrapper_t<float, at::native::sum_functor<c10::BFloat16, float, "
                            "c10::BFloat16>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, "
                            "c10::BFloat16, 4, 4> >(at::native::ReduceOp<c10::BFloat16, at::native::func_wrapper_t<float, "
                            "at::native::sum_functor<c10::BFloat16, float, c10::BFloat16>::operator()(at::TensorIterator&)"
                            "::{lambda(float, float)#1}>, unsigned int, c10::BFloat16, 4, 4>)")
                    spec = KernelSpec(name, self._roofline_ns(f, b, 0.2, 0.7, 2_500), (ceil(n / 32), 16, 1),
                                      (32, 16, 1), 32, 4_112)
                    out.append(ctx.launch(spec, COMPUTE_STREAM, rec=rec, phase=phase))
        return out

    def sdpa_backward(self, b: int, h: int, s: int, d: int, *, causal: bool, seq: int, phase: str = "bwd") -> GpuOp:
        """``_scaled_dot_product_flash_attention_backward(grad_out, query, key, value, out, logsumexp,
        cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset, *, scale)``
        recorded as torch 2.x does for dense inputs: undefined cum_seq tensors, the max lengths and
        the flags as ``Concrete Inputs``, the uint64 rng state ([2]) and its unused partner ([])."""
        ctx = self.ctx
        q = [b, h, s, d]
        lse = [b, h, s]
        with self._bwd_node("ScaledDotProductFlashAttentionBackward0", seq):
            dims = [q, q, q, q, q, lse, [], [], [], [], [], [], [2], [], []]
            types = [BF16, BF16, BF16, BF16, BF16, FP32, "", "", "Scalar", "Scalar", "Scalar", "Scalar", U64, U64, ""]
            concrete = ["", "", "", "", "", "", "", "", str(s), str(s), "0.", "True" if causal else "False", "", "", ""]
            with ctx.op("aten::_scaled_dot_product_flash_attention_backward", dims=dims, types=types,
                        concrete=concrete, pre=6_000):
                pairs = attention_pairs(s, s, causal)
                flops, model = flash_bwd_flops(b, h, pairs, d)
                nbytes = BPE * 8 * b * h * s * d + 4 * b * h * s
                rec = self._rec("aten::_scaled_dot_product_flash_attention_backward", [q, q, q, q, q, lse], flops,
                                nbytes, True, "10*B*H*P*d (model 8*B*H*P*d), P = "
                                + ("N(N+1)/2 (causal)" if causal else "N*N"), model_flops=model)
                return ctx.launch(self._flash_spec(b, h, s, flops, nbytes, bwd=True), COMPUTE_STREAM, rec=rec,
                                  phase=phase)

    def layer_norm_backward(self, m: int, c: int, *, seq: int, phase: str = "bwd") -> GpuOp:
        ctx = self.ctx
        with self._bwd_node("NativeLayerNormBackward0", seq):
            # (grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask)
            d = [[m, c], [m, c], [], [m, 1], [m, 1], [c], [c], []]
            with ctx.op("aten::native_layer_norm_backward", dims=d,
                        types=[BF16, BF16, "ScalarList", FP32, FP32, BF16, BF16, "ScalarList"],
                        concrete=["", "", f"[{c}]", "", "", "", "", "[True, True, True]"]):
                flops, nbytes = 14 * m * c, BPE * (3 * m * c + 4 * c) + 8 * m
                rec = self._rec("aten::native_layer_norm_backward", [[m, c], [m, c], [m, 1], [m, 1], [c], [c]],
                                flops, nbytes, False, "14*M*C (2x forward)")
                name = ("void at::native::(anonymous namespace)::layer_norm_grad_input_kernel_vectorized<c10::BFloat16, "
                        "float>(c10::BFloat16 const*, c10::BFloat16 const*, float const*, float const*, "
                        "c10::BFloat16 const*, c10::BFloat16*, int)")
                spec = KernelSpec(name, self._roofline_ns(flops, nbytes, 0.2, 0.7, 2_500), (m, 1, 1), (128, 1, 1), 40, 0)
                return ctx.launch(spec, COMPUTE_STREAM, rec=rec, phase=phase)

    def gelu_backward(self, m: int, c: int, *, seq: int, phase: str = "bwd") -> GpuOp:
        ctx = self.ctx
        n = m * c
        with self._bwd_node("GeluBackward0", seq):
            with ctx.op("aten::gelu_backward", dims=[[m, c], [m, c], []], types=[BF16, BF16, ""],
                        concrete=["", "", ""]):
                rec = self._rec("aten::gelu_backward", [[m, c], [m, c]], n, BPE * 3 * n, False, "n")
                spec = self.elementwise_spec("at::native::GeluBackwardCUDAKernelImpl(at::TensorIteratorBase&, "
                                             "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}::"
                                             "operator()() const::{lambda(c10::BFloat16, c10::BFloat16)#1}",
                                             n, n, BPE * 3 * n)
                return ctx.launch(spec, COMPUTE_STREAM, rec=rec, phase=phase)

    def add_backward(self, m: int, c: int, *, seq: int, phase: str = "bwd") -> GpuOp:
        """Residual-gradient accumulation (``AddBackward0`` then an in-place add of the two branches)."""
        with self._bwd_node("AddBackward0", seq):
            pass
        return self.add_(m, c, phase=phase)

    # ---- optimizer ---------------------------------------------------------------------------
    def adamw(self, params: int, *, tensors: int, phase: str = "opt") -> list[GpuOp]:
        """``Optimizer.step#AdamW.step`` > ``aten::_fused_adamw_``: one multi_tensor_apply launch per chunk."""
        ctx = self.ctx
        out: list[GpuOp] = []
        with ctx.op("Optimizer.step#AdamW.step", cat="user_annotation", pre=20_000, post=5_000):
            with ctx.op("aten::_fused_adamw_", dims=[[], [], [], [], [], [], [], [], [], [], [], [], [], [], []],
                        types=["TensorList"] * 6 + ["Double", "Double", "Double", "Double", "Double", "Scalar",
                                                    "Scalar", "", ""], pre=8_000):
                flops, nbytes = 12 * params, 16 * params
                rec = self._rec("aten::_fused_adamw_", [[params]], flops, nbytes, False, "12*P (P params)")
                rec.shapes_in_trace = False  # TensorList inputs: the trace has no shapes, no roofline class
                name = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
                        "namespace)::FusedOptimizerTensorListMetadata<4>, at::native::(anonymous namespace)::"
                        "FusedAdamMathFunctor<c10::BFloat16, 4, (at::native::ADAM_MODE)1, false>, double*, double, "
                        "double, double, double, double, bool, float const*, float const*>(at::native::(anonymous "
                        "namespace)::FusedOptimizerTensorListMetadata<4>, at::native::(anonymous namespace)::"
                        "FusedAdamMathFunctor<c10::BFloat16, 4, (at::native::ADAM_MODE)1, false>, double*, double, "
                        "double, double, double, double, bool, float const*, float const*)")
                chunks = max(1, min(tensors, 4))
                for _ in range(chunks):
                    spec = KernelSpec(name, self._roofline_ns(flops / chunks, nbytes / chunks, 0.2, 0.8, 3_000),
                                      (320, 1, 1), (512, 1, 1), 64, 0)
                    out.append(ctx.launch(spec, COMPUTE_STREAM, rec=rec, phase=phase))
        return out

    def loss(self, m: int, c: int, *, seq: int) -> GpuOp:
        """``aten::mean`` of the output: a scalar loss (reduce kernel)."""
        ctx = self.ctx
        with ctx.op("aten::mean", dims=[[m, c], []], types=[BF16, ""], concrete=["", ""], seq=seq):
            f, b = m * c, BPE * (m * c + 1)
            rec = self._rec("aten::mean", [[m, c]], f, b, False, "n")
            name = ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::BFloat16, at::native::MeanOps<float, "
                    "float, float, float>, unsigned int, c10::BFloat16, 4, 4> >(at::native::ReduceOp<c10::BFloat16, "
                    "at::native::MeanOps<float, float, float>, unsigned int, c10::BFloat16, 4, 4>)")
            spec = KernelSpec(name, self._roofline_ns(f, b, 0.2, 0.7, 2_500), (self.dev.num_sms * 4, 1, 1),
                              (512, 1, 1), 32, 16)
            return ctx.launch(spec, COMPUTE_STREAM, rec=rec, phase="loss")

    def loss_backward(self, m: int, c: int, *, seq: int) -> GpuOp:
        ctx = self.ctx
        n = m * c
        with self._bwd_node("MeanBackward0", seq):
            with ctx.op("aten::div", dims=[[m, c], []], types=[BF16, "Scalar"], concrete=["", str(n)]):
                rec = self._rec("aten::div", [[m, c]], n, BPE * 2 * n, False, "n")
                spec = self.elementwise_spec("at::native::BUnaryFunctor<c10::BFloat16, c10::BFloat16, c10::BFloat16, "
                                             "at::native::binary_internal::DivFunctor<c10::BFloat16> >", n, n,
                                             BPE * 2 * n, arity=2)
                return ctx.launch(spec, COMPUTE_STREAM, rec=rec, phase="loss")


class _Nested:
    """Open several nested ops with one ``with`` (backward evaluate_function + node)."""

    def __init__(self, ctx: RankCtx, specs: list[dict]) -> None:
        self.ctx = ctx
        self.specs = specs
        self._cms: list = []

    def __enter__(self) -> None:
        for s in self.specs:
            cm = self.ctx.op(**s)
            cm.__enter__()
            self._cms.append(cm)

    def __exit__(self, *exc: object) -> None:
        while self._cms:
            self._cms.pop().__exit__(None, None, None)
