"""Host self time per step (analysis/host_activity.py) on a hand-built host table with exact answers."""

from __future__ import annotations

import polars as pl

from tests.rank_factory import make_rank
from traceread.analysis.time.host_activity import host_self_time


def test_self_time_per_step_window() -> None:
    # Step 1 window [0, 100), step 2 window [100, 200). Rows are in ts order, parent = row index.
    rt = make_rank(host=[
        {"name": "ProfilerStep#1", "cat": "user_annotation", "ts": 0.0, "dur": 100.0},          # 0
        {"name": "enumerate(DataLoader)", "cat": "user_annotation", "ts": 5.0, "dur": 40.0, "parent": 0},  # 1
        {"name": "aten::copy_", "cat": "cpu_op", "ts": 10.0, "dur": 15.0, "parent": 1},          # 2
        {"name": "aten::copy_", "cat": "cpu_op", "ts": 30.0, "dur": 5.0, "parent": 1},           # 3
        {"name": None, "cat": "cpu_op", "ts": 50.0, "dur": 7.0, "parent": 0},                    # 4: unnamed
        {"name": "ProfilerStep#2", "cat": "user_annotation", "ts": 100.0, "dur": 100.0},        # 5
        {"name": "enumerate(DataLoader)", "cat": "user_annotation", "ts": 110.0, "dur": 60.0, "parent": 5},  # 6
        {"name": "cudaLaunchKernel", "cat": "cuda_runtime", "ts": 120.0, "dur": 70.0, "parent": 6},  # 7
        {"name": "late", "cat": "cpu_op", "ts": 250.0, "dur": 9.0},                             # 8: no window
    ])
    windows = pl.DataFrame({"step": [1, 2], "start": [0.0, 100.0], "end": [100.0, 200.0], "duration": [100.0, 100.0]})
    got = {(r["step"], r["name"]): r["self_us"] for r in host_self_time(rt, windows).iter_rows(named=True)}
    assert got == {
        (1, "enumerate(DataLoader)"): 40.0 - 15.0 - 5.0,
        (1, "aten::copy_"): 15.0 + 5.0,
        # its child is longer than it (start containment): self time clipped at 0, so not listed
        (2, "cudaLaunchKernel"): 70.0,
    }
