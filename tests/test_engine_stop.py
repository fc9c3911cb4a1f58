"""Stopping a report stops its workers: real processes, real signals.

``traceread report`` with two worker processes reads a simulated 4-rank job from a real HTTP server
on 127.0.0.1 that this test runs: it answers listings (HEAD) at once and holds every download (GET)
until the test lets it go. So the test knows, without timing anything, that the report is still
running when it is stopped: both workers are inside their task, each blocked on a download the test
holds (the test finds the worker by the connection it holds), and the report waits for them. Then
the report gets SIGTERM or SIGKILL (neither runs any clean-up in it): whoever waits for its output
(``communicate()``) gets it back at once, and no worker and no resource tracker is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import needs
import psutil
import pytest

needs.module("aiohttp")
needs.module("fsspec")
pytestmark = pytest.mark.slow

#: Hang guards only (a broken report fails here instead of hanging the suite); never reached when it works.
HANG_GUARD_S = 300.0


class Gate:
    """What the server has been asked for: the client ports of the downloads it holds."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.held: list[int] = []
        self.release = threading.Event()

    def hold(self, port: int) -> None:
        with self.cond:
            self.held.append(port)
            self.cond.notify_all()
        self.release.wait(HANG_GUARD_S)

    def wait_for_workers(self, n: int, proc: subprocess.Popen[bytes]) -> dict[int, psutil.Process]:
        """Once ``n`` worker processes of ``proc`` each hold a download here (the rendezvous): every
        process below ``proc`` by pid. A held request whose connection no worker owns (the report's
        own existence check, a GET it closes after the headers) does not count."""
        give_up = time.monotonic() + HANG_GUARD_S
        with self.cond:
            while True:
                assert proc.poll() is None, proc.communicate()[1][-2000:]
                assert time.monotonic() < give_up, f"no {n} workers asked for their files: {self.held}"
                seen = {p.pid: p for p in psutil.Process(proc.pid).children(recursive=True)}
                workers = [p for p in seen.values() if "spawn_main" in " ".join(_cmdline(p))]
                holding = {p.pid for p in workers if _ports(p) & set(self.held)}
                if len(holding) >= n:
                    return seen
                self.cond.wait(0.5)  # wakes on a request; the timeout only re-checks that the report lives


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sim") / "ddp"
    subprocess.run([sys.executable, "-m", "traceread.cli", "simulate", "ddp", "-o", str(out), "--ranks", "4",
                    "--steps", "4"], check=True, capture_output=True, timeout=HANG_GUARD_S)
    return out


@pytest.fixture
def served(job: Path) -> Iterator[tuple[list[str], Gate]]:
    """The job's trace files as http:// URLs, and the gate that holds their downloads."""
    gate = Gate()
    files = {f"/{p.name}": p for p in sorted(job.rglob("*.pt.trace.json*"))}
    assert len(files) == 4, sorted(files)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # quiet
            pass

        def do_HEAD(self) -> None:
            self._head()

        def do_GET(self) -> None:
            if self._head():
                gate.hold(self.client_address[1])  # the rendezvous: the body never comes while the test runs

        def _head(self) -> bool:
            f = files.get(self.path)
            self.send_response(200 if f else 404)
            self.send_header("Content-Length", str(f.stat().st_size if f else 0))
            self.end_headers()
            return f is not None

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield [f"http://127.0.0.1:{httpd.server_address[1]}{name}" for name in files], gate
    finally:
        gate.release.set()
        httpd.shutdown()
        httpd.server_close()


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.NoSuchProcess:
        return []


def _ports(p: psutil.Process) -> set[int]:
    try:
        return {c.laddr.port for c in p.net_connections(kind="tcp") if c.laddr}
    except psutil.NoSuchProcess:
        return set()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_stopped_report_leaves_no_worker(served: tuple[list[str], Gate], tmp_path: Path, sig: signal.Signals) -> None:
    urls, gate = served
    env = dict(os.environ, TRACEREAD_CACHE_DIR=str(tmp_path / "cache"), TRACEREAD_URL_TIMEOUT=str(HANG_GUARD_S))
    proc = subprocess.Popen([sys.executable, "-m", "traceread.cli", "report", *urls, "-j", "2", "--no-cache",
                             "--format", "json", "-o", str(tmp_path / "r.json")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    seen: dict[int, psutil.Process] = {}
    try:
        seen.update(gate.wait_for_workers(2, proc))  # both workers blocked on a download: the report cannot end
        assert any("resource_tracker" in " ".join(_cmdline(p)) for p in seen.values() if _alive(p))
        assert proc.poll() is None
        proc.send_signal(sig)
        proc.communicate(timeout=60)  # its output ends: nobody holds its stdout/stderr any more
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        left = [p for p in seen.values() if _alive(p)]
        give_up = time.monotonic() + 60
        while left and time.monotonic() < give_up:  # the kernel ends them (PDEATHSIG); reaping takes a moment
            time.sleep(0.1)
            left = [p for p in left if _alive(p)]
        for p in left:
            p.kill()
    assert proc.returncode == -sig
    assert not left, [" ".join(p.cmdline())[-80:] for p in left]
