"""GPU time breakdown and idle split against brute-force ground truth (unit time slots)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rank_factory import make_rank

from traceread.analysis.time.breakdown import (
    BREAKDOWN_FIELDS,
    Breakdown,
    identity_error,
    rank_breakdown,
    step_breakdowns,
)
from traceread.analysis.time.idle import idle_breakdown
from traceread.analysis.time.steps import device_steps
from traceread.model import RankTrace

NAMES = {"comp": "void gemm_kernel", "comm": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "memset": "Memset"}


def gpu_event(cls: str, ts: int, dur: int, stream: int = 7, **extra: Any) -> dict[str, Any]:
    kind = {"memcpy": "memcpy", "memset": "memset"}.get(cls, "kernel")
    name = {"memcpy": "Memcpy HtoD (Pageable -> Device)"}.get(cls, NAMES.get(cls, "k"))
    return {"kind": kind, "name": name, "ts": float(ts), "dur": float(dur), "stream": stream, **extra}


def brute_force(events: list[tuple[str, int, int]], lo: int, hi: int) -> dict[str, float]:
    """Classify every 1-µs slot of [lo, hi) independently: the definition, spelt out."""
    out = dict.fromkeys(("compute", "comm", "exposed_comm", "memcpy", "exposed_memcpy", "busy", "overlap"), 0.0)
    for t in range(lo, hi):
        on = {c for c, s, d in events if s <= t < s + d}
        comp = bool(on & {"comp", "memset"})
        comm = "comm" in on
        mcp = "memcpy" in on
        out["compute"] += comp
        out["comm"] += comm
        out["exposed_comm"] += comm and not comp
        out["memcpy"] += mcp
        out["exposed_memcpy"] += mcp and not comp and not comm
        out["busy"] += bool(on)
        out["overlap"] += comm and comp
    return out


def check_against_brute(b: Breakdown, events: list[tuple[str, int, int]], lo: int, hi: int) -> None:
    truth = brute_force(events, lo, hi)
    assert b.window_us == pytest.approx(hi - lo, abs=1e-9)
    assert b.compute_us == pytest.approx(truth["compute"], abs=1e-9)
    assert b.comm_us == pytest.approx(truth["comm"], abs=1e-9)
    assert b.exposed_comm_us == pytest.approx(truth["exposed_comm"], abs=1e-9)
    assert b.memcpy_us == pytest.approx(truth["memcpy"], abs=1e-9)
    assert b.exposed_memcpy_us == pytest.approx(truth["exposed_memcpy"], abs=1e-9)
    assert b.gpu_busy_us == pytest.approx(truth["busy"], abs=1e-9)
    assert b.idle_us == pytest.approx(hi - lo - truth["busy"], abs=1e-9)
    if truth["comm"]:
        assert b.comm_overlap_pct == pytest.approx(truth["overlap"] / truth["comm"] * 100, abs=1e-9)
    else:
        assert b.comm_overlap_pct is None
    assert identity_error(b) < 1e-6


def test_hand_example() -> None:
    # Stream 7: gemm [0,10), gemm [30,40). Stream 20: allreduce [5,20). Stream 9: memcpy [18,25), memset [50,52).
    events = [("comp", 0, 10), ("comp", 30, 10), ("comm", 5, 15), ("memcpy", 18, 7), ("memset", 50, 2)]
    rt = make_rank([gpu_event(c, s, d, stream=i) for i, (c, s, d) in enumerate(events)])
    b = rank_breakdown(rt)
    assert b.to_dict() == {
        "window_us": 52.0,
        "gpu_busy_us": 37.0,  # [0,25) + [30,40) + [50,52)
        "compute_us": 22.0,
        "comm_us": 15.0,
        "exposed_comm_us": 10.0,  # [10,20)
        "memcpy_us": 7.0,
        "exposed_memcpy_us": 5.0,  # [20,25)
        "idle_us": 52.0 - 37.0,
        "comm_overlap_pct": pytest.approx(100 * 5 / 15),
        "gpu_util_pct": pytest.approx(100 * 37 / 52),
    }
    check_against_brute(b, events, 0, 52)


event_st = st.tuples(
    st.sampled_from(["comp", "comm", "memcpy", "memset"]),
    st.integers(0, 60),
    st.integers(0, 15),
    st.integers(0, 3),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(event_st, min_size=1, max_size=25), st.integers(-5, 40), st.integers(1, 50))
def test_random_interval_sets_match_brute_force(events: list[tuple[str, int, int, int]], lo: int, width: int) -> None:
    rt = make_rank([gpu_event(c, s, d, stream=k) for c, s, d, k in events])
    plain = [(c, s, d) for c, s, d, _ in events]
    # Explicit window, possibly reaching past the events.
    check_against_brute(rank_breakdown(rt, (float(lo), float(lo + width))), plain, lo, lo + width)
    # Default window: first GPU start .. last GPU end.
    g_lo = min(s for _, s, _ in plain)
    g_hi = max(s + d for _, s, d in plain)
    b = rank_breakdown(rt)
    check_against_brute(b, plain, g_lo, g_hi)
    # The whole-GPU idle split divides exactly that idle time.
    idle = idle_breakdown(rt)
    assert idle is not None
    split = idle["host_bound_us"] + idle["kernel_gap_us"] + idle["other_us"]
    assert split == pytest.approx(b.idle_us, abs=1e-9)
    for row in idle["streams"]:
        assert row["host_bound_us"] + row["kernel_gap_us"] + row["other_us"] == pytest.approx(row["idle_us"])


def test_realistic_magnitudes_keep_the_identity() -> None:
    rng = np.random.default_rng(7)
    base = 1.6e15  # Kineto epoch-µs timestamps of old traces
    starts = base + np.sort(rng.uniform(0, 5e6, 3000))
    durs = rng.uniform(0.5, 800, 3000)
    classes = rng.choice(["comp", "comm", "memcpy", "memset"], 3000)
    rt = make_rank([
        {**gpu_event(str(c), 0, 0, stream=int(i % 4)), "ts": float(s), "dur": float(d)}
        for i, (c, s, d) in enumerate(zip(classes, starts, durs))
    ])
    assert identity_error(rank_breakdown(rt)) < 1e-6


def test_no_gpu_events_gives_none_filled() -> None:
    rt = make_rank([], [{"cat": "cpu_op", "name": "aten::add", "ts": 0.0, "dur": 5.0}])
    assert rank_breakdown(rt).to_dict() == dict.fromkeys(BREAKDOWN_FIELDS)
    assert step_breakdowns(rt, device_steps(rt)).height == 0
    assert idle_breakdown(rt) is None


def test_step_breakdowns_match_window_breakdowns() -> None:
    host = [{"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": float(t), "dur": 1.0} for t in (1, 20, 41, 60)]
    gpu = [
        gpu_event("comp", 2, 20, launch_row=0),
        gpu_event("comm", 21, 25, stream=30, launch_row=1),  # step 1's comm runs until 46
        gpu_event("comp", 47, 10, launch_row=2),
        gpu_event("comm", 61, 9, stream=30, launch_row=3),
    ]
    rt = make_rank(gpu, host, [(1, 0, 40), (2, 40, 80)])
    steps = device_steps(rt)
    assert steps.table.rows() == [(1, 0.0, 46.0, 46.0), (2, 46.0, 80.0, 34.0)]
    table = step_breakdowns(rt, steps)
    assert table["step"].to_list() == [1, 2]
    assert table.columns == ["step", *BREAKDOWN_FIELDS]
    for row, (lo, hi) in zip(table.iter_rows(named=True), [(0.0, 46.0), (46.0, 80.0)]):
        expect = rank_breakdown(rt, (lo, hi)).to_dict()
        assert {k: row[k] for k in BREAKDOWN_FIELDS} == expect
    first = table.row(0, named=True)
    assert first["compute_us"] == 20.0 and first["exposed_comm_us"] == 24.0 and first["idle_us"] == 2.0


def test_other_devices_rows_are_ignored() -> None:
    rt = make_rank([gpu_event("comp", 0, 10), {**gpu_event("comp", 100, 10), "device": 3}])
    assert rank_breakdown(rt).window_us == 10.0


# ---- idle split -------------------------------------------------------------------------------


def test_idle_split_host_bound_kernel_gap_other() -> None:
    host = [{"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": float(t), "dur": 1.0} for t in (0, 1, 2, 115, 3)]
    gpu = [
        gpu_event("comp", 10, 10, launch_row=0),   # [10,20)
        gpu_event("comp", 25, 5, launch_row=1),    # gap [20,25) = 5 µs, queued at 1 -> kernel_gap
        gpu_event("comp", 100, 10, launch_row=2),  # gap [30,100) = 70 µs, queued at 2 -> other
        gpu_event("comp", 130, 10, launch_row=3),  # gap [110,130), launched at 115 -> host_bound until 115
        gpu_event("comp", 145, 5, stream=9),       # gap [140,145): unlinked, short -> kernel_gap
    ]
    rt = make_rank(gpu, host)
    out = idle_breakdown(rt)
    assert out is not None
    # [110,115) host-bound; [115,130) after the launch: 15 µs, short -> kernel_gap.
    assert out["kernel_gap_us"] == 5.0 + 5.0 + 15.0
    assert out["other_us"] == 70.0
    assert out["host_bound_us"] == 5.0
    assert out["idle_us"] == rank_breakdown(rt).idle_us == 100.0
    streams = {r["stream"]: r for r in out["streams"]}
    # Per stream is HTA's view (the whole gap is host-bound): gaps 5 (kernel_gap), 70 (other),
    # 20 (host_bound); stream 9 has one kernel.
    assert (streams[7]["kernel_gap_us"], streams[7]["other_us"], streams[7]["host_bound_us"]) == (5.0, 70.0, 20.0)
    assert streams[9]["idle_us"] == 0.0
    # Threshold is a parameter: with 3 µs no gap is "short".
    out3 = idle_breakdown(rt, kernel_gap_threshold_us=3.0)
    assert out3 is not None and out3["kernel_gap_us"] == 0.0 and out3["other_us"] == 95.0


def test_gap_after_the_launch_is_not_host_bound() -> None:
    # GPipe-like: the host launched everything up front; the GPU then waits on a dependency.
    host = [{"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": float(t), "dur": 1.0} for t in (0, 1)]
    rt = make_rank([gpu_event("comp", 10, 10, launch_row=0), gpu_event("comp", 500, 10, launch_row=1)], host)
    out = idle_breakdown(rt)
    assert out is not None and out["host_bound_us"] == 0.0 and out["other_us"] == 480.0


def test_idle_on_step_window_counts_edges() -> None:
    host = [{"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": float(t), "dur": 1.0} for t in (0, 40)]
    rt = make_rank([gpu_event("comp", 10, 10, launch_row=0), gpu_event("comp", 50, 10, launch_row=1)], host)
    out = idle_breakdown(rt, (5.0, 100.0))
    assert out is not None
    # [5,10): its kernel was launched at 0, before the window: not host-bound, short -> kernel_gap.
    # [20,50): its kernel was launched at 40, after the GPU drained at 20 -> host_bound [20,40),
    # then 10 µs launch latency -> kernel_gap. [60,100): nothing ends it -> other.
    assert out["host_bound_us"] == 20.0
    assert out["kernel_gap_us"] == 5.0 + 10.0
    assert out["other_us"] == 40.0
    assert out["idle_us"] == rank_breakdown(rt, (5.0, 100.0)).idle_us


# ---- exact ground truth from the simulator -------------------------------------------------------

SIM_CASES = {
    "ddp": {"ranks": 2, "steps": 3},
    "ddp_skewed": {"ranks": 4, "steps": 2, "hosts": 2, "skew_us": 1500.0, "comm": "fsdp"},
    "tp": {"ranks": 4, "steps": 2},
    "pp": {"ranks": 4, "steps": 2, "stage_factors": [1.0, 1.3, 1.0, 0.8]},
    "slow_steps": {"ranks": 2, "steps": 4, "slow_steps": [(11, "dataloader", 5000.0)]},
}


@pytest.fixture(scope="module", params=sorted(SIM_CASES))
def simulated(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[RankTrace]]:
    import traceread.simulate as simulate_mod
    from traceread.engine import jobs as reader
    name = request.param
    out = tmp_path_factory.mktemp(name)
    truth = simulate_mod.simulate(name.split("_skewed")[0], out, **SIM_CASES[name])
    ranks = [reader.read_rank(out / f"rank{r}.pt.trace.json.gz", use_cache=False) for r in range(truth["world_size"])]
    return truth, ranks


TRUTH_FIELDS = ("window_us", "gpu_busy_us", "compute_us", "comm_us", "exposed_comm_us", "memcpy_us",
                "exposed_memcpy_us", "idle_us", "comm_overlap_pct")


def compare_to_truth(truth: dict[str, Any], ranks: list[RankTrace]) -> None:
    from traceread.analysis.compute.occupancy import sm_metrics

    for rt in ranks:
        tr = truth["ranks"][str(rt.rank)]
        b = rank_breakdown(rt).to_dict()
        for key in TRUTH_FIELDS:
            if tr[key] is None:
                assert b[key] is None, key
            else:
                assert b[key] == pytest.approx(tr[key], abs=1e-6), (rt.rank, key)
        idle = idle_breakdown(rt)
        assert idle is not None and idle["idle_us"] == pytest.approx(tr["idle_us"], abs=1e-6)
        # The simulator's SM metrics use the breakdown window (first..last GPU event).
        lo, hi = float(rt.gpu["ts"].min()), float(rt.gpu["end"].max())  # type: ignore[arg-type]
        m = sm_metrics(rt, (lo, hi))
        assert m.sm_efficiency_pct == pytest.approx(tr["sm_efficiency_pct"], abs=1e-6)
        assert m.achieved_occupancy_pct == pytest.approx(tr["achieved_occupancy_pct"], abs=1e-6)
        # Steps: truth is on the unskewed clock; our windows are on this rank's own trace clock.
        offset = float(truth.get("clock_offsets_us", {}).get(str(rt.rank), 0.0))
        sw = device_steps(rt)
        table = step_breakdowns(rt, sw)
        assert sw.dropped == []
        assert sw.table["step"].to_list() == [s["step"] for s in tr["steps"]] == truth["steps"]
        for ours, row, want in zip(sw.table.iter_rows(named=True), table.iter_rows(named=True), tr["steps"]):
            assert ours["start"] - offset == pytest.approx(want["start_us"], abs=1e-6)
            assert ours["duration"] == pytest.approx(want["duration_us"], abs=1e-6)
            for key in ("compute_us", "comm_us", "exposed_comm_us", "idle_us"):
                assert row[key] == pytest.approx(want[key], abs=1e-6), (rt.rank, want["step"], key)


def test_simulated_runs_match_truth_exactly(simulated: tuple[dict[str, Any], list[RankTrace]]) -> None:
    truth, ranks = simulated
    compare_to_truth(truth, ranks)


def test_sample_traces_match_their_truth(samples_dir: Path) -> None:
    from traceread.engine import jobs as reader
    truths = sorted(samples_dir.glob("*/truth.json"))
    assert truths, "sample_traces/*/truth.json are tracked files: the checkout is incomplete"
    for path in truths:
        truth = json.loads(path.read_text())
        files = sorted(path.parent.rglob("rank*.pt.trace.json*"))
        compare_to_truth(truth, [reader.read_rank(f, use_cache=False) for f in files])


def test_queued_work_ending_a_gap_is_not_host_bound_even_beside_late_work() -> None:
    """Two activities start when the gap ends: one queued long before (its stream waited on an event),
    one launched late. The GPU was not starved by the host (work was queued): of the activities
    ending a gap the earliest-launched decides, so no part of the gap is host-bound."""
    host = [{"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": float(t), "dur": 1.0} for t in (0, 1, 90)]
    gpu = [
        gpu_event("comp", 10, 10, launch_row=0),             # [10,20)
        gpu_event("comp", 100, 10, stream=9, launch_row=2),  # launched at 90, after the GPU drained at 20
        gpu_event("comp", 100, 10, launch_row=1),            # queued at 1: waited on a dependency
    ]
    out = idle_breakdown(make_rank(gpu, host))
    assert out is not None
    assert (out["host_bound_us"], out["kernel_gap_us"], out["other_us"]) == (0.0, 0.0, 80.0)
    only_late = idle_breakdown(make_rank(gpu[:2], host))  # without the queued one: host-bound until 90
    assert only_late is not None and (only_late["host_bound_us"], only_late["kernel_gap_us"]) == (70.0, 10.0)


def test_per_stream_gap_starts_at_the_latest_end_so_far() -> None:
    """A stream's activities can overlap in the record (a short one inside a long one: graph replays,
    timestamp skew); its gap starts where everything before it ended, never inside an activity."""
    host = [{"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": float(t), "dur": 1.0} for t in (0, 1, 2)]
    gpu = [gpu_event("comp", 0, 100, launch_row=0), gpu_event("comp", 10, 10, launch_row=1),
           gpu_event("comp", 130, 10, launch_row=2)]
    out = idle_breakdown(make_rank(gpu, host))
    assert out is not None
    (stream,) = out["streams"]
    assert stream["idle_us"] == 30.0 == out["idle_us"]  # [100,130), not [20,130)
    assert (stream["other_us"], stream["kernel_gap_us"]) == (30.0, 0.0)
