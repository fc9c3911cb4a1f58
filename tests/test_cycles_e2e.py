"""End-to-end: ``traceread collect --repeat K`` / ``--every N`` around real 2-rank torchrun jobs (gloo, CPU)
keep every cycle, and ``traceread report`` reads each one; a job compiling inside the window is warm-up."""

from __future__ import annotations

import json
from pathlib import Path

import needs
import pytest
import test_collect_e2e  # (same launcher helper: torchrun on a free port)
from click.testing import CliRunner
from test_collect_e2e import collect

from traceread.assemble.report import ReportOptions, build_report
from traceread.cli import cli

needs.module("torch")
pytestmark = pytest.mark.slow
COMPILE_JOB = Path(__file__).resolve().parent / "jobs" / "compile_train.py"


def _collect_run(tmp_path: Path, steps: int, schedule: list[str]) -> tuple[Path, dict]:
    """The 2-rank job under ``traceread collect`` with ``schedule``; (RUN, its run.json)."""
    run = tmp_path / "run"
    res = collect(run, ["--steps", str(steps)], [*schedule, "--hang-timeout", "60"])
    assert res.returncode == 0, res.stderr[-3000:]
    return run, json.loads((run / "run.json").read_text())


def _steps(rep: dict) -> list[int]:
    return sorted({s["step"] for e in rep["ranks"] for s in e["steps"]})


def test_repeat_3_keeps_three_cycles_and_reports_each(tmp_path: Path) -> None:
    run, doc = _collect_run(tmp_path, 12, ["--repeat", "3", "--wait", "0", "--warmup", "1", "--active", "2"])
    assert [(c["cycle"], c["steps"], c["ranks"]) for c in doc["cycles"]] == [
        (1, [1, 2], [0, 1]), (2, [4, 5], [0, 1]), (3, [7, 8], [0, 1])]
    assert all(c["start_ns"] <= c["end_ns"] and c["start_time"].endswith("Z") for c in doc["cycles"])
    for c in (1, 2, 3):
        assert sorted(p.name for p in (run / "traces" / f"cycle{c}").iterdir()) == [
            "rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"]
    assert not list((run / "traces").glob("rank*"))  # nothing left at the single-cycle path
    opts = ReportOptions(workers=1, use_cache=False)
    for c, steps in ((1, [1, 2]), (2, [4, 5]), (3, [7, 8])):
        rep = build_report([run], ReportOptions(workers=1, cycle=str(c)))
        assert [e["rank"] for e in rep["ranks"]] == [0, 1] and _steps(rep) == steps
        assert rep["source"]["cycle"]["label"] == f"1:{c}"
    latest = build_report([run], opts)
    assert latest["source"]["cycle"]["complete"] and latest["source"]["cycle"]["cycle"] in (2, 3)
    res = CliRunner().invoke(cli, ["report", str(run), "--cycle", "all", "--format", "json"])
    assert res.exit_code == 0, res.output[-2000:]
    drift = json.loads(res.output)["drift"]
    assert [r["steps"] for r in drift["cycles"]] == [[1, 2], [4, 5], [7, 8]]
    assert all(r["step_us"] and r["step_us"] > 0 for r in drift["cycles"]) and drift["headline"]


def test_every_n_steps_is_capped_keeping_first_and_latest(tmp_path: Path) -> None:
    run, doc = _collect_run(tmp_path, 22, ["--every", "4", "--warmup", "1", "--active", "1", "--max-cycles", "3"])
    rows = [(c["cycle"], c["steps"], c["kept"]) for c in doc["cycles"]]
    assert rows == [(1, [3, 3], True), (2, [7, 7], False), (3, [11, 11], False), (4, [15, 15], True),
                    (5, [19, 19], True)]
    assert doc["cycles"][1]["dropped_ranks"] == [0, 1]
    assert sorted(p.name for p in (run / "traces").iterdir()) == ["cycle1", "cycle4", "cycle5"]
    res = CliRunner().invoke(cli, ["report", str(run), "--cycle", "all", "--format", "json"])
    assert res.exit_code == 0, res.output[-2000:]
    assert [r["label"] for r in json.loads(res.output)["drift"]["cycles"]] == ["1:1", "1:4", "1:5"]


def test_compilation_in_the_window_is_warmup_and_not_the_default(tmp_path: Path) -> None:
    """compile_train.py compiles (torch.compile, aot_eager) at its third step: cycle 1 (profiler steps
    1-3) holds real TorchDynamo/AOTAutograd compilation spans, cycle 2 (steps 5-7) is steady. (A warm-up
    step before each cycle keeps the previous cycle's export out of the recorded steps.)"""
    run = tmp_path / "run"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(test_collect_e2e, "JOB", COMPILE_JOB)
        res = collect(run, ["--steps", "12"], ["--repeat", "2", "--wait", "0", "--warmup", "1", "--active", "3",
                                               "--hang-timeout", "60"], timeout=180)
    assert "Profiler clears events" not in res.stderr  # torch's per-cycle warning stays out of the job's output
    assert res.returncode == 0, res.stderr[-3000:]
    (run / "launcher.log").unlink()
    rep = build_report([run], ReportOptions(workers=1))
    c1, c2 = rep["source"]["cycles"]
    assert c1["steps"] == [1, 3] and c2["steps"] == [5, 7]
    assert c1["warmup"] is True and any("_compile.compile_inner (dynamo_timed)" in r for r in c1["warmup_reasons"]), c1
    # cycle 2 holds no start-up work (its first-step ratio is left free: 3 CPU steps on a loaded box are noisy)
    assert not any("compilation" in r for r in c2["warmup_reasons"]) and rep["source"]["cycle"]["cycle"] == 2
    early = build_report([run], ReportOptions(workers=1, cycle="1"))
    assert any(w.startswith("recorded steps look like warm-up") and "compilation" in w for w in early["warnings"])
