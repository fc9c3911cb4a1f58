"""The step ledger as text: one stacked bar for the job, one per rank, and the findings' coverage.

Bars are proportional strings of one glyph per category (legend below them), so they work in a
colour terminal, a log file and ``--format text`` alike. Jobs with many ranks show the critical
rank and the slowest others, plus a bar of all ranks' mean share, and say so.
"""

from __future__ import annotations

from collections import defaultdict

from traceread.fmt import WHOLE_TRACE, ms, step_name, whole_trace
from traceread.report_schema import LEDGER_CATEGORIES, LedgerPart, Report

#: Glyph, short label and rich colour of each category.
STYLE: dict[str, tuple[str, str, str]] = {
    "compute_bound": ("C", "compute-bound", "green"),
    "memory_bound": ("M", "memory-bound", "yellow"),
    "compute_other": ("c", "other compute", "bright_green"),
    "comm_transfer": ("T", "comm transfer", "blue"),
    "comm_wait": ("W", "comm wait", "magenta"),
    "bubble": ("B", "pipeline bubble", "red"),
    "exposed_memcpy": ("Y", "exposed memcpy", "cyan"),
    "host_bound": ("H", "host-bound", "bright_red"),
    "dependency": ("D", "dependency wait", "bright_magenta"),
    "idle_other": (".", "other idle", "white"),
}
BAR_WIDTH = 60
#: Each category in words, for every view (the document's ids are for programs).
CATEGORY_WORDS: dict[str, str] = {c: label for c, (_glyph, label, _colour) in STYLE.items()}


def by_category(parts: list[LedgerPart]) -> dict[str, float]:
    """µs per category (roles and ranks summed), in display order."""
    acc: dict[str, float] = defaultdict(float)
    for p in parts:
        acc[p["category"]] += float(p["us"])
    return {c: acc[c] for c in LEDGER_CATEGORIES if acc.get(c)}


def bar_cells(totals: dict[str, float], width: int = BAR_WIDTH) -> list[tuple[str, int]]:
    """(category, cells) summing to ``width`` (largest remainder), categories in display order."""
    total = sum(totals.values())
    if total <= 0:
        return []
    raw = {c: v / total * width for c, v in totals.items()}
    cells = {c: int(v) for c, v in raw.items()}
    for c in sorted(raw, key=lambda c: -(raw[c] - cells[c]))[: width - sum(cells.values())]:
        cells[c] += 1
    return [(c, n) for c, n in cells.items() if n > 0]


def bar_text(totals: dict[str, float], width: int = BAR_WIDTH) -> str:
    return "".join(STYLE[c][0] * n for c, n in bar_cells(totals, width))


def legend(totals: dict[str, float]) -> str:
    """``C compute-bound 30.1 ms · W comm wait 3.0 ms · ...`` biggest first."""
    items = sorted(totals.items(), key=lambda kv: -kv[1])
    return " · ".join(f"{STYLE[c][0]} {STYLE[c][1]} {ms(v)}" for c, v in items if v > 0)


def coverage_line(report: Report) -> str | None:
    cov = report.get("coverage")
    if not cov or not cov.get("step_us"):
        return None
    e, s = float(cov["explained_us"]), float(cov["step_us"])
    if whole_trace(report):
        return f"Findings account for {ms(e)} of {ms(s)} ({100 * e / s:.0f}%) of {WHOLE_TRACE}."
    over = f" over {cov['steps']} steps" if cov.get("steps") else ""
    return f"Findings account for {ms(e)} of {ms(s)} per step ({100 * e / s:.0f}%){over}."


def title_line(report: Report) -> str:
    """What the job bars are: the window (every recorded step) and its median step."""
    w = (report.get("ledger") or {}).get("window")
    if not w:
        return "Step ledger — where the median step's time goes (docs/ledger.md)"
    if whole_trace(report):
        return f"Window ledger — where the time of {WHOLE_TRACE} goes ({ms(w['total_us'])}; docs/ledger.md)"
    return (f"Window ledger — where the time of the {w['steps']} recorded steps goes ({ms(w['total_us'])}, "
            f"mean step {ms(w['mean_step_us'])}, median step {ms(w['median_step_us'])}; docs/ledger.md)")


def job_lines(report: Report) -> list[tuple[str, dict[str, float]]]:
    """(caption, totals) of the job's bars: the window per step on average, then its median step."""
    led = report.get("ledger")
    if not led:
        return []
    crit = led.get("critical_rank")
    out = []
    w = led.get("window")
    if whole_trace(report):  # one window: no per-step average, no median step
        return [(f"{WHOLE_TRACE} (critical rank {crit}, {ms(led.get('step_us'))})", by_category(led.get("parts") or []))]
    if w and w.get("steps"):
        per = {c: v / w["steps"] for c, v in by_category(w.get("parts") or []).items()}
        out.append((f"window, per step ({ms(w['mean_step_us'])})", per))
    caption = f"{step_name(led.get('step'), median=True)} (critical rank {crit}, {ms(led.get('step_us'))})"
    out.append((caption, by_category(led.get("parts") or [])))
    return out


def followed_note(report: Report) -> str | None:
    led = report.get("ledger") or {}
    peers = [w for w in led.get("waited_on") or [] if w.get("us")]
    if not peers:
        return None
    return ("critical path followed late rank(s): "
            + ", ".join(f"rank {w['rank']} {ms(w['us'])} ({w.get('role') or 'comm'} wait)" for w in peers[:4]))


def rank_lines(report: Report, top: int) -> tuple[list[tuple[str, dict[str, float]]], str | None]:
    """Bars of the critical rank and the slowest others (at most ``top``), plus the mean over ranks."""
    ranks = [r for r in report.get("ranks") or [] if r.get("ledger")]
    if not ranks:
        return [], None
    crit = (report.get("ledger") or {}).get("critical_rank")
    ordered = sorted(ranks, key=lambda r: (r["rank"] != crit, -float(r["ledger"]["step_us"]), r["rank"]))
    shown = sorted(ordered[:top], key=lambda r: r["rank"])
    out = [(f"rank {r['rank']}" + (" *" if r["rank"] == crit else ""), by_category(r["ledger"]["parts"]))
           for r in shown]
    note = None
    if len(ranks) > len(shown):
        mean: dict[str, float] = defaultdict(float)
        for r in ranks:
            for c, v in by_category(r["ledger"]["parts"]).items():
                mean[c] += v / len(ranks)
        out.append((f"mean of {len(ranks)}", {c: mean[c] for c in LEDGER_CATEGORIES if mean.get(c)}))
        note = (f"showing the critical rank (*) and the {len(shown) - 1} slowest others of {len(ranks)} ranks, "
                "plus the mean over all ranks (every rank is in the JSON/HTML)")
    return out, note
