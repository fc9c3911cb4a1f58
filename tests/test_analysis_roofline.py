"""Per-operator roofline: kernel attribution, union time, ceilings, and real traces."""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from rank_factory import make_op_rank

from traceread.analysis.compute.roofline import MAX_REPORT_OPS, operator_table, roofline_summary
from traceread.analysis.hardware import DEVICES, device_for_meta

H100 = DEVICES["h100-sxm"]
BF = "c10::BFloat16"


def mm_host(ts: float, m: int, k: int, n: int, **extra: Any) -> dict[str, Any]:
    return {"name": "aten::mm", "ts": ts, "dur": 10.0, "input_dims": [[m, k], [k, n]], "input_types": [BF, BF], **extra}


def test_union_time_and_roofline_numbers_exact() -> None:
    # one bf16 GEMM whose two kernels overlap on two streams: busy = [0, 150) -> 150 us
    rt = make_op_rank([mm_host(0.0, 4096, 4096, 4096)],
                      [{"name": "sm90_gemm_a", "ts": 100.0, "dur": 100.0, "op_row": 0},
                       {"name": "sm90_gemm_b", "ts": 150.0, "dur": 100.0, "op_row": 0, "stream": 8}])
    ops = operator_table(rt, H100)
    assert ops.height == 1
    r = ops.row(0, named=True)
    flops = 2 * 4096**3
    nbytes = 3 * 4096 * 4096 * 2
    assert r["kernel_time_us"] == 150.0 and r["kernels"] == 2
    assert r["flops"] == flops and r["bytes"] == nbytes
    assert r["achieved_tflops"] == pytest.approx(flops / 150e-6 / 1e12, rel=1e-12)
    assert r["achieved_gbps"] == pytest.approx(nbytes / 150e-6 / 1e9, rel=1e-12)
    assert r["intensity"] == pytest.approx(4096 / 3, rel=1e-12)
    assert r["bound"] == "compute"  # 1365 FLOP/B > ridge 989.4e12/3.35e12 = 295
    assert r["pct_of_roof"] == pytest.approx(100 * (flops / 989.4e12) / 150e-6, rel=1e-12)
    assert r["ceiling"] == "bf16 dense tensor core 989.4 TFLOP/s" and r["precision"] == "bf16"


def test_memory_bound_op_and_zero_flop_copy() -> None:
    host = [
        {"name": "aten::add", "ts": 0.0, "dur": 5.0, "input_dims": [[1 << 20], [1 << 20], []],
         "input_types": [BF, BF, "Scalar"]},
        {"name": "aten::copy_", "ts": 10.0, "dur": 5.0, "input_dims": [[1 << 20], [1 << 20], []],
         "input_types": [BF, BF, "Scalar"]},
    ]
    rt = make_op_rank(host, [{"name": "elementwise", "ts": 20.0, "dur": 4.0, "op_row": 0},
                             {"name": "copy", "ts": 30.0, "dur": 2.0, "op_row": 1}])
    ops = operator_table(rt, H100).sort("row")
    add, cp = ops.row(0, named=True), ops.row(1, named=True)
    n = 1 << 20
    assert add["bound"] == "memory" and add["bytes"] == 3 * n * 2
    # attainable = intensity * bandwidth; pct = achieved / attainable
    attainable = add["intensity"] * 3350e9
    assert add["pct_of_roof"] == pytest.approx(100 * (add["flops"] / 4e-6) / attainable, rel=1e-12)
    assert add["ceiling"].startswith("fp32 vector (CUDA cores) 66.9")
    assert add["precision"] == "bf16"
    assert cp["flops"] == 0 and cp["bound"] == "memory"
    assert cp["pct_of_roof"] == pytest.approx(100 * (2 * n * 2 / 3350e9) / 2e-6, rel=1e-12)


def test_kernel_goes_to_nearest_modelled_ancestor_once() -> None:
    # aten::linear -> aten::addmm (kernel) ; aten::embedding -> aten::index_select (kernel, no formula)
    host = [
        {"name": "aten::linear", "ts": 0.0, "dur": 50.0, "input_dims": [[64, 128], [256, 128], [256]],
         "input_types": [BF, BF, BF]},
        {"name": "aten::addmm", "ts": 1.0, "dur": 40.0, "depth": 1, "parent": 0,
         "input_dims": [[256], [64, 128], [128, 256], [], []], "input_types": [BF, BF, BF, "Scalar", "Scalar"]},
        {"name": "aten::embedding", "ts": 60.0, "dur": 30.0, "input_dims": [[1000, 64], [8, 16]],
         "input_types": [BF, "long int"]},
        {"name": "aten::index_select", "ts": 61.0, "dur": 20.0, "depth": 1, "parent": 2,
         "input_dims": [[1000, 64], [], [128]], "input_types": [BF, "Scalar", "long int"]},
        {"name": "nccl:all_reduce", "ts": 100.0, "dur": 5.0, "input_dims": [[10]], "input_types": [BF]},
        {"name": "aten::add_", "ts": 110.0, "dur": 5.0, "input_dims": [[10], [10]], "input_types": [BF, BF]},
    ]
    gpu = [
        {"name": "gemm", "ts": 200.0, "dur": 10.0, "op_row": 1},
        {"name": "indexSelectLargeIndex", "ts": 220.0, "dur": 3.0, "op_row": 3},
        {"name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "ts": 230.0, "dur": 50.0, "op_row": 4},
        {"kind": "memcpy", "name": "Memcpy DtoD", "ts": 290.0, "dur": 5.0, "op_row": 5},
        {"name": "no_op_kernel", "ts": 300.0, "dur": 1.0, "op_row": None},
    ]
    ops = operator_table(make_op_rank(host, gpu), H100).sort("row")
    assert ops["name"].to_list() == ["aten::addmm", "aten::embedding"]
    assert ops["kernel_time_us"].to_list() == [10.0, 3.0]
    assert ops["flops"][0] == 2 * 64 * 256 * 128


def test_tf32_kernel_names_and_precision_fallback() -> None:
    host = [{"name": "aten::mm", "ts": 0.0, "dur": 1.0, "input_dims": [[256, 256], [256, 256]],
             "input_types": ["float", "float"]}]
    rt = make_op_rank(host, [{"name": "sm80_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x16", "ts": 5.0,
                              "dur": 8.0, "op_row": 0}])
    a100 = DEVICES["a100-sxm-80gb"]
    r = operator_table(rt, a100).row(0, named=True)
    assert r["precision"] == "tf32" and r["peak_tflops"] == 156.0
    plain = make_op_rank(host, [{"name": "ampere_sgemm_128x64_nn", "ts": 5.0, "dur": 8.0, "op_row": 0}])
    assert operator_table(plain, a100).row(0, named=True)["precision"] == "fp32"
    # bf16 GEMM on a V100: no bf16 tensor cores -> FP32 ceiling, said so
    bf = make_op_rank([mm_host(0.0, 256, 256, 256)], [{"name": "volta_gemm", "ts": 5.0, "dur": 8.0, "op_row": 0}])
    v = operator_table(bf, DEVICES["v100-sxm2"]).row(0, named=True)
    assert v["peak_tflops"] == 15.7 and "no bf16 units" in v["ceiling"]


def test_unknown_device_keeps_achieved_rates() -> None:
    rt = make_op_rank([mm_host(0.0, 512, 512, 512)], [{"name": "gemm", "ts": 5.0, "dur": 10.0, "op_row": 0}])
    r = operator_table(rt, None).row(0, named=True)
    assert r["achieved_tflops"] == pytest.approx(2 * 512**3 / 10e-6 / 1e12)
    assert r["bound"] is None and r["pct_of_roof"] is None and r["ceiling"] is None
    s = roofline_summary(rt, None)
    assert s["device"] is None and s["peak_tflops"] is None and "device" in s["note"]


def test_summary_aggregates_and_bounds() -> None:
    host, gpu = [], []
    for i in range(MAX_REPORT_OPS + 20):  # more distinct shapes than the report keeps
        host.append(mm_host(float(i * 10), 64 + i, 64, 64))
        gpu.append({"name": "gemm", "ts": 10_000.0 + i * 10, "dur": 1.0 + i, "op_row": i})
    host.append(mm_host(5000.0, 64, 64, 64))  # a second call of the first shape
    gpu.append({"name": "gemm", "ts": 20_000.0, "dur": 3.0, "op_row": len(host) - 1})
    s = roofline_summary(make_op_rank(host, gpu), H100)
    assert len(s["ops"]) == MAX_REPORT_OPS
    assert s["ops"][0]["kernel_time_us"] == 1.0 + MAX_REPORT_OPS + 19  # sorted by time
    fam = s["families"]
    assert [f["family"] for f in fam] == ["gemm"] and fam[0]["calls"] == MAX_REPORT_OPS + 21
    total_t = sum(1.0 + i for i in range(MAX_REPORT_OPS + 20)) + 3.0
    assert fam[0]["kernel_time_us"] == pytest.approx(total_t)
    roof_us = sum(r["pct_of_roof"] * r["kernel_time_us"] / 100 for r in operator_table(make_op_rank(host, gpu), H100)
                  .iter_rows(named=True))
    assert fam[0]["pct_of_roof"] == pytest.approx(100 * roof_us / total_t, rel=1e-12)
    # the smallest shape falls out of the top-N even with its 2 calls (1 + 3 us)
    assert not any(o["shapes"] == "[64, 64], [64, 64]" for o in s["ops"])
    assert s["precision"] == "bf16" and s["peak_tflops"] == 989.4 and s["peak_gbps"] == 3350.0
    assert s["ridge_flop_per_byte"] == pytest.approx(989.4e12 / 3350e9)
    assert s["coverage_pct"] == 100.0
    json.dumps(s)  # JSON-ready


# ---------------------------------------------------------------- real traces


def _finite_rows(ops: pl.DataFrame) -> None:
    for r in ops.iter_rows(named=True):
        for col in ("flops", "bytes", "kernel_time_us", "achieved_tflops", "achieved_gbps", "pct_of_roof"):
            assert r[col] is not None and math.isfinite(r[col]) and r[col] >= 0, (col, r)
        assert r["intensity"] is None or math.isfinite(r["intensity"])
        assert r["bound"] in ("compute", "memory")


@pytest.mark.slow
def test_mi300_bert_against_raw_events(shared_traces: Path) -> None:
    from traceread.engine.jobs import read_rank

    path = shared_traces / "tracelens_mi300" / "gaunernst_bert-small-uncased__1016001.json.gz"
    rt = read_rank(path, use_cache=False)
    match = device_for_meta(rt.meta)
    assert match.spec is DEVICES["mi300x"]
    ops = operator_table(rt, match.spec)
    _finite_rows(ops)
    assert set(ops["family"].to_list()) >= {"gemm", "attention", "norm", "elementwise", "embedding"}
    # independent check from the raw events: every aten::addmm's kernel time = its kernels' dur
    # (linked by External id), and its FLOPs = 2*M*N*K from its own Input Dims
    events = json.load(gzip.open(path, "rt"))["traceEvents"]
    kernels: dict[int, float] = {}
    for e in events:
        if e.get("cat") == "kernel":
            xid = e["args"].get("External id")
            kernels[xid] = kernels.get(xid, 0.0) + e["dur"]
    raw = [(e["ts"], e["args"]) for e in events if e.get("cat") == "cpu_op" and e["name"] == "aten::addmm"]
    table = ops.filter(pl.col("name") == "aten::addmm").sort("ts")
    assert table.height == len(raw) == 26
    for (_ts, args), r in zip(sorted(raw, key=lambda x: x[0]), table.iter_rows(named=True)):
        (m, k), (_, n) = args["Input Dims"][1], args["Input Dims"][2]
        assert r["flops"] == 2 * m * n * k
        assert r["kernel_time_us"] == pytest.approx(kernels[args["External id"]], abs=1e-9)
    s = roofline_summary(rt, match.spec, device_reason=match.reason, ops=ops)
    assert s["device"] == "MI300X" and s["precision"] == "bf16" and s["peak_tflops"] == 1307.4
    assert s["coverage_pct"] == pytest.approx(100.0)


@pytest.mark.slow
def test_mi300_traces_and_hta_amd_finite(shared_traces: Path) -> None:
    from traceread.engine.jobs import read_rank

    paths = sorted((shared_traces / "tracelens_mi300").glob("*.json.gz"))[:3] + [
        shared_traces / "hta_amd_trace" / "mi250_minitoy_train_ROCm6_2_kineto.json.gz",
        shared_traces / "param_dlrm_8rank" / "worker0_step_12.1694128201545.pt.trace.json",  # V100, fp32
        shared_traces / "tracelens_mi300_ddp_resnet18_no_pool" / "train_resnet18.json.gz",
    ]
    for path in paths:
        rt = read_rank(path, use_cache=False)
        spec = device_for_meta(rt.meta).spec
        assert spec is not None, path
        ops = operator_table(rt, spec)
        assert ops.height > 0, path
        _finite_rows(ops)
        s = roofline_summary(rt, spec, ops=ops)
        assert 0 < s["coverage_pct"] <= 100.0 + 1e-9
        json.dumps(s)
    # the resnet18 DDP trace: convolutions (MIOpen) and their backward are modelled
    fams = set(ops["name"].to_list())
    assert {"aten::miopen_convolution", "aten::convolution_backward"} & fams


@pytest.mark.slow
def test_linear_kineto_without_shapes(shared_traces: Path) -> None:
    from traceread.engine.jobs import read_rank

    rt = read_rank(shared_traces / "param_et_replay" / "linear_kineto.json.gz", use_cache=False)
    match = device_for_meta(rt.meta)
    assert match.spec is DEVICES["rtx-2080-ti"]
    assert operator_table(rt, match.spec).height == 0  # recorded without record_shapes
    s = roofline_summary(rt, match.spec)
    assert s["ops"] == [] and "record_shapes" in s["note"] and s["gpu_compute_time_us"] > 0


def test_simulated_run_matches_truth(tmp_path: Path) -> None:
    """Every op of the simulator's truth (rank 0) has exactly its FLOPs, model FLOPs, bytes, call
    count and kernel time in traceread's operator table. The simulator computes them itself, with
    traceread's conventions (causal attention = N(N+1)/2 pairs, flash backward 2.5x forward as
    hardware and 2x as model FLOPs, 1 FLOP per element of add/gelu/gelu_backward, layer norm 5 + 1
    per affine tensor per element and 2x in backward, fp32 statistics in the bytes), from the
    shapes it generated."""
    from traceread.analysis.compute.flops import attention_causal_flag
    from traceread.engine.jobs import read_rank
    from traceread.simulate import simulate

    truth = simulate("ddp", tmp_path, ranks=2, steps=2, layers=2, hidden=1024, heads=8, seq_len=512, batch=2)
    rt = read_rank(tmp_path / "rank0.pt.trace.json.gz", use_cache=False)
    spec = device_for_meta(rt.meta).spec
    assert spec is DEVICES["h100-sxm"]
    ops = operator_table(rt, spec)
    _finite_rows(ops)
    # _fused_adamw_ records TensorList inputs without shapes and traceread has no optimizer formula:
    # its 12 FLOPs / 16 bytes per parameter exist only in the truth.
    modelled = [t for t in truth["ops"] if t["name"] != "aten::_fused_adamw_"]
    assert len(modelled) == len(truth["ops"]) - 1
    for t in modelled:
        shapes = ", ".join("[" + ", ".join(map(str, d)) + "]" for d in t["input_dims"])
        rows = ops.filter((pl.col("name") == t["name"]) & (pl.col("shapes") == shapes))
        assert rows.height == t["calls"], t
        assert rows["flops"].unique().to_list() == [t["flops"]], t
        assert rows["model_flops"].unique().to_list() == [t["model_flops"]], t
        assert rows["bytes"].unique().to_list() == [t["bytes"]], t
        assert rows["kernel_time_us"].mean() == pytest.approx(t["time_us"], abs=1e-6)
        assert (rows["unit"] == "matrix").all() == t["matmul"]
    # nothing else launched GPU work under a modelled op
    assert ops.height == sum(t["calls"] for t in modelled)
    # the flash backward records its own is_causal, as torch 2.x does: no forward lookup needed
    bwd = rt.host.filter(pl.col("name") == "aten::_scaled_dot_product_flash_attention_backward")
    assert bwd.height > 0
    assert all(attention_causal_flag(n, c) is True for n, c in zip(bwd["name"], bwd["concrete_inputs"]))
    (fa,) = [t for t in modelled if t["name"] == "aten::_scaled_dot_product_flash_attention_backward"]
    b, h, n, d = fa["input_dims"][0]
    pairs = n * (n + 1) // 2
    assert (fa["flops"], fa["model_flops"]) == (10 * b * h * pairs * d, 8 * b * h * pairs * d)


def test_attention_backward_takes_causal_flag_from_forward() -> None:
    """A backward call without Concrete Inputs inherits is_causal from the forward op of the same
    autograd Sequence number (through its backward node)."""
    q = [1, 4, 256, 64]
    fwd = {"name": "aten::_scaled_dot_product_flash_attention", "ts": 0.0, "dur": 10.0, "seq_num": 7, "fwd_tid": 0,
           "input_dims": [q, q, q, [], [], [], []], "input_types": [BF, BF, BF, "Scalar", "Scalar", "Scalar", "Scalar"],
           "concrete_inputs": ["", "", "", "0.", "True", "False", ""]}
    node = {"name": "ScaledDotProductFlashAttentionBackward0", "ts": 100.0, "dur": 50.0, "seq_num": 7, "fwd_tid": 1}
    bwd = {"name": "aten::_scaled_dot_product_flash_attention_backward", "ts": 101.0, "dur": 40.0, "depth": 1,
           "parent": 1, "input_dims": [q, q, q, q, q, [1, 4, 256]], "input_types": [BF] * 5 + ["float"]}
    rt = make_op_rank([fwd, node, bwd], [{"name": "flash_fwd", "ts": 200.0, "dur": 10.0, "op_row": 0},
                                         {"name": "flash_bwd", "ts": 220.0, "dur": 25.0, "op_row": 2}])
    ops = operator_table(rt, H100).sort("row")
    pairs = 256 * 257 // 2
    assert ops["flops"].to_list() == [4 * 4 * pairs * 64, 10 * 4 * pairs * 64]
    assert ops["model_flops"][1] == 8 * 4 * pairs * 64
