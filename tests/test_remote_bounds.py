"""URL inputs are bounded: a silent server costs the timeout, not 300 s; an endless or huge response
stops at ``--max-rank-bytes`` and leaves nothing on disk; every message names the URL.

A real HTTP server on 127.0.0.1 (``http.server`` in a thread) serves four paths: a real trace
(the control), one that never answers, one that streams forever without a length, and one that
says it is bigger than the bound. No assertion times anything: the server says what happened on
its side (the silent path was still holding the connection when the report gave up; the endless
path stopped because the client closed, not at its cap), so a slow machine changes no result.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import needs
import pytest

needs.module("aiohttp")
needs.module("fsspec")

SAMPLE = Path(__file__).resolve().parents[1] / "sample_traces" / "cpu_ddp_gloo" / "traces" / "rank0.pt.trace.json.gz"
STOP = threading.Event()
ENDLESS_CAP = 96 << 20
#: How long the silent path holds a connection: a hang guard for a client without timeouts, never
#: reached by a working one (it gives up after its 2 s of silence, however slow the machine).
SILENT_GUARD_S = 120.0
SENT: dict[str, int] = {}
#: Silent connections the server still holds (the client must leave first), and how the endless
#: stream ended ("client closed" | "cap" | "stopped"), set when it ends.
HOLDING = {"silent": 0}
HOLDING_LOCK = threading.Lock()
ENDED: dict[str, str] = {}
ENDLESS_DONE = threading.Event()


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _answer(self, body: bool) -> None:
        if self.path.startswith("/silent/"):
            with HOLDING_LOCK:
                HOLDING["silent"] += 1
            try:
                STOP.wait(SILENT_GUARD_S)  # accepts the connection, does not answer
            finally:
                with HOLDING_LOCK:
                    HOLDING["silent"] -= 1
            return
        if self.path.startswith("/endless/"):
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.end_headers()  # no length: HTTP/1.0, the body runs until the connection closes
            if not body:
                return
            block = gzip.compress(b" " * 1024)[:1024] * 64
            sent = 0
            ended = "cap"
            try:
                while sent < ENDLESS_CAP:  # "endless": far more than any bound under test
                    if STOP.is_set():
                        ended = "stopped"
                        break
                    self.wfile.write(block)
                    sent += len(block)
                    SENT[self.path] = sent
            except OSError:
                ended = "client closed"  # the client stopped reading: what we want
            ENDED[self.path] = ended
            ENDLESS_DONE.set()
            return
        if self.path.startswith("/huge/"):
            self.send_response(200)
            self.send_header("Content-Length", str(50 << 30))
            self.end_headers()
            return  # says 50 GiB, sends nothing: it must not even be asked for
        if self.path.startswith("/ok/"):
            data = SAMPLE.read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if body:
                self.wfile.write(data)
            return
        self.send_response(404)
        self.end_headers()


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    STOP.clear()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        STOP.set()
        httpd.shutdown()
        httpd.server_close()


def _run(args: list[str], tmp_path: Path, **env: str) -> tuple[int, str]:
    """``traceread ARGS`` in this process through the console entry point; (exit code, output)."""
    from traceread.cli import main

    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    saved_env = {k: os.environ.get(k) for k in (*env, "TRACEREAD_CACHE_DIR")}
    os.environ.update(env, TRACEREAD_CACHE_DIR=str(tmp_path / "cache"))
    saved_argv, sys.argv = sys.argv, ["traceread", *args]
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        sys.argv = saved_argv
        for k, v in saved_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    out.flush()
    return code, out.buffer.getvalue().decode()  # type: ignore[attr-defined]


def _remote_temps() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("traceread-remote-*")}


def test_control_a_served_trace_reads(server: str, tmp_path: Path) -> None:
    code, out = _run(["report", f"{server}/ok/rank0.pt.trace.json.gz", "-j", "1", "--format", "text"], tmp_path)
    assert code == 0 and "1 rank(s)" in out, out


def test_silent_server_costs_the_timeout_and_names_the_url(server: str, tmp_path: Path) -> None:
    url = f"{server}/silent/rank0.pt.trace.json.gz"
    code, out = _run(["report", url, "-j", "1", "--format", "text"], tmp_path, TRACEREAD_URL_TIMEOUT="2")
    assert HOLDING["silent"] >= 1  # the server was still silent: the client gave up on its own timeout
    assert code in (2, 3), (code, out)
    assert f"{url}: cannot list: no answer within 2 s ($TRACEREAD_URL_TIMEOUT sets the limit)" in out, out
    assert "no such file or folder" not in out and "Traceback" not in out


def test_endless_response_stops_at_the_bound_and_leaves_nothing(server: str, tmp_path: Path) -> None:
    url = f"{server}/endless/rank0.pt.trace.json.gz"
    before = _remote_temps()
    ENDLESS_DONE.clear()
    code, out = _run(["report", url, "-j", "1", "--format", "text", "--max-rank-bytes", "8MiB"], tmp_path)
    assert code in (2, 3) and "Traceback" not in out
    assert f"{url}: more than 8 MiB (--max-rank-bytes) while downloading: stopped, nothing kept" in out, out
    assert _remote_temps() == before  # the partial download is gone
    assert ENDLESS_DONE.wait(SILENT_GUARD_S)  # the server's writes fail once the client has closed
    assert ENDED["/endless/rank0.pt.trace.json.gz"] == "client closed"  # the client stopped reading ...
    assert SENT["/endless/rank0.pt.trace.json.gz"] < ENDLESS_CAP // 2  # ... long before the cap


def test_object_bigger_than_the_bound_is_not_downloaded(server: str, tmp_path: Path) -> None:
    url = f"{server}/huge/rank0.pt.trace.json.gz"
    code, out = _run(["report", url, "-j", "1", "--format", "text", "--max-rank-bytes", "1GiB"], tmp_path)
    assert code in (2, 3)
    assert f"{url}: 50 GiB: larger than --max-rank-bytes (1 GiB); not downloaded" in out, out
