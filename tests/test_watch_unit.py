"""The watch's detector on step series with exact truth (no job, no clock): which kind fires, at which
step, since which step, and that noise, spikes and the collector's own profiled steps never fire."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

from traceread.collect.captures import SeriesReader, allocate, lead_steps, read_series
from traceread.collect.live import LiveRun, sparkline
from traceread.collect.watch import Detector, WatchOptions, default_window_end, profiler_steps

MS = 1_000_000
DEFAULT_CFG = {"wait": 5, "warmup": 3, "active": 10, "repeat": 1, "every": 0, "profile": True}


def _series(durations_ms: dict[int, list[float]], lag_ms: dict[int, dict[int, float]] | None = None
            ) -> dict[int, list[tuple[int, int]]]:
    """Per rank ``(step, time_ns)``: step s ends at the sum of the job's step times, plus the rank's lag."""
    lag_ms = lag_ms or {}
    job = durations_ms[-1]
    out: dict[int, list[tuple[int, int]]] = {}
    ranks = [r for r in durations_ms if r >= 0] or [0, 1]
    for r in ranks:
        t, pts = 0.0, []
        for s, d in enumerate(job, start=1):
            t += d
            pts.append((s, int((t + lag_ms.get(r, {}).get(s, 0.0)) * MS)))
        out[r] = pts
    return out


def _noisy(n: int, base: float, seed: int, spread: float = 0.1) -> list[float]:
    rnd = random.Random(seed)
    return [base * rnd.lognormvariate(0, spread) for _ in range(n)]


def _run(series: dict[int, list[tuple[int, int]]], opts: WatchOptions | None = None, chunk: int = 7,
         excluded=lambda s: False) -> list:
    det = Detector(opts or WatchOptions(), excluded)
    fired = []
    n = max(len(p) for p in series.values())
    for i in range(0, n, chunk):  # as the launcher sees it: a few steps per poll
        for r, pts in series.items():
            det.add(r, pts[i:i + chunk])
        fired.extend(det.evaluate())
    return fired


def _first_step_lasting(job: list[float], since: int, seconds: float, steps: int = 5) -> int:
    """Truth: the step at which the slow stretch from ``since`` has ``steps`` steps and lasts ``seconds``."""
    total = 0.0
    for s in range(since, len(job) + 1):
        total += job[s - 1] / 1e3
        if s - since + 1 >= steps and total >= seconds:
            return s
    raise AssertionError("never")


def test_job_slowdown_fires_once_when_the_stretch_lasts() -> None:
    job = _noisy(320, 15.0, 1)
    for s in range(200, 240):
        job[s - 1] += 40.0
    fired = _run(_series({-1: job, 0: [], 1: []}))
    at = _first_step_lasting(job, 200, WatchOptions().min_slow_s)
    assert 210 <= at <= 222
    assert [(t.kind, t.since_step, t.detected_at_step, t.ranks) for t in fired] == [("job_slowdown", 200, at, [])]
    assert 3.0 < fired[0].factor < 4.3 and 13.0 < fired[0].baseline_step_ms < 17.0


def test_one_rank_late_is_named() -> None:
    job = _noisy(320, 15.0, 2)
    for s in range(150, 231):
        job[s - 1] += 40.0  # the others wait for it at the next collective
    lag = {1: {s: 40.0 for s in range(150, 231)}}
    fired = _run(_series({-1: job, 0: [], 1: []}, lag))
    seen = list(job)
    seen[150 - 1] += 40.0  # the job's step 150 ends when rank 1 ends it: 40 ms later
    at = _first_step_lasting(seen, 150, WatchOptions().min_slow_s)
    assert [(t.kind, t.ranks, t.since_step, t.detected_at_step) for t in fired] == [("rank_late", [1], 150, at)]
    assert 3.0 < fired[0].factor < 4.3


def test_healthy_noise_and_isolated_spikes_never_fire() -> None:
    job = _noisy(5000, 15.0, 3, spread=0.35)  # a loaded machine: ±35 % step to step
    for s in range(300, 5000, 97):
        job[s] *= 12.0  # a GC pause, a log flush: one step, never five in a row
    for s in range(1000, 5000, 500):
        job[s:s + 3] = [v * 4 for v in job[s:s + 3]]  # three slow steps in a row: below --watch-steps
    lags = {r: {s: random.Random(s * 7 + r).uniform(0, 6.0) for s in range(1, 5001)} for r in (0, 1, 2, 3)}
    assert _run(_series({-1: job, 0: [], 1: [], 2: [], 3: []}, lags)) == []


def test_a_gradual_drift_within_the_factor_never_fires() -> None:
    job = [15.0 * (1 + 0.4 * s / 3000) for s in range(3000)]  # +40 % over the run: slower, never 1.5x the recent
    assert _run(_series({-1: job, 0: [], 1: []})) == []


def test_profiled_steps_are_not_slow_steps() -> None:
    job = _noisy(400, 15.0, 4)
    slowed = profiler_steps(DEFAULT_CFG)
    for s in range(1, 401):
        if slowed(s):
            job[s - 1] *= 5.0  # the default window's profiler overhead and export
    assert _run(_series({-1: job, 0: [], 1: []}), excluded=slowed) == []
    assert [s for s in range(1, 40) if slowed(s)] == list(range(1, 22))


def test_every_mode_profiled_steps_repeat() -> None:
    slowed = profiler_steps({**DEFAULT_CFG, "every": 100, "warmup": 2, "active": 3})
    marked = [s for s in range(30, 260) if slowed(s)]
    assert marked == [*range(96, 104), *range(196, 204)]
    assert default_window_end({**DEFAULT_CFG, "every": 100}) is None
    assert default_window_end(DEFAULT_CFG) == 20 and default_window_end({**DEFAULT_CFG, "profile": False}) == 0


def test_a_new_regime_fires_once_then_becomes_the_baseline() -> None:
    job = _noisy(200, 15.0, 5) + _noisy(800, 45.0, 6)
    fired = _run(_series({-1: job, 0: [], 1: []}))
    assert [(t.kind, t.since_step) for t in fired] == [("job_slowdown", 201)]


def test_two_slowdowns_apart_fire_twice() -> None:
    job = _noisy(600, 15.0, 7)
    for a in (200, 400):
        for s in range(a, a + 30):
            job[s - 1] += 45.0
    fired = _run(_series({-1: job, 0: [], 1: []}))
    assert [(t.kind, t.since_step) for t in fired] == [("job_slowdown", 200), ("job_slowdown", 400)]


def test_stall_fires_once_past_the_threshold() -> None:
    det = Detector(WatchOptions(stall_min_s=10.0))
    series = _series({-1: _noisy(100, 15.0, 8), 0: [], 1: []})
    for r, pts in series.items():
        det.add(r, pts)
    det.evaluate()
    last = max(t for pts in series.values() for _, t in pts)
    assert det.stall(last + 9 * 10**9) is None
    trig = det.stall(last + 11 * 10**9)
    assert trig is not None and trig.kind == "stall" and trig.since_step == 101 and trig.detected_at_step == 100
    assert 10_000 < trig.observed_step_ms < 12_000
    assert det.stall(last + 30 * 10**9) is None  # once per stall


def test_one_normal_step_inside_a_slowdown_is_tolerated_two_are_not() -> None:
    job = _noisy(400, 15.0, 9)
    for s in range(200, 260):
        job[s - 1] += 45.0
    job[203 - 1] -= 45.0  # one dip: the stretch goes on
    fired = _run(_series({-1: job, 0: [], 1: []}))
    assert [(t.kind, t.since_step) for t in fired] == [("job_slowdown", 200)]
    job = _noisy(400, 15.0, 9)
    for s in [*range(200, 204), *range(206, 210), *range(212, 216)]:
        job[s - 1] += 45.0  # 4-step bursts two normal steps apart: never 5 in one stretch
    assert _run(_series({-1: job, 0: [], 1: []})) == []


def test_a_short_burst_of_slow_steps_is_no_slowdown() -> None:
    job = _noisy(400, 15.0, 10)
    for s in range(200, 208):
        job[s - 1] *= 3.0  # 8 steps 3x slower: 0.36 s, under --watch-min-time
    assert _run(_series({-1: job, 0: [], 1: []})) == []


def test_no_judgement_before_enough_history() -> None:
    job = [15.0] * 10 + [60.0] * 20 + [15.0] * 50
    assert _run(_series({-1: job, 0: [], 1: []})) == []


def test_series_reader_reads_only_complete_new_lines(tmp_path: Path) -> None:
    (tmp_path / "progress").mkdir()
    path = tmp_path / "progress" / "rank3.steps"
    path.write_bytes(b"1 100\n2 200\n3 3")
    reader = SeriesReader(tmp_path)
    assert reader.read_new() == {3: [(1, 100), (2, 200)]}
    with open(path, "ab") as fh:
        fh.write(b"00\nbad line\n4 400\n")
    assert reader.read_new() == {3: [(3, 300), (4, 400)]}
    assert reader.read_new() == {}
    assert read_series(path) == [(1, 100), (2, 200), (3, 300), (4, 400)]


def test_capture_ids_are_allocated_once(tmp_path: Path) -> None:
    hosts = [tmp_path / "a", tmp_path / "b"]
    for h in hosts:
        h.mkdir()
    assert [allocate(hosts) for _ in range(3)] == [1, 2, 3]
    (hosts[1] / "captures" / "capture4").mkdir()  # taken on one host by someone else
    assert allocate(hosts) == 5
    assert lead_steps(0.015, 0.3) == 21 and lead_steps(2.0, 0.3) == 3 and lead_steps(None, 0.3) == 3


def test_live_view_of_a_run_folder(tmp_path: Path) -> None:
    for sub in ("progress", "inject", "captures/capture1"):
        (tmp_path / sub).mkdir(parents=True)
    t = {0: 0, 1: 0}
    lines = {0: [], 1: []}
    for s in range(1, 101):
        for r in (0, 1):
            t[r] += (15 if s < 80 else 45) * MS + (2 * MS if r == 1 else 0)
            lines[r].append(f"{s} {t[r]}\n")
    for r in (0, 1):
        (tmp_path / "progress" / f"rank{r}.steps").write_text("".join(lines[r][: 100 - r]))
    (tmp_path / "captures" / "capture1" / "trigger.json").write_text(json.dumps(
        {"id": 1, "kind": "job_slowdown", "steps": [90, 99], "ranks": []}))
    view = LiveRun(tmp_path).refresh()
    assert [(r.rank, r.step, r.behind_steps) for r in view.ranks] == [(0, 100, 0), (1, 99, 1)]
    assert view.job_step == 99 and view.job_step_ms == 47.0  # the job goes at its slowest rank's pace
    assert view.ranks[1].lag_ms > 100 and view.ranks[0].lag_ms == 0.0
    assert view.ranks[0].last_capture == "#1 job_slowdown 90-99" and not view.ended
    assert sparkline(view.trend_ms)[-1] == "█" and sparkline(view.trend_ms)[0] != "█"
    (tmp_path / "run.json").write_text(json.dumps({"exit_code": 0}))
    assert LiveRun(tmp_path).refresh().ended


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "traceread.cli", *args], capture_output=True, text=True, timeout=60)


def test_snap_times_out_with_one_line_and_exit_3(tmp_path: Path) -> None:
    for sub in ("inject", "ranks", "progress"):
        (tmp_path / sub).mkdir()
    (tmp_path / "ranks" / "rank0.json").write_text(json.dumps({"rank": 0}))
    (tmp_path / "progress" / "rank0").write_text(f"{40:>12d} {1:>20d} {1:>10d}\n")
    res = _cli("snap", str(tmp_path), "--timeout", "0.5", "--steps", "4")
    assert res.returncode == 3, res.stderr
    assert res.stderr.count("\n") == 1 and "no trace yet from rank(s) 0" in res.stderr
    req = json.loads((tmp_path / "inject" / "capture.request").read_text())
    assert req["id"] == 1 and req["steps"] == 4 and req["start_step"] > 41 and req["requested_by"] == "snap"
    trig = json.loads((tmp_path / "captures" / "capture1" / "trigger.json").read_text())
    assert trig["kind"] == "on_demand" and trig["steps"] == [req["start_step"], req["start_step"] + 3]


def test_snap_and_watch_on_an_ended_or_missing_run(tmp_path: Path) -> None:
    res = _cli("snap", str(tmp_path / "nope"))
    assert res.returncode == 2 and "not a run folder" in res.stderr
    (tmp_path / "inject").mkdir()
    (tmp_path / "run.json").write_text(json.dumps({"exit_code": 0}))
    res = _cli("snap", str(tmp_path))
    assert res.returncode == 2 and "has ended" in res.stderr
    res = _cli("watch", str(tmp_path))
    assert res.returncode == 0 and "the job ended (exit code 0)" in res.stdout


def test_a_capture_dump_moves_into_its_folder_and_leaves_a_hang_dump_alone(tmp_path: Path) -> None:
    from traceread.collect.captures import capture_dir, take_dump

    for sub in ("stacks", "fr", "captures/capture2"):
        (tmp_path / sub).mkdir(parents=True)
    (tmp_path / "stacks" / "rank0.txt").write_text("=== traceread dump rank 0 (hang) ===\nold\n")
    (tmp_path / "fr" / "rank0.json").write_text('{"hang": true}')

    def dump(reason: str) -> dict:
        assert reason == "capture2"
        with open(tmp_path / "stacks" / "rank0.txt", "a") as fh:
            fh.write("=== traceread dump rank 0 (request) ===\nnew\n")
        (tmp_path / "fr" / "rank0.json").write_text('{"capture": true}')
        (tmp_path / "fr" / "rank0.cpu.json").write_text("{}")
        return {}

    assert take_dump(tmp_path, 2, dump) == ("captures/capture2/stacks", "captures/capture2/fr")
    folder = capture_dir(tmp_path, 2)
    assert (folder / "stacks" / "rank0.txt").read_text() == "=== traceread dump rank 0 (request) ===\nnew\n"
    assert (folder / "fr" / "rank0.json").read_text() == '{"capture": true}' and (folder / "fr" / "rank0.cpu.json").exists()
    assert (tmp_path / "stacks" / "rank0.txt").read_text() == "=== traceread dump rank 0 (hang) ===\nold\n"
    assert (tmp_path / "fr" / "rank0.json").read_text() == '{"hang": true}'
    assert sorted(p.name for p in (tmp_path / "fr").iterdir()) == ["rank0.json"]
