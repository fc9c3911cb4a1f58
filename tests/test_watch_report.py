"""The report of a watched run against exact truth: a simulated baseline window, a step series of the
whole job, and a capture of a slow stretch (traceread.simulate.watched), through every output.

Truth comes from what the simulator wrote (which rank was slowed, which steps, by how much), never
from the analysis. Tolerances: step numbers exact (the series is written at step resolution), the
excess per step and the time lost within 5 % (the written series carries ±1 % jitter per step).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from traceread.cli import cli
from traceread.compare.captures import build_watched, slow_stretch
from traceread.options import ReportOptions
from traceread.read.watch import StepSeries, read_series
from traceread.simulate.watched import write_watched_run


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    run = tmp_path_factory.mktemp("watched") / "run"
    truth = write_watched_run(run)
    return run, truth


@pytest.fixture(scope="module")
def doc(watched: tuple[Path, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    run, _ = watched
    cache = tmp_path_factory.mktemp("cache")
    return dict(build_watched([str(run)], ReportOptions(cache_dir=cache, workers=1)))


def test_answer_names_rank_steps_size_and_cause(doc: dict[str, Any], watched: tuple[Path, dict[str, Any]]) -> None:
    _, truth = watched
    a = doc["watch"]["answer"]
    assert a is not None and a["changed"]
    assert a["rank"] == truth["slow_rank"]
    assert a["slow_steps"] == truth["slow_steps"]
    assert a["n_slow_steps"] == truth["slow_steps"][1] - truth["slow_steps"][0] + 1
    assert a["excess_us"] == pytest.approx(truth["excess_us"], rel=0.05)
    assert a["lost_us"] == pytest.approx(truth["lost_us"], rel=0.05)
    assert a["host_span"]["name"] == truth["host_span"]
    assert a["host_span"]["delta_us"] == pytest.approx(truth["excess_us"], rel=0.05)
    assert a["what"]["category"] == "host_bound"
    assert a["waited_in"]["role"] == "dp" and a["waited_in"]["collective"] == "allreduce"
    s = a["sentence"]
    assert s.startswith(f"from step {truth['slow_steps'][0]} the step took ")
    assert f"rank {truth['slow_rank']}'s `enumerate(DataLoader)" in s and "gradient all-reduce" in s


def test_json_series_keeps_every_step_and_marks(doc: dict[str, Any], watched: tuple[Path, dict[str, Any]]) -> None:
    _, truth = watched
    w = doc["watch"]
    series = w["series"]
    assert series["steps"] == truth["total_steps"] - 1  # step 1 has no previous step to time it from
    assert series["first_step"] == 2 and series["last_step"] == truth["total_steps"]
    assert series["median_us"] == pytest.approx(truth["baseline_step_us"], rel=0.02)
    assert max(series["job_max_us"]) == pytest.approx(truth["slow_step_us"], rel=0.02)
    assert w["baseline_steps"] == truth["baseline_steps"]
    assert w["captures"][0]["steps"] == truth["capture_steps"]
    assert json.loads(json.dumps(doc))["watch"]["answer"]["name"] == "capture1"  # plain JSON


def test_terminal_answer_sparkline_and_marks(watched: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    run, truth = watched
    res = CliRunner().invoke(cli, ["report", str(run), "--format", "text", "--no-cache"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    answer = next(line for line in lines if line.startswith("ANSWER:"))
    assert f"from step {truth['slow_steps'][0]}" in answer and f"rank {truth['slow_rank']}'s" in answer
    head = next(i for i, line in enumerate(lines) if line.startswith("Step time over the whole job"))
    bars, marks = lines[head + 1], lines[head + 2]
    assert "#" in bars and "_" in bars  # ASCII bars: the slow stretch is tall, the rest low
    assert "b" in marks and "1" in marks
    assert marks.index("b") < marks.index("1")
    # the capture's mark sits under tall bars (the slow stretch)
    assert bars[marks.index("1")] == "#"


def test_html_chart_and_captures_table(watched: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    run, truth = watched
    out = tmp_path / "r.html"
    res = CliRunner().invoke(cli, ["report", str(run), "-o", str(out), "--no-cache"])
    assert res.exit_code == 0, res.output
    page = out.read_text()
    assert '<section id="watch">' in page and 'data-chart="watch"' in page
    assert 'data-capture="1"' in page and "gradient all-reduce" in page
    assert page.index('<section id="watch">') < page.index('id="ledger"')


def test_export_counter_track_and_capture_slices(watched: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    run, truth = watched
    out = tmp_path / "t.json.gz"
    res = CliRunner().invoke(cli, ["export", str(run), "-o", str(out), "--no-cache"])
    assert res.exit_code == 0, res.output
    events = json.loads(gzip.decompress(out.read_bytes()))["traceEvents"]
    counters = [e for e in events if e.get("ph") == "C" and e.get("name") == "step time (ms)"]
    assert len(counters) > 100
    slow = [e for e in counters if e["args"]["max"] > 10 * truth["baseline_step_us"] / 1e3]
    assert slow and all(e["args"]["max"] == pytest.approx(truth["slow_step_us"] / 1e3, rel=0.02) for e in slow)
    slices = {e["name"]: e for e in events if e.get("pid") == 100_001 and e.get("ph") == "X"}
    assert slices["capture 1: rank_late"]["args"]["steps"] == truth["capture_steps"]
    assert slices["capture 1: rank_late"]["args"]["rank"] == truth["slow_rank"]
    # the baseline slice sits on the trace's own clock: where rank 0's events are
    rank0 = [e["ts"] for e in events if e.get("pid") == 1 and e.get("ph") == "X"]  # rank 0 (pid = rank + 1)
    base = slices["baseline window"]
    assert min(rank0) - 100 <= base["ts"] <= max(rank0)


def test_series_is_the_last_rank_to_finish(tmp_path: Path) -> None:
    """Job step time = the last rank's end of s − the last rank's end of s−1; a step some rank lacks is out."""
    (tmp_path / "progress").mkdir()
    ends = {0: [1000, 2000, 3000, 4000], 1: [1100, 2500, 3100, 4100]}
    for r, e in ends.items():
        (tmp_path / "progress" / f"rank{r}.steps").write_text("".join(f"{i + 1} {t}\n" for i, t in enumerate(e)))
    # rank 2 stopped after step 2: steps 3 and 4 are not every rank's
    (tmp_path / "progress" / "rank2.steps").write_text("1 900\n2 1900\n")
    warns: list[str] = []
    s = read_series(tmp_path, warns.append)
    assert s is not None and not warns
    assert s.steps.tolist() == [2]
    assert s.job_us.tolist() == [(2500 - 1100) / 1e3]


def test_bad_series_files_are_one_line_each(tmp_path: Path) -> None:
    (tmp_path / "progress").mkdir()
    (tmp_path / "progress" / "rank0.steps").write_text("".join(f"{i} {1000 * i}\n" for i in range(1, 50)))
    (tmp_path / "progress" / "rank1.steps").write_bytes(b"\x00\xff" * 5000)
    (tmp_path / "progress" / "rank2.steps").write_text("1 1000\nbad line\n3 x\n" + "".join(
        f"{i} {1000 * i}\n" for i in range(4, 50)) + "17")  # a last line cut mid-write
    warns: list[str] = []
    s = read_series(tmp_path, warns.append)
    assert s is not None and s.ranks == [0, 2]
    assert len(warns) == 2
    assert "rank1.steps: not read" in warns[0]
    assert "rank2.steps: 2 line(s)" in warns[1]


def test_healthy_run_without_capture_keeps_the_normal_answer(watched: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    import shutil

    run, _ = watched
    shutil.copytree(run / "traces", tmp_path / "traces")
    (tmp_path / "progress").mkdir()
    for r in (0, 1):
        (tmp_path / "progress" / f"rank{r}.steps").write_text("".join(f"{i} {10**15 + i * 1_100_000}\n" for i in range(1, 300)))
    d = build_watched([str(tmp_path)], ReportOptions(use_cache=False, workers=1))
    assert d["watch"]["answer"] is None and d["watch"]["captures"] == []
    plain = CliRunner().invoke(cli, ["report", str(run / "traces"), "--format", "text", "--no-cache", "-q"])
    watched_q = CliRunner().invoke(cli, ["report", str(tmp_path), "--format", "text", "--no-cache", "-q"])
    assert plain.output == watched_q.output  # the answer of the baseline window, unchanged


def test_capture_with_no_change_is_said_and_not_the_answer(watched: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    import shutil

    run, _ = watched
    shutil.copytree(run / "traces", tmp_path / "traces")
    shutil.copytree(run / "progress", tmp_path / "progress")
    snap = tmp_path / "captures" / "capture1"
    shutil.copytree(run / "traces", snap)
    (snap / "trigger.json").write_text(json.dumps({"id": 1, "kind": "on_demand", "requested_by": "snap"}))
    d = build_watched([str(tmp_path)], ReportOptions(use_cache=False, workers=1))
    cap = d["watch"]["captures"][0]
    assert cap["changed"] is False and "no change" in cap["sentence"]
    assert d["watch"]["answer"] is None


def test_slow_stretch_counts_from_the_series() -> None:
    """A sustained stretch to the step; spikes of a loaded machine (one or two in a row) are not in it."""
    steps = np.arange(1, 101)
    job = np.full(100, 10.0)
    job[49:60] = 30.0  # steps 50..60: the slowdown
    job[63] = job[65] = 30.0  # steps 64 and 66: spikes after it (a normal step between)
    job[40] = job[41] = 30.0  # steps 41, 42: two spikes in a row before it
    s = StepSeries(steps=steps, job_us=job, end_ns=np.cumsum(job * 1000).astype(np.int64), ranks=[0])
    first, last, n, lost = slow_stretch(s, 52, 10.0, 20.0, (55, 58)) or (0, 0, 0, 0.0)
    assert (first, last, n) == (50, 60, 11) and lost == pytest.approx(11 * 20.0)


def test_gpu_slowdown_capture_names_compute_and_the_throttled_clock(tmp_path: Path) -> None:
    """Rank 1's GPU 20 ms slower per step in steps 200-239 (the simulator spreads it over its compute
    kernels); its telemetry says power cap at 1,290 MHz over the captured window's wall time."""
    from traceread.simulate.kineto import T0_NS
    from traceread.simulate.telemetry import TelemetryPlan, Throttle, trace_wall_ns, write_telemetry

    run = tmp_path / "run"
    truth = write_watched_run(run, cause="gpu", delay_us=20_000.0)
    t0 = trace_wall_ns(T0_NS / 1000)  # the simulated capture starts at the trace's origin
    write_telemetry(run, TelemetryPlan(gpus=2, start_ns=t0 - 10**10, end_ns=t0 + 10**10,
                                       throttles=[Throttle(1, t0 - 10**10, t0 + 10**10, "sw_power_cap", 1290)]))
    a = build_watched([str(run)], ReportOptions(use_cache=False, workers=1))["watch"]["answer"]
    assert a["rank"] == truth["slow_rank"] and a["slow_steps"] == truth["slow_steps"]
    assert a["what"]["category"] == "compute_bound"
    assert a["compute_delta_us"] == pytest.approx(20_000.0, rel=0.02)
    assert a["host_span"] is None  # the host waiting on its GPU (cudaStreamSynchronize) is no cause
    assert a["telemetry"]["throttled"] and a["telemetry"]["sm_clock_mhz"] == 1290
    assert "rank 1's GPU compute took 20.0 ms more per step" in a["sentence"]
    assert "throttled (power cap, 100% of samples): SM clock 1,290 MHz vs 1,980 MHz max" in a["sentence"]


def test_api_tables_of_a_watched_run(watched: tuple[Path, dict[str, Any]]) -> None:
    import traceread

    run, truth = watched
    rep = traceread.analyze(run, use_cache=False, workers=1)
    assert rep.answer.startswith(f"from step {truth['slow_steps'][0]} the step took ")
    caps = rep.table("captures")
    assert caps["rank"].to_list() == [truth["slow_rank"]]
    assert caps["slow_first_step"].to_list() == [truth["slow_steps"][0]]
    assert caps["lost_us"][0] == pytest.approx(truth["lost_us"], rel=0.05)
    series = rep.table("step_series")
    assert series.height == truth["total_steps"] - 1 and series["job_max_us"].max() == pytest.approx(
        truth["slow_step_us"], rel=0.02)


def test_a_stall_is_priced_from_the_series(watched: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    """A ``stall`` trigger: its step took 12 s in a ~1.1 ms job; the capture after it is healthy, so the
    series says what was lost, and the answer points at the stacks taken then."""
    import shutil

    run, truth = watched
    shutil.copytree(run / "traces", tmp_path / "traces")
    base_ns = truth["baseline_step_us"] * 1000
    (tmp_path / "progress").mkdir()
    for r in (0, 1):
        t, lines = 10**18, []
        for s in range(1, 301):
            t += int(12e9 if s == 100 else base_ns)
            lines.append(f"{s} {t + r}\n")
        (tmp_path / "progress" / f"rank{r}.steps").write_text("".join(lines))
    cap = tmp_path / "captures" / "capture1"
    shutil.copytree(run / "traces", cap)
    (cap / "trigger.json").write_text(json.dumps({"id": 1, "kind": "stall", "since_step": 100, "detected_at_step": 99,
                                                  "steps": [105, 114], "requested_by": "watch",
                                                  "stacks": "captures/capture1/stacks"}))
    a = build_watched([str(tmp_path)], ReportOptions(use_cache=False, workers=1))["watch"]["answer"]
    assert a is not None and a["kind"] == "stall" and a["slow_steps"] == [100, 100]
    assert a["lost_us"] == pytest.approx(12e6 - truth["baseline_step_us"], rel=1e-3)
    assert a["sentence"].startswith("step 100 took 12.00 s instead of ")
    assert "the stacks taken then are in captures/capture1/stacks" in a["sentence"]


def test_a_hang_stays_the_answer_of_a_watched_run(doc: dict[str, Any]) -> None:
    """The job stopped: every later step is lost, more than any slow stretch before it."""
    from traceread.render.terminal import answer

    hung = dict(doc, findings=[{"id": "hang", "title": "Job hung in all_reduce", "category": "hang"}])
    assert answer(hung)[0].startswith("Job hung in all_reduce")
    assert answer(doc)[0].startswith("from step 200 the step took ")


def test_the_watchs_capture_dumps_are_no_hang(watched: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    """fr/ holding the dumps the watch took for a capture of a running job (run.json dumps[].reason
    capture1, the job ended by itself): no hang finding, one line saying why."""
    import shutil

    from traceread.simulate.fr_hang import HangKnobs, simulate_hang

    run, _ = watched
    for sub in ("traces", "progress", "captures"):
        shutil.copytree(run / sub, tmp_path / sub)
    simulate_hang(tmp_path / "fr", HangKnobs(tp=2, pp=1, dp=1, faults=[(1, 0.4)]), prefix="rank", write_truth=False)
    info = {"exit_code": 0, "hang": None, "ranks": {},
            "dumps": [{"reason": "capture1", "answered_ranks": [0, 1], "unanswered_ranks": []}]}
    (tmp_path / "run.json").write_text(json.dumps(info))
    d = build_watched([str(tmp_path)], ReportOptions(use_cache=False, workers=1))
    assert d["hang"] is None and not any(f["id"] == "hang" for f in d["findings"])
    assert any("the dumps the watch took for capture1 while the job ran" in w for w in d["warnings"])
    assert d["watch"]["answer"]["rank"] == 1
    info["dumps"][0]["reason"] = "hang"  # a dump the watchdog took for a hang stays hang evidence
    (tmp_path / "run.json").write_text(json.dumps(info))
    d = build_watched([str(tmp_path)], ReportOptions(use_cache=False, workers=1))
    assert d["hang"] is not None
