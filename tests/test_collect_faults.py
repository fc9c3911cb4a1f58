"""Faults around ``traceread collect``, each on a real 2-rank torchrun/gloo job (tests/jobs/fault_train.py).

A rank SIGKILLed mid-step; SIGTERM and SIGINT to the collector (children gone, nothing orphaned, the
traces written so far complete and readable); the run folder becoming unwritable mid-run (the job
finishes with its own exit code); a job that never imports torch; ``sys.exit(3)`` (the command's exit
code kept, compared with the same command run without traceread).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import needs
import psutil
import pytest
from test_collect_e2e import free_port

needs.module("torch")
JOBS = Path(__file__).resolve().parent / "jobs"
FAULT_JOB = JOBS / "fault_train.py"
pytestmark = pytest.mark.slow
#: A trace early (after optimizer step 4), so a fault later in the run has one to keep intact.
EARLY_WINDOW = ["--wait", "0", "--warmup", "1", "--active", "2"]


def torchrun(script: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
            str(free_port()), "--monitor-interval", "0.2", str(script), *args]


def collect_cmd(run: Path, job: list[str], *collect_args: str) -> list[str]:
    return [sys.executable, "-m", "traceread.cli", "collect", "-o", str(run), "--hang-timeout", "120",
            *collect_args, "--", *job]


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("TRACEREAD_")}
    e["OMP_NUM_THREADS"] = "1"
    return e


def start(cmd: list[str]) -> tuple[subprocess.Popen, dict[int, psutil.Process]]:
    proc = subprocess.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, {}


def watch_descendants(proc: subprocess.Popen, seen: dict[int, psutil.Process]) -> None:
    """Remember every process below the collector (torchrun, its agent, the ranks)."""
    try:
        for child in psutil.Process(proc.pid).children(recursive=True):
            seen.setdefault(child.pid, child)
    except psutil.NoSuchProcess:
        pass


def wait_for(cond, proc: subprocess.Popen, seen: dict[int, psutil.Process], timeout: float = 300.0) -> None:  # type: ignore[no-untyped-def]
    """Until ``cond()`` (a rendezvous on what the job writes); ``timeout`` is a hang guard only."""
    deadline = time.monotonic() + timeout
    while not cond():
        watch_descendants(proc, seen)
        assert proc.poll() is None, f"collector ended early: {proc.communicate()[1][-2000:]}"
        assert time.monotonic() < deadline, "timed out waiting for the job"
        time.sleep(0.1)
    watch_descendants(proc, seen)


def assert_no_orphans(seen: dict[int, psutil.Process], grace: float = 60.0) -> None:
    """Every process seen is gone; ``grace`` bounds the wait (a hang guard: they end at once or never)."""
    deadline = time.monotonic() + grace
    alive = list(seen.values())
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if _running(p)]
        time.sleep(0.2)
    assert not alive, f"left running: {[(p.pid, p.cmdline()[-3:]) for p in alive if _running(p)]}"


def _running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def assert_traces_readable(run: Path, ranks: list[int]) -> None:
    from traceread.engine.jobs import read_traces

    assert not list((run / "traces").glob(".*")), "temporary export files left behind"
    files = sorted((run / "traces").glob("rank*.pt.trace.json.gz"))
    assert [f.name for f in files] == [f"rank{r}.pt.trace.json.gz" for r in ranks]
    ts = read_traces([run / "traces"], use_cache=False)
    assert [rt.rank for rt in ts.ranks] == ranks and not ts.failures


def run_json(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())


def test_rank_sigkilled_mid_step(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc, seen = start(collect_cmd(run, torchrun(FAULT_JOB, "--steps", "40", "--step-sleep", "0.05",
                                                 "--kill-rank", "1", "--kill-step", "8"), *EARLY_WINDOW))
    wait_for(lambda: proc.poll() is not None or len(list((run / "traces").glob("rank*.gz"))) == 2, proc, seen)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode != 0  # torchrun reports the failed worker ...
    assert run_json(run)["exit_code"] == proc.returncode  # ... and that code is what collect exits with
    assert "Traceback" not in "\n".join(line for line in err.splitlines() if line.startswith("[traceread]"))
    assert_traces_readable(run, [0, 1])  # written at step 4, before the kill at step 8
    assert_no_orphans(seen)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_to_collector_stops_everything(tmp_path: Path, sig: signal.Signals) -> None:
    run = tmp_path / "run"
    proc, seen = start(collect_cmd(run, torchrun(FAULT_JOB, "--steps", "100000", "--step-sleep", "0.05"),
                                   *EARLY_WINDOW))
    wait_for(lambda: len(list((run / "traces").glob("rank*.gz"))) == 2, proc, seen)
    assert len([p for p in seen.values() if _running(p)]) >= 3  # torchrun + 2 ranks
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    doc = run_json(run)  # the collector finished its bookkeeping
    assert doc["exit_code"] == proc.returncode and sorted(doc["ranks"]) == ["0", "1"]
    assert_no_orphans(seen)
    assert_traces_readable(run, [0, 1])


def _make_unwritable(path: Path) -> list[str]:
    """chattr +i (root ignores permission bits) or chmod a-w; returns the command that undoes it.
    Where neither takes (root on a file system without chattr), the folder is moved away and a plain
    file put in its place: every write under the path then fails for any user."""
    if os.geteuid() == 0 and shutil.which("chattr"):
        if subprocess.run(["chattr", "-R", "+i", str(path)], capture_output=True).returncode == 0:
            return ["chattr", "-R", "-i", str(path)]
    if os.geteuid() != 0:
        subprocess.run(["chmod", "-R", "a-w", str(path)], check=True)
        return ["chmod", "-R", "u+w", str(path)]
    away = path.with_name(path.name + ".away")
    path.rename(away)
    path.write_text("not a folder")
    return ["sh", "-c", f'rm -f "{path}" && mv "{away}" "{path}"']


def test_run_folder_unwritable_mid_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc, seen = start(collect_cmd(run, torchrun(FAULT_JOB, "--steps", "30", "--step-sleep", "0.1"),
                                   "--wait", "10", "--warmup", "1", "--active", "2"))
    wait_for(lambda: len([p for p in (run / "progress").glob("rank*") if p.name[4:].isdigit()]) == 2, proc, seen)
    undo = _make_unwritable(run)
    try:
        with pytest.raises(OSError):
            (run / "probe").write_text("x")
        out, err = proc.communicate(timeout=120)
    finally:
        subprocess.run(undo, capture_output=True)
    assert proc.returncode == 0, err[-3000:]  # the job's own exit code
    assert "step 29 loss" in out  # every step ran
    assert "Traceback" not in err
    assert_no_orphans(seen)


def test_job_that_never_imports_torch(tmp_path: Path) -> None:
    run = tmp_path / "run"
    res = subprocess.run(collect_cmd(run, torchrun(JOBS / "no_torch.py")), env=env(), capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "rank 0 of 2 done without torch" in res.stdout and "rank 1 of 2 done without torch" in res.stdout
    assert "Traceback" not in res.stderr
    doc = run_json(run)
    assert doc["exit_code"] == 0 and not list((run / "traces").glob("*"))
    for log in (run / "inject").glob("rank*.log"):
        assert "FAILED" not in log.read_text()


def test_exit_code_3_kept(tmp_path: Path) -> None:
    job = torchrun(FAULT_JOB, "--steps", "3", "--exit-code", "3")
    bare = subprocess.run(job, env=env(), capture_output=True, text=True, timeout=120)
    job[job.index("--master-port") + 1] = str(free_port())
    res = subprocess.run(collect_cmd(tmp_path / "run", job), env=env(), capture_output=True, text=True,
                         timeout=120)
    assert bare.returncode != 0 and res.returncode == bare.returncode, (bare.returncode, res.stderr[-2000:])
    single = subprocess.run(collect_cmd(tmp_path / "single", [sys.executable, "-c", "import sys; sys.exit(3)"]),
                            env=env(), capture_output=True, text=True, timeout=60)
    assert single.returncode == 3, single.stderr[-2000:]
    assert run_json(tmp_path / "single")["exit_code"] == 3
