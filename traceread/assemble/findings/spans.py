"""Which recorded host span a finding's host time was in, said the same way by every finding.

A finding that claims host time from the window (:class:`~traceread.assemble.findings.base.Budget`)
gets back the spans that time was in (``Budget.drain``): exactly the µs it holds, per (rank, span),
so a straggler, a slow step and the host-bound share never name one span's time twice and never
disagree on its cause. The cause is the span holding most of it; "outside any recorded span" only
when most of it is time no span covers, and then the finding lists the spans it checked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from traceread.assemble.findings.base import SpanId
from traceread.fmt import ms
from traceread.report_schema import Report

#: How a family reads in a sentence ("its data loader takes …").
FAMILY_WORDS: dict[str, str] = {
    "data_loading": "data loader", "optimizer": "optimizer step", "sync": "synchronising call",
    "checkpoint": "checkpoint saving", "gc": "garbage collection", "logging": "logging",
    "evaluation": "evaluation", "framework_step": "framework hook", "annotation": "annotated region",
    "python": "Python code", "operator": "operator", "communication": "communication call",
}


@dataclass
class SpanCause:
    """The span most of a finding's host time was in (or None: no recorded span covers most of it)."""

    rank: int | None
    family: str | None
    span: str | None
    us: float  # µs of the finding's time in that span (over the window)
    total_us: float  # the finding's host time that was looked up (over the window)
    uncovered_us: float  # of it, time no span covers
    parts: list[tuple[int, SpanId, float]] = field(default_factory=list)  # every (rank, span, µs), largest first

    @property
    def covered(self) -> bool:
        return self.span is not None


def cause_of(taken: Mapping[tuple[int, SpanId], float]) -> SpanCause | None:
    """The dominant span of a drained claim; None when the claim held no host span data."""
    items = sorted(((r, sid, us) for (r, sid), us in taken.items() if us > 0), key=lambda x: (-x[2], str(x[1])))
    if not items:
        return None
    total = sum(us for _, _, us in items)
    unc = sum(us for _, sid, us in items if sid is None)
    by_span: dict[tuple[int, SpanId], float] = {}
    for r, sid, us in items:
        by_span[(r, sid)] = by_span.get((r, sid), 0.0) + us
    covered = [(r, sid, us) for (r, sid), us in by_span.items() if sid is not None]
    covered.sort(key=lambda x: (-x[2], str(x[1])))
    if not covered or unc >= covered[0][2]:
        return SpanCause(items[0][0], None, None, unc, total, unc, items)
    r, sid, us = covered[0]
    assert sid is not None
    return SpanCause(r, sid[0], sid[1], us, total, unc, items)


#: Ledger categories whose time is labelled with its covering span (analysis/ledger/rank.py SPAN_CATEGORIES).
LABELLED = ("host_bound", "idle_other")


def late_cause(late: Mapping[str, Any]) -> SpanCause | None:
    """Why a late rank was late, by span: its host time beyond the other ranks' (``late[].excess`` of
    the labelled categories) per covering span (``late[].spans``), the rest no span covers. None when
    that host time is less than half of its excess (the cause is not the host's)."""
    excess = {str(x["category"]): float(x["us"]) for x in late.get("excess") or []}
    host = sum(us for c, us in excess.items() if c in LABELLED)
    if host <= 0 or host < 0.5 * sum(excess.values()):
        return None
    rank = int(late["rank"])
    taken: dict[tuple[int, SpanId], float] = {}
    for x in late.get("spans") or []:
        if x.get("category") in LABELLED:
            sid: SpanId = (x.get("family"), str(x["span"]))
            taken[(rank, sid)] = taken.get((rank, sid), 0.0) + float(x["us"])
    covered = sum(taken.values())
    if covered > host:  # per-span excess is taken span by span: it can exceed the category's
        scale = host / covered
        taken = {k: v * scale for k, v in taken.items()}
    elif host - covered > 0:
        taken[(rank, None)] = host - covered
    return cause_of(taken)


def span_per_step(report: Report, rank: int, name: str) -> float | None:
    """The span's own time per step on ``rank`` (``ranks[].host_spans``), None when not recorded there."""
    for r in report.get("ranks") or []:
        if int(r.get("rank", -1)) == rank:
            for s in r.get("host_spans") or []:
                if s.get("name") == name:
                    return float(s.get("us_per_step") or 0.0)
            return 0.0 if r.get("host_spans") is not None else None
    return None


def others_text(report: Report, rank: int, name: str, top: int = 3) -> str:
    """"rank 0: 0.2 ms" — the same span on the other ranks (the median of the rest when there are many)."""
    vals = []
    for r in report.get("ranks") or []:
        rk = int(r.get("rank", -1))
        if rk != rank and r.get("host_spans") is not None:
            v = span_per_step(report, rk, name)
            vals.append((rk, v or 0.0))
    if not vals:
        return ""
    if len(vals) <= top:
        return ", ".join(f"rank {rk}: {ms(v)}" for rk, v in vals)
    s = sorted(v for _, v in vals)
    return f"median of the other {len(vals)} ranks: {ms(s[(len(s) - 1) // 2])}"


def phrase(c: SpanCause) -> str:
    """"its data loader (enumerate(DataLoader)#…)" for a covered cause."""
    word = FAMILY_WORDS.get(c.family or "", "span")
    return f"its {word} ({c.span})"


def checked(report: Report, rank: int | None, top: int = 6) -> str:
    """The recorded spans of ``rank`` that were checked and do not cover the time (for "outside any span")."""
    for r in report.get("ranks") or []:
        if rank is not None and int(r.get("rank", -1)) == rank:
            names = [f"{s['name']} ({ms(float(s.get('us_per_step') or 0.0))}/step)"
                     for s in (r.get("host_spans") or [])[:top] if s.get("family") != "communication"]
            if names:
                return "checked the rank's recorded spans, none covers it: " + ", ".join(names)
            return "the rank's trace records no named host span (data loader, optimizer, annotations) in its steps"
    return "no recorded span covers it"


def evidence(report: Report, c: SpanCause, n: int) -> list[str]:
    """One line per span the time was in, with the same span on the other ranks."""
    out = []
    for r, sid, us in c.parts[:4]:
        if sid is None:
            out.append(f"rank {r}: {ms(us / n)} per step no recorded span covers ({checked(report, r)})")
            continue
        fam, name = sid
        own = span_per_step(report, r, name)
        oth = others_text(report, r, name)
        extra = f"; the span takes {ms(own)} per step on rank {r}" if own else ""
        extra += f" ({oth})" if oth else ""
        out.append(f"rank {r}: {ms(us / n)} per step of this time inside {name} "
                   f"({FAMILY_WORDS.get(fam or '', 'span')}){extra}")
    return out


def span_numbers(report: Report, c: SpanCause, n: int) -> tuple[float, str]:
    """(the span's time per step on its rank, the same span on the others) for a title."""
    own = span_per_step(report, c.rank, c.span) if c.rank is not None and c.span else None
    per = own if own else c.us / max(n, 1)
    return per, others_text(report, c.rank, c.span) if c.rank is not None and c.span else ""


def grown_spans(step: Mapping[str, Any], ref: Mapping[str, Any] | None) -> list[SpanId]:
    """The spans whose time in ``step`` grew over the reference step's, largest growth first."""
    def tot(b: Mapping[str, Any] | None) -> dict[SpanId, float]:
        d: dict[SpanId, float] = {}
        for s in (b or {}).get("spans") or []:
            sid = (s.get("family"), str(s["span"]))
            d[sid] = d.get(sid, 0.0) + float(s["us"])
        return d
    mine, base = tot(step), tot(ref)
    grow = sorted(((us - base.get(sid, 0.0), sid) for sid, us in mine.items()), key=lambda x: (-x[0], str(x[1])))
    return [sid for g, sid in grow if g > 0]


def describe(report: Report, c: SpanCause | None, n: int) -> tuple[str, Any] | None:
    """(sentence, family) naming the span a share of host time was in; None without span data."""
    if c is None:
        return None
    if not c.covered:
        return (f"its host time is outside any recorded span ({checked(report, c.rank)})", None)
    per, oth = span_numbers(report, c, n)
    return (f"{phrase(c)} takes {ms(per)} per step" + (f" ({oth})" if oth else ""), c.family)


__all__ = ["FAMILY_WORDS", "SpanCause", "cause_of", "checked", "describe", "evidence", "grown_spans", "others_text",
           "phrase", "span_numbers", "span_per_step"]
