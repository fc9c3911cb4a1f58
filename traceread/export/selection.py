"""What part of a job goes into the export: ``--ranks 0,3-5`` and ``--steps A:B``.

Big jobs produce traces no viewer can open at once; a few ranks and a few steps keep the file
loadable. A rank's window for a step range is the union of its device step windows (from the
report) and its host ``ProfilerStep`` windows, so the CPU work that launched those steps is kept.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import polars as pl

if TYPE_CHECKING:
    from traceread.report_schema import RankEntry


def parse_ranks(text: str | None) -> set[int] | None:
    """``"0,3-5"`` -> {0, 3, 4, 5}; None/empty -> None (every rank). Raises ValueError on bad text."""
    if not text:
        return None
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-", 1)
            lo, hi = int(a), int(b)
            if lo < 0 or hi < lo:
                raise ValueError(f"bad rank range {part!r}")
            out.update(range(lo, hi + 1))
        else:
            r = int(part)
            if r < 0:
                raise ValueError(f"bad rank {part!r}")
            out.add(r)
    if not out:
        raise ValueError(f"no rank in {text!r}")
    return out


def parse_steps(text: str | None) -> tuple[int | None, int | None] | None:
    """``"A:B"`` (inclusive), ``"A:"``, ``":B"`` or ``"A"`` -> (lo, hi); None -> every step."""
    if not text:
        return None
    if ":" in text:
        a, b = text.split(":", 1)
        lo = int(a) if a.strip() else None
        hi = int(b) if b.strip() else None
    else:
        lo = hi = int(text)
    if lo is not None and hi is not None and hi < lo:
        raise ValueError(f"empty step range {text!r}")
    return lo, hi


def in_range(step: int, steps: tuple[int | None, int | None] | None) -> bool:
    if steps is None:
        return True
    lo, hi = steps
    return (lo is None or step >= lo) and (hi is None or step <= hi)


def rank_window(entry: RankEntry, host_steps: pl.DataFrame | None,
                steps: tuple[int | None, int | None] | None) -> tuple[float, float] | None:
    """The rank's own-clock time window of the selected steps; None = keep everything.

    Returns an empty window (lo > hi) when the rank has none of the selected steps."""
    if steps is None:
        return None
    spans = [(float(s["start_us"]), float(s["start_us"]) + float(s.get("duration_us") or 0.0))
             for s in entry.get("steps") or [] if in_range(int(s["step"]), steps)]
    if host_steps is not None and host_steps.height:
        for step, ts, end in host_steps.select("step", "ts", "end").iter_rows():
            if step is not None and ts is not None and end is not None and in_range(int(step), steps):
                spans.append((float(ts), float(end)))
    if not spans:
        return (1.0, 0.0)
    return min(a for a, _ in spans), max(b for _, b in spans)
