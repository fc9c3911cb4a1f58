"""Stopping a report stops its workers: real processes, real signals.

``traceread report`` on a simulated 4-rank job with two worker processes; once both workers are
busy, the report gets SIGTERM or SIGKILL (neither runs any clean-up in it). Whoever waits for its
output (``communicate()``) gets it back at once, and no worker and no resource tracker is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sim") / "ddp"
    subprocess.run([sys.executable, "-m", "traceread.cli", "simulate", "ddp", "-o", str(out), "--ranks", "4",
                    "--steps", "30"], check=True, capture_output=True, timeout=300)
    return out


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_stopped_report_leaves_no_worker(job: Path, tmp_path: Path, sig: signal.Signals) -> None:
    env = dict(os.environ, TRACEREAD_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.Popen([sys.executable, "-m", "traceread.cli", "report", str(job), "-j", "2", "--no-cache",
                             "--format", "json", "-o", str(tmp_path / "r.json")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    seen: dict[int, psutil.Process] = {}
    deadline = time.monotonic() + 120
    busy_since = None
    while busy_since is None or time.monotonic() - busy_since < 1.5:  # both workers started and working
        assert proc.poll() is None, proc.communicate()[1][-2000:]
        assert time.monotonic() < deadline, "the workers never started"
        for child in psutil.Process(proc.pid).children(recursive=True):
            seen.setdefault(child.pid, child)
        workers = [p for p in seen.values() if _alive(p) and "spawn_main" in " ".join(p.cmdline())]
        if busy_since is None and len(workers) >= 2:
            busy_since = time.monotonic()
        time.sleep(0.05)
    assert any("resource_tracker" in " ".join(p.cmdline()) for p in seen.values() if _alive(p))
    proc.send_signal(sig)
    try:
        proc.communicate(timeout=20)  # its output ends: nobody holds its stdout/stderr any more
    finally:
        left = [p for p in seen.values() if _alive(p)]
        deadline = time.monotonic() + 10
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = [p for p in left if _alive(p)]
        for p in left:
            p.kill()
    assert proc.returncode == -sig
    assert not left, [" ".join(p.cmdline())[-80:] for p in left]
