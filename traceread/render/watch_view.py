"""The watched run (``report["watch"]``, :mod:`traceread.compare.captures`): the whole job's step time
with each captured window marked — a sparkline in the terminal, a chart on the page — and one line
per capture saying what changed against the baseline.

Renders only: every number comes from the document.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.text import Text

from traceread.fmt import ms

if TYPE_CHECKING:
    from traceread.report_schema import Report

BARS = "▁▂▃▄▅▆▇█"
ASCII_BARS = "_.-:=+*#"


def watch_of(report: Report) -> dict[str, Any] | None:
    w = report.get("watch")
    return w if isinstance(w, dict) else None


def answer_text(report: Report) -> tuple[str, str | None] | None:
    """The run's answer when a capture changed (the largest time lost), and the capture's own advice."""
    w = watch_of(report)
    a = (w or {}).get("answer")
    if not a:
        return None
    top = next(iter(report.get("findings") or []), None)
    if top and (top.get("id") == "hang" or (top.get("id") == "failure" and not top.get("recovered"))):
        return None  # the job stopped there: every later step is lost, more than any slow stretch
    where = "; ".join(str(x) for x in (a.get("kind"), a.get("name"), (a.get("trigger") or {}).get("requested_by")) if x)
    return f"{a.get('sentence')} [{where}]", a.get("capture_change")


def _buckets(series: dict[str, Any], width: int) -> list[tuple[int, int, float]]:
    """(first step, last step, step time µs) in at most ``width`` columns (max of the bucket medians)."""
    firsts, lasts, vals = series["step_first"], series["step_last"], series["job_median_us"]
    n = len(vals)
    if not n:
        return []
    per = max(1, -(-n // width))
    return [(firsts[i], lasts[min(n, i + per) - 1], max(vals[i:i + per])) for i in range(0, n, per)]


def sparkline(report: Report, width: int, ascii_only: bool = False) -> list[str]:
    """The series as bars, and a line below marking the baseline window (b) and each capture (1, 2…)."""
    w = watch_of(report)
    series = (w or {}).get("series")
    if w is None or not series or not series.get("steps"):
        return []
    cols = _buckets(series, max(10, width))
    top = max(v for _, _, v in cols) or 1.0
    bars = ASCII_BARS if ascii_only else BARS
    line = "".join(bars[min(len(bars) - 1, int(v / top * (len(bars) - 1) + 0.5))] for _, _, v in cols)
    marks = [" "] * len(cols)

    def mark(span: list[int] | None, ch: str) -> None:
        if not span:
            return
        for i, (a, b, _) in enumerate(cols):
            if a <= span[1] and b >= span[0]:
                marks[i] = ch
    mark(w.get("baseline_steps"), "b")
    for c in w.get("captures") or []:
        mark(c.get("steps"), str(c.get("id") or "c")[-1:])
    return [line, "".join(marks).rstrip()]


def render_terminal(report: Report, console: Console, width: int, ascii_only: bool = False) -> None:
    w = watch_of(report)
    if not w:
        return
    series = w.get("series") or {}
    if series.get("steps"):
        console.print(Text(f"Step time over the whole job: {series['steps']} steps ({series['first_step']}-"
                           f"{series['last_step']}), median {ms(series.get('median_us'))}, peak "
                           f"{ms(max(series.get('job_max_us') or [0.0]))}", style="bold"))
        for line in sparkline(report, width - 4, ascii_only):
            console.print(Text("  " + line), overflow="crop", no_wrap=True)
        console.print(Text("  b: the baseline window · 1, 2…: captured windows (docs/watch-report.md)"))
    for c in w.get("captures") or []:
        steps = c.get("steps")
        head = f"  capture {c.get('id')} ({c.get('kind')}, {c.get('requested_by') or '?'}"
        head += f", steps {steps[0]}-{steps[1]})" if steps else ")"
        console.print(Text(f"{head}: {c.get('sentence') or c.get('note') or 'no comparison'}"))
    console.print()


def figure(report: Report) -> tuple[dict[str, Any] | None, str | None]:
    """The series as a line (median and max per bucket), the baseline and each capture shaded."""
    w = watch_of(report)
    series = (w or {}).get("series")
    if not w or not series or not series.get("steps"):
        return None, "No step series (RUN/progress/rank*.steps)."
    x = [(a + b) / 2 for a, b in zip(series["step_first"], series["step_last"])]
    shapes, notes = [], []

    def band(span: list[int] | None, color: str, text: str) -> None:
        if not span:
            return
        shapes.append({"type": "rect", "xref": "x", "yref": "paper", "x0": span[0] - 0.5, "x1": span[1] + 0.5,
                       "y0": 0, "y1": 1, "fillcolor": color, "opacity": 0.25, "line": {"width": 0}})
        if text:
            notes.append({"x": span[0], "y": 1, "xref": "x", "yref": "paper", "text": text, "showarrow": False,
                          "xanchor": "left", "yanchor": "bottom", "font": {"size": 11}})
    band(w.get("baseline_steps"), "#4C78A8", "baseline")
    for c in w.get("captures") or []:
        band(c.get("steps"), "#E45756", f"capture {c.get('id')}")
        if c.get("slow_steps") and c.get("changed"):
            band(c["slow_steps"], "#FF9DA6", "")
    data = [{"type": "scatter", "mode": "lines", "name": "step time (median per point)", "x": x,
             "y": [v / 1e3 for v in series["job_median_us"]], "line": {"color": "#4C78A8"},
             "hovertemplate": "step %{x:.0f}: %{y:.2f} ms<extra></extra>"},
            {"type": "scatter", "mode": "lines", "name": "max per point", "x": x,
             "y": [v / 1e3 for v in series["job_max_us"]], "line": {"color": "#BAB0AC", "width": 1}}]
    from traceread.render.charts import _layout

    return {"data": data, "layout": _layout(f"Step time over the whole job ({series['steps']} steps; shaded: baseline "
                                            "and captured windows)", shapes=shapes, annotations=notes,
                                            xaxis={"title": {"text": "step"}}, yaxis={"title": {"text": "ms"}})}, None


def explanation(report: Report) -> str:
    return ("The job's step time at every optimizer step, from the step counts and wall times each rank wrote "
            "(RUN/progress/rank*.steps; the job's step ends when its last rank ends it). Blue: the baseline window "
            "the report above analyses; red: each window the watch (or traceread snap) recorded; pink: the slow "
            "stretch counted as time lost. Each capture is analysed like the baseline and compared with it below.")
