"""A run folder is only a folder: damaged or hostile side files give one line, never a traceback.

Each case mutates a copy of ``sample_traces/cpu_hang_gloo`` (a real collected gloo hang) and runs
``report`` and ``hang`` on it; the diagnosis that does not depend on the damaged field must survive.
Also: the HTML page of a trace whose kernels have no name.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from traceread.cli import cli

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
    if not (SAMPLE / "hang.json").is_file():
        pytest.skip("sample_traces/cpu_hang_gloo not generated")
    dest = tmp_path / "run"
    shutil.copytree(SAMPLE, dest)
    return dest


def _invoke(args: list[str], tmp_path: Path) -> tuple[int, str]:
    res = CliRunner().invoke(cli, args, env={"TRACEREAD_CACHE_DIR": str(tmp_path / "cache")})
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output
    return res.exit_code, res.output


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_damaged_run_folder_is_one_line_not_a_traceback(run: Path, tmp_path: Path, mutation: str) -> None:
    MUTATIONS[mutation](run)
    code, out = _invoke(["hang", str(run)], tmp_path)
    assert code == 0 and out.startswith("Rank 1 never joined all_reduce")  # the FR evidence still answers
    code, out = _invoke(["report", str(run), "--format", "json"], tmp_path)
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
    _, out = _invoke(["report", str(run), "--format", "text"], tmp_path)
    assert "run.json: cannot read (JSON nested too deeply)" in out


def test_html_with_kernels_without_a_name(tmp_path: Path) -> None:
    src = next((SAMPLE.parent / "h100_transformer_1gpu" / "traces").glob("*.pt.trace.json.gz"))
    doc = json.loads(gzip.decompress(src.read_bytes()))
    for e in doc["traceEvents"]:
        if e.get("cat") == "kernel":
            e["name"] = None
    trace = tmp_path / "rank0.pt.trace.json"
    trace.write_text(json.dumps(doc))
    code, out = _invoke(["report", str(trace), "--format", "html", "-o", str(tmp_path / "r.html")], tmp_path)
    assert code == 0, out
    assert "(kernel without a name)" in (tmp_path / "r.html").read_text()
