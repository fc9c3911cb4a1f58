"""Small numbers every view needs, computed the same way from the report document.

A rank's top-level fields (``window_us``, ``compute_us``, ...) cover the whole-trace GPU window.
"Per step" always means: the mean over the rank's ``steps`` entries of that step's own value (each
step's breakdown on its device-aligned window), never a whole-trace total divided by the number of
steps (the whole trace also holds the time before the first and after the last analysed step).
A rank without steps is one window: its top-level value is its per-step value.
"""

from __future__ import annotations

from collections.abc import Iterable
from statistics import fmean, median
from typing import Any

from traceread.report_schema import CollectiveEntry, RankEntry, Report

#: Rank-level field -> the StepEntry field holding the same quantity for one step.
_STEP_FIELD = {"window_us": "duration_us"}


def n_steps(rank: RankEntry) -> int:
    """Steps analysed on this rank (at least 1: a trace without step markers is one window)."""
    return max(1, len(rank.get("steps") or []))


def step_values(rank: RankEntry, field: str) -> list[float] | None:
    """Each step's value of ``field`` (``window_us`` reads ``duration_us``); None when the rank has
    no steps or a step lacks the value."""
    steps = rank.get("steps") or []
    key = _STEP_FIELD.get(field, field)
    vals: list[Any] = [s.get(key) for s in steps]  # a field chosen at run time: any step value
    if not steps or any(v is None for v in vals):
        return None
    return [float(v) for v in vals]


def per_step(rank: RankEntry, field: str) -> float | None:
    """Mean over the rank's steps of each step's ``field``; the rank's own value when it has no
    steps (one window); None when unknown."""
    if rank.get("steps"):
        vals = step_values(rank, field)
        return fmean(vals) if vals else None
    value: Any = rank.get(field)
    return None if value is None else float(value)


def step_us(rank: RankEntry) -> float | None:
    """Mean step duration of a rank (mean of ``steps[].duration_us``)."""
    return per_step(rank, "window_us")


def median_step_duration_us(rank: RankEntry) -> float | None:
    """Median step duration of a rank; its window when it has no steps."""
    if rank.get("steps"):
        vals = step_values(rank, "window_us")
        return median(vals) if vals else None
    value = rank.get("window_us")
    return None if value is None else float(value)


def host_bound_per_step(rank: RankEntry) -> float | None:
    """Mean over steps of the GPU idle time the host caused (``steps[].host_bound_us``); the
    whole-window ``idle_breakdown.host_bound_us`` for a rank without steps."""
    if rank.get("steps"):
        return per_step(rank, "host_bound_us")
    ib = rank.get("idle_breakdown")
    v = ib.get("host_bound_us") if ib else None
    return None if v is None else float(v)


def med(values: Iterable[float | None]) -> float | None:
    """Median of the known values, None when none is known."""
    vals = [float(v) for v in values if v is not None]
    return median(vals) if vals else None


def median_step_us(report: Report) -> float | None:
    """Median over ranks of each rank's mean step time (per-rank views; the job's step is
    :func:`step_figure`)."""
    return med(step_us(r) for r in report.get("ranks") or [])


def step_figure(report: Report) -> tuple[float | None, int, float | None]:
    """The job's step: (mean step µs, steps, median step µs) of the window ledger (docs/ledger.md:
    each step's duration on its critical rank, the longest). Documents without one: the same from
    the ranks' step entries (a step's duration is its longest rank's); else the per-rank median."""
    w = (report.get("ledger") or {}).get("window")
    if w:
        return float(w["mean_step_us"]), int(w["steps"]), float(w["median_step_us"])
    ranks = report.get("ranks") or []
    per: dict[int, list[float]] = {}
    for r in ranks:
        for s in r.get("steps") or []:
            if s.get("duration_us") is not None:
                per.setdefault(int(s["step"]), []).append(float(s["duration_us"]))
    durs = sorted(max(v) for v in per.values() if len(v) == len(ranks))
    if durs:
        return fmean(durs), len(durs), durs[(len(durs) - 1) // 2]
    m = median_step_us(report)
    return m, total_steps(report), m


def total_steps(report: Report) -> int:
    """Number of steps in the analysed window (the most any rank has)."""
    ranks = report.get("ranks") or []
    return max((n_steps(r) for r in ranks), default=1)


def worst_rank(report: Report, field: str) -> tuple[RankEntry | None, float | None]:
    """The rank with the largest per-step value of ``field`` and that value."""
    best: tuple[RankEntry | None, float | None] = (None, None)
    for r in report.get("ranks") or []:
        v = per_step(r, field)
        if v is not None and (best[1] is None or v > best[1]):
            best = (r, v)
    return best


def pct_of_step(us: float | None, report: Report) -> float | None:
    """``us`` as a percentage of the job's median step time."""
    step = median_step_us(report)
    if us is None or not step:
        return None
    return 100.0 * us / step


def get(d: Any, key: str, default: Any = None) -> Any:
    """``d[key]`` for dicts that may be None."""
    return default if not isinstance(d, dict) else d.get(key, default)


def coll_time(c: Any) -> float:
    """Total time ranks spent in a collective group: (transfer + mean wait) × calls."""
    return (float(c.get("latency_us") or 0) + float(c.get("wait_us") or 0)) * int(c.get("count") or 1)


def network_loss_us(report: Report) -> tuple[list[CollectiveEntry], float]:
    """(network collectives, their time above the link floor per step): an upper bound on what a
    correct transport would save."""
    steps = total_steps(report)
    net = [c for c in report.get("collectives") or [] if c.get("link") == "network"]
    lost = 0.0
    for c in net:
        bus, peak, latency = c.get("busbw_gbps"), c.get("link_peak_gbps"), c.get("latency_us")
        if bus and peak and latency:
            frac = max(0.0, 1.0 - float(bus) / float(peak))
            lost += frac * float(latency) * int(c.get("count") or 1) / steps
    return net, lost
