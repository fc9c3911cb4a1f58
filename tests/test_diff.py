"""``traceread diff``: two runs side by side, on simulated runs whose difference is known."""

from __future__ import annotations

import json
import re
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


def test_identical_runs_say_no_significant_change(runs: tuple[Path, Path]) -> None:
    rep = build_report([runs[0]], ReportOptions(workers=1, use_cache=False))
    d = diff_reports(rep, rep)  # type: ignore[arg-type]
    assert d["verdict"] == "same" and d["answer"][0].startswith("No significant change in step time: +0 µs/step")
    assert d["appeared"] == [] and d["vanished"] == []
    assert d["kernels"] == [] and d["operators"] == [] and d["collectives"] == []
    assert d["kernels_unchanged"] == len(rep["kernels"])
    text = render_diff(d)
    assert "B is faster" not in text and "B is slower" not in text and "+0 µs +0.0%" not in text
    assert "Kernels" not in text  # no table of unchanged rows


def test_noise_of_another_seed_is_not_a_change(tmp_path: Path) -> None:
    """Two runs of the same job that differ only by the simulator's kernel jitter (seed): the step
    moves by less than the threshold, so the answer is "no significant change"."""
    from traceread.simulate import simulate

    a, b = tmp_path / "s0", tmp_path / "s1"
    simulate("ddp", a, ranks=4, steps=5, layers=2, seed=0)
    simulate("ddp", b, ranks=4, steps=5, layers=2, seed=1)
    ra = build_report([a], ReportOptions(workers=1, use_cache=False))
    rb = build_report([b], ReportOptions(workers=1, use_cache=False))
    d = diff_reports(ra, rb)  # type: ignore[arg-type]
    assert d["step_us"]["delta"] != 0.0 and abs(d["step_us"]["delta"]) <= d["step_us"]["threshold_us"]
    assert d["verdict"] == "same" and "under the" in d["answer"][0]


def test_the_answer_names_what_appeared_and_vanished(runs: tuple[Path, Path]) -> None:
    ra = build_report([runs[0]], ReportOptions(workers=1, use_cache=False))
    rb = build_report([runs[1]], ReportOptions(workers=1, use_cache=False))
    d = diff_reports(ra, rb)  # type: ignore[arg-type]
    assert d["verdict"] == "slower" and d["answer"][0].startswith("B is slower by")
    assert d["appeared"][0]["kind"] == "straggler" and d["appeared"][0]["key"] == "rank1"
    assert "New in B: straggler rank 1 (gpu;" in d["answer"][1]
    assert not any(x["kind"] == "finding" and x["key"].startswith("straggler") for x in d["appeared"])  # named once
    row = next(f for f in d["findings"] if f["id"] == "straggler")
    assert row["status"] == "new" and row["pct"] is None
    back = diff_reports(rb, ra)  # type: ignore[arg-type]
    assert back["verdict"] == "faster" and "Gone in B: straggler rank 1" in back["answer"][1]
    assert next(f for f in back["findings"] if f["id"] == "straggler")["status"] == "gone"
    text = render_diff(d)
    assert re.search(r"straggler:dp:rank1 .*\| +new *$", text, re.M)


def test_relative_changes_are_capped_in_text() -> None:
    from traceread.render.diff_view import _pct

    assert _pct({"status": "up", "pct": 133809.4}) == ">+999%"
    assert _pct({"status": "down", "pct": -1200.0}) == ">-999%"
    assert _pct({"status": "up", "pct": 12.34}) == "+12.3%"
    assert _pct({"status": "new", "pct": None}) == "new" and _pct({"status": "gone", "pct": None}) == "gone"
