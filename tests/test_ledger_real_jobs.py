"""The window ledger's answer on real collected jobs (torchrun, gloo on CPU) and the recorded samples.

``tests/jobs/ddp_buckets_train.py`` runs DDP with several gradient buckets per step; one rank sleeps a
known time before every forward. The others wait for it at every bucket (blame counts the delay at each
one); the step gains the delay once. The machine is shared (2 cores), so the late rank's own host work
also slows while the other spins in gloo: the saving may exceed the sleep by some ms (a sleep long
against that noise keeps the check meaningful), never by a multiple of it. A healthy job's "no
straggler" is checked on the recorded sample and the simulator's jitter (tests/test_ledger_window.py):
on a machine this loaded one rank's compute can run several times slower than the other's for real.
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import needs
import pytest
from ports import free_port as _free_port

from traceread.assemble.report import ReportOptions, build_report

JOB = Path(__file__).resolve().parent / "jobs" / "ddp_buckets_train.py"


def _collect(run: Path, job_args: list[str]) -> subprocess.CompletedProcess:
    needs.module("torch")
    cmd = [sys.executable, "-m", "traceread.cli", "collect", "-o", str(run), "--wait", "2", "--warmup", "1",
           "--active", "4", "--hang-timeout", "60", "--", sys.executable, "-m", "torch.distributed.run",
           "--nproc-per-node", "2", "--master-port", str(_free_port()), "--monitor-interval", "0.5", str(JOB),
           *job_args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEREAD_")}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)


def bucket_arrivals_us(trace: dict) -> dict[str, list[float]]:
    """Per profiled step, when this rank entered each of its gradient all-reduces (DDP's buckets, in
    order), from raw events."""
    ev = trace["traceEvents"]
    steps = {e["name"]: (e["ts"], e["ts"] + e["dur"]) for e in ev if str(e.get("name", "")).startswith("ProfilerStep#")}
    starts = sorted(e["ts"] for e in ev if e.get("name") == "gloo:all_reduce")
    return {n: [t for t in starts if a <= t <= b] for n, (a, b) in steps.items() if any(a <= t <= b for t in starts)}


def union_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [a, b] intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


@pytest.mark.slow
@pytest.mark.parametrize("sleep_s", [0.2])
def test_late_rank_under_ddp_buckets_saves_the_injected_delay_once(tmp_path: Path, sleep_s: float) -> None:
    """Before the window ledger this job's straggler "saved" about twice the sleep (once per bucket)."""
    run = tmp_path / "run"
    res = _collect(run, ["--steps", "9", "--sleep-rank", "1", "--sleep-s", str(sleep_s)])
    assert res.returncode == 0, res.stderr[-3000:]
    doc = build_report([run], ReportOptions(use_cache=False, workers=1))
    top = doc["findings"][0]
    assert (top["id"], top["rank"]) == ("straggler", 1), [f["title"] for f in doc["findings"]]
    assert "(host)" in top["title"]  # a CPU job: never "gpu"
    # What rank 0 really waited per step, from the traces' own events (one host, one clock), so no margin
    # for a loaded machine is needed beyond clock reads.
    t0, t1 = (json.loads(gzip.decompress(next(run.rglob(f"rank{r}.pt.trace.json.gz")).read_bytes())) for r in (0, 1))
    a0, a1 = bucket_arrivals_us(t0), bucket_arrivals_us(t1)
    assert len(a0) == 4 and a0.keys() == a1.keys(), (a0, a1)  # --active 4
    assert all(len(a0[n]) == len(a1[n]) > 1 for n in a0), (a0, a1)
    # Gloo runs a step's bucket all-reduces on its worker threads as backward launches them, so rank 0
    # is held back on rank 1 while any bucket it entered waits for rank 1 to enter it: the union of
    # [rank 0 entered, rank 1 entered] over the step's buckets. That is the most the step could shrink
    # (with 1 ms for clock reads on a busy machine); counting the wait once per bucket would be a
    # multiple of it. The saving is rank 1's own work beyond rank 0's, so where the busy machine slowed
    # rank 0 too it is less than the first bucket's gap: most of that gap is still the floor.
    first = [a1[n][0] - a0[n][0] for n in sorted(a0)]
    assert min(first) > 0, first  # rank 1 (it slept) arrived last in every step
    held = [union_us([(a, b) for a, b in zip(a0[n], a1[n]) if b > a]) for n in sorted(a0)]
    lo, hi = 0.8 * sum(first) / len(first), sum(held) / len(held) + 1_000
    assert lo <= top["predicted_saving_us"] <= hi, (top, first, held)
    assert top["predicted_saving_us"] <= top["impact_us_per_step"] <= doc["coverage"]["step_us"]
    (e,) = [s for s in doc["stragglers"] if s["rank"] == 1]
    # the entry is the rank's what-if alone; the finding's saving is what is left of it once earlier
    # findings (a slow step on a loaded machine) claimed their part of the same time: never more
    assert e["impact_us_per_step"] >= top["predicted_saving_us"] - 1e-6
    assert e["blame_us_per_step"] > 1.5 * e["impact_us_per_step"]  # the delay was waited out at several buckets
    assert e["cause"] == "host" and not e["noise"]
    w = doc["ledger"]["window"]
    assert sum(p["us"] for p in w["parts"]) == pytest.approx(w["total_us"], abs=1e-3)


def test_recorded_samples(samples_dir: Path) -> None:
    """Healthy CPU DDP: no straggler and no "gpu" anywhere; the 150 ms sleeper is charged 150 ms once;
    two ranks sharing one H100 over gloo: the host all-reduce is the answer, not "waiting for the CPU"."""
    healthy = build_report([samples_dir / "cpu_ddp_gloo"], ReportOptions(use_cache=False, workers=1))
    assert not [f for f in healthy["findings"] if f["id"] == "straggler"]
    assert all(s.get("noise") and s["cause"] != "gpu" for s in healthy["stragglers"]), healthy["stragglers"]
    late = build_report([samples_dir / "cpu_straggler_gloo"], ReportOptions(use_cache=False, workers=1))
    top = late["findings"][0]
    assert (top["id"], top["rank"]) == ("straggler", 1) and "(host)" in top["title"]
    assert 150_000 <= top["predicted_saving_us"] <= 1.05 * 150_000
    gpu = build_report([samples_dir / "h100_ddp_gloo_2proc_1gpu"], ReportOptions(use_cache=False, workers=1))
    top = gpu["findings"][0]
    assert (top["category"], top["role"]) == ("comm_transfer", "dp") and "gloo" in top["title"]
    assert not [f for f in gpu["findings"] if f["category"] == "host_bound"]
