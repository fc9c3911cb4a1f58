"""Hostile strings in traces, logs and file names reach every renderer inert.

A real run folder is written by the simulator, then every string a trace can carry (kernel names,
operator names, annotations, thread names, process-group descriptions and other ``args``) gets a
payload that clears the screen (``ESC[2J``), resets the terminal (``ESC c``), retitles the window
(OSC 0), plants a hyperlink (OSC 8), starts an 8-bit CSI, reverses text (U+202E), and carries HTML
and rich markup. File names, NCCL log lines and host names, Flight Recorder / stack-dump frames and
hang evidence get the same. Then: terminal (real rich terminal codes), ``--format text``, JSON, HTML,
``hang``, ``diff``, error lines, ``simulate`` and ``collect`` messages. Terminal/text output must
hold no control character except newline/tab (and rich's own colour codes on a real terminal),
show the payload escaped, and print rich markup literally; JSON must be valid and keep the exact
data; HTML must escape the markup.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from rich.console import Console

from traceread.cli import cli
from traceread.textsafe import clean, clean_lines

REPO = Path(__file__).resolve().parents[1]
HANG_SAMPLE = REPO / "sample_traces" / "cpu_hang_gloo"

UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
SGR = re.compile("\x1b\\[[0-9;]*m")


def payload(tag: str) -> str:
    return (f"{tag}\x1b[2J\x1b]0;pwned\x07\x1b]8;;http://evil.example/\x1b\\link\x1b]8;;\x1b\\\x9b31m\x1bc"
            f"\u202e<img src=x onerror=alert(1)>[bold red]{tag}[/bold red]")


def assert_inert(text: str, *, tags: tuple[str, ...] = (), terminal_codes: bool = False) -> None:
    """No control survives; each tag's payload is visible, escaped, with its markup printed literally."""
    if terminal_codes:
        text = SGR.sub("", text)  # rich's own colours on a real terminal
    bad = UNSAFE.search(text)
    assert bad is None, f"unescaped {bad.group(0)!r} at {text[max(0, bad.start() - 60):bad.start() + 20]!r}"
    assert "<img src=x" not in text or "\\x1b" in text  # only ever inside an escaped payload
    flat = re.sub(r"[\s|]+", "", text)  # tables wrap long names across lines and cells
    for tag in tags:
        t = re.sub(r"\s+", "", tag)
        assert f"{t}\\x1b[2J" in flat, f"payload {tag!r} missing from output"
        assert f"[boldred]{t}[" in flat, f"markup of {tag!r} was interpreted"


def holds(obj: Any, text: str) -> bool:
    """Whether some string in a JSON document contains ``text`` exactly."""
    if isinstance(obj, dict):
        return any(holds(k, text) or holds(v, text) for k, v in obj.items())
    if isinstance(obj, list):
        return any(holds(v, text) for v in obj)
    return isinstance(obj, str) and text in obj


def _walk(obj: Any, key: str, cat: str) -> Any:
    if isinstance(obj, dict):
        return {k: _walk(v, k, cat) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_walk(v, key, cat) for v in obj]
    if isinstance(obj, str) and key not in ("ph", "cat", "Collective name", "dtype", "In msg nelems"):
        return obj + payload(f"{cat}:{key}"[:24])
    return obj


def poison_trace(path: Path) -> None:
    """Append a payload to every string value of every event (not to the keys the reader dispatches on)."""
    doc = json.loads(gzip.decompress(path.read_bytes()))
    events = []
    for e in doc["traceEvents"]:
        cat = "kernel" if e.get("cat") == "kernel" else ("op" if e.get("cat") == "cpu_op" else "ev")
        e2 = dict(e)
        if "name" in e2 and e.get("ph") != "M" and not str(e["name"]).startswith("ProfilerStep#"):
            e2["name"] = e["name"] + payload(cat)
        if isinstance(e.get("args"), dict):
            e2["args"] = _walk(e["args"], "args", cat)
        events.append(e2)
    doc["traceEvents"] = events
    if isinstance(doc.get("distributedInfo"), dict):
        doc["distributedInfo"] = _walk(doc["distributedInfo"], "dist", "pg")
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))


NCCL_LOG = """\
{host}:101:201 [0] NCCL INFO NCCL version 2.21.5+cuda12.4
{host}:101:201 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via NET/Socket/0
other-host:102:202 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via NET/Socket/0
other-host:102:202 [1] misc/socket.cc:483 NCCL WARN socketStartConnect: Connect to 10.0.0.2<45763> failed : {p}
{host}:101:201 [0] NCCL WARN Cuda failure {p}
"""

FILE_TAG = payload("file").replace("/", "_")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hostile")
    clean_run, run = root / "clean", root / "run"
    res = CliRunner().invoke(cli, ["simulate", "ddp", "-o", str(clean_run), "--ranks", "2", "--steps", "3",
                                   "--straggler", "1", "--straggler-delay-us", "3000"])
    assert res.exit_code == 0, res.output
    shutil.copytree(clean_run, run)
    for f in sorted(run.glob("rank*.pt.trace.json.gz")):
        poison_trace(f)
    (run / "rank1.pt.trace.json.gz").rename(run / f"rank1{FILE_TAG}.pt.trace.json.gz")
    (run / f"broken{FILE_TAG}.pt.trace.json").write_text('{"traceEvents": [')
    (run / f"nccl{FILE_TAG}.log").write_text(NCCL_LOG.format(host="evil\x1bc\x9bhost", p=payload("nccl")))
    hang = root / "hang"
    shutil.copytree(HANG_SAMPLE, hang)
    for f in (hang / "stacks").glob("*.txt"):
        f.write_text(f.read_text().replace(" in ", " in " + payload("frame") + "_"))
    for f in (hang / "fr").glob("*.json"):
        doc = json.loads(f.read_text())
        f.write_text(json.dumps(_walk(doc, "fr", "fr")))
    return {"clean": clean_run, "run": run, "hang": hang, "root": root}


def invoke(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args), color=True)  # color=True: click strips nothing


def test_sanitize_escapes_every_control_but_keeps_text() -> None:
    assert clean("a\x1b[2Jb\x07\n\u202e") == "a\\x1b[2Jb\\x07\\x0a\\u202e"
    assert clean("ncclDevKernel_AllReduce [bold] ü 日本") == "ncclDevKernel_AllReduce [bold] ü 日本"
    assert clean_lines("a\n\tb\x9b") == "a\n\tb\\x9b"
    assert UNSAFE.search(clean(payload("x"))) is None


def test_report_text_terminal_and_json(runs: dict[str, Path]) -> None:
    res = invoke("report", str(runs["run"]), "--no-cache", "-j", "1", "--format", "text")
    assert res.exit_code == 0, res.output
    # the backend (distributedInfo), findings (NCCL WARN lines), warnings (file names); process-group
    # names no longer reach the terminal (findings name the group's role), so they are not required
    assert_inert(res.output, tags=("pg:backend", "nccl", "file"))
    res = invoke("report", str(runs["run"]), "--no-cache", "-j", "1", "--no-html")
    assert res.exit_code == 0
    assert_inert(res.output, tags=("nccl", "file"))
    res = invoke("report", str(runs["run"]), "--no-cache", "-j", "1", "--format", "json")
    doc = json.loads(res.stdout)  # valid JSON ...
    assert any(k["name"].endswith(payload("kernel")) for k in doc["kernels"])  # ... exact data
    assert "\x1b" not in res.stdout and "\\u001b" in res.stdout  # controls written as JSON escapes
    assert holds(doc, FILE_TAG) and holds(doc, payload("nccl"))
    from traceread.render import terminal

    buf = io.StringIO()  # a real colour terminal: rich's SGR codes are the only escapes
    terminal.render(doc, Console(file=buf, force_terminal=True, color_system="truecolor", width=200), top=50)
    assert_inert(buf.getvalue(), tags=("nccl", "file"), terminal_codes=True)


def test_html_escapes_every_payload(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    res = invoke("report", str(runs["run"]), "--no-cache", "-j", "1", "-o", str(out))
    assert res.exit_code == 0, res.output
    assert_inert(res.output)
    page = out.read_text()
    assert "<img src=x" not in page
    assert "&lt;img src=x" in page or "\\u003cimg src=x" in page  # the payload is there, escaped


def test_hang_text_json_and_report(runs: dict[str, Path]) -> None:
    res = invoke("hang", str(runs["hang"]))
    assert res.exit_code == 0, res.output
    assert_inert(res.output, tags=("frame",))
    res = invoke("hang", str(runs["hang"]), "--format", "json")
    assert holds(json.loads(res.stdout), payload("frame"))
    res = invoke("report", str(runs["hang"]), "--no-cache", "-j", "1", "--format", "text")
    assert res.exit_code == 0, res.output
    assert_inert(res.output, tags=("frame",))


def test_diff_text_and_json(runs: dict[str, Path]) -> None:
    res = invoke("diff", str(runs["clean"]), str(runs["run"]), "--no-cache", "--top", "200")
    assert res.exit_code == 0, res.output
    assert_inert(res.output)
    assert "x1b[2J" in res.output  # kernel names reach the table (cut at 90 characters), escaped
    res = invoke("diff", str(runs["clean"]), str(runs["run"]), "--no-cache", "--format", "json")
    assert holds(json.loads(res.stdout), payload("kernel"))


def test_error_lines_and_messages(runs: dict[str, Path]) -> None:
    broken = runs["run"] / f"broken{FILE_TAG}.pt.trace.json"
    res = invoke("report", str(broken), "--no-cache")
    assert res.exit_code == 2
    assert_inert(res.output, tags=("file",))
    assert len(res.output.strip().splitlines()) == 1
    out = runs["root"] / f"sim{FILE_TAG}"
    res = invoke("simulate", "ddp", "-o", str(out), "--ranks", "2", "--steps", "2")
    assert res.exit_code == 0, res.output
    assert_inert(res.output, tags=("file",))
    res = invoke("hang", str(out))
    assert res.exit_code == 3
    assert_inert(res.output, tags=("file",))


def test_collect_messages(runs: dict[str, Path]) -> None:
    run = runs["root"] / f"collect{FILE_TAG}"
    proc = subprocess.run([sys.executable, "-m", "traceread.cli", "collect", "-o", str(run), "--no-inject", "--",
                           sys.executable, "-c", "print('job output')"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "job output" in proc.stdout
    assert_inert(proc.stderr, tags=("file",))
