"""The step ledger's rules on hand-built ranks, and its identity on every sample and reference trace.

Exactness against the simulator's truth is in test_ledger_truth.py; here: each rule in isolation
(numbers computable by hand) and the identity (sum of parts == step) on real traces.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest
from rank_factory import make_rank

from traceread.analysis.ledger import job as job_ledger
from traceread.analysis.ledger.rank import rank_segments, step_totals
from traceread.analysis.time.steps import device_steps

LAUNCH = "cudaLaunchKernel"


def _totals(rt: Any, ops: pl.DataFrame | None = None) -> dict[str, float]:
    segs = rank_segments(rt, device_steps(rt).table, ops)
    return {c: us for _s, c, us in step_totals(segs).iter_rows()}


def test_host_bound_only_until_the_launch_then_dependency_then_tail() -> None:
    host = [{"cat": "cuda_runtime", "name": LAUNCH, "ts": float(t), "dur": 1.0} for t in (1, 30, 2)]
    gpu = [
        {"name": "gemm", "ts": 10.0, "dur": 10.0, "launch_row": 0},  # [10,20)
        {"name": "gemm", "ts": 40.0, "dur": 10.0, "launch_row": 1},  # gap [20,40): launched at 30
        {"name": "memcpyHtoD", "kind": "memcpy", "ts": 70.0, "dur": 5.0, "launch_row": 2},  # gap [50,70): launched at 2
    ]
    rt = make_rank(gpu, host, [(1, 0.0, 100.0)])
    t = _totals(rt)
    # [0,10): its kernel was launched at 1 -> host_bound [0,1), dependency [1,10);
    # [20,30) host_bound, [30,40) dependency; [50,70) dependency; memcpy 5; tail [75,100) idle_other.
    assert t == {"compute_other": 20.0, "dependency": 9.0 + 10.0 + 20.0, "host_bound": 1.0 + 10.0,
                 "exposed_memcpy": 5.0, "idle_other": 25.0}
    assert sum(t.values()) == 100.0


def test_compute_wins_over_comm_and_comm_over_memcpy() -> None:
    gpu = [
        {"name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ts": 0.0, "dur": 50.0, "stream": 13, "pg_name": "0"},
        {"name": "gemm", "ts": 10.0, "dur": 10.0},
        {"name": "memcpyDtoD", "kind": "memcpy", "ts": 40.0, "dur": 20.0, "stream": 9},
    ]
    rt = make_rank(gpu, [], [])
    segs = rank_segments(rt, pl.DataFrame({"step": [1], "start": [0.0], "end": [60.0]}))
    t = {c: us for _s, c, us in step_totals(segs).iter_rows()}
    assert t == {"comm_transfer": 40.0, "compute_other": 10.0, "exposed_memcpy": 10.0}
    assert set(segs.filter(pl.col("category") == "comm_transfer")["pg"].to_list()) == {"0"}


def test_bound_comes_from_the_launching_operator() -> None:
    ops = pl.DataFrame({"row": [0, 1], "bound": ["compute", "memory"]})
    host = [{"cat": "cpu_op", "name": "aten::mm", "ts": 0.0, "dur": 1.0},
            {"cat": "cpu_op", "name": "aten::add", "ts": 2.0, "dur": 1.0}]
    gpu = [{"name": "gemm", "ts": 0.0, "dur": 10.0, "op_row": 0},
           {"name": "add", "ts": 5.0, "dur": 10.0, "op_row": 1, "stream": 8},
           {"name": "other", "ts": 15.0, "dur": 5.0}]
    rt = make_rank(gpu, host, [])
    segs = rank_segments(rt, pl.DataFrame({"step": [1], "start": [0.0], "end": [20.0]}), ops)
    t = {c: us for _s, c, us in step_totals(segs).iter_rows()}
    assert t == {"compute_bound": 10.0, "memory_bound": 5.0, "compute_other": 5.0}


def _segs(rows: list[tuple[int, int, str, str | None, int | None]], base: float = 0.0) -> pl.DataFrame:
    from traceread.analysis.ledger.rank import SEGMENT_SCHEMA

    return pl.DataFrame({"step": [1] * len(rows), "start_ns": [r[0] for r in rows], "end_ns": [r[1] for r in rows],
                         "category": [r[2] for r in rows], "pg": [r[3] for r in rows], "kts_ns": [r[4] for r in rows],
                         "stream": [13 if r[4] is not None else None for r in rows],
                         "base_us": [base] * len(rows)}, schema=SEGMENT_SCHEMA)


def test_job_ledger_follows_the_late_peer() -> None:
    """Rank 0 waits in an all-reduce for rank 1 (which computes meanwhile): the job's critical path
    is rank 0's step with the wait replaced by rank 1's compute."""
    segs = {
        0: _segs([(0, 10_000, "compute_bound", None, None), (10_000, 40_000, "comm_transfer", "0", 10_000),
                  (40_000, 50_000, "idle_other", None, None)]),
        1: _segs([(0, 30_000, "compute_bound", None, None), (30_000, 40_000, "comm_transfer", "0", 30_000),
                  (40_000, 45_000, "idle_other", None, None)]),
    }
    ev = pl.DataFrame({"instance": [0, 0], "rank": [0, 1], "ts": [10.0, 30.0], "stream": [13, 13]})

    class M:  # the matched events: only these columns are read
        events = ev

    roles = {"0": "dp"}
    led = job_ledger.build(segs, [], M(), None, lambda pg: roles.get(pg, "other"))
    assert led.per_rank[0]["parts"][0] == {"category": "comm_wait", "role": "dp", "rank": 0, "us": 20.0}
    job = led.job
    assert job is not None and job["critical_rank"] == 0 and job["step_us"] == 50.0
    got = {(p["category"], p["role"], p["rank"]): p["us"] for p in job["parts"]}
    assert got == {("compute_bound", None, 0): 10.0, ("compute_bound", None, 1): 20.0,
                   ("comm_transfer", "dp", 0): 10.0, ("idle_other", None, 0): 10.0}
    assert job["waited_on"] == [{"rank": 1, "role": "dp", "us": 20.0}]


# ---- identity on real traces ---------------------------------------------------------------------


def _check_report(folder: Path) -> dict[str, Any]:
    """Every sample has a window ledger (CPU-only ranks: the host's): the parts of each step and of the
    window sum to them exactly, the header's step is the window's, and findings are shares of it."""
    from traceread.assemble.queries import step_figure
    from traceread.assemble.report import ReportOptions, build_report

    report = build_report([folder], ReportOptions(use_cache=False, workers=1))
    led = report["ledger"]
    assert led is not None, report["warnings"]
    assert sum(p["us"] for p in led["parts"]) == pytest.approx(led["step_us"], abs=1e-6)
    w = led["window"]
    assert sum(b["step_us"] for b in w["by_step"]) == pytest.approx(w["total_us"], abs=1e-6)
    assert sum(p["us"] for p in w["parts"]) == pytest.approx(w["total_us"], abs=1e-3)
    for b in w["by_step"]:
        assert sum(p["us"] for p in b["parts"]) == pytest.approx(b["step_us"], abs=1e-6)
    assert w["mean_step_us"] == pytest.approx(w["total_us"] / w["steps"])
    assert step_figure(report) == (w["mean_step_us"], w["steps"], w["median_step_us"])
    for r in report["ranks"]:
        rl = r["ledger"]
        assert sum(p["us"] for p in rl["parts"]) == pytest.approx(rl["step_us"], abs=1e-6)
        dur = next(s["duration_us"] for s in r["steps"] if s["step"] == rl["step"])
        assert rl["step_us"] == pytest.approx(dur, abs=1e-3)  # whole ns
    crit = next(r for r in report["ranks"] if r["rank"] == led["critical_rank"])
    assert crit["ledger"]["step_us"] == pytest.approx(led["step_us"], abs=1e-6)
    shares = [f["impact_us_total"] for f in report["findings"] if f["id"] not in ("hang", "failure")]  # not shares
    assert sum(shares) <= w["total_us"] + 1e-6
    assert report["coverage"]["explained_total_us"] == pytest.approx(min(sum(shares), w["total_us"]))
    assert report["coverage"]["step_us"] == pytest.approx(w["mean_step_us"])
    for f in report["findings"]:
        assert f["category"] and "role" in f
        assert f.get("predicted_saving_us", 0.0) <= f["impact_us_per_step"] + 1e-9
        if f["id"] not in ("hang", "failure"):
            assert f["impact_us_per_step"] == pytest.approx(f["impact_us_total"] / w["steps"])
            assert f["impact_pct"] == pytest.approx(100.0 * f["impact_us_total"] / w["total_us"])
    return report


SAMPLES = sorted(p.name for p in (Path(__file__).resolve().parents[1] / "sample_traces").iterdir() if p.is_dir())


@pytest.mark.parametrize("name", SAMPLES)
def test_identity_on_every_sample(samples_dir: Path, name: str) -> None:
    _check_report(samples_dir / name)


def test_pipeline_samples_put_the_bubble_first_and_never_as_comm_or_host(samples_dir: Path) -> None:
    for name in ("pp_1f1b_h100", "pp_gpipe_h100"):
        report = _check_report(samples_dir / name)
        top = report["findings"][0]
        assert (top["category"], top["role"]) == ("bubble", "pp"), top["title"]
        assert not any(f["category"] in ("comm_transfer", "comm_wait", "host_bound")
                       and f["impact_us_per_step"] > 0.05 * report["ledger"]["step_us"] for f in report["findings"])


def test_identity_on_param_dlrm(shared_traces: Path) -> None:
    folder = shared_traces / "param_dlrm_8rank"
    report = _check_report(folder)
    assert report["ledger"] is not None and len(report["ranks"]) == 8


TRUTH_SAMPLES = [n for n in SAMPLES if (Path(__file__).resolve().parents[1] / "sample_traces" / n / "truth.json").is_file()]


@pytest.mark.parametrize("name", TRUTH_SAMPLES)
def test_sample_job_ledger_matches_its_truth(samples_dir: Path, name: str) -> None:
    """The committed samples' truth.json (written by the simulator): the job ledger part by part."""
    import json
    from collections import defaultdict

    truth = json.loads((samples_dir / name / "truth.json").read_text())
    report = _check_report(samples_dir / name)
    ours, want = report["ledger"], truth["ledger"]
    assert (ours["step"], ours["critical_rank"]) == (want["step"], want["critical_rank"])

    def agg(parts: list[dict[str, Any]]) -> dict[tuple[str, str | None, int], float]:
        d: dict[tuple[str, str | None, int], float] = defaultdict(float)
        for p in parts:
            d[(p["category"], p["role"], p["rank"])] += p["us"]
        return d

    a, b = agg(ours["parts"]), agg(want["parts"])
    # skewed clocks are estimated from the traces (within ε), so waits there agree to ε, not exactly
    tol = 1e-6 if not truth.get("clock_offsets_us") or not any(truth["clock_offsets_us"].values()) else \
        float(report["source"]["clock"]["epsilon_us"])
    for k in set(a) | set(b):
        assert a.get(k, 0.0) == pytest.approx(b.get(k, 0.0), abs=tol), (name, k)


def test_terminal_ledger_stays_compact_for_many_ranks() -> None:
    """1200 ranks: the critical rank and the slowest others are drawn, plus the mean, and it says so."""
    from traceread.render import ledger_view, terminal

    def parts(r: int, us: float) -> list[dict]:
        return [{"category": "compute_bound", "role": None, "rank": r, "us": us},
                {"category": "comm_wait", "role": "dp", "rank": r, "us": 100.0}]

    ranks = [{"rank": r, "ledger": {"step": 3, "step_us": 1000.0 + r % 7, "parts": parts(r, 900.0 + r % 7)},
              "steps": [{"step": 3, "start_us": 0.0, "duration_us": 1000.0 + r % 7}]} for r in range(1200)]
    doc = {"schema": "traceread.report/1", "source": {}, "ranks": ranks, "findings": [],
           "ledger": {"step": 3, "step_us": 1006.0, "critical_rank": 6, "parts": parts(6, 906.0)},
           "coverage": {"explained_us": 0.0, "step_us": 1006.0}}
    rows, note = ledger_view.rank_lines(doc, top=10)
    assert len(rows) == 11 and rows[-1][0] == "mean of 1200" and note and "1200 ranks" in note
    assert any(c.startswith("rank 6 *") for c, _ in rows)
    assert ledger_view.bar_text(rows[0][1]).count("C") + ledger_view.bar_text(rows[0][1]).count("W") == 60
    text = terminal.render_text(doc, top=10)
    assert "Findings account for 0 µs of 1.0 ms per step" in text
    assert text.count("|") < 200  # a few dozen bars, not 1200


@pytest.mark.parametrize("name", TRUTH_SAMPLES)
def test_sample_window_and_answer_match_truth(samples_dir: Path, name: str) -> None:
    """The committed samples: the window ledger part by part against truth.json's ``ledger_window``, the
    header's step figure is its mean step, and the ANSWER is truth's biggest loss (grouped as in
    tests/test_ledger_truth.py)."""
    import json
    from collections import defaultdict

    from test_ledger_truth import _names, _truth_shares

    from traceread.render.terminal import headline

    truth = json.loads((samples_dir / name / "truth.json").read_text())
    report = _check_report(samples_dir / name)
    w, t = report["ledger"]["window"], truth["ledger_window"]
    assert (w["steps"], w["median_step"]) == (t["steps"], t["median_step"])

    def agg(parts: list[dict[str, Any]]) -> dict[tuple[str, str | None, int], float]:
        d: dict[tuple[str, str | None, int], float] = defaultdict(float)
        for p in parts:
            d[(p["category"], p["role"], p["rank"])] += p["us"]
        return d

    tol = 1e-6 if not any(truth["clock_offsets_us"].values()) else 3 * float(report["source"]["clock"]["epsilon_us"])
    a, b = agg(w["parts"]), agg(t["parts"])
    for k in set(a) | set(b):
        assert a.get(k, 0.0) == pytest.approx(b.get(k, 0.0), abs=tol), (name, k)
    from traceread.fmt import ms

    assert f"mean step {ms(t['mean_step_us'])}" in headline(report)
    shares = _truth_shares(truth)
    best = max(shares.values())
    top_keys = [k for k, v in shares.items() if v >= 0.97 * best]
    assert any(_names(report["findings"][0], k) for k in top_keys), (report["findings"][0]["title"], top_keys)
