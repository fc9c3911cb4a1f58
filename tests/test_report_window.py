"""The JSON report's per-rank fields use the whole-trace GPU window (first GPU event start .. last GPU
event end, as HTA and TraceLens), checked against the simulator's exact truth on every sample, and
per-step views come from the step entries."""

from __future__ import annotations

import json
from pathlib import Path
from statistics import fmean

import pytest

from traceread.assemble.queries import host_bound_per_step, per_step, step_us
from traceread.assemble.report import ReportOptions, build_report
from traceread.render import json_report

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"
TRUTH_DIRS = sorted(p for p in SAMPLES.iterdir() if (p / "truth.json").is_file()) if SAMPLES.is_dir() else []
ALL_DIRS = sorted(p for p in SAMPLES.iterdir() if p.is_dir()) if SAMPLES.is_dir() else []
TRUTH_FIELDS = ("window_us", "compute_us", "comm_us", "exposed_comm_us", "memcpy_us", "exposed_memcpy_us",
                "idle_us", "gpu_busy_us", "comm_overlap_pct", "sm_efficiency_pct", "achieved_occupancy_pct")


def _json_report(folder: Path, **kw: object) -> dict:
    doc = build_report([folder], ReportOptions(workers=1, **kw))  # type: ignore[arg-type]
    return json.loads(json_report.to_json(doc))


def _identity(r: dict) -> None:
    parts = r["compute_us"] + r["exposed_comm_us"] + r["exposed_memcpy_us"] + r["idle_us"]
    assert parts == pytest.approx(r["window_us"], rel=1e-6), r["rank"]


@pytest.mark.parametrize("folder", TRUTH_DIRS, ids=[p.name for p in TRUTH_DIRS])
def test_rank_fields_equal_whole_trace_truth(folder: Path) -> None:
    truth = json.loads((folder / "truth.json").read_text())
    doc = _json_report(folder)
    assert len(doc["ranks"]) == truth["world_size"]
    for r in doc["ranks"]:
        t = truth["ranks"][str(r["rank"])]
        for key in TRUTH_FIELDS:
            assert r[key] == pytest.approx(t[key], rel=1e-6), (r["rank"], key)
        assert r["gpu_util_pct"] == pytest.approx(100.0 * t["gpu_busy_us"] / t["window_us"], rel=1e-6)
        # idle split on the same window
        ib = r["idle_breakdown"]
        assert ib["host_bound_us"] + ib["kernel_gap_us"] + ib["other_us"] == pytest.approx(r["idle_us"], rel=1e-6)
        # the steps keep their own breakdown: equal to the truth's per-step numbers
        assert [s["step"] for s in r["steps"]] == [s["step"] for s in t["steps"]]
        for s, ts in zip(r["steps"], t["steps"]):
            for key in ("duration_us", "compute_us", "comm_us", "exposed_comm_us", "idle_us"):
                assert s[key] == pytest.approx(ts[key], rel=1e-6, abs=1e-6), (r["rank"], s["step"], key)
        # per-step views are means over the steps, not whole-trace totals ÷ steps
        assert step_us(r) == pytest.approx(fmean(ts["duration_us"] for ts in t["steps"]), rel=1e-9)
        assert per_step(r, "idle_us") == pytest.approx(fmean(ts["idle_us"] for ts in t["steps"]), rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("folder", ALL_DIRS, ids=[p.name for p in ALL_DIRS])
def test_breakdown_identity_on_every_sample(folder: Path) -> None:
    doc = _json_report(folder)
    assert doc["ranks"]
    for r in doc["ranks"]:
        if r["cpu"] is not None:  # CPU-only rank: GPU fields null, window = its host step windows
            assert r["compute_us"] is None and r["idle_us"] is None
            if r["steps"]:
                assert r["window_us"] == pytest.approx(sum(s["duration_us"] for s in r["steps"]))
            continue
        _identity(r)


def test_dlrm_whole_trace_window(shared_traces: Path) -> None:
    """Real 8-rank V100 job: window = first GPU start .. last GPU end, identity exact, and the
    per-step host-bound idle equals the idle analysis on each step window."""
    from traceread.analysis.time import idle
    from traceread.analysis.time.breakdown import device_gpu_rows
    from traceread.engine.jobs import read_rank

    doc = _json_report(shared_traces / "param_dlrm_8rank")
    assert [r["rank"] for r in doc["ranks"]] == list(range(8))
    for r in doc["ranks"]:
        _identity(r)
        rt = read_rank(r["file"])
        gpu = device_gpu_rows(rt)
        assert r["window_us"] == pytest.approx(float(gpu["end"].max()) - float(gpu["ts"].min()), rel=1e-9)
        assert r["gpu_util_pct"] == pytest.approx(100.0 * r["gpu_busy_us"] / r["window_us"], rel=1e-9)
        if r["rank"] == 0:
            for s in r["steps"]:
                win = (s["start_us"], s["start_us"] + s["duration_us"])
                ib = idle.idle_breakdown(rt, win)
                assert s["host_bound_us"] == pytest.approx(ib["host_bound_us"], abs=1e-6)
            assert host_bound_per_step(r) == pytest.approx(fmean(s["host_bound_us"] for s in r["steps"]))


def test_formula_mfu_uses_the_median_step() -> None:
    folder = SAMPLES / "slow_steps_a100"  # one slow step: mean and median step differ
    from statistics import median

    from traceread.analysis.hardware import lookup_device

    n, d = 1e8, 16384.0
    doc = _json_report(folder, params=n, tokens_per_step=d)
    world = len(doc["ranks"])
    for r in doc["ranks"]:
        durs = [s["duration_us"] for s in r["steps"]]
        assert median(durs) < fmean(durs)
        peak = lookup_device(r["device"], r["num_sms"], None).spec.peak("bf16")  # type: ignore[union-attr]
        expected = 100.0 * 6 * n * d / world / (median(durs) / 1e6 * peak)
        assert r["mfu_pct"] == pytest.approx(expected, rel=1e-6)
