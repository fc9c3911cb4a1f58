"""A run folder is only a folder: damaged or hostile side files give one line, never a traceback.

Each case mutates a copy of ``sample_traces/cpu_hang_gloo`` (a real collected gloo hang) and runs
``report`` and ``hang`` on it; the diagnosis that does not depend on the damaged field must survive.
Also: the HTML page of a trace whose kernels have no name.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

SAMPLE = Path(__file__).resolve().parents[1] / "sample_traces" / "cpu_hang_gloo"


def _edit(name: str, fn: Callable[[dict], None]) -> Callable[[Path], None]:
    def apply(run: Path) -> None:
        doc = json.loads((run / name).read_text())
        fn(doc)
        (run / name).write_text(json.dumps(doc))
    return apply


def _fifo(name: str) -> Callable[[Path], None]:
    def apply(run: Path) -> None:
        (run / name).unlink()
        os.mkfifo(run / name)
    return apply


MUTATIONS: dict[str, Callable[[Path], None]] = {
    "world_size 10**12": _edit("run.json", lambda d: d.update(world_size=10**12)),
    "world.world_size 1e12 and -3": _edit("run.json", lambda d: d.update(world={"world_size": 1e12}, world_size=-3)),
    "world_size a string of 5000 digits": _edit("run.json", lambda d: d.update(world_size="9" * 5000)),
    "last_step_per_rank a list": _edit("hang.json", lambda d: d.update(last_step_per_rank=[5, 4])),
    "last_step_per_rank huge rank keys": _edit("hang.json", lambda d: d.update(last_step_per_rank={"9" * 40: 3, "1": "x"})),
    "unanswered_ranks a map": _edit("hang.json", lambda d: d.update(unanswered_ranks={"1": 1})),
    "timeout_s a list": _edit("hang.json", lambda d: d.update(timeout_s=[1])),
    "run.json nested 100,000 deep": lambda run: (run / "run.json").write_text("[" * 100_000 + "]" * 100_000),
    "run.json a FIFO": _fifo("run.json"),
}


@pytest.fixture
def run(tmp_path: Path) -> Path:
    dest = tmp_path / "run"
    shutil.copytree(SAMPLE, dest)
    return dest


def _invoke(args: list[str], tmp_path: Path) -> tuple[int, str]:
    """``traceread ARGS`` through the console entry point (its one-line error handling included), in
    this process; stdout + stderr. An exception escaping it fails the test with its traceback."""
    from traceread.cli import main

    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    saved = sys.argv, os.environ.get("TRACEREAD_CACHE_DIR")
    sys.argv = ["traceread", *args]
    os.environ["TRACEREAD_CACHE_DIR"] = str(tmp_path / "cache")
    code = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = saved[0]
        if saved[1] is None:
            os.environ.pop("TRACEREAD_CACHE_DIR", None)
        else:
            os.environ["TRACEREAD_CACHE_DIR"] = saved[1]
    text = "".join(s.buffer.getvalue().decode("utf-8", "replace") for s in (out, err) if not s.flush())  # type: ignore[attr-defined]
    assert "Traceback" not in text
    return code, text


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_damaged_run_folder_is_one_line_not_a_traceback(run: Path, tmp_path: Path, mutation: str) -> None:
    MUTATIONS[mutation](run)
    code, out = _invoke(["hang", str(run)], tmp_path)
    assert code == 0 and out.startswith("Rank 1 never joined all_reduce")  # the FR evidence still answers
    code, out = _invoke(["report", str(run), "-j", "1", "--format", "json"], tmp_path)
    assert code == 0
    doc = json.loads(out[out.index("{"):])
    assert doc["hang"]["missing_ranks"] == [1] and len(doc["ranks"]) == 2


def test_damaged_fields_are_named(run: Path, tmp_path: Path) -> None:
    MUTATIONS["world_size 10**12"](run)
    MUTATIONS["last_step_per_rank a list"](run)
    _, out = _invoke(["hang", str(run)], tmp_path)
    assert "run.json: world_size 1000000000000 is not a possible number of ranks; ignored" in out
    assert "hang.json: last_step_per_rank is not a map of rank to step; nothing used" in out
    (run / "run.json").write_text("[" * 100_000 + "]" * 100_000)
    _, out = _invoke(["report", str(run), "-j", "1", "--format", "text"], tmp_path)
    assert "run.json: cannot read (JSON nested too deeply)" in " ".join(out.split())  # a long path may wrap


def test_html_with_kernels_without_a_name(tmp_path: Path) -> None:
    src = next((SAMPLE.parent / "h100_transformer_1gpu" / "traces").glob("*.pt.trace.json.gz"))
    doc = json.loads(gzip.decompress(src.read_bytes()))
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel":
            e["name"] = None
    trace = tmp_path / "rank0.pt.trace.json"
    trace.write_text(json.dumps(doc))
    code, out = _invoke(["report", str(trace), "-j", "1", "--format", "html", "-o", str(tmp_path / "r.html")], tmp_path)
    assert code == 0, out
    assert "(kernel without a name)" in (tmp_path / "r.html").read_text()


def test_export_into_the_run_folder_is_not_a_rank(tmp_path: Path) -> None:
    run = tmp_path / "ddp"
    shutil.copytree(SAMPLE.parent / "cpu_ddp_gloo", run)
    out = run / "timeline.json.gz"
    sizes = []
    for _ in range(2):
        code, text = _invoke(["export", str(run), "-j", "1", "-o", str(out)], tmp_path)
        assert code == 0 and ", 2 rank(s)," in text, text
        sizes.append(out.stat().st_size)
    assert sizes[1] == sizes[0]  # the second export did not swallow the first
    code, text = _invoke(["report", str(run), "-j", "1", "--format", "json"], tmp_path)
    doc = json.loads(text[text.index("{"):])
    assert code == 0 and [e["rank"] for e in doc["ranks"]] == [0, 1] and doc["source"]["world_size"] == 2
    assert any("timeline.json.gz: not a Kineto trace: a timeline written by traceread export" in w
               for w in doc["warnings"])


def test_rank_outside_the_world_size_is_refused(tmp_path: Path) -> None:
    """docs/reader.md: files that cannot be one job are refused, a rank outside the world size included."""
    run = tmp_path / "ddp"
    shutil.copytree(SAMPLE.parent / "cpu_ddp_gloo", run)
    doc = json.loads(gzip.decompress((run / "traces" / "rank0.pt.trace.json.gz").read_bytes()))
    doc.pop("distributedInfo")
    (run / "traces" / "extra.pt.trace.json").write_text(json.dumps(doc))  # no rank in its name or its content
    code, text = _invoke(["report", str(run), "-j", "1", "--format", "json"], tmp_path)
    assert code == 2 and "extra.pt.trace.json" in text
    # refused either as a rank outside the world size or, earlier, as a file of another job (no
    # distributedInfo among files that have it: docs/layout.md, one job per report)
    assert ("rank 2 (given by file order" in text and "is outside world size 2" in text) or "different jobs" in text


def test_export_line_shows_a_hostile_path_inert(tmp_path: Path) -> None:
    out = tmp_path / "t\x1b[2J\x1b]0;pwned\x07.json.gz"
    code, text = _invoke(["export", str(SAMPLE.parent / "cpu_ddp_gloo"), "-j", "1", "-o", str(out)], tmp_path)
    assert code == 0 and out.is_file()
    assert "\x1b" not in text and "\x07" not in text and "wrote " in text and "\\x1b[2J" in text
