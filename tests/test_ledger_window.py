"""The window ledger's answer against the simulator's exact truth, on the jobs issue 23 names.

Truth comes from the simulator's own schedule (``truth.json``: ``ledger_window``, ``ledger_by_step``,
the stragglers' cost from a re-run without them; :func:`traceread.simulate.missing_truth` for the view
without a rank's trace), never from the analysis. Each case checks the window exactly, then what the
findings say about it: each delay once, a saving no larger than removing the cause could give, the
biggest share first.
"""

from __future__ import annotations

import gzip
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from traceread.assemble.report import ReportOptions, build_report

SMALL = {"layers": 4, "hidden": 2048, "heads": 16, "seq_len": 1024}
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    # four DDP buckets per step, one rank late to every one of them
    "buckets_gpu": ("ddp", {"ranks": 4, "steps": 4, "buckets": 4, "stragglers": [(1, 2000.0, "gpu")], **SMALL}),
    "buckets_host": ("ddp", {"ranks": 4, "steps": 4, "buckets": 4, "stragglers": [(1, 2000.0, "host")], **SMALL}),
    # the late rank also has the longest step (the critical rank) in most steps
    "late_critical": ("ddp", {"ranks": 4, "steps": 3, "stragglers": [(2, 3000.0, "gpu")]}),
    # one slow step of each cause
    "slow_steps": ("slow_steps", {"ranks": 2, "steps": 8, "layers": 2, "hidden": 2048, "heads": 16, "seq_len": 1024,
                                  "slow_steps": [(11, "dataloader", 20000.0), (13, "gc", 10000.0),
                                                 (15, "checkpoint", 30000.0)]}),
    # every rank late now and then by up to 3 ms: noise, no straggler
    "jitter": ("ddp", {"ranks": 4, "steps": 8, "host_jitter_us": 3000.0, **SMALL, "layers": 2}),
    # two ranks, host jitter up to 20 ms (seed 18022 draws it so): rank 1 is ~16 ms late in two steps of
    # three, rank 0 as late in the third; late in most steps is not late steadily: no straggler
    "jitter_two_of_three": ("ddp", {"ranks": 2, "steps": 3, "host_jitter_us": 20000.0, "seed": 18022, **SMALL,
                                    "layers": 2}),
    # gloo on CUDA tensors: the host all-reduces while the GPU idles; rank 1's host is late
    "gloo_host": ("gloo_host", {"steps": 4, "stragglers": [(1, 5000.0, "host")]}),
}


def _agg(parts: list[dict[str, Any]]) -> dict[tuple[str, str | None, int], float]:
    d: dict[tuple[str, str | None, int], float] = defaultdict(float)
    for p in parts:
        d[(p["category"], p["role"], p["rank"])] += p["us"]
    return d


def _same(ours: list[dict[str, Any]], want: list[dict[str, Any]], tol: float = 1e-6) -> None:
    a, b = _agg(ours), _agg(want)
    bad = {k: (a.get(k, 0.0), b.get(k, 0.0)) for k in set(a) | set(b) if abs(a.get(k, 0.0) - b.get(k, 0.0)) > tol}
    assert not bad, bad


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict[str, Any]]:
    """Each case simulated and reported once per module, on first use."""
    from traceread.simulate import simulate

    done: dict[str, dict[str, Any]] = {}

    def get(name: str) -> dict[str, Any]:
        if name not in done:
            scenario, knobs = CASES[name]
            out: Path = tmp_path_factory.mktemp(name)
            truth = simulate(scenario, out, **knobs)
            done[name] = {"name": name, "truth": truth,
                          "report": build_report([out], ReportOptions(use_cache=False, workers=1))}
        return done[name]

    return get


@pytest.fixture(params=sorted(CASES))
def case(request: pytest.FixtureRequest, runs: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    return runs(request.param)


def _by_id(report: dict[str, Any], fid: str) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["id"] == fid]


def test_window_and_header_agree_with_truth(case: dict[str, Any]) -> None:
    from traceread.assemble.queries import step_figure
    from traceread.render.terminal import headline

    w, t = case["report"]["ledger"]["window"], case["truth"]["ledger_window"]
    _same(w["parts"], t["parts"])
    assert w["total_us"] == pytest.approx(t["total_us"], abs=1e-6) and w["steps"] == t["steps"]
    mean, n, median = step_figure(case["report"])
    assert (mean, n) == (pytest.approx(t["mean_step_us"]), t["steps"]) and median == pytest.approx(t["median_step_us"])
    assert f"{t['steps']} step(s) · mean step " in headline(case["report"])
    shares = sum(f["impact_us_total"] for f in case["report"]["findings"] if f["id"] != "hang")
    assert shares <= t["total_us"] + 1e-6


def test_each_delay_once_and_a_saving_that_can_happen(case: dict[str, Any]) -> None:
    """A late rank is charged once per step however many buckets waited on it; its saving is the
    re-run's (within 2 %), never more than its share, and the critical rank is never its own straggler."""
    truth, report = case["truth"], case["report"]
    found = _by_id(report, "straggler")
    if not truth["stragglers"]:
        assert not found, [f["title"] for f in found]
        assert all(s.get("noise") for s in report["stragglers"]), report["stragglers"]
        return
    (st,) = truth["stragglers"]
    (f,) = found
    assert report["findings"][0] is f or case["name"] == "gloo_host"  # the host all-reduce itself is bigger there
    assert f["rank"] == st["rank"] and f["category"] == "comm_wait"
    assert st["cause"] in f["title"]  # gpu / host, from its own steps against the others'
    assert f["predicted_saving_us"] == pytest.approx(st["window_cost_us"], rel=0.02)
    assert f["predicted_saving_us"] <= f["impact_us_per_step"] + 1e-9
    assert f["predicted_saving_us"] <= st["injected_delay_us"] * 1.02  # once per step, not once per bucket
    (entry,) = [s for s in report["stragglers"] if s["rank"] == st["rank"]]
    assert entry["impact_us_per_step"] == pytest.approx(f["predicted_saving_us"])
    assert entry["cause"] == st["cause"] and not entry["noise"]
    assert f"critical rank {st['rank']} waited" not in f["title"]


def test_late_rank_that_is_critical_claims_its_excess_not_all_its_work(
        runs: Callable[[str], dict[str, Any]]) -> None:
    """Where the late rank has the longest step itself, its share is its work beyond the other
    ranks' (about the injected delay), never all of its compute; nothing else claims that time."""
    case = runs("late_critical")
    report, truth = case["report"], case["truth"]
    (st,) = truth["stragglers"]
    late = next(x for x in report["ledger"]["window"]["late"] if x["rank"] == st["rank"])
    assert late["critical_steps"] >= 2
    (f,) = _by_id(report, "straggler")
    compute = sum(p["us"] for p in truth["ledger_window"]["parts"]
                  if p["rank"] == st["rank"] and p["category"] in ("compute_bound", "memory_bound", "compute_other"))
    assert f["impact_us_total"] < 0.15 * compute
    assert f["impact_us_per_step"] == pytest.approx(st["window_cost_us"], rel=0.02)


def test_slow_steps_are_the_window_loss_they_are(case: dict[str, Any]) -> None:
    """Each slow step's excess over the median step is a share of the window, named by what the host
    was doing; the biggest of them is the answer. (Jobs without slow steps get no such finding.)"""
    truth, report = case["truth"], case["report"]
    slow = {s["step"]: s for s in truth.get("slow_steps") or []}
    found = {tuple(f["steps"]): f for f in _by_id(report, "slow_steps")}
    assert sorted(s for k in found for s in k) == sorted(slow)
    if not slow:
        return
    by_step = truth["ledger_by_step"]
    med = by_step[str(truth["ledger_window"]["median_step"])]["step_us"]
    names = {"dataloader": "DataLoader", "checkpoint": "checkpoint.save", "gc": "DistributedDataParallel.forward"}
    for k, s in slow.items():
        f = found[(k,)]
        assert f["impact_us_total"] == pytest.approx(by_step[str(k)]["step_us"] - med, abs=1e-6)
        assert f["impact_us_per_step"] == pytest.approx(f["impact_us_total"] / truth["ledger_window"]["steps"])
        assert names[s["cause"]] in f["title"], f["title"]
    worst = max(slow, key=lambda k: by_step[str(k)]["step_us"])
    assert report["findings"][0]["id"] == "slow_steps" and report["findings"][0]["steps"] == [worst]


def test_host_side_collectives_are_communication(runs: Callable[[str], dict[str, Any]]) -> None:
    report = runs("gloo_host")["report"]
    top = report["findings"][0]
    assert (top["id"], top["category"], top["role"]) == ("exposed_comm", "comm_transfer", "dp")
    host = [f for f in report["findings"] if f["category"] == "host_bound"]
    assert not host, [f["title"] for f in host]


def test_missing_straggler_file_is_named_first(tmp_path: Path) -> None:
    """Rank 2's trace is unreadable: the first lines say so, and the window the other ranks' traces
    show (truth: the simulator's view without rank 2) holds the collectives that went on after every
    present member arrived — rank 2 is the likely straggler, not "exposed communication"."""
    from traceread.render.terminal import render_text
    from traceread.simulate import missing_truth, simulate

    knobs = {"ranks": 4, "steps": 3, "stragglers": [(2, 3000.0, "gpu")]}
    simulate("ddp", tmp_path, **knobs)
    (tmp_path / "rank2.pt.trace.json.gz").write_bytes(gzip.compress(b'{"traceEvents": [truncated'))
    want = missing_truth("ddp", [2], **knobs)
    report = build_report([tmp_path], ReportOptions(use_cache=False, workers=1))
    w = report["ledger"]["window"]
    _same(w["parts"], want["parts"])
    assert [(b["rank"], b["role"]) for b in w["blind"]] == [(b["rank"], b["role"]) for b in want["blind"]]
    for ours, truth_b in zip(w["blind"], want["blind"]):
        assert ours["us"] == pytest.approx(truth_b["us"], abs=1e-6)
    top = report["findings"][0]
    assert (top["id"], top["rank"]) == ("missing_rank", 2)
    assert top["impact_us_total"] == pytest.approx(want["blind"][0]["us"], abs=1e-6)
    assert report["source"]["missing_ranks"] == [2]
    lines = render_text(report).splitlines()
    head = " ".join(lines[1:lines.index(next(x for x in lines if x.startswith("ANSWER:")))])
    assert lines[1].startswith("MISSING: rank(s) 2 of 4") and "rank 2 is the likely straggler" in head
    assert next(x for x in lines if x.startswith("ANSWER:")).startswith("ANSWER: Rank 2's trace is missing")


def test_two_late_ranks_each_save_only_what_the_other_leaves(tmp_path: Path) -> None:
    """Rank 1 is 5 ms late (GPU) and rank 2 3 ms late in every step. With rank 1 on time, rank 2 still
    holds every step: the step shrinks by about 2 ms, not 5 (nor rank 1's whole share on the critical
    path). Truth: the simulator re-run with rank 1 on time (and with rank 2 on time: no shorter)."""
    from traceread.simulate import simulate

    knobs: dict[str, Any] = {"ranks": 4, "steps": 4, **SMALL}
    both = [(1, 5000.0, "gpu"), (2, 3000.0, "gpu")]
    mean = {name: simulate("ddp", tmp_path / name, stragglers=st, **knobs)["ledger_window"]["mean_step_us"]
            for name, st in (("both", both), ("only2", both[1:]), ("only1", both[:1]))}
    saving1, saving2 = mean["both"] - mean["only2"], mean["both"] - mean["only1"]
    assert 1500.0 < saving1 < 2500.0 and abs(saving2) < 50.0  # the case is what it says
    report = build_report([tmp_path / "both"], ReportOptions(use_cache=False, workers=1))
    (f,) = _by_id(report, "straggler")
    assert f["rank"] == 1 and f["predicted_saving_us"] == pytest.approx(saving1, rel=0.02)
    assert f["impact_us_per_step"] > 1.2 * saving1  # its share is more than the step could shrink
    assert [s["rank"] for s in report["stragglers"] if not s["noise"]] == [1]


def test_late_in_two_steps_of_three_is_not_a_straggler(runs: Callable[[str], dict[str, Any]]) -> None:
    """The case is what it says: rank 1 late in two of the three steps, typically by far more than the
    noise floor (1 % of the step), yet under the three quarters of the steps that make a straggler."""
    report = runs("jitter_two_of_three")["report"]
    late = {x["rank"]: x for x in report["ledger"]["window"]["late"]}
    assert late[1]["steps_late"] == 2 and late[0]["steps_late"] == 1
    assert late[1]["delay_us"] > 10_000.0 > 0.01 * report["ledger"]["window"]["total_us"] / 3
    assert not late[1]["straggler"] and not _by_id(report, "straggler")
