"""The report as a notebook cell shows it: ``Report._repr_html_`` (docs/api.md).

The same answer and findings templates as the page (``templates/_answer.html.j2``,
``_findings.html.j2``), and the step ledger as one CSS bar: a cell output must not load anything
from outside (offline notebooks, sanitising viewers), and plotly.js would add megabytes to every
saved notebook. The page's figures stay available as objects through ``Report.figures``.
"""

from __future__ import annotations

from typing import Any

from traceread.render import terminal
from traceread.render.charts import LEDGER_COLORS, all_figures
from traceread.render.html import _env, whole_trace
from traceread.render.ledger_view import CATEGORY_WORDS, by_category
from traceread.report_schema import Report


def ledger_parts(report: Report) -> tuple[float | None, str, list[tuple[str, str, str, float, float]]]:
    """(step µs, what the bar is, [(category, words, colour, µs, fraction of the step)]) of the job ledger."""
    led = report.get("ledger")
    if not led:
        return None, "", []
    totals = by_category(led.get("parts") or [])
    step = float(led.get("step_us") or sum(totals.values()) or 0.0)
    if step <= 0:
        return None, "", []
    label = f"critical rank {led.get('critical_rank')}, step {led.get('step')}"
    return step, label, [(c, CATEGORY_WORDS.get(c, c), LEDGER_COLORS.get(c, "#999"), us, us / step) for c, us in totals.items()]


def notebook_html(report: Report) -> str:
    answer, change = terminal.answer(report)
    step, label, parts = ledger_parts(report)
    return _env().get_template("notebook.html.j2").render(
        r=report, headline=terminal.headline(report), answer=answer, change=change, ledger_parts=parts,
        ledger_step_us=step, ledger_label=label, inline=[], see=[], whole_trace=whole_trace(report))


def figures(report: Report) -> dict[str, Any]:
    """The page's charts that have data, as plotly ``Figure`` objects by name (breakdown, timeline,
    heatmap, collectives, roofline, pipeline, slow_steps, ledger…)."""
    import plotly.graph_objects as go

    return {name: go.Figure(fig) for name, (fig, _why) in all_figures(report).items() if fig is not None}
