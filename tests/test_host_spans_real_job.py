"""A real job's slow DataLoader named by its own span (issue 36): torchrun, 2 ranks, gloo on CPU, collected
with ``traceread collect``, no change to the script (``tests/jobs/slow_loader_train.py``).

Rank 1's dataset sleeps ``SLEEP_MS`` per item in ``__getitem__``; the plain DataLoader (no workers)
records its own span, ``enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__``, around it; the
job accumulates gradients over ``ACCUM`` batches per optimizer step. The answer must be rank 1, late
because of that span, with its time per step: at least ``ACCUM`` x ``BATCH`` x ``SLEEP_MS``
(``time.sleep`` never returns early), and on this shared machine at most 3x that (a sleep can overshoot
by scheduling delay, never by a multiple of a 40 ms step). Rank 0's same span holds no sleep: under a
quarter of rank 1's. The workload line says the ``ACCUM`` micro-steps per optimizer step.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import needs
import pytest
from ports import free_port as _free_port

from traceread.assemble.report import ReportOptions, build_report

JOB = Path(__file__).resolve().parent / "jobs" / "slow_loader_train.py"
SPAN = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
SLEEP_MS, BATCH, ACCUM = 10.0, 2, 2


@pytest.mark.slow
def test_slow_loader_on_rank_1_is_named_by_the_dataloader_span(tmp_path: Path) -> None:
    needs.module("torch")
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "traceread.cli", "collect", "-o", str(run), "--wait", "2", "--warmup", "1",
           "--active", "4", "--hang-timeout", "60", "--", sys.executable, "-m", "torch.distributed.run",
           "--nproc-per-node", "2", "--master-port", str(_free_port()), "--monitor-interval", "0.5", str(JOB),
           "--steps", "9", "--batch", str(BATCH), "--slow-rank", "1", "--sleep-ms", str(SLEEP_MS),
           "--accum", str(ACCUM)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEREAD_")}
    env["OMP_NUM_THREADS"] = "1"
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = build_report([run], ReportOptions(use_cache=False, workers=1))
    top = doc["findings"][0]
    assert (top["id"], top["rank"]) == ("straggler", 1), [f["title"] for f in doc["findings"]]
    assert f"late because its data loader ({SPAN})" in top["title"], top["title"]
    assert "num_workers" in top["suggestions"][0]
    per = {r["rank"]: next((s["us_per_step"] for s in r.get("host_spans") or [] if s["name"] == SPAN), 0.0)
           for r in doc["ranks"]}
    floor = ACCUM * BATCH * SLEEP_MS * 1000.0
    assert 0.99 * floor <= per[1] <= 3.0 * floor, per
    assert per[0] < per[1] / 4, per
    # the straggler's host time is the span's, counted once: no other finding names it again
    assert top["spans"][0]["span"] == SPAN and top["spans"][0]["rank"] == 1
    again = [f for f in doc["findings"][1:] if any(s.get("span") == SPAN and s["rank"] == 1 for s in f.get("spans") or [])]
    named = sum(s["us_per_step"] for f in [top, *again] for s in f["spans"] if s.get("span") == SPAN and s["rank"] == 1)
    w = doc["ledger"]["window"]
    in_window = sum(p["us"] for p in w["spans"] if p["span"] == SPAN and p["rank"] == 1) / w["steps"]
    assert named <= in_window + 1e-6
    assert sum(p["us"] for p in w["parts"]) == pytest.approx(w["total_us"], abs=1e-3)
    assert doc["workload"]["micro_steps"] == ACCUM and doc["workload"]["framework"] is None
    from traceread.render.layout_view import workload_line

    assert f"gradient accumulation: {ACCUM} micro-steps per optimizer step" in str(workload_line(doc))
