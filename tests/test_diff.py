"""``traceread diff``: two runs side by side, on simulated runs whose difference is known."""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from pathlib import Path
from statistics import mean, median

import pytest
from click.testing import CliRunner

from traceread.assemble.report import ReportOptions, build_report
from traceread.commands.diff import diff
from traceread.compare.diff import diff_reports
from traceread.render.diff_view import render_diff

FIELDS = ("compute_us", "exposed_comm_us", "exposed_memcpy_us", "idle_us", "comm_us")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict]]:
    """Baseline: 4 healthy ranks. ``slow``: the same job with rank 1's GPU 2 ms slower per step.
    ``reseeded``: the baseline with its default jitter under another seed (every kernel moves a little)."""
    from traceread.simulate import simulate

    out = {}
    for name, knobs in {"base": {"jitter": 0.0}, "slow": {"jitter": 0.0, "stragglers": [(1, 2000.0, "gpu")]},
                        "jitter0": {"seed": 0}, "jitter1": {"seed": 1}}.items():
        folder = tmp_path_factory.mktemp(name)
        out[name] = (folder, simulate("ddp", folder, ranks=4, steps=3, layers=2, **knobs))
    return out


@pytest.fixture(scope="module")
def reports(runs: dict[str, tuple[Path, dict]]) -> dict[str, dict]:
    return {name: build_report([folder], ReportOptions(workers=1, use_cache=False))  # type: ignore[misc]
            for name, (folder, _) in runs.items()}


def truth_side(truth: dict) -> dict[str, float]:
    """The diff's per-side numbers from the simulator's own schedule: median over ranks of the mean
    over steps of each step's value (the definitions of traceread.compare.diff)."""
    def field(f: str) -> float:
        return median(mean(s[f] for s in r["steps"]) for r in truth["ranks"].values())
    return {"step_us": field("duration_us"), **{f: field(f) for f in FIELDS}}


def raw_kernels(folder: Path, steps: int) -> dict[str, float]:
    """Kernel time per step per rank by name, summed from the trace files the simulator wrote."""
    files = sorted(folder.glob("rank*.pt.trace.json.gz"))
    out: dict[str, float] = defaultdict(float)
    for f in files:
        for e in json.loads(gzip.decompress(f.read_bytes()))["traceEvents"]:
            if e.get("cat") == "kernel":
                out[e["name"]] += e["dur"]
    return {k: v / len(files) / steps for k, v in out.items()}


@pytest.mark.parametrize("a,b", [("base", "slow"), ("slow", "base"), ("jitter0", "jitter1")])
def test_diff_deltas_are_the_truths_difference(a: str, b: str, runs: dict[str, tuple[Path, dict]],
                                               reports: dict[str, dict]) -> None:
    """Two different runs: every step and breakdown delta is B's truth minus A's, exactly."""
    d = diff_reports(reports[a], reports[b])  # type: ignore[arg-type]
    ta, tb = truth_side(runs[a][1]), truth_side(runs[b][1])
    assert d["step_us"]["a"] == pytest.approx(ta["step_us"], abs=1e-3)
    assert d["step_us"]["delta"] == pytest.approx(tb["step_us"] - ta["step_us"], abs=1e-3)
    assert d["step_us"]["pct"] == pytest.approx(100.0 * (tb["step_us"] - ta["step_us"]) / ta["step_us"], abs=1e-6)
    for f in FIELDS:
        assert d["breakdown"][f]["a"] == pytest.approx(ta[f], abs=1e-3), f
        assert d["breakdown"][f]["delta"] == pytest.approx(tb[f] - ta[f], abs=1e-3), f
    steps = len(runs[a][1]["steps"])
    ka, kb = raw_kernels(runs[a][0], steps), raw_kernels(runs[b][0], steps)
    assert set(ka) == set(kb)  # the same kernels ran: every row is up, down or the same
    # a kernel row is listed when it moved by at least the floor (0.5 % of A's step, >= 1 µs) and 5 % of itself
    floor = max(0.005 * ta["step_us"], 1.0)
    moved = {n: kb[n] - ka[n] for n in ka
             if abs(kb[n] - ka[n]) >= max(floor, 0.05 * max(ka[n], kb[n])) + 1e-3}
    borderline = {n for n in ka if abs(abs(kb[n] - ka[n]) - max(floor, 0.05 * max(ka[n], kb[n]))) <= 1e-3}
    assert not borderline  # the truth is not within rounding of the rule's edge
    got = {k["name"]: k["delta"] for k in d["kernels"]}
    assert got == {n: pytest.approx(v, abs=1e-3) for n, v in sorted(moved.items(), key=lambda x: -abs(x[1]))[:15]}
    assert d["kernels_unchanged"] == len(ka) - len(moved)
    assert [k["name"] for k in d["kernels"]] == sorted(got, key=lambda n: -abs(moved[n]))  # biggest change first


def test_diff_finds_the_slowdown(runs: dict[str, tuple[Path, dict]], reports: dict[str, dict]) -> None:
    d = diff_reports(reports["base"], reports["slow"])  # type: ignore[arg-type]
    # the whole job waits for rank 1: its compute grows by the injected 2 ms, the others wait that long
    # in the all-reduce, and the median rank's compute does not move
    assert d["step_us"]["delta"] > 1000.0 and d["breakdown"]["compute_us"]["delta"] == 0.0
    assert d["breakdown"]["exposed_comm_us"]["delta"] == pytest.approx(d["step_us"]["delta"], abs=5.0)
    # the same all-reduce buckets, the same transfer (truth): only the waits changed, no collective row moved
    transfers = [{c["transfer_us"] for c in runs[k][1]["collectives"]} for k in ("base", "slow")]
    assert transfers[0] == transfers[1]
    assert d["collectives"] == [] and d["collectives_unchanged"] == 1
    straggler = next(f for f in d["findings"] if f["id"] == "straggler")
    assert straggler["a"] is None and straggler["b"] > 1000.0 and straggler["key"] == "straggler:dp:rank1"
    text = render_diff(d)
    assert "ANSWER: B is slower by" in text and "exposed comm" in text


def test_diff_cli_json(runs: dict[str, tuple[Path, dict]], tmp_path: Path) -> None:
    out = tmp_path / "d.json"
    res = CliRunner().invoke(diff, [str(runs["base"][0]), str(runs["slow"][0]), "--format", "json", "-o", str(out)])
    assert res.exit_code == 0, res.output
    d = json.loads(out.read_text())
    assert d["schema"] == "traceread.diff/1" and d["step_us"]["delta"] > 0
    assert {"a", "b", "breakdown", "operators", "kernels", "collectives", "findings"} <= set(d)
    # rank 0's operators (the detailed rank) did not change: none is listed, all are counted as unchanged
    assert d["operators"] == [] and d["operators_unchanged"] > 0
    res = CliRunner().invoke(diff, [str(runs["base"][0]), str(tmp_path / "missing")])
    assert res.exit_code == 2


def test_identical_runs_say_no_significant_change(runs: dict[str, tuple[Path, dict]]) -> None:
    rep = build_report([runs["base"][0]], ReportOptions(workers=1, use_cache=False))
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


def test_the_answer_names_what_appeared_and_vanished(runs: dict[str, tuple[Path, dict]]) -> None:
    ra = build_report([runs["base"][0]], ReportOptions(workers=1, use_cache=False))
    rb = build_report([runs["slow"][0]], ReportOptions(workers=1, use_cache=False))
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


def test_answer_when_a_has_no_step_time_to_compare_against() -> None:
    """A's median step is 0 (negative or zero durations in a damaged trace): the change has no percentage, and the
    answer says so instead of failing (fuzz case: bench/fuzz_cli.py --replay 6031 --seed 0 --max-events 300)."""
    from traceread.compare.diff import _answer

    step = {"a": 0.0, "b": 5000.0, "delta": 5000.0, "pct": None, "significant": True, "threshold_us": 0.0,
            "noise_us": 0.0}
    assert _answer(step, {}, [], [])[0] == "B is slower by 5.0 ms/step."
