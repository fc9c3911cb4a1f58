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
    names = rt.gpu["name"].to_list()
    got = Counter(k for k in kinds.to_list() if k)
    assert got == Counter({"nccl": sum(1 for n in names if "nccl" in n.lower())})
    assert got["nccl"] == 8
    for d in ("tracelens_inference_vllm_decode_full", "tracelens_inference_sglang_prefilldecode"):
        rt = read_rank(next((shared_traces / d).glob("*.json.gz")), use_cache=False)
        assert commkind.comm_mask(rt.gpu, rt.host).sum() == 0, d
