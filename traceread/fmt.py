"""How numbers, durations, sizes and rank lists are written, the same in every output.

A leaf: the findings (document text), the renderers and the analyses' warnings all write numbers
through these, so "3.0 ms" or "0-3, 7" reads the same wherever it appears.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


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


def rank_runs(ranks: Iterable[int]) -> list[str]:
    """Runs of consecutive ranks: ``[0, 1, 2, 5, 7, 8]`` → ``["0-2", "5", "7-8"]``."""
    rs = sorted(set(int(r) for r in ranks))
    if not rs:
        return []
    parts: list[str] = []
    start = prev = rs[0]
    for r in rs[1:] + [None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return parts


def rank_list(ranks: Iterable[int], limit: int = 8) -> str:
    """"0-3, 7" style compact list of ranks (ranges collapsed, long lists cut)."""
    rs = sorted(set(int(r) for r in ranks))
    if not rs:
        return "none"
    parts = rank_runs(rs)
    if len(parts) > limit:
        return ", ".join(parts[:limit]) + f", … ({len(rs)} ranks)"
    return ", ".join(parts)


def export_command(report: Any) -> str:
    """The command that writes the merged multi-rank timeline for this report's traces."""
    import shlex

    paths = " ".join(shlex.quote(p) for p in (report.get("source") or {}).get("paths") or ["RUN"])
    return f"traceread export {paths} -o timeline.json.gz"
