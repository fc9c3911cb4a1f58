"""The launcher's watch: catch the slow step when it happens (docs/watch.md defines every rule).

From the per-step series the ranks append (``progress/rank{R}.steps``) the :class:`Detector` keeps a
robust baseline (rolling median and MAD of the recent healthy steps) of the job's step time and of
each rank's lag behind the earliest rank, and decides, beyond the run's own noise:

* ``job_slowdown``: a stretch of ``steps`` job steps (one normal step in between tolerated), lasting at
  least ``min_slow_s``, slower than the baseline by both a factor
  (``median × factor``) and the noise (``median + mads × 1.4826 × MAD``);
* ``rank_late``: the same rule on one rank's lag (its step ends later than the earliest rank's by
  more than its usual lag plus ``(factor − 1) × median step``, and beyond its lag's noise);
* ``stall``: no step anywhere for ``max(stall_min_s, stall_factor × median step)``, not yet a hang.

Steps the collector itself slows down (the default profiling window, ``--every`` cycles, captures and
the export step after each) never enter the baseline and never count as slow. After a trigger the
same kind fires again only once the condition cleared; the :class:`Watch` adds a cool-down, a cap on
captures and on disk, and turns a trigger into a capture request (``traceread.collect.captures``).
"""

from __future__ import annotations

import socket
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traceread.collect import captures as cap
from traceread.collect.runinfo import iso, pid_running, read_json, write_json

ROBUST_SIGMA = 1.4826  # MAD × this = the standard deviation of a normal distribution


@dataclass
class WatchOptions:
    """Thresholds of the watch (``traceread collect --watch-*``)."""

    enabled: bool = True
    factor: float = 1.5  # a slow step is at least this many times the baseline median
    steps: int = 5  # ... for this many steps in a stretch (one normal step in between tolerated)
    min_slow_s: float = 1.0  # ... lasting at least this long (a sub-second load burst is no slowdown)
    mads: float = 3.0  # ... and beyond median + mads × robust sigma (the run's own noise)
    window: int = 200  # steps in the rolling baseline
    min_history: int = 30  # healthy steps needed before anything is judged
    capture_steps: int = 10  # K
    max_captures: int = 5
    cooldown_s: float = 60.0
    stall_min_s: float = 10.0
    stall_factor: float = 10.0
    max_disk_mb: float = 2048.0
    dump: bool = True
    lead_s: float = 0.2  # time given to every rank to read the request before the capture starts


@dataclass
class Trigger:
    kind: str
    detected_at_step: int
    since_step: int
    ranks: list[int]
    baseline_step_ms: float | None
    observed_step_ms: float | None
    note: str

    @property
    def factor(self) -> float | None:
        if not self.baseline_step_ms or self.observed_step_ms is None:
            return None
        return round(self.observed_step_ms / self.baseline_step_ms, 3)


class Baseline:
    """Rolling median and MAD of the recent healthy values.

    Recomputed after every ``refresh`` new values once the window holds 50: one value moves the median of
    a few hundred by little, and the two sorts per value were most of the launcher's CPU (bench_watch)."""

    refresh = 8

    def __init__(self, size: int) -> None:
        self.values: deque[float] = deque(maxlen=size)
        self._cache: tuple[float, float] | None = None
        self._stale = 0

    def add(self, value: float) -> None:
        self.values.append(value)
        self._stale += 1
        if len(self.values) < 50 or self._stale >= self.refresh:
            self._cache = None

    def __len__(self) -> int:
        return len(self.values)

    def stats(self) -> tuple[float, float]:
        """(median, robust sigma)."""
        if self._cache is None:
            med = statistics.median(self.values)
            mad = statistics.median(abs(v - med) for v in self.values)
            self._cache = (med, ROBUST_SIGMA * mad)
            self._stale = 0
        return self._cache


class _Streak:
    """A slow stretch: slow values, one normal value in between tolerated (two in a row end it).

    Re-armed once ``need`` consecutive normal values were seen (one long slowdown fires once)."""

    def __init__(self) -> None:
        self.values: list[tuple[int, float]] = []
        self.seconds = 0.0  # wall time the stretch has lasted
        self.dip = 0
        self.normal_run = 0
        self.armed = True

    def slow(self, step: int, value: float, seconds: float) -> None:
        self.values.append((step, value))
        self.seconds += seconds
        self.dip = self.normal_run = 0

    def normal(self, need: int, seconds: float) -> None:
        self.normal_run += 1
        if self.values:
            self.dip += 1
            self.seconds += seconds
            if self.dip >= 2:
                self.values, self.seconds, self.dip = [], 0.0, 0
        if self.normal_run >= need:
            self.armed = True

    def ready(self, steps: int, min_s: float) -> bool:
        return self.armed and len(self.values) >= steps and self.seconds >= min_s


class Detector:
    """Pure decision logic over step series (no files): fed ``(rank, step, time_ns)`` points."""

    def __init__(self, opts: WatchOptions, excluded: Callable[[int], bool] = lambda s: False) -> None:
        self.opts = opts
        self.excluded = excluded
        self.times: dict[int, dict[int, int]] = {}  # rank -> step -> time_ns (recent steps only)
        self.last_step: dict[int, int] = {}
        self.job_done = 0  # newest step every rank finished and the detector looked at
        self.job = Baseline(opts.window)
        self.lags: dict[int, Baseline] = {}
        self.job_streak = _Streak()
        self.lag_streaks: dict[int, _Streak] = {}
        self.recent: deque[tuple[int, float]] = deque(maxlen=opts.window)  # (step, job step s), every step
        self.stalled_at: int | None = None  # job step at which a stall already fired

    def add(self, rank: int, points: list[tuple[int, int]]) -> None:
        series = self.times.setdefault(rank, {})
        for step, t_ns in points:
            if step <= self.last_step.get(rank, 0) and step == 1:  # a restarted process: start again
                series.clear()
            series[step] = t_ns
            self.last_step[rank] = step

    def median_step_s(self) -> float | None:
        return self.job.stats()[0] if len(self.job) else None

    def recent_step_s(self) -> float | None:
        """Median of the last few job steps, slow ones included (to size the capture's lead)."""
        last = [d for _, d in list(self.recent)[-self.opts.steps:]]
        return statistics.median(last) if last else self.median_step_s()

    def evaluate(self) -> list[Trigger]:
        """Look at every step all ranks finished since the last call; the triggers that fire."""
        out: list[Trigger] = []
        if not self.times:
            return out
        ranks = sorted(self.times)
        newest = min(self.last_step.get(r, 0) for r in ranks)
        for step in range(max(self.job_done + 1, 2), newest + 1):
            ends = [self.times[r].get(step) for r in ranks]
            prev = [self.times[r].get(step - 1) for r in ranks]
            if None in ends or None in prev:
                continue
            now_ends = [e for e in ends if e is not None]
            prev_ends = [e for e in prev if e is not None]
            duration = (max(now_ends) - max(prev_ends)) / 1e9
            self.recent.append((step, duration))
            if duration <= 0 or self.excluded(step):
                continue
            earliest = min(now_ends)
            lags = {r: (t - earliest) / 1e9 for r, t in zip(ranks, now_ends)}
            out.extend(self._judge(step, duration, lags))
        self.job_done = max(self.job_done, newest)
        for r in ranks:  # bounded memory: keep the steps still needed
            series = self.times[r]
            if len(series) > 4 * self.opts.window:
                for s in [s for s in series if s < self.job_done - self.opts.window]:
                    del series[s]
        return out

    def _judge(self, step: int, duration: float, lags: dict[int, float]) -> list[Trigger]:
        o = self.opts
        out: list[Trigger] = []
        ready = len(self.job) >= o.min_history
        med, sigma = self.job.stats() if len(self.job) else (duration, 0.0)
        late: list[int] = []
        lag_extra: list[float] = []
        for rank, lag in lags.items():
            base = self.lags.setdefault(rank, Baseline(o.window))
            streak = self.lag_streaks.setdefault(rank, _Streak())
            if not ready or len(base) < o.min_history:
                base.add(lag)
                continue
            lmed, lsigma = base.stats()
            if lag > lmed + max((o.factor - 1) * med, o.mads * lsigma):
                streak.slow(step, lag - lmed, duration)
                if streak.ready(o.steps, o.min_slow_s):
                    late.append(rank)
                    lag_extra.append(statistics.median(v for _, v in streak.values))
            else:
                streak.normal(o.steps, duration)
                base.add(lag)
        if not ready:
            self.job.add(duration)
            return out
        slow = duration > med + max((o.factor - 1) * med, o.mads * sigma)
        if slow:
            self.job_streak.slow(step, duration, duration)
            if len(self.job_streak.values) > o.window:  # a new regime lasting a whole window: adopt it
                for _, v in self.job_streak.values:
                    self.job.add(v)
                self.job_streak.values, self.job_streak.seconds = [], 0.0
        else:
            self.job_streak.normal(o.steps, duration)
            self.job.add(duration)
        if late:
            since = min(self.lag_streaks[r].values[0][0] for r in late)
            extra = statistics.median(lag_extra)
            for r in late:
                self.lag_streaks[r].armed = False
            self.job_streak.armed = False  # the job is slow because of them: one trigger
            out.append(Trigger("rank_late", step, since, late, med * 1e3, (med + extra) * 1e3,
                               f"rank(s) {', '.join(map(str, late))} ended {len(self.lag_streaks[late[0]].values)} steps "
                               f"from step {since} on {extra * 1e3:.1f} ms later than usual relative to the earliest rank "
                               f"(threshold: (factor {o.factor} - 1) x median step and {o.mads} MADs of its lag)"))
        elif slow and self.job_streak.ready(o.steps, o.min_slow_s):
            values = [v for _, v in self.job_streak.values]
            observed = statistics.median(values)
            self.job_streak.armed = False
            out.append(Trigger("job_slowdown", step, self.job_streak.values[0][0], [], med * 1e3, observed * 1e3,
                               f"{len(values)} slow steps from step {self.job_streak.values[0][0]} on took "
                               f"{observed * 1e3:.1f} ms (median) instead of "
                               f"{med * 1e3:.1f} ms: beyond x{o.factor} and median + {o.mads} robust sigmas "
                               f"({(med + o.mads * sigma) * 1e3:.1f} ms)"))
        return out

    def stall(self, now_ns: int) -> Trigger | None:
        """A stall: no rank finished a step for much longer than a step takes (once per stall)."""
        o = self.opts
        if len(self.job) < o.min_history or not self.last_step:
            return None
        newest = max(self.last_step.values())
        latest_ns = max(self.times[r].get(self.last_step[r], 0) for r in self.times)
        med = self.job.stats()[0]
        limit = max(o.stall_min_s, o.stall_factor * med)
        gap = (now_ns - latest_ns) / 1e9
        if gap <= limit or self.stalled_at == newest or self.excluded(newest + 1):
            return None
        self.stalled_at = newest
        return Trigger("stall", self.job_done, newest + 1, [], med * 1e3, gap * 1e3,
                       f"no rank finished a step for {gap:.1f} s (usual step {med * 1e3:.1f} ms; stall threshold "
                       f"max({o.stall_min_s} s, {o.stall_factor} x median) = {limit:.1f} s)")


def profiler_steps(config: dict[str, Any]) -> Callable[[int], bool]:
    """Optimizer steps the default profiler may slow down (traced steps and the export step after)."""
    if not config.get("profile", True):
        return lambda s: False
    wait, warmup, active = int(config["wait"]), int(config["warmup"]), int(config["active"])
    every, repeat = int(config.get("every") or 0), int(config.get("repeat") or 1)
    if every > 0:
        wait, repeat = max(0, every - warmup - active), 0
    n = wait + warmup + active

    def slowed(step: int) -> bool:
        p = step - 2  # the profiler starts after step 1: profiler step p is optimizer step p + 2
        if p < 0:
            return True  # step 1 and the profiler's start
        cycle, pos = divmod(p, n)
        if repeat > 0:  # the whole bounded window (start-up steps are no steady state) and its export
            return cycle < repeat or p - repeat * n <= 1
        return pos >= wait - 1 or pos <= 1

    return slowed


def default_window_end(config: dict[str, Any]) -> int | None:
    """The last optimizer step the default profiler runs in (None: it never stops, ``--every``)."""
    if not config.get("profile", True):
        return 0
    if int(config.get("every") or 0) > 0:
        return None
    n = int(config["wait"]) + int(config["warmup"]) + int(config["active"])
    return 1 + n * int(config.get("repeat") or 1) + 1


class Watch:
    """The launcher's side: polls the series, asks for captures, services dump requests."""

    def __init__(self, host_dir: Path, opts: WatchOptions, profiler_config: dict[str, Any],
                 note: Callable[[str], None]) -> None:
        self.host_dir = host_dir
        self.opts = opts
        self.note = note
        self.reader = cap.SeriesReader(host_dir)
        self.default_end = default_window_end(profiler_config)
        self.profiled = profiler_steps(profiler_config)
        self.capture_spans: list[tuple[int, int]] = []
        self.detector = Detector(opts, self._excluded)
        self.captures: list[dict[str, Any]] = []  # this watch's own
        self.last_capture_at: float | None = None
        self.last_capture_step = 0
        self.seen_request: int = 0
        self.dumped: set[int] = set()
        self.stopped: str | None = None
        self.last_state_write = 0.0

    def _excluded(self, step: int) -> bool:
        if self.profiled(step):
            return True
        return any(first - 1 <= step <= last + 2 for first, last in self.capture_spans)

    def poll(self, dump: Callable[[str], dict[str, Any]]) -> None:
        """One round: new steps, requests written by others (``snap``), detection, state file."""
        for rank, points in self.reader.read_new().items():
            self.detector.add(rank, points)
        self._follow_requests(dump)
        if self.opts.enabled:
            triggers = self.detector.evaluate()
            stall = self.detector.stall(time.time_ns())
            if stall is not None and self._ranks_running():  # a rank exiting: the job is ending, no stall
                triggers.append(stall)
            for trig in triggers[:1]:
                self._on_trigger(trig, dump)
        else:
            self.detector.evaluate()
        now = time.monotonic()
        if now - self.last_state_write > 2.0:
            self.write_state()
            self.last_state_write = now

    def _ranks_running(self) -> bool:
        """Every rank process of this host is running and none began exiting (``progress/rank{R}.exit``)."""
        if any((self.host_dir / "progress").glob("rank*.exit")):
            return False
        host = socket.gethostname()
        pids = [doc["pid"] for doc in (read_json(p) for p in (self.host_dir / "ranks").glob("rank*.json"))
                if doc and doc.get("host") == host and isinstance(doc.get("pid"), int)]
        return bool(pids) and all(pid_running(pid) for pid in pids)

    def _follow_requests(self, dump: Callable[[str], dict[str, Any]]) -> None:
        """A request from ``snap``: its steps leave the baseline; with ``dump`` this launcher dumps."""
        req = cap.read_request(self.host_dir)
        if not req or not isinstance(req.get("id"), int) or req["id"] <= self.seen_request:
            return
        self.seen_request = req["id"]
        try:
            first, k = int(req["start_step"]), int(req["steps"])
        except (KeyError, TypeError, ValueError):
            return
        self.capture_spans.append((first - cap.WARMUP_STEPS, first + k - 1))
        if req.get("dump") and req["id"] not in self.dumped:
            self._dump_into(req["id"], dump)

    def _dump_into(self, cid: int, dump: Callable[[str], dict[str, Any]]) -> None:
        self.dumped.add(cid)
        stacks, fr = cap.take_dump(self.host_dir, cid, dump)
        path = cap.capture_dir(self.host_dir, cid) / "trigger.json"
        trigger = read_json(path)
        if trigger is not None:
            trigger["stacks"], trigger["fr"] = stacks, fr
            write_json(path, trigger)

    def _blocked(self, trig: Trigger) -> str | None:
        """Why no capture now: the cool-down (quiet), or a cap reached (said once, then the watch stops)."""
        o = self.opts
        if self.stopped:
            return self.stopped
        if len(self.captures) >= o.max_captures:
            self.stopped = f"--max-captures {o.max_captures} reached; the watch records no more"
        elif cap.captures_bytes(self.host_dir) > o.max_disk_mb * 1e6:
            self.stopped = f"captures use more than --watch-max-disk {o.max_disk_mb:g} MB; the watch records no more"
        if self.stopped:
            self.note(f"watch: {trig.kind} at step {trig.detected_at_step} not recorded: {self.stopped}")
            return self.stopped
        if self.last_capture_at is not None and time.monotonic() - self.last_capture_at < o.cooldown_s:
            return "cool-down"
        if trig.detected_at_step <= self.last_capture_step:
            return "cool-down"
        return None

    def _on_trigger(self, trig: Trigger, dump: Callable[[str], dict[str, Any]]) -> None:
        if self._blocked(trig):
            return
        o = self.opts
        cid = cap.allocate([self.host_dir])
        steps: list[int] | None = None
        why = "the --every profiler runs all the time (stacks and Flight Recorder only)"
        if self.default_end is not None:
            first = cap.start_step([self.host_dir], self.detector.recent_step_s(), o.lead_s,
                                   not_before=self.default_end + 2)
            steps = [first, first + o.capture_steps - 1]
        trigger = {"id": cid, "kind": trig.kind, "detected_at_step": trig.detected_at_step,
                   "since_step": trig.since_step, "ranks": trig.ranks,
                   "baseline_step_ms": _r(trig.baseline_step_ms), "observed_step_ms": _r(trig.observed_step_ms),
                   "factor": trig.factor, "steps": steps, "wall_time": iso(time.time_ns()),
                   "requested_by": "watch", "stacks": None, "fr": None,
                   "note": trig.note + ("" if steps else f"; no trace recorded: {why}")}
        cap.write_trigger(self.host_dir, cid, trigger)
        self.captures.append(trigger)
        self.last_capture_at = time.monotonic()
        if steps is not None:
            self.capture_spans.append((steps[0] - cap.WARMUP_STEPS, steps[1]))
            cap.write_request(self.host_dir, cap.make_request(cid, steps[0], o.capture_steps, trig.kind, "watch",
                                                              None, o.dump))
            self.seen_request = cid
            self.last_capture_step = steps[1]
        self.note(f"watch: {trig.kind} at step {trig.detected_at_step} ({trig.note}); "
                  + (f"recording steps {steps[0]}-{steps[1]} on every rank into {cap.capture_dir(self.host_dir, cid)}"
                     if steps else f"no trace: {why}"))
        if o.dump:
            self._dump_into(cid, dump)
        self.write_state()

    def finish(self) -> None:
        """After the job: a capture no rank answered says so in its trigger (the job ended first)."""
        for cid in cap.capture_ids(self.host_dir):
            path = cap.capture_dir(self.host_dir, cid) / "trigger.json"
            trigger = read_json(path)
            if not trigger or not trigger.get("steps") or cap.rank_outcomes(self.host_dir, cid):
                continue
            trigger["note"] = (f"{trigger.get('note') or ''}; the job ended before step {trigger['steps'][0]}: "
                               "nothing was recorded").lstrip("; ")
            write_json(path, trigger)
        self.write_state()

    def write_state(self) -> None:
        """``RUN/watch.json``: options, the baseline and the captures so far (read by ``traceread watch``)."""
        med = self.detector.median_step_s()
        doc = {"enabled": self.opts.enabled, "options": {k: v for k, v in vars(self.opts).items()},
               "not_before_step": (self.default_end or 0) + 2 if self.default_end is not None else None,
               "baseline_step_ms": _r(med * 1e3 if med else None), "job_step": self.detector.job_done,
               "captures": [{k: c[k] for k in ("id", "kind", "steps", "detected_at_step")} for c in self.captures],
               "stopped": self.stopped, "updated_at": iso(time.time_ns())}
        try:
            write_json(self.host_dir / "watch.json", doc)
        except OSError:
            pass


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
