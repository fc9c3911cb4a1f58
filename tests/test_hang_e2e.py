"""End to end: a real hung gloo job (spawned here) and the collector's sample run, through the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from traceread.analysis.hang.diagnose import diagnose
from traceread.cli import cli

DATA = Path(__file__).parent / "data"
JOB = DATA / "hang_job.py"
REPO = Path(__file__).resolve().parents[1]


def _line_of(path: Path, needle: str) -> int:
    return next(i for i, text in enumerate(path.read_text().splitlines(), 1) if needle in text)


@pytest.mark.slow
def test_live_gloo_hang(tmp_path: Path) -> None:
    run = tmp_path / "run"
    subprocess.run([sys.executable, str(JOB), str(run)], check=True, timeout=120,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    d = diagnose(run)
    assert d is not None
    e = d.entry
    assert e["missing_ranks"] == [1] and e["waiting_ranks"] == [0]
    assert e["op"] == "all_reduce" and e["seq"] == 12
    assert e["stacks"]["1"] == f"hang_job.py:{_line_of(JOB, 'time.sleep(')} in train_step"
    res = CliRunner().invoke(cli, ["hang", str(run), "--format", "json"])
    assert res.exit_code == 0
    assert json.loads(res.output)["missing_ranks"] == [1]


@pytest.mark.slow
def test_collector_sample_run() -> None:
    """``sample_traces/cpu_hang_gloo``: made by ``traceread collect`` around tests/jobs/ddp_train.py."""
    run = REPO / "sample_traces" / "cpu_hang_gloo"
    d = diagnose(run)
    assert d is not None
    assert d.entry["missing_ranks"] == [1] and d.entry["waiting_ranks"] == [0]
    assert d.entry["op"] == "all_reduce"
    script = REPO / "tests" / "jobs" / "ddp_train.py"
    if script.is_file():
        line = _line_of(script, "traceread-test: culprit line")
        assert d.entry["stacks"]["1"].startswith(f"ddp_train.py:{line} in ")
    res = CliRunner().invoke(cli, ["hang", str(run)])
    assert res.exit_code == 0 and res.output.startswith("Rank 1 never joined all_reduce")
    healthy = REPO / "sample_traces" / "cpu_ddp_gloo"
    if healthy.is_dir():
        assert CliRunner().invoke(cli, ["hang", str(healthy)]).exit_code == 3


@pytest.mark.slow
def test_live_multigroup_job_matches_its_truth(tmp_path: Path) -> None:
    """tests/jobs/make_fr_fixtures.py end to end: a fresh 8-process TP2 x PP2 x DP2 torchrun/gloo job that skips a
    collective, its dumps taken on timeout, diagnosed against the truth the job wrote."""
    subprocess.run([sys.executable, str(REPO / "tests" / "jobs" / "make_fr_fixtures.py"), "--only", "skip", "--out",
                    str(tmp_path)], check=True, timeout=300, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    folder = tmp_path / "groups_skip"
    truth = json.loads((folder / "truth.json").read_text())
    e = diagnose(folder, workers=1).entry
    assert [(c["rank"], c["why"]) for c in e["culprits"]] == [(6, "out_of_order")]
    listed = {(g["pg"], g["seq"]): g["waiting"] for g in e["groups"]}
    assert all(listed[(s["pg"], s["seq"])] == s["waiting"] for s in truth["stuck"])
