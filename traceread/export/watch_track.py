"""The ``traceread watch`` process of the merged trace: the whole job's step time as a counter track,
and each captured window (and the baseline) as a slice, for a watched run (``report["watch"]``).

Times: the series is in wall-clock ns; the trace in each rank's µs. ``watch.anchor`` is a step both
hold (the baseline window's last step): its end on rank 0's trace, minus its wall time, maps every
wall time onto the trace clock. Without an anchor the wall time in µs is used as is.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from traceread.report_schema import Report

WATCH_PID = 100_001
_encode = msgspec.json.Encoder().encode


def _offset_us(report: Report, watch: dict[str, Any]) -> float:
    anchor = watch.get("anchor") or {}
    ranks = sorted(report.get("ranks") or [], key=lambda e: e["rank"])
    if anchor.get("wall_ns") is None or not ranks:
        return 0.0
    step = next((s for s in ranks[0].get("steps") or [] if s.get("step") == anchor.get("step")), None)
    if step is None:
        return 0.0
    return float(step["start_us"]) + float(step["duration_us"]) - int(anchor["wall_ns"]) / 1e3


def watch_events(report: Report) -> Iterator[bytes]:
    """Counter samples (one per series point, at its last step's end) and capture slices."""
    watch = report.get("watch")
    if not isinstance(watch, dict) or not watch.get("series"):
        return
    series = watch["series"]
    ends = series.get("wall_end_ns") or []
    if not ends:
        return
    off = _offset_us(report, watch)
    yield _encode({"ph": "M", "name": "process_name", "pid": WATCH_PID, "args": {"name": "traceread watch: whole job"}})
    yield _encode({"ph": "M", "name": "thread_name", "pid": WATCH_PID, "tid": 1, "args": {"name": "captured windows"}})
    at: dict[int, float] = {}
    for last, end, med, top in zip(series["step_last"], ends, series["job_median_us"], series["job_max_us"]):
        ts = end / 1e3 + off
        at[int(last)] = ts
        yield _encode({"ph": "C", "name": "step time (ms)", "pid": WATCH_PID, "ts": ts,
                       "args": {"median": round(med / 1e3, 3), "max": round(top / 1e3, 3)}})
    firsts = series["step_first"]

    def when(step: int) -> float | None:
        keys = [k for k in at if k >= step]
        return at[min(keys)] if keys else None

    spans: list[tuple[str, Any, dict[str, Any]]] = [("baseline window", watch.get("baseline_steps"), {})]
    spans += [(f"capture {c.get('id')}: {c.get('kind')}", c.get("steps"),
               {"sentence": c.get("sentence"), "rank": c.get("rank"), "lost_ms": round((c.get("lost_us") or 0) / 1e3, 3)})
              for c in watch.get("captures") or []]
    for name, steps, args in spans:
        if not steps:
            continue
        start = when(int(steps[0]) - 1) if int(steps[0]) - 1 >= firsts[0] else None
        end = when(int(steps[1]))
        if end is None:
            continue
        start = end - 1.0 if start is None or start >= end else start
        yield _encode({"ph": "X", "name": name, "pid": WATCH_PID, "tid": 1, "ts": start, "dur": end - start,
                       "args": {"steps": steps, **args}})
