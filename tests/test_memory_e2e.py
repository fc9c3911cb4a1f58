"""End to end: ``traceread collect --memory-snapshot`` around real 2-rank torchrun jobs on CPU (gloo),
then ``traceread report``; and the memory chart in a real headless browser.

The job (``tests/jobs/memory_train.py``) knows nothing about traceread: rank 1 keeps 1 MiB per step
alive (a leak) and runs a 4x larger batch; the OOM run asks for an impossible tensor on rank 0.
"""

from __future__ import annotations

import json
import pickle
import sys
from pathlib import Path

import needs
import pytest
from test_browser import check_page
from test_collect_e2e import free_port

from traceread.analysis.memory.snapshot import read_snapshot
from traceread.assemble.report import ReportOptions, build_report
from traceread.render import html, terminal
from traceread.simulate import simulate

needs.module("torch")
pytestmark = pytest.mark.slow
JOB = Path(__file__).resolve().parent / "jobs" / "memory_train.py"


def collect(run: Path, window: list[str], job_args: list[str]) -> int:
    import os
    import subprocess

    cmd = [sys.executable, "-m", "traceread.cli", "collect", "-o", str(run), *window, "--memory-snapshot", "--",
           sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
           "--monitor-interval", "0.5", str(JOB), *job_args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEREAD_")} | {"OMP_NUM_THREADS": "1"}
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=150)
    return res.returncode


def test_collect_memory_snapshot_and_report(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert collect(run, ["--wait", "1", "--warmup", "1", "--active", "4"],
                   ["--steps", "8", "--leak-rank", "1", "--big-rank", "1"]) == 0
    for r in (0, 1):
        snap = read_snapshot(run / "memory" / f"rank{r}.pickle")
        assert snap["rank"] == r and not snap["oom"] and snap["devices"][0]["history_entries"] > 0
    doc = json.loads((run / "run.json").read_text())
    assert doc["exit_code"] == 0
    rep = build_report([str(run)], ReportOptions(use_cache=False, workers=1))
    m = rep["memory"]
    rows = {r["rank"]: r for r in m["ranks"]}
    assert m["peak_rank"] == 1 and rows[1]["peak_allocated_bytes"] > rows[0]["peak_allocated_bytes"]  # 4x batch
    assert rows[1]["leak"] and not rows[0]["leak"] and m["leak_ranks"] == [1]
    levels = [s["start_allocated_bytes"] for s in rows[1]["steps"]]
    assert len(levels) == 4 and [b - a for a, b in zip(levels[1:], levels[2:])] == [1 << 20, 1 << 20]
    assert rows[1]["growth_per_step_bytes"] == 1 << 20  # the job's leak, measured from the second step
    assert sorted(s["rank"] for s in m["snapshots"]) == [0, 1]
    ids = [f["id"] for f in rep["findings"]]
    assert "memory_leak" in ids and "memory_imbalance" in ids
    assert "Memory: peak" in terminal.render_text(rep, width=300)


def test_collect_oom_snapshot_keeps_exit_code(tmp_path: Path) -> None:
    run = tmp_path / "run"
    code = collect(run, ["--wait", "1", "--warmup", "1", "--active", "3"], ["--steps", "8", "--oom-step", "3"])
    doc = json.loads((run / "run.json").read_text())
    assert code != 0 and doc["exit_code"] == code  # torchrun's failure, passed through unchanged
    errors = json.loads((run / "errors" / "rank0.json").read_text())
    assert "can't allocate memory" in errors["message"]["message"]
    snap = read_snapshot(run / "memory" / "rank0_oom.pickle")
    assert snap["oom"] and snap["devices"][0]["peak_allocated_bytes"] > 0
    rep = build_report([str(run)], ReportOptions(use_cache=False, workers=1))
    # the job died of it: why it died leads (issue #37), the OOM's own finding right after it
    first, oom = rep["findings"][0], rep["findings"][1]
    assert first["id"] == "failure" and rep["failure"]["first"]["rank"] == 0
    assert rep["failure"]["first"]["family"] == "oom" and "memory" in rep["failure"]["first"]["next_step"]
    assert oom["id"] == "memory_oom" and oom["rank"] == 0
    assert "memory_train.py" in oom["title"]  # the job's own line, from the snapshot's stacks
    with open(run / "memory" / "rank0_oom.pickle", "rb") as fh:
        assert isinstance(pickle.load(fh), dict)  # torch's format: a plain dict


def test_memory_chart_renders_in_a_browser(tmp_path: Path) -> None:
    sim = tmp_path / "sim"
    simulate("ddp", sim, ranks=2, steps=3, layers=2, hidden=2048, heads=16, seq_len=1024, memory=True,
             leak_bytes=1 << 24)
    rep = build_report([str(sim)], ReportOptions(use_cache=False, workers=1, params=2 * 2048 * (12 * 2048 + 10)))
    page = tmp_path / "report.html"
    html.write_html(rep, page)
    dom = check_page(page, tmp_path)
    assert 'id="chart-memory"' in dom and 'data-table="memory-ranks"' in dom
    plain = tmp_path / "plain"
    simulate("ddp", plain, ranks=2, steps=2, layers=2, hidden=2048, heads=16, seq_len=1024)
    rep = build_report([str(plain)], ReportOptions(use_cache=False, workers=1))
    page2 = tmp_path / "plain.html"
    html.write_html(rep, page2)
    assert 'id="memory"' not in check_page(page2, tmp_path)
