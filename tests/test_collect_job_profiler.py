"""A job that runs its own torch.profiler under ``traceread collect`` (issue #36).

Two Kineto sessions in one process crashed both ranks (SIGSEGV in 3 runs of 3): traceread exported
its window after the job's profiler had started. Now the bootstrap sees the job's profiler start
(``_traceread_profiler_guard``), closes its own window first and steps aside. Each case is a real
2-rank torchrun job (``tests/jobs/own_profiler_train.py``, gloo on CPU) that profiles itself before,
inside or after traceread's window, through ``schedule``/``on_trace_ready``, ``start()``/``stop()``,
the profiler context and the autograd profiler. Truth comes from the job's arguments: which loop
iterations it profiles and how many steps it runs.
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
from ports import free_port

needs.module("torch")

JOB = Path(__file__).resolve().parent / "jobs" / "own_profiler_train.py"
STEPS = 22


def collect(tmp: Path, collect_args: list[str], job_args: list[str]) -> tuple[subprocess.CompletedProcess, Path, Path]:
    run, job_dir = tmp / "run", tmp / "job_traces"
    cmd = [sys.executable, "-m", "traceread.cli", "collect", "-o", str(run), *collect_args, "--",
           sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
           "--monitor-interval", "0.5", str(JOB), "--steps", str(STEPS), "--trace-dir", str(job_dir), *job_args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEREAD_")}
    env["OMP_NUM_THREADS"] = "1"
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=tmp)
    return res, run, job_dir


def step_names(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        doc = json.load(fh)
    return sorted({e["name"] for e in doc["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")})


# (id, collect options, job options, traceread keeps a trace, partial, optimizer step the job's profiler starts in)
# traceread's window: starts after optimizer step 1, then --wait, --warmup, --active steps.
# The job profiles loop iterations start..start+count-1; iteration i ends with optimizer step i+1.
CASES = [
    # the job: defaults (records optimizer steps 10-19), the job's schedule warms up in step 10
    ("schedule-inside-defaults", [], ["--api", "schedule", "--first", "10", "--iters", "5"], False, False, 10),
    # traceread recorded optimizer steps 5-9 when the job's schedule warms up in step 10: those 5 are kept
    ("schedule-inside-kept", ["--wait", "2", "--warmup", "1", "--active", "10"],
     ["--api", "schedule", "--first", "10", "--iters", "5"], True, True, 10),
    # the job profiles iterations 0-1 (steps 1-2): traceread never starts
    ("startstop-before", ["--wait", "0", "--warmup", "1", "--active", "3"],
     ["--api", "startstop", "--first", "0", "--iters", "2"], False, False, 1),
    # traceread's window (steps 3-5) is over when the job profiles steps 17-19
    ("context-after", ["--wait", "0", "--warmup", "1", "--active", "3"],
     ["--api", "context", "--first", "16", "--iters", "3"], True, False, 17),
    # the autograd profiler from iteration 8 (step 9): traceread had recorded steps 4-8
    ("autograd-inside", ["--wait", "1", "--warmup", "1", "--active", "10"],
     ["--api", "autograd", "--first", "8", "--iters", "3"], True, True, 9),
]


@pytest.mark.slow
@pytest.mark.parametrize(("collect_args", "job_args", "ours", "partial", "from_step"),
                         [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_job_profiler_never_crashes_the_job(tmp_path: Path, collect_args: list[str], job_args: list[str],
                                            ours: bool, partial: bool, from_step: int) -> None:
    res, run, job_dir = collect(tmp_path, collect_args, job_args)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "rank 0 done" in res.stdout and "rank 1 done" in res.stdout
    doc = json.loads((run / "run.json").read_text())
    start, count = int(job_args[3]), int(job_args[5])
    for r in (0, 1):
        info = doc["ranks"][str(r)]
        assert info["steps"] == STEPS
        job = info["job_profiler"]
        assert job["from_step"] == from_step
        # the job's own traces: where its handler / export_chrome_trace wrote them, all recorded
        theirs = sorted(job_dir.glob(f"rank{r}.*"))
        assert len(theirs) == 1 and [str(p) for p in theirs] == job["traces"]
        assert job["trace_dirs"] == [str(job_dir)]
        if job_args[1] == "schedule":  # the job's own step markers are its iterations start..start+count-1
            assert step_names(theirs[0]) == sorted(f"ProfilerStep#{i}" for i in range(start, start + count))
        log = (run / "inject" / f"rank{r}.log").read_text()
        assert "traceread stepped aside" in log and "FAILED" not in log
        mine = run / "traces" / f"rank{r}.pt.trace.json.gz"
        assert mine.is_file() == ours
        if ours:
            assert step_names(mine) == sorted(f"ProfilerStep#{s}" for s in info["profiler_steps"])
        assert ("partial" in info) == partial
        if partial:  # every step traceread recorded before the job's profiler began is kept
            assert info["partial"]["cut_by"] == "the job's own profiler"
            first_recorded = 1 + int(collect_args[1]) + int(collect_args[3]) + 1
            assert info["partial"]["recorded"] == from_step - first_recorded == len(info["profiler_steps"])
    summary = [line for line in res.stderr.splitlines() if line.startswith("[traceread]")]
    text = "\n".join(summary)
    assert f"the job ran its own profiler from step {from_step} on 2 rank(s); traceread stepped aside" in text
    assert f"its traces (2 file(s)): {job_dir}" in text
    assert f"exit code 0, {STEPS} optimizer step(s): {run}" in text  # not the '1 optimizer step(s)' of a crash
    assert "no trace:" not in text
    assert ("none from traceread" in text) == (not ours)
    if partial:
        kept = doc["ranks"]["0"]["partial"]["recorded"]
        assert (f"partial: the job started its own profiler after traceread recorded {kept} of the --active "
                f"{collect_args[5]} steps on 2 rank(s)") in text
    # the report reads traceread's traces, else the job's own, and says which
    rep = subprocess.run([sys.executable, "-m", "traceread.cli", "report", str(run), "--format", "json"],
                         capture_output=True, text=True, timeout=600)
    assert rep.returncode == 0, rep.stderr[-2000:]
    report = json.loads(rep.stdout)
    assert report["source"]["ranks_read"] == 2
    said = [w for w in report["warnings"] if "the job ran its own profiler" in w]
    assert len(said) == 1 and str(job_dir) in said[0]
    assert ("this report reads the job's own traces" in said[0]) == (not ours)


def test_step_count_comes_from_the_progress_file(tmp_path: Path) -> None:
    """A rank killed by a signal never rewrote its rank file (it still says step 1); its progress file,
    written at every step, has the count the summary must give."""
    from traceread.collect.runinfo import read_ranks

    (tmp_path / "ranks").mkdir()
    (tmp_path / "progress").mkdir()
    (tmp_path / "ranks" / "rank0.json").write_text(json.dumps({"rank": 0, "steps": 1}))
    (tmp_path / "progress" / "rank0").write_text(f"{19:>12d} {123:>20d} {456:>10d}\n")
    (tmp_path / "ranks" / "rank1.json").write_text(json.dumps({"rank": 1, "steps": 7}))  # no progress file
    assert {r: i["steps"] for r, i in read_ranks(tmp_path).items()} == {0: 19, 1: 7}


def test_guard_sees_the_jobs_profiler_and_not_traceread_own(tmp_path: Path) -> None:
    """In-process, with real torch: every way a job starts a profiler reaches the guard once per start,
    traceread's own calls (inside ``ours()``) do not, and the trace folder of a
    ``tensorboard_trace_handler`` and every exported file are recorded."""
    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "traceread" / "collect" / "bootstrap"))
    try:
        import _traceread_profiler_guard as guard_mod
    finally:
        sys.path.pop(0)
    seen: list[dict] = []
    paths: list[tuple[list[str], list[str]]] = []
    logs: list[str] = []
    guard = guard_mod.install(torch, guard_mod.Guard(seen.append, lambda d, f: paths.append((d, f)), logs.append))
    try:
        x = torch.randn(8, 8)
        with guard_mod.ours():
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
                x @ x
            p.export_chrome_trace(str(tmp_path / "ours.json"))
        assert seen == [] and paths == [] and guard.starts == 0
        tb = tmp_path / "tb"
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    schedule=torch.profiler.schedule(wait=0, warmup=1, active=1, repeat=1),
                                    on_trace_ready=torch.profiler.tensorboard_trace_handler(str(tb), "w")) as prof:
            for _ in range(3):
                x @ x
                prof.step()
        assert len(seen) == 1 and seen[0]["api"] == "torch.profiler.profiler.profile"
        assert seen[0]["trace_dirs"] == [str(tb)]
        with torch.autograd.profiler.profile() as legacy:
            x @ x
        legacy.export_chrome_trace(str(tmp_path / "autograd.json"))
        assert len(seen) == 1 and guard.starts >= 3  # called back once; every start counted
        written = sorted(str(p) for p in tb.iterdir()) + [str(tmp_path / "autograd.json")]
        assert paths[-1][1] == written
        assert logs == []
    finally:
        guard_mod.uninstall(guard)
    assert torch.autograd.profiler._prepare_profiler is torch.autograd._prepare_profiler
