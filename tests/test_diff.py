"""``traceread diff``: two runs side by side, on simulated runs whose difference is known."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path
from statistics import mean, median

import pytest
from click.testing import CliRunner

from traceread.build.report import ReportOptions, build_report
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
    want = sorted(((n, kb.get(n, 0.0) - ka.get(n, 0.0)) for n in set(ka) | set(kb)), key=lambda x: -abs(x[1]))
    got = [(k["name"], k["delta"]) for k in d["kernels"]]
    assert len(got) == min(15, len(want))
    assert {n: pytest.approx(v, abs=1e-3) for n, v in got} == {n: v for n, v in want if n in dict(got)}
    assert abs(got[-1][1]) >= abs(want[len(got) - 1][1]) - 1e-3  # the biggest changes, in order


def test_diff_finds_the_slowdown(runs: dict[str, tuple[Path, dict]], reports: dict[str, dict]) -> None:
    d = diff_reports(reports["base"], reports["slow"])  # type: ignore[arg-type]
    # the whole job waits for rank 1: its compute grows by the injected 2 ms, the others wait that long
    # in the all-reduce, and the median rank's compute does not move
    assert d["step_us"]["delta"] > 1000.0 and d["breakdown"]["compute_us"]["delta"] == 0.0
    assert d["breakdown"]["exposed_comm_us"]["delta"] == pytest.approx(d["step_us"]["delta"], abs=5.0)
    (coll,) = d["collectives"]  # the same all-reduce buckets, the same transfer: only the waits changed
    per_step = sum(1 for c in runs["base"][1]["collectives"] if c["bytes"] == coll["bytes"]) / 3
    assert coll["calls_per_step"] == {"a": per_step, "b": per_step, "delta": 0.0, "pct": 0.0}
    assert coll["latency_us"]["a"] == pytest.approx(runs["base"][1]["collectives"][0]["transfer_us"], abs=1e-3)
    assert coll["latency_us"]["delta"] == pytest.approx(0.0, abs=1e-6)
    straggler = next(f for f in d["findings"] if f["id"] == "straggler")
    assert straggler["a"] is None and straggler["b"] > 1000.0 and straggler["key"] == "straggler:dp:rank1"
    text = render_diff(d)
    assert "ANSWER: B is slower by" in text and "exposed comm" in text


def test_diff_cli_json(runs: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "d.json"
    res = CliRunner().invoke(diff, [str(runs["base"][0]), str(runs["slow"][0]), "--format", "json", "-o", str(out)])
    assert res.exit_code == 0, res.output
    d = json.loads(out.read_text())
    assert d["schema"] == "traceread.diff/1" and d["step_us"]["delta"] > 0
    assert {"a", "b", "breakdown", "operators", "kernels", "collectives", "findings"} <= set(d)
    assert d["operators"] and d["operators"][0]["name"].startswith("aten::")
    res = CliRunner().invoke(diff, [str(runs["base"][0]), str(tmp_path / "missing")])
    assert res.exit_code == 2
