"""SM efficiency / occupancy (traceread.analysis.compute.occupancy) against the TensorBoard plugin's own test
expectations and against a slice-by-slice brute force of the plugin's algorithm."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rank_factory import make_rank

from traceread.analysis.compute.occupancy import kernel_table, sm_metrics
from traceread.analysis.time.steps import device_steps
from traceread.model import RankMeta, RankTrace


def rt_launch(ts: float, dur: float) -> dict[str, Any]:
    return {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": dur}


NLL = "void cunn_ClassNLLCriterion_updateGradInput_kernel<float>"
GEMM = "void gemmSN_TN_kernel_64addr"


def tb_plugin_gpu_utilization_case() -> RankTrace:
    """The events of kineto tb_plugin ``test_profiler.py::test_gpu_utilization`` (device 1)."""
    host = [
        {"cat": "cpu_op", "name": "aten::mat_mul", "ts": 100.0, "dur": 100.0},
        {"cat": "cpu_op", "name": "aten::mm", "ts": 120.0, "dur": 70.0},
        rt_launch(120, 0), rt_launch(120, 0), rt_launch(125, 3), rt_launch(195, 1),
    ]
    k = [
        (NLL, 7, 130, 10, 0.5, 0.6, 2),
        (GEMM, 8, 135, 15, 0.6, 0.1, 3),
        (GEMM, 8, 150, 0, 0.3, 0.2, 3),
        (NLL, 7, 145, 25, 0.3, 1.0, 4),
        (NLL, 7, 200, 20, 10.5, 0.3, 5),
    ]
    gpu = [
        {"name": n, "stream": s, "ts": float(t), "dur": float(d), "blocks_per_sm": b, "occupancy_pct": o,
         "launch_row": r, "device": 1}
        for n, s, t, d, b, o, r in k
    ]
    rt = make_rank(gpu, host)
    rt.meta.device_id = 1
    return rt


def test_tb_plugin_expected_values() -> None:
    """Numbers asserted by the plugin's own unit test (no ProfilerStep: window = 100..220)."""
    m = sm_metrics(tb_plugin_gpu_utilization_case())
    assert m.window_us == 120.0
    assert m.gpu_util_pct == pytest.approx((40 + 20) / 120 * 100)
    expect_sm = (0.5 * 5 + 1.0 * 5 + 0.6 * 5 + 0.9 * 5 + 0.3 * 20 + 1.0 * 20) / 120
    assert m.sm_efficiency_pct == pytest.approx(expect_sm * 100)
    assert m.achieved_occupancy_pct == pytest.approx((0.6 * 10 + 0.1 * 15 + 1.0 * 25 + 0.3 * 20) / 70)
    assert m.blocks_per_sm_source == "trace"
    # Busy-normalised SM efficiency: the same integral over kernel busy time (60 µs).
    assert m.sm_efficiency_busy_pct == pytest.approx(expect_sm * 120 / 60 * 100)


def test_tb_plugin_kernel_table_values() -> None:
    t = {r["name"]: r for r in kernel_table(tb_plugin_gpu_utilization_case()).iter_rows(named=True)}
    # Plugin's kernel_stat: the zero-duration call carries no weight.
    assert t[GEMM]["blocks_per_sm"] == pytest.approx(0.6)
    assert t[GEMM]["occupancy_pct"] == pytest.approx(0.1)
    assert t[NLL]["blocks_per_sm"] == pytest.approx((0.5 * 10 + 0.3 * 25 + 10.5 * 20) / 55)
    assert t[NLL]["occupancy_pct"] == pytest.approx((0.6 * 10 + 1.0 * 25 + 0.3 * 20) / 55)
    assert t[NLL]["calls"] == 3 and t[NLL]["total_us"] == 55.0
    assert t[NLL]["sm_time_lost_us"] == pytest.approx(10 * 0.5 + 25 * 0.7 + 0)
    assert t[GEMM]["sm_time_lost_us"] == pytest.approx(15 * 0.4)
    # Sorted by SM time lost.
    assert list(t) == [NLL, GEMM]


def test_tb_plugin_kernels_outside_the_step() -> None:
    """Plugin's ``test_gpu_utilization_kernel_out_of_step``: util 0, SM eff. and occupancy None."""
    host = [
        {"cat": "cpu_op", "name": "aten::mat_mul", "ts": 10.0, "dur": 10.0},
        {"cat": "cpu_op", "name": "aten::mm", "ts": 120.0, "dur": 70.0},
        {"cat": "cpu_op", "name": "aten::mm", "ts": 220.0, "dur": 20.0},
        rt_launch(15, 5), rt_launch(230, 10),
    ]
    gpu = [
        {"name": NLL, "ts": 60.0, "dur": 20.0, "blocks_per_sm": 0.5, "occupancy_pct": 0.6, "launch_row": 3},
        {"name": NLL, "ts": 240.0, "dur": 25.0, "blocks_per_sm": 10.5, "occupancy_pct": 0.3, "launch_row": 4},
    ]
    m = sm_metrics(make_rank(gpu, host, [(2, 100.0, 200.0)]))
    assert m.window_us == 100.0
    assert m.gpu_util_pct == 0.0
    assert m.sm_efficiency_pct is None and m.achieved_occupancy_pct is None


def brute_sm_efficiency(kernels: list[tuple[int, int, float]], lo: int, hi: int) -> float:
    """The plugin's definition, slot by slot: Σ blocks/SM of running kernels, clipped to 1."""
    total = 0.0
    for t in range(lo, hi):
        total += min(sum(v for s, d, v in kernels if s <= t < s + d and v > 0), 1.0)
    return total / (hi - lo) * 100


@settings(max_examples=120, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 50), st.integers(0, 12), st.sampled_from([0.05, 0.25, 0.5, 0.7, 1.5, 0.0])),
             min_size=1, max_size=20),
    st.integers(-3, 30),
    st.integers(1, 60),
)
def test_sm_efficiency_matches_slice_brute_force(kernels: list[tuple[int, int, float]], lo: int, width: int) -> None:
    rt = make_rank([{"name": "k", "ts": float(s), "dur": float(d), "blocks_per_sm": v, "stream": i % 3}
                    for i, (s, d, v) in enumerate(kernels)])
    m = sm_metrics(rt, (float(lo), float(lo + width)))
    if any(v > 0 and d > 0 and s < lo + width and s + d > lo for s, d, v in kernels):
        assert m.sm_efficiency_pct == pytest.approx(brute_sm_efficiency(kernels, lo, lo + width), abs=1e-9)
    else:
        assert m.sm_efficiency_pct is None


def test_rocm_blocks_per_sm_from_grid() -> None:
    # MI300X-like: 304 CUs, no Kineto blocks/SM. Grid in work-items (divisible by block) and in
    # blocks (Triton-style grid smaller than the block).
    gpu = [
        {"name": "Cijk_gemm", "ts": 0.0, "dur": 10.0, "grid_x": 350208, "grid_y": 1, "grid_z": 1,
         "block_x": 256, "block_y": 1, "block_z": 1},
        {"name": "attn_fwd", "ts": 20.0, "dur": 10.0, "grid_x": 64, "grid_y": 16, "grid_z": 8,
         "block_x": 128, "block_y": 1, "block_z": 1},
    ]
    rt = make_rank(gpu, meta=RankMeta(rank=0, device_id=0, num_sms=304))
    table = {r["name"]: r for r in kernel_table(rt).iter_rows(named=True)}
    assert table["Cijk_gemm"]["blocks_per_sm"] == pytest.approx(350208 / 256 / 304)  # 1368 blocks
    assert table["attn_fwd"]["blocks_per_sm"] == pytest.approx(64 * 16 * 8 / 304)
    # 1368 blocks on 304 CUs = 5 waves, the last 152/304 full: 1368 / 1520.
    assert table["Cijk_gemm"]["wave_efficiency_pct"] == pytest.approx(1368 / 1520 * 100)
    assert table["attn_fwd"]["occupancy_pct"] is None
    m = sm_metrics(rt, (0.0, 30.0))
    assert m.blocks_per_sm_source == "grid"
    assert m.sm_efficiency_pct == pytest.approx((10 * 1.0 + 10 * 1.0) / 30 * 100)
    assert m.achieved_occupancy_pct is None
    # Without a CU count nothing is invented.
    assert sm_metrics(make_rank(gpu), (0.0, 30.0)).sm_efficiency_pct is None


def test_wave_efficiency_and_inferred_sm_count() -> None:
    # 133 blocks on 132 SMs: 2 waves, 133/264. No num_sms in meta: inferred from Kineto's blocks/SM.
    gpu = [{"name": "tail", "ts": 0.0, "dur": 4.0, "grid_x": 133, "grid_y": 1, "grid_z": 1,
            "blocks_per_sm": 133 / 132, "occupancy_pct": 25.0},
           {"name": "small", "ts": 10.0, "dur": 6.0, "grid_x": 33, "grid_y": 1, "grid_z": 1,
            "blocks_per_sm": 33 / 132, "occupancy_pct": 12.0}]
    t = {r["name"]: r for r in kernel_table(make_rank(gpu)).iter_rows(named=True)}
    assert t["tail"]["wave_efficiency_pct"] == pytest.approx(133 / 264 * 100)
    assert t["small"]["wave_efficiency_pct"] == pytest.approx(25.0)
    assert t["small"]["sm_time_lost_us"] == pytest.approx(6.0 * 0.75)
    assert t["tail"]["sm_time_lost_us"] == 0.0
    assert math.isclose(t["tail"]["mean_us"], 4.0)


def test_no_kernels() -> None:
    rt = make_rank([{"kind": "memcpy", "name": "Memcpy HtoD", "ts": 0.0, "dur": 5.0}])
    assert sm_metrics(rt).sm_efficiency_pct is None
    assert kernel_table(rt).height == 0


def test_tb_plugin_sample_trace_matches_brute_force(shared_traces: Path) -> None:
    """The plugin's test input trace (real V100 kernels, legacy categories), read by traceread."""
    from traceread.engine import jobs as reader
    rt = reader.read_rank(shared_traces / "kineto_tb_test" / "gpu_metrics_input.json", use_cache=False)
    k = rt.gpu.filter(pl.col("kind") == "kernel")
    assert k.height == 30
    m = sm_metrics(rt)
    lo, hi = device_steps(rt).span  # type: ignore[misc]
    assert m.window_us == hi - lo == 13410.0  # ProfilerStep#2; its kernels end inside it
    # Independent re-computation on a 1-µs grid (Kineto's integer µs): slot-by-slot sums.
    ts = k["ts"].to_numpy()
    dur = k["dur"].to_numpy()
    bps = k["blocks_per_sm"].fill_null(0).to_numpy()
    occ = k["occupancy_pct"].to_numpy()
    grid = np.arange(int(lo), int(hi))
    running = (ts[None, :] <= grid[:, None]) & (grid[:, None] < (ts + dur)[None, :])
    util = running.any(axis=1).sum() / (hi - lo) * 100
    sm = np.minimum((running * np.where(bps > 0, bps, 0)[None, :]).sum(axis=1), 1.0).sum() / (hi - lo) * 100
    assert m.gpu_util_pct == pytest.approx(util, rel=1e-12)
    assert m.sm_efficiency_pct == pytest.approx(sm, rel=1e-12)
    if np.isfinite(occ.astype(float)).any():
        w = np.clip(np.minimum(ts + dur, hi) - np.maximum(ts, lo), 0, None)
        ok = np.isfinite(occ.astype(float))
        assert m.achieved_occupancy_pct == pytest.approx(float((occ[ok] * w[ok]).sum() / w[ok].sum()))
    else:
        assert m.achieved_occupancy_pct is None
