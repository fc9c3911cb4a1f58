"""Device-aligned step windows (traceread.analysis.time.steps) against hand-computed ground truth."""

from __future__ import annotations

from typing import Any

import polars as pl
import pytest
from rank_factory import make_rank

from traceread.analysis.time.steps import NO_MARKER_STEP, device_steps


def launch(ts: float, dur: float = 2.0) -> dict[str, Any]:
    return {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": dur}


def test_steps_extend_to_last_gpu_work_and_never_overlap() -> None:
    # Host steps: 1 [0,100), 2 [100,200), 3 [200,300). Launch rows 0..5.
    host = [launch(10), launch(90), launch(110), launch(150), launch(210), launch(250)]
    gpu = [
        {"name": "k", "ts": 20, "dur": 30, "launch_row": 0},
        {"name": "k", "ts": 95, "dur": 40, "launch_row": 1},  # step 1 work runs until 135
        {"name": "k", "ts": 140, "dur": 10, "launch_row": 2},
        {"name": "k", "ts": 160, "dur": 80, "launch_row": 3},  # step 2 until 240
        {"name": "k", "ts": 245, "dur": 10, "launch_row": 4},
        {"name": "k", "ts": 260, "dur": 100, "launch_row": 5},  # step 3 until 360
    ]
    sw = device_steps(make_rank(gpu, host, [(1, 0, 100), (2, 100, 200), (3, 200, 300)]))
    t = sw.table
    assert t["step"].to_list() == [1, 2, 3]
    # start = max(prev end, host start); end = max(host end, last GPU end of the step).
    assert t["start"].to_list() == [0.0, 135.0, 240.0]
    assert t["end"].to_list() == [135.0, 240.0, 360.0]
    assert t["duration"].to_list() == [135.0, 105.0, 120.0]
    assert sw.dropped == [] and sw.note is None
    assert t.schema == {"step": pl.Int64, "start": pl.Float64, "end": pl.Float64, "duration": pl.Float64}


def test_trailing_partial_step_is_dropped_and_said() -> None:
    # Step 1 launches 5 kernels, step 2 only 2 (< 80 %): the profiler stopped mid-step 2.
    host = [launch(10 + 10 * i) for i in range(5)] + [launch(110), launch(120)]
    gpu = [{"name": "k", "ts": 15 + 10 * i, "dur": 5, "launch_row": i} for i in range(5)]
    gpu += [{"name": "k", "ts": 115, "dur": 5, "launch_row": 5}, {"name": "k", "ts": 125, "dur": 5, "launch_row": 6}]
    sw = device_steps(make_rank(gpu, host, [(1, 0, 100), (2, 100, 200), (3, 200, 300)]))
    assert sw.table["step"].to_list() == [1]
    assert sw.dropped == [2, 3]
    assert sw.note is not None and "step 2" in sw.note and "[3]" in sw.note


def test_steps_without_gpu_work_after_the_last_busy_step_are_dropped() -> None:
    host = [launch(10), launch(110)]
    gpu = [{"name": "k", "ts": 20, "dur": 5, "launch_row": 0}, {"name": "k", "ts": 120, "dur": 5, "launch_row": 1}]
    sw = device_steps(make_rank(gpu, host, [(5, 0, 100), (6, 100, 200), (7, 200, 300)]))
    assert sw.table["step"].to_list() == [5, 6]
    assert sw.dropped == [7]


def test_launch_straddling_a_step_boundary_belongs_to_no_step() -> None:
    host = [launch(10), launch(98, dur=5)]  # second launch ends at 103, past step 1's end
    gpu = [{"name": "k", "ts": 20, "dur": 5, "launch_row": 0}, {"name": "k", "ts": 150, "dur": 100, "launch_row": 1}]
    sw = device_steps(make_rank(gpu, host, [(1, 0, 100), (2, 100, 200)]))
    # Step 2 owns no GPU work and is trailing -> dropped; step 1 is not stretched to 250.
    assert sw.table["end"].to_list() == [100.0]
    assert sw.dropped == [2]


def test_leftover_gpu_work_before_step_zero_moves_its_start() -> None:
    # A kernel launched before profiling (not in any step) runs until 30; step 1's first own kernel
    # starts at 40, so step 1 starts at 30 (TB plugin), not at the host start 0.
    host = [launch(-50), launch(10)]
    gpu = [{"name": "old", "ts": -10, "dur": 40, "launch_row": 0}, {"name": "k", "ts": 40, "dur": 5, "launch_row": 1}]
    sw = device_steps(make_rank(gpu, host, [(1, 0, 100)]))
    assert sw.table["start"].to_list() == [30.0]
    assert sw.table["end"].to_list() == [100.0]


def test_no_markers_gives_one_whole_trace_step() -> None:
    host = [{"cat": "cpu_op", "name": "aten::mm", "ts": 100, "dur": 100}, launch(120)]
    gpu = [{"name": "k", "ts": 130, "dur": 90, "launch_row": 1}]
    sw = device_steps(make_rank(gpu, host))
    assert sw.table.rows() == [(NO_MARKER_STEP, 100.0, 220.0, 120.0)]
    assert sw.note is not None and "no ProfilerStep" in sw.note


def test_cpu_only_trace_keeps_host_windows() -> None:
    host = [{"cat": "cpu_op", "name": "aten::add", "ts": 5, "dur": 5}]
    sw = device_steps(make_rank([], host, [(3, 0, 50), (4, 50, 90)]))
    assert sw.table["start"].to_list() == [0.0, 50.0]
    assert sw.table["end"].to_list() == [50.0, 90.0]
    assert sw.dropped == []


def test_empty_trace() -> None:
    sw = device_steps(make_rank())
    assert sw.table.height == 0 and sw.span is None


@pytest.mark.parametrize("n", [1])
def test_single_step_is_never_dropped(n: int) -> None:
    host = [launch(10)]
    gpu = [{"name": "k", "ts": 20, "dur": 500, "launch_row": 0}]
    sw = device_steps(make_rank(gpu, host, [(9, 0, 100)]))
    assert sw.table.rows() == [(9, 0.0, 520.0, 520.0)]
