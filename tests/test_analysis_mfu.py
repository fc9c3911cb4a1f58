"""MFU/HFU: per-step model FLOPs, recompute detection, formula MFU, and the simulator's truth."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import needs
import numpy as np
import polars as pl
import pytest
from rank_factory import make_op_rank

from traceread.analysis.compute.mfu import formula_mfu, model_flops_per_step, recompute_mask, trace_mfu
from traceread.analysis.hardware import DEVICES

H100 = DEVICES["h100-sxm"]
BF = "c10::BFloat16"
WINDOW_SCHEMA = {"step": pl.Int64, "start": pl.Float64, "end": pl.Float64, "duration": pl.Float64}


def mm(ts: float, n: int, **extra: Any) -> dict[str, Any]:
    return {"name": "aten::mm", "ts": ts, "dur": 5.0, "input_dims": [[n, n], [n, n]], "input_types": [BF, BF], **extra}


def test_trace_mfu_two_steps_exact() -> None:
    # step 1: one 8192^3 GEMM; step 2: two. Host step windows decide membership; device windows
    # (starting later than the host step, as device_steps does) give the durations.
    host = [mm(10.0, 8192), mm(1010.0, 8192), mm(1020.0, 8192), mm(5000.0, 8192)]  # last one is outside
    gpu = [{"name": "gemm", "ts": 100.0 + 1000 * i, "dur": 500.0, "op_row": i} for i in range(4)]
    rt = make_op_rank(host, gpu, steps=[(1, 0.0, 1000.0), (2, 1000.0, 2000.0)])
    windows = pl.DataFrame({"step": [1, 2], "start": [50.0, 1100.0], "end": [1100.0, 2600.0],
                            "duration": [1050.0, 1500.0]}, schema=WINDOW_SCHEMA)
    r = trace_mfu(rt, windows, H100)
    f = 2.0 * 8192**3
    assert r.model_flops_per_step == 1.5 * f and r.hardware_flops_per_step == 1.5 * f
    assert r.mfu_pct == pytest.approx(100 * 3 * f / (2550e-6 * 989.4e12), rel=1e-12)
    assert r.steps[0]["mfu_pct"] == pytest.approx(100 * f / (1050e-6 * 989.4e12), rel=1e-12)
    assert r.steps[1]["model_flops"] == 2 * f
    assert r.hfu_pct is None and not r.recompute_detected and r.precision == "bf16" and r.peak_tflops == 989.4


def test_trace_mfu_without_host_steps_uses_windows_and_unknown_device() -> None:
    rt = make_op_rank([mm(10.0, 1024)], [{"name": "gemm", "ts": 20.0, "dur": 30.0, "op_row": 0}])
    windows = pl.DataFrame({"step": [-1], "start": [0.0], "end": [100.0], "duration": [100.0]}, schema=WINDOW_SCHEMA)
    r = trace_mfu(rt, windows, None)
    assert r.model_flops_per_step == 2.0 * 1024**3 and r.mfu_pct is None and "device" in r.note
    r2 = trace_mfu(rt, windows, H100)
    assert r2.mfu_pct == pytest.approx(100 * 2.0 * 1024**3 / (100e-6 * 989.4e12), rel=1e-12)
    empty = trace_mfu(make_op_rank([], []), windows, H100)
    assert empty.mfu_pct is None and "record_shapes" in empty.note


def _ckpt_host(reentrant: bool) -> list[dict[str, Any]]:
    """The host tree the real profiler records for checkpoint(linear) + backward (see ckpt test below)."""
    lin = {"input_dims": [[64, 128], [128, 128]], "input_types": [BF, BF]}
    rows: list[dict[str, Any]] = [
        mm(0.0, 0, **lin, seq_num=None if reentrant else 0, fwd_tid=None if reentrant else 0),  # forward
        {"name": "autograd::engine::evaluate_function: MmBackward0", "ts": 100.0, "dur": 100.0, "seq_num": 0,
         "fwd_tid": 1},
        {"name": "CheckpointFunctionBackward" if reentrant else "MmBackward0", "ts": 101.0, "dur": 98.0,
         "depth": 1, "parent": 1, "seq_num": 0, "fwd_tid": 1},
        mm(102.0, 0, **lin, depth=2, parent=2, seq_num=1, fwd_tid=0),  # the recompute
        {"name": "autograd::engine::evaluate_function: MmBackward0", "ts": 120.0, "dur": 60.0, "depth": 2,
         "parent": 2, "seq_num": 1, "fwd_tid": 1},
        mm(121.0, 0, **lin, depth=3, parent=4),  # real backward GEMM (no sequence number)
    ]
    rows[0]["input_dims"] = rows[3]["input_dims"] = rows[5]["input_dims"] = [[64, 128], [128, 128]]
    return rows


@pytest.mark.parametrize("reentrant", [False, True])
def test_recompute_excluded_from_mfu_included_in_hfu(reentrant: bool) -> None:
    host = _ckpt_host(reentrant)
    if not reentrant:  # non-reentrant: the recompute runs under the MmBackward0 node of the saved tensor
        host[4]["parent"], host[4]["depth"] = 1, 1
        host[5]["depth"] = 2
    rt = make_op_rank(host, [{"name": "gemm", "ts": 1000.0 + 10 * i, "dur": 5.0, "op_row": r}
                             for i, r in enumerate([0, 3, 5])])
    mask = recompute_mask(rt.host)
    # reentrant: the CheckpointFunctionBackward node (no kernels of its own) and the forward it re-runs
    assert np.flatnonzero(mask).tolist() == ([2, 3] if reentrant else [3])
    windows = pl.DataFrame({"step": [-1], "start": [0.0], "end": [2000.0], "duration": [2000.0]}, schema=WINDOW_SCHEMA)
    r = trace_mfu(rt, windows, H100)
    f = 2.0 * 64 * 128 * 128
    assert r.recompute_detected and r.model_flops_per_step == 2 * f and r.hardware_flops_per_step == 3 * f
    assert r.hfu_pct == pytest.approx(1.5 * r.mfu_pct, rel=1e-12)
    assert r.recompute_flops_per_step == f and "recompute" in r.note


CKPT_SCRIPT = """
import sys, torch
from torch.utils.checkpoint import checkpoint
from torch.profiler import profile, ProfilerActivity
lin1, lin2 = torch.nn.Linear(64, 64), torch.nn.Linear(64, 64)
x = torch.randn(8, 64, requires_grad=True)
for reentrant in (False, True):
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as p:
        y = checkpoint(lambda t: lin2(torch.relu(lin1(t))), x, use_reentrant=reentrant)
        y.sum().backward()
    p.export_chrome_trace(sys.argv[1] + f"/ckpt_{int(reentrant)}.json")
"""


@pytest.fixture(scope="module")
def ckpt_traces(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real torch.profiler output (CPU) of checkpoint(Linear-ReLU-Linear) + backward, both flavours."""
    needs.module("torch")
    out = tmp_path_factory.mktemp("ckpt")
    subprocess.run([sys.executable, "-c", CKPT_SCRIPT, str(out)], check=True, capture_output=True, timeout=300)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("reentrant", ["0", "1"])
def test_recompute_mask_on_real_profiler_output(ckpt_traces: Path, reentrant: str) -> None:
    """On real host trees exactly the re-run forward ops are flagged, never the real backward GEMMs."""
    from traceread.engine.jobs import read_rank

    rt = read_rank(ckpt_traces / f"ckpt_{reentrant}.json", use_cache=False)
    h = rt.host.with_columns(pl.Series("rc", recompute_mask(rt.host)))
    gemms = h.filter(pl.col("name") == "aten::addmm")
    assert gemms.height == 4  # 2 forward + 2 recomputed; the backward uses aten::mm
    assert gemms["rc"].to_list() == [False, False, True, True]
    assert h.filter(pl.col("name") == "aten::mm")["rc"].sum() == 0  # real backward work
    assert h.filter(pl.col("name") == "aten::relu")["rc"].to_list() == [False, True]


def test_formula_mfu_hand_numbers() -> None:
    # 7e9 params, 4M tokens/step over 8 H100s, 10 s/step: 6*7e9*4e6 / (10 * 8 * 989.4e12)
    assert formula_mfu(7e9, 4e6, 10.0, H100, n_gpus=8) == pytest.approx(100 * 1.68e17 / (10 * 8 * 989.4e12), rel=1e-12)
    with_attn = formula_mfu(7e9, 4e6, 10.0, H100, n_layers=32, seq_len=4096, d_model=4096, n_gpus=8)
    extra = 12 * 32 * 4096 * 4096 * 4e6
    assert with_attn == pytest.approx(100 * (1.68e17 + extra) / (10 * 8 * 989.4e12), rel=1e-12)
    assert model_flops_per_step(1e9, 1e3) == 6e12
    assert formula_mfu(1e9, 1e3, 1.0, H100, precision="fp8") == pytest.approx(100 * 6e12 / 1978.9e12)
    with pytest.raises(ValueError):
        formula_mfu(1e9, 1e3, 0.0, H100)
    with pytest.raises(ValueError):
        formula_mfu(1e9, 1e3, 1.0, DEVICES["v100-sxm2"], precision="bf16")


def _measured_vs_truth(rt: Any, t: dict[str, Any]) -> None:
    """traceread's trace MFU/HFU of one simulated rank equals the simulator's truth for that rank.

    Both sides count the same ops with the same conventions (GEMMs and flash attention only; causal
    attention as N(N+1)/2 pairs; attention backward 2x forward for MFU, 2.5x for HFU), the simulator
    from the shapes it generated, traceread from the shapes in the trace, so FLOPs are equal as
    integers and the percentages differ only by float rounding of the step durations.
    """
    from traceread.analysis.hardware import device_for_meta
    from traceread.analysis.time.steps import device_steps

    spec = device_for_meta(rt.meta).spec
    windows = device_steps(rt).table
    assert windows["duration"].to_list() == pytest.approx([s["duration_us"] for s in t["steps"]], abs=1e-6)
    r = trace_mfu(rt, windows, spec)
    assert r.precision == "bf16" and not r.recompute_detected
    assert r.model_flops_per_step == t["model_flops_per_step"]
    assert r.hardware_flops_per_step == t["hardware_flops_per_step"]
    assert r.mfu_pct == pytest.approx(t["mfu_pct"], rel=1e-9)
    assert r.hfu_pct == pytest.approx(t["hfu_pct"], rel=1e-9)
    assert [s["step"] for s in r.steps] == [s["step"] for s in t["steps"]]
    for got, want in zip(r.steps, t["steps"]):
        assert got["model_flops"] == want["model_flops"] and got["hardware_flops"] == want["hardware_flops"]
        assert got["mfu_pct"] == pytest.approx(want["mfu_pct"], rel=1e-9)
        assert got["hfu_pct"] == pytest.approx(want["hfu_pct"], rel=1e-9)


def test_simulated_run_mfu_matches_truth(tmp_path: Path) -> None:
    """Model/hardware FLOPs per step, MFU and HFU (whole run and per step) equal the simulator's truth."""
    from traceread.engine.jobs import read_rank
    from traceread.simulate import simulate

    truth = simulate("ddp", tmp_path, ranks=2, steps=3, layers=2, hidden=1024, heads=8, seq_len=512, batch=2)
    for r in ("0", "1"):
        t = truth["ranks"][r]
        assert t["hfu_pct"] > t["mfu_pct"] > 0  # the flash backward's QK^T recompute: HFU only
        _measured_vs_truth(read_rank(tmp_path / f"rank{r}.pt.trace.json.gz", use_cache=False), t)


def test_sample_traces_mfu_matches_truth(samples_dir: Path) -> None:
    """Every rank of every simulated sample (DDP, TP x DP, 1F1B/GPipe pipeline stages, A100)."""
    from traceread.engine.jobs import read_rank

    truths = sorted(samples_dir.glob("*/truth.json"))
    assert truths, "sample_traces/*/truth.json are tracked files: the checkout is incomplete"
    checked = 0
    for path in truths:
        truth = json.loads(path.read_text())
        for f in sorted(path.parent.glob("rank*.pt.trace.json.gz")):
            rt = read_rank(f, use_cache=False)
            _measured_vs_truth(rt, truth["ranks"][str(rt.rank)])
            checked += 1
    assert checked >= 30
