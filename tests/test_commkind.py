"""One communication-kernel classifier (analysis.commkind): by name and by launching operator, and
its consequences: communication counts as comm in the breakdown and is never judged by SM use or
the roofline."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from rank_factory import make_rank

from traceread.analysis import kinds as commkind
from traceread.analysis.compute import occupancy, roofline
from traceread.analysis.kinds import gpu_class_expr
from traceread.analysis.time import breakdown

# Real kernel names of the communication libraries (from their public sources / real traces).
COMM_NAMES = {
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)": "nccl",
    "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)": "nccl",
    "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, "
    "vllm::Signal*, __nv_bfloat16*, int, int)": "custom_allreduce",
    "void vllm::cross_device_reduce_2stage<c10::Half, 4>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, "
    "vllm::RankData*, c10::Half*, int, int)": "custom_allreduce",
    "void tensorrt_llm::kernels::oneShotAllReduceKernel<__nv_bfloat16, 8>(AllReduceParams<__nv_bfloat16>)":
        "custom_allreduce",
    "void c10d::symmetric_memory::multimem_all_reduce_kernel<__nv_bfloat16, 16, 8>(...)": "symm_mem",
    "void c10d::symmetric_memory::two_shot_all_reduce_kernel<float, 16, 8>(...)": "symm_mem",
    "void deep_ep::intranode::dispatch<8, 768, 8192>(int4*, float*, int*, long*)": "ep",
    "void deep_ep::internode_ll::combine<false, 7168>(void*, void*, int*)": "ep",
    "void mscclpp::allreduce6<__nv_bfloat16>(__nv_bfloat16*, mscclpp::DeviceHandle<mscclpp::SmChannel>*)": "msccl",
}
# Compute kernels whose names merely contain "reduce", "gather", "dispatch" or "combine".
COMPUTE_NAMES = [
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>>>",
    "void at::native::vectorized_gather_kernel<16, long>(char*, char*, long*, int, long, long, long, long, bool)",
    "reduce_segments",
    "_combined_routing_compute",
    "void deep_ep::layout::get_dispatch_layout<256, 32, 8>(long const*, int*, int*, int*, bool*, int, int, int, int)",
]


@pytest.mark.parametrize("name,kind", sorted(COMM_NAMES.items()))
def test_communication_kernels_by_name(name: str, kind: str) -> None:
    assert commkind.comm_kind_of_name(name) == kind
    assert commkind.is_comm_kernel_name(name)


@pytest.mark.parametrize("name", COMPUTE_NAMES)
def test_compute_kernels_are_not_communication(name: str) -> None:
    assert commkind.comm_kind_of_name(name) is None


def test_collective_of_non_nccl_kernels() -> None:
    assert commkind.collective_of_kernel("void vllm::cross_device_reduce_1stage<float, 2>()") == "allreduce"
    assert commkind.collective_of_kernel("void deep_ep::intranode::combine<8>()") == "alltoall"
    assert commkind.collective_of_kernel("multimem_all_gather_kernel") == "allgather"
    assert commkind.collective_of_kernel("void at::native::reduce_kernel<512>()") is None


def test_communication_operators() -> None:
    for op in ("record_param_comms", "nccl:all_reduce", "gloo:all_reduce", "c10d::allreduce_",
               "_c10d_functional::all_gather_into_tensor", "symm_mem::one_shot_all_reduce",
               "_C_custom_ar::all_reduce", "vllm::all_reduce", "sglang::outplace_all_reduce"):
        assert commkind.is_comm_op_name(op), op
    for op in ("aten::copy_", "aten::mm", "vllm::unified_attention", "aten::reduce_sum", None):
        assert not commkind.is_comm_op_name(op), op


def _engine_rank():  # type: ignore[no-untyped-def]
    """A decode step of an inference engine: a GEMM, a custom all-reduce kernel with an unknown name
    launched by ``_C_custom_ar::all_reduce``, a copy launched by ``aten::copy_`` nested inside
    ``c10d::allgather_`` (compute: only the innermost operator counts) and a DeepEP dispatch."""
    host = [
        {"cat": "cpu_op", "name": "aten::mm", "ts": 0.0, "dur": 5.0},  # 0
        {"cat": "cpu_op", "name": "_C_custom_ar::all_reduce", "ts": 6.0, "dur": 5.0},  # 1
        {"cat": "cpu_op", "name": "c10d::allgather_", "ts": 12.0, "dur": 6.0},  # 2
        {"cat": "cpu_op", "name": "aten::copy_", "ts": 13.0, "dur": 2.0, "parent": 2, "depth": 1},  # 3
        {"cat": "cpu_op", "name": "deep_ep::dispatch", "ts": 19.0, "dur": 2.0},  # 4
    ]
    gpu = [
        {"name": "sm90_xmma_gemm_bf16", "ts": 10.0, "dur": 40.0, "op_row": 0, "grid_x": 4, "grid_y": 1,
         "grid_z": 1, "blocks_per_sm": 0.03},
        {"name": "my_allreduce_kernel", "ts": 50.0, "dur": 20.0, "op_row": 1, "grid_x": 2, "grid_y": 1,
         "grid_z": 1, "blocks_per_sm": 0.015},
        {"name": "void at::native::elementwise_kernel<copy>", "ts": 70.0, "dur": 10.0, "op_row": 3, "grid_x": 1,
         "grid_y": 1, "grid_z": 1, "blocks_per_sm": 0.0075},
        {"name": "void deep_ep::intranode::dispatch<8, 768, 8192>(int4*)", "ts": 80.0, "dur": 20.0,
         "op_row": 4, "grid_x": 24, "grid_y": 1, "grid_z": 1, "blocks_per_sm": 0.18},
    ]
    return make_rank(gpu, host)


def test_kinds_by_launching_operator() -> None:
    rt = _engine_rank()
    kinds = commkind.comm_kinds(rt.gpu, rt.host).to_list()
    assert kinds == [None, "op", None, "ep"]
    # without the host table only the name counts
    assert commkind.comm_kinds(rt.gpu).to_list() == [None, None, None, "ep"]
    assert commkind.gpu_classes(rt.gpu, rt.host).to_list() == ["comp", "comm", "comp", "comm"]
    assert rt.gpu.select(gpu_class_expr())["gpu_class"].to_list() == ["comp", "comp", "comp", "comm"]


@pytest.mark.parametrize("op,comm", [
    ("vllm::all_reduce", True), ("sgl_kernel::all_gather_into_tensor", True), ("c10d::allreduce_", True),
    ("aten::all_gather_into_tensor", False), ("prim::all_reduce", False), ("inductor::reduce_scatter_tensor", False),
])
def test_launching_operator_rule_is_the_operator_names_rule(op: str, comm: bool) -> None:
    """A kernel with a compute-looking name is communication by its launching operator exactly when
    that operator is a communication operator (torch's own aten/prim/inductor ops never are)."""
    host = [{"cat": "cpu_op", "name": op, "ts": 0.0, "dur": 50.0},
            {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 1.0, "dur": 2.0, "parent": 0, "depth": 1}]
    rt = make_rank([{"name": "void k_impl<float>(float*)", "ts": 10.0, "dur": 5.0, "op_row": 0, "launch_row": 1}], host)
    assert commkind.is_comm_op_name(op) is comm
    assert commkind.comm_kinds(rt.gpu, rt.host).to_list() == (["op"] if comm else [None])


def test_breakdown_counts_non_nccl_communication_as_comm() -> None:
    b = breakdown.rank_breakdown(_engine_rank())
    assert b.compute_us == pytest.approx(50.0)  # GEMM 40 + copy 10
    assert b.comm_us == pytest.approx(40.0)  # custom all-reduce 20 + DeepEP dispatch 20
    assert b.exposed_comm_us == pytest.approx(40.0)


def test_kernel_table_never_judges_communication_by_sm_use() -> None:
    rt = _engine_rank()
    table = {r["name"]: r for r in occupancy.kernel_table(rt, num_sms=132).to_dicts()}
    for name in ("my_allreduce_kernel", "void deep_ep::intranode::dispatch<8, 768, 8192>(int4*)"):
        assert table[name]["comm_kind"] is not None
        assert table[name]["sm_time_lost_us"] is None and table[name]["wave_efficiency_pct"] is None
    gemm = table["sm90_xmma_gemm_bf16"]
    assert gemm["comm_kind"] is None and gemm["sm_time_lost_us"] == pytest.approx(40.0 * (1 - 0.03))


def test_roofline_coverage_leaves_communication_out() -> None:
    rt = _engine_rank()
    import polars as pl

    _modelled, total = roofline._coverage(rt, pl.DataFrame({"row": [0]}))
    assert total == pytest.approx(50.0)  # GEMM + copy; the two communication kernels are not compute


def test_real_traces(shared_traces: Path) -> None:
    """Real traces: every NCCL kernel of the DLRM job is communication and nothing else is; the
    inference engines' single-GPU traces (vLLM, SGLang) have no communication kernel although
    their kernels' names contain reduce/gather/routing."""
    from traceread.engine.jobs import read_rank

    rt = read_rank(next((shared_traces / "param_dlrm_8rank").glob("worker0*.json")), use_cache=False)
    kinds = commkind.comm_kinds(rt.gpu, rt.host)
    got = Counter(k for k in kinds.to_list() if k)
    # the step's 5 all-to-alls and 3 all-reduces (its collective operators; kernel by kernel, from the
    # launching operators of the raw trace, in tests/test_real_diagnosis.py), and nothing else
    assert got == Counter({"nccl": 8})
    for d in ("tracelens_inference_vllm_decode_full", "tracelens_inference_sglang_prefilldecode"):
        rt = read_rank(next((shared_traces / d).glob("*.json.gz")), use_cache=False)
        assert commkind.comm_mask(rt.gpu, rt.host).sum() == 0, d


# ---- name variants nobody typed into the patterns (generated) -------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

#: namespace components that mean something to a rule, kept out of the random ones
_RESERVED = {"ep", "ll", "a2a", "intranode", "internode", "internode_ll", "low_latency", "all_to_all", "alltoall",
             "aten", "prim", "profiler", "inductor", "nccl", "rccl", "hccl", "nvshmem", "msccl", "mscclpp", "symm_mem",
             "multimem", "symmetric_memory"}
IDENT = st.from_regex(r"[a-z][a-z0-9_]{1,9}", fullmatch=True).filter(
    lambda s: s not in _RESERVED and not any(w in s for w in ("nccl", "rccl", "hccl", "shmem", "msccl", "multimem",
                                                              "symm", "reduce", "gather", "scatter", "dispatch",
                                                              "combine", "notify", "all_to", "alltoall", "lamport",
                                                              "quick", "shot")))
TARGS = st.lists(st.one_of(st.integers(1, 8192).map(str), st.sampled_from(["__nv_bfloat16", "float", "true", "c10::Half"])),
                 min_size=0, max_size=4).map(lambda a: f"<{', '.join(a)}>" if a else "")
PARAMS = st.sampled_from(["(int4*, float*, int*, long*)", "(void*, void*, int*)", "()", ""])
SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(st.lists(IDENT, min_size=1, max_size=3), st.sampled_from(["ep", "intranode", "internode", "internode_ll",
                                                                 "low_latency", "a2a"]),
       st.sampled_from(["dispatch", "combine", "notify_dispatch", "notify_combine", "cached_notify",
                        "cached_notify_dispatch", "cached_notify_combine", "ll_dispatch", "low_latency_combine",
                        "dispatch_kernel", "combineKernel", "dispatch_recv", "combine_send"]),
       st.lists(IDENT, max_size=1), TARGS, PARAMS, st.booleans())
def test_ep_token_exchange_in_any_namespace(ns: list[str], transport: str, leaf: str, inner: list[str], targs: str,
                                            params: str, void: bool) -> None:
    """``<ns>::ep::internode::dispatch<...>`` and friends: communication whatever the fork calls its namespace."""
    name = ("void " if void else "") + "::".join([*ns, transport, *inner, leaf]) + targs + params
    assert commkind.comm_kind_of_name(name) == "ep", name
    assert commkind.collective_of_kernel(name) == "alltoall"


@SETTINGS
@given(st.lists(IDENT, min_size=1, max_size=3), st.sampled_from(["moe", "layout", "router", "topk"]),
       st.sampled_from(["combine", "dispatch", "get_dispatch_layout", "moe_sum", "align_block_size"]), TARGS, PARAMS)
def test_moe_compute_is_not_communication(ns: list[str], mid: str, leaf: str, targs: str, params: str) -> None:
    """A MoE *compute* kernel (local weighted sum of expert outputs, token counting, routing) outside a
    transport namespace is compute, whatever its namespace."""
    name = "void " + "::".join([*ns, mid, leaf]) + targs + params
    assert commkind.comm_kind_of_name(name) is None, name


@SETTINGS
@given(st.lists(IDENT, min_size=1, max_size=2), st.sampled_from(["", "fused_", "custom_", "outplace_", "inplace_"]),
       st.sampled_from(["all_reduce", "allreduce", "all_gather", "allgather", "reduce_scatter", "all_to_all",
                        "all_gather_into_tensor", "reduce_scatter_tensor"]),
       st.sampled_from(["", "_rmsnorm", "_residual", "_out", "_"]))
def test_engine_collective_operators_in_any_namespace(ns: list[str], prefix: str, verb: str, suffix: str) -> None:
    """An engine's or in-house collective operator launches communication kernels, whatever its namespace."""
    op = "::".join([*ns, prefix + verb + suffix])
    assert commkind.is_comm_op_name(op), op
    assert not commkind.is_comm_op_name(f"aten::{prefix}{verb}{suffix}")  # torch's compute ops never are


@SETTINGS
@given(st.lists(IDENT, min_size=0, max_size=2), st.sampled_from(["cross_device_reduce_1stage", "cross_device_reduce_2stage",
                                                                 "custom_all_reduce", "quick_reduce", "oneShotAllReduceKernel",
                                                                 "twoShotAllReduceKernel", "allreduce_fusion_kernel_oneshot",
                                                                 "lamport_allreduce"]), TARGS, PARAMS)
def test_engine_custom_allreduce_in_any_namespace(ns: list[str], leaf: str, targs: str, params: str) -> None:
    name = "void " + "::".join([*ns, leaf]) + targs + params
    assert commkind.comm_kind_of_name(name) == "custom_allreduce", name
    assert commkind.collective_of_kernel(name) == "allreduce"


@SETTINGS
@given(st.sampled_from(["ncclDevKernel_Generic_{n}", "ncclDevKernel_AllReduce_Sum_f32_RING_LL{n}", "rcclGenericKernel_{n}",
                        "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t", "mscclKernel_Sum_bf16_LL{n}",
                        "void mscclpp::allreduce{n}<__nv_bfloat16>", "nvshmemi_transfer_rma_kernel_{n}",
                        "void c10d::symmetric_memory::multimem_all_gather_kernel<{n}>",
                        "void c10d::symmetric_memory::two_shot_all_reduce_kernel_inplace<float, {n}>"]),
       st.integers(0, 64))
def test_library_kernels_by_structure(template: str, n: int) -> None:
    assert commkind.is_comm_kernel_name(template.format(n=n))


def test_step_timeline_and_export_use_the_launching_operator() -> None:
    """A kernel launched by an engine's collective operator under a compute-looking name is
    communication in the step timeline (and the export's bubble marks) as in the breakdown."""
    import polars as pl

    from traceread.analysis.time.step_timeline import rank_intervals

    rt = _engine_rank()
    windows = pl.DataFrame({"step": [0], "start": [0.0], "end": [110.0], "duration": [110.0]})
    rows = rank_intervals(rt, windows).filter(pl.col("stream") >= 0)
    kinds = dict(zip(rows["start"].to_list(), rows["kind"].to_list()))
    assert kinds[50.0] == "comm"  # my_allreduce_kernel, launched by _C_custom_ar::all_reduce
    assert kinds[70.0] == "compute"  # the copy inside c10d::allgather_ stays compute
