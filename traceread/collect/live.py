"""What ``traceread watch`` shows, read from a run folder while the job runs (no torch, bounded work).

Each :meth:`LiveRun.refresh` reads only what the ranks appended to their step series since the last
call, plus a few small JSON files (``watch.json``, ``captures/capture{N}/trigger.json``, ``run.json``).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traceread.collect import captures as cap
from traceread.collect.runinfo import read_json

RECENT = 10  # steps in a rank's "current step time"
TREND_BUCKETS = 24


@dataclass
class RankRow:
    rank: int
    step: int
    step_ms: float | None  # median of its last RECENT steps
    lag_ms: float | None  # how much later than the earliest rank it ended the newest common step
    behind_steps: int  # steps behind the most advanced rank
    last_capture: str | None


@dataclass
class LiveView:
    ranks: list[RankRow]
    job_step: int
    job_step_ms: float | None
    baseline_ms: float | None
    trend_ms: list[float]  # job step time, median per bucket of steps, oldest first
    trend_steps: int  # steps per bucket
    captures: list[dict[str, Any]]
    ended: bool
    exit_code: int | None


@dataclass
class LiveRun:
    run_dir: Path
    history: int = 2000  # steps kept per rank
    hosts: list[Path] = field(default_factory=list)
    readers: dict[Path, cap.SeriesReader] = field(default_factory=dict)
    times: dict[int, deque[tuple[int, int]]] = field(default_factory=dict)

    def refresh(self) -> LiveView:
        self.hosts = cap.host_dirs(self.run_dir)
        for host in self.hosts:
            reader = self.readers.setdefault(host, cap.SeriesReader(host))
            for rank, points in reader.read_new().items():
                series = self.times.setdefault(rank, deque(maxlen=self.history))
                if points and series and points[0][0] <= series[-1][0]:
                    series.clear()  # a restarted rank process
                series.extend(points)
        return self._view()

    def _view(self) -> LiveView:
        per_rank = {r: dict(s) for r, s in self.times.items() if s}
        last = {r: max(s) for r, s in per_rank.items()}
        common = min(last.values()) if last else 0
        newest = max(last.values()) if last else 0
        ends = {s: max(per_rank[r][s] for r in per_rank) for s in range(max(1, common - self.history + 1), common + 1)
                if all(s in per_rank[r] for r in per_rank)}
        job = [(s, (ends[s] - ends[s - 1]) / 1e6) for s in sorted(ends) if s - 1 in ends]
        caps = self._captures()
        rows = []
        for r in sorted(per_rank):
            steps = per_rank[r]
            durs = [(steps[s] - steps[s - 1]) / 1e6 for s in sorted(steps)[-RECENT - 1:] if s - 1 in steps]
            lag = None
            if common in steps and all(common in per_rank[o] for o in per_rank):
                lag = (steps[common] - min(per_rank[o][common] for o in per_rank)) / 1e6
            mine = [c for c in caps if not c.get("ranks") or r in c["ranks"]]
            last_cap = None
            if mine:
                c = mine[-1]
                st = c.get("steps") or [None, None]
                last_cap = f"#{c['id']} {c.get('kind')} {st[0]}-{st[1]}"
            rows.append(RankRow(r, last[r], round(statistics.median(durs), 3) if durs else None,
                                None if lag is None else round(lag, 3), newest - last[r], last_cap))
        trend, per = _trend([d for _, d in job])
        state = next((s for s in (read_json(h / "watch.json") for h in self.hosts) if s), {}) or {}
        ended, code = self._ended()
        recent = [d for _, d in job[-RECENT:]]
        return LiveView(rows, common, round(statistics.median(recent), 3) if recent else None,
                        state.get("baseline_step_ms"), trend, per, caps, ended, code)

    def _captures(self) -> list[dict[str, Any]]:
        out = []
        for host in self.hosts[:1]:
            for cid in cap.capture_ids(host):
                trig = read_json(cap.capture_dir(host, cid) / "trigger.json")
                if trig:
                    out.append(trig)
        return out

    def _ended(self) -> tuple[bool, int | None]:
        if not self.hosts:
            return False, None
        docs = [read_json(h / "run.json") for h in self.hosts]
        if all(d is not None and "exit_code" in d for d in docs):
            codes = [d["exit_code"] for d in docs if d is not None and isinstance(d.get("exit_code"), int)]
            return True, max(codes, key=abs) if codes else None
        return False, None


def _trend(durations: list[float]) -> tuple[list[float], int]:
    if not durations:
        return [], 0
    per = max(1, len(durations) // TREND_BUCKETS)
    tail = durations[-per * TREND_BUCKETS:]
    return [round(statistics.median(tail[i:i + per]), 3) for i in range(0, len(tail), per)], per


SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float]) -> str:
    """One character per value, scaled from 0 to the largest (a slowdown stands out)."""
    if not values:
        return ""
    top = max(values) or 1.0
    return "".join(SPARK[min(len(SPARK) - 1, int(v / top * (len(SPARK) - 1) + 0.5))] for v in values)
