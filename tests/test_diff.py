"""``traceread diff``: two runs side by side, on simulated runs whose difference is known."""

from __future__ import annotations

import json
from pathlib import Path
from statistics import mean, median

import pytest
from click.testing import CliRunner

from traceread.build.report import ReportOptions, build_report
from traceread.commands.diff import diff
from traceread.compare.diff import diff_reports
from traceread.render.diff_view import render_diff


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Baseline: 4 healthy ranks. Candidate: the same job with rank 1's GPU 2 ms slower per step."""
    from traceread.simulate import simulate

    a = tmp_path_factory.mktemp("base")
    b = tmp_path_factory.mktemp("slow")
    simulate("ddp", a, ranks=4, steps=3, layers=2, jitter=0.0)
    simulate("ddp", b, ranks=4, steps=3, layers=2, jitter=0.0, stragglers=[(1, 2000.0, "gpu")])
    return a, b


def test_diff_against_itself_is_zero(runs: tuple[Path, Path]) -> None:
    rep = build_report([runs[0]], ReportOptions(workers=1, use_cache=False))
    d = diff_reports(rep, rep)  # type: ignore[arg-type]
    assert d["step_us"]["delta"] == 0.0 and d["step_us"]["pct"] == 0.0
    assert all(v["delta"] in (0.0, None) for v in d["breakdown"].values())
    assert all(k["delta"] == 0.0 for k in d["kernels"])


def test_diff_finds_the_slowdown(runs: tuple[Path, Path]) -> None:
    ra = build_report([runs[0]], ReportOptions(workers=1, use_cache=False))
    rb = build_report([runs[1]], ReportOptions(workers=1, use_cache=False))
    d = diff_reports(ra, rb)  # type: ignore[arg-type]
    step = d["step_us"]
    # median over ranks of each rank's mean step duration (from the step entries)
    assert step["a"] == pytest.approx(median(mean(s["duration_us"] for s in r["steps"]) for r in ra["ranks"]))
    # the whole job waits for rank 1: every step grows by about the injected 2 ms
    assert step["delta"] == pytest.approx(2000.0, rel=0.25)
    assert d["breakdown"]["exposed_comm_us"]["delta"] > 1000.0  # the others wait in the all-reduce
    straggler = next(f for f in d["findings"] if f["id"] == "straggler")
    assert straggler["a"] is None and straggler["b"] > 1000.0
    text = render_diff(d)
    assert "ANSWER: B is slower by" in text and "exposed comm" in text


def test_diff_cli_json(runs: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "d.json"
    res = CliRunner().invoke(diff, [str(runs[0]), str(runs[1]), "--format", "json", "-o", str(out)])
    assert res.exit_code == 0, res.output
    d = json.loads(out.read_text())
    assert d["schema"] == "traceread.diff/1" and d["step_us"]["delta"] > 0
    assert {"a", "b", "breakdown", "operators", "kernels", "collectives", "findings"} <= set(d)
    # rank 0's operators (the detailed rank) did not change: none is listed, all are counted as unchanged
    assert d["operators"] == [] and d["operators_unchanged"] > 0
    res = CliRunner().invoke(diff, [str(runs[0]), str(tmp_path / "missing")])
    assert res.exit_code == 2
