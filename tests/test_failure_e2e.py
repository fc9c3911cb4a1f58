"""Why the job stopped (issue 37), on real 2-rank torchrun/gloo jobs that fail each way (tests/jobs/crash_train.py).

Each job runs once under ``traceread collect``; the truth is the script itself: which rank fails, at which
optimizer step, on which line (the lines marked FAIL-*), with which exception. ``report`` and ``hang`` must
lead with that first failure, and the other rank's error ("Connection closed by peer", or SIGTERM from
torchrun) must be a consequence, never the cause.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import needs
import pytest
from test_collect_e2e import free_port

needs.module("torch")
JOBS = Path(__file__).resolve().parent / "jobs"
JOB = JOBS / "crash_train.py"
pytestmark = pytest.mark.slow
WINDOW = ["--wait", "0", "--warmup", "1", "--active", "3"]  # records optimizer steps 2-4


def line_of(marker: str) -> int:
    """The line of ``crash_train.py`` carrying ``marker``: the truth is the script."""
    return next(i for i, text in enumerate(JOB.read_text().splitlines(), 1) if f"# {marker}" in text)


def collect(run: Path, *job_args: str, torchrun: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEREAD_")}
    env["OMP_NUM_THREADS"] = "1"
    cmd = [sys.executable, "-m", "traceread.cli", "collect", "-o", str(run), "--hang-timeout", "120", *WINDOW, "--",
           sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
           "--monitor-interval", "0.2", *torchrun, str(JOB), *job_args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "traceread.cli", *args], capture_output=True, text=True, timeout=300)


def failure_json(run: Path) -> dict[str, Any]:
    res = cli("hang", str(run), "--format", "json")
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)["failure"]


def report_json(run: Path) -> dict[str, Any]:
    res = cli("report", str(run), "--no-cache", "--format", "json", "-o", "-")
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout)


def check_first(fail: dict[str, Any], rank: int, family: str, exception: str | None, marker: str | None,
                step: int) -> None:
    first = fail["first"]
    assert (first["rank"], first["family"], first["exception"], first["step"]) == (rank, family, exception, step)
    if marker:
        assert first["where"].endswith(f"crash_train.py:{line_of(marker)} in fail"), first["where"]
    assert first["host"]
    # no consequence is named as the cause; the other rank is one
    assert all(c["rank"] != rank and c["echo"] for c in fail["consequences"])
    assert fail["lines"][0].startswith(f"Rank {rank} ")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {}


def _run(runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory, name: str, *args: str,
         torchrun: tuple[str, ...] = ()) -> Path:
    if name not in runs:
        run = tmp_path_factory.mktemp(name) / "RUN"
        res = collect(run, *args, torchrun=torchrun)
        assert res.returncode != 0 or torchrun, res.stderr[-3000:]
        runs[name] = run
    return runs[name]


def test_cuda_error_in_the_window_leads_report_and_hang(runs: dict[str, Path],
                                                         tmp_path_factory: pytest.TempPathFactory) -> None:
    """Rank 1 raises a CUDA illegal-access error in optimizer step 3 (inside the recorded steps 2-4)."""
    run = _run(runs, tmp_path_factory, "cuda", "--fail-rank", "1", "--fail-step", "2", "--how", "cuda")
    fail = failure_json(run)
    check_first(fail, 1, "cuda_illegal_access", "RuntimeError", "FAIL-CUDA", 3)
    assert [c["rank"] for c in fail["consequences"]] == [0]
    assert fail["consequences"][0]["family"] == "peer_gone"
    assert "CUDA_LAUNCH_BLOCKING=1" in fail["first"]["next_step"]
    doc = report_json(run)
    top = doc["findings"][0]
    assert top["id"] == "failure" and top["rank"] == 1
    assert "rank 1 failed first: RuntimeError: CUDA error: an illegal memory access" in top["title"]
    assert "compute-sanitizer" in top["suggestions"][0]
    assert doc["failure"]["first"]["rank"] == 1
    text = cli("report", str(run), "--no-cache", "--format", "text", "-o", "-").stdout
    answer = next(line for line in text.splitlines() if line.startswith("ANSWER:"))
    assert "Job died: rank 1 failed first" in answer
    hang = cli("hang", str(run)).stdout.splitlines()
    assert hang[0].startswith("Rank 1 on ") and "failed first: RuntimeError: CUDA error" in hang[0]
    assert "rank 0 (peer gone)" in hang[1]


def test_memory_error_after_the_window(runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> None:
    """Rank 0 raises MemoryError in step 10, after the window closed: the window is kept, the failure leads."""
    run = _run(runs, tmp_path_factory, "memory", "--fail-rank", "0", "--fail-step", "9", "--how", "memory")
    fail = failure_json(run)
    check_first(fail, 0, "oom", "MemoryError", "FAIL-MEMORY", 10)
    assert "memory section" in fail["first"]["next_step"]
    doc = report_json(run)
    assert doc["findings"][0]["id"] == "failure" and len(doc["ranks"]) == 2  # the recorded window still reported


def test_two_ranks_raise_at_different_times(runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> None:
    """Rank 1 raises in step 6; rank 0 raises a ValueError of its own 1.5 s later in the same step: the first by
    time is the answer, the second is listed as a later failure of its own, not as an echo."""
    run = _run(runs, tmp_path_factory, "two", "--fail-rank", "1", "--fail-step", "5", "--how", "cuda",
               "--fail2-rank", "0", "--fail2-step", "5", "--fail2-delay", "1.5")
    fail = failure_json(run)
    check_first(fail, 1, "cuda_illegal_access", "RuntimeError", "FAIL-CUDA", 6)
    (later,) = fail["others"]
    assert (later["rank"], later["exception"], later["echo"]) == (0, "ValueError", False)
    assert later["where"].endswith(f"crash_train.py:{line_of('FAIL-SECOND')} in main")
    assert later["time_ns"] > fail["first"]["time_ns"]


def test_sigkill_without_a_python_error(runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> None:
    """Rank 1 is SIGKILLed (as the kernel's OOM killer does): no error file, exit code -9 from torchrun."""
    run = _run(runs, tmp_path_factory, "kill", "--fail-rank", "1", "--fail-step", "5", "--how", "kill")
    fail = failure_json(run)
    check_first(fail, 1, "killed", None, None, 6)
    assert fail["first"]["signal"] == "SIGKILL" and fail["first"]["exit_code"] == -9
    assert "OOM killer" in fail["first"]["next_step"]
    assert [c["rank"] for c in fail["consequences"]] == [0]


def test_segfault(runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> None:
    """Rank 0 dereferences NULL (ctypes.string_at(0)): faulthandler's dump gives the line, torchrun the signal."""
    run = _run(runs, tmp_path_factory, "segv", "--fail-rank", "0", "--fail-step", "5", "--how", "segv")
    fail = failure_json(run)
    check_first(fail, 0, "segfault", None, "FAIL-SEGV", 6)
    assert fail["first"]["signal"] == "SIGSEGV"
    assert [c["rank"] for c in fail["consequences"]] == [1]


def test_elastic_restart_keeps_both_attempts(runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> None:
    """torchrun --max-restarts 1: rank 1 fails in step 6 of attempt 0, attempt 1 runs to the end. Attempt 0's
    files stay where they were (RUN/), attempt 1's go to RUN/attempts/attempt1/; the report says what the first
    attempt lost and analyses the last window."""
    run = _run(runs, tmp_path_factory, "restart", "--fail-rank", "1", "--fail-step", "5", "--how", "cuda",
               "--first-attempt-only", torchrun=("--max-restarts", "1"))
    assert json.loads((run / "run.json").read_text())["exit_code"] == 0
    assert (run / "errors" / "rank1.json").is_file()
    assert sorted(p.name for p in (run / "attempts" / "attempt1" / "traces").glob("rank*")) == \
        ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"]
    assert sorted(p.name for p in (run / "traces").glob("rank*")) == ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"]
    fail = failure_json(run)
    check_first(fail, 1, "cuda_illegal_access", "RuntimeError", "FAIL-CUDA", 6)
    assert fail["attempt"] == 0
    a0, a1 = fail["attempts"]
    assert (a0["attempt"], a0["steps"], a0["steps_lost"], a0["ended_by"]["rank"]) == (0, 6, 6, 1)
    assert a0["time_lost_s"] > 0
    assert (a1["attempt"], a1["failed"], a1["steps"]) == (1, False, 12)
    doc = report_json(run)
    top = doc["findings"][0]
    assert top["id"] == "failure" and top["recovered"]
    assert top["title"].startswith("Attempt 0 died and torchrun restarted the job: rank 1 failed first")
    assert "(6 step(s), " in top["title"]
    assert any("attempts" in s for s in top["suggestions"])
    assert all("attempts/attempt1" in r["file"] for r in doc["ranks"])  # the last window: attempt 1's
