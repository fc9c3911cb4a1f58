"""Small numbers every view needs, computed the same way from the report document.

"Per step" always means: a rank's total over the analysed window divided by the number of steps
that rank has (1 when the trace has no ``ProfilerStep`` markers and the whole trace is one window).
"""

from __future__ import annotations

from statistics import median
from typing import Any, Iterable

from traceread.report_schema import RankEntry, Report


def n_steps(rank: RankEntry) -> int:
    """Steps analysed on this rank (at least 1: a trace without step markers is one window)."""
    return max(1, len(rank.get("steps") or []))


def per_step(rank: RankEntry, field: str) -> float | None:
    """``rank[field]`` averaged over the rank's steps; None when the field is unknown."""
    value = rank.get(field)  # type: ignore[misc]
    if value is None:
        return None
    return float(value) / n_steps(rank)


def step_us(rank: RankEntry) -> float | None:
    """Mean step duration of a rank: window / steps."""
    return per_step(rank, "window_us")


def med(values: Iterable[float | None]) -> float | None:
    """Median of the known values, None when none is known."""
    vals = [float(v) for v in values if v is not None]
    return median(vals) if vals else None


def median_step_us(report: Report) -> float | None:
    """Median over ranks of each rank's mean step time — the job's step time."""
    return med(step_us(r) for r in report.get("ranks") or [])


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


def ms(us: float | None, digits: int = 1) -> str:
    """Microseconds as a human string in ms ("12.3 ms"), or "n/a"."""
    if us is None:
        return "n/a"
    if abs(us) < 1000.0:
        return f"{us:.0f} µs"
    return f"{us / 1000.0:.{digits}f} ms"


def pct(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}%"


def nbytes(value: float | None) -> str:
    """Bytes with a decimal unit (GB = 1e9, as the bandwidths)."""
    if value is None:
        return "n/a"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B"


def rank_list(ranks: Iterable[int], limit: int = 8) -> str:
    """"0-3, 7" style compact list of ranks (ranges collapsed, long lists cut)."""
    rs = sorted(set(int(r) for r in ranks))
    if not rs:
        return "none"
    parts: list[str] = []
    start = prev = rs[0]
    for r in rs[1:] + [None]:  # type: ignore[list-item]
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    if len(parts) > limit:
        return ", ".join(parts[:limit]) + f", … ({len(rs)} ranks)"
    return ", ".join(parts)


def get(d: Any, key: str, default: Any = None) -> Any:
    """``d[key]`` for dicts that may be None."""
    return default if not isinstance(d, dict) else d.get(key, default)


def coll_time(c: Any) -> float:
    """Total time ranks spent in a collective group: (transfer + mean wait) × calls."""
    return (float(c.get("latency_us") or 0) + float(c.get("wait_us") or 0)) * int(c.get("count") or 1)
