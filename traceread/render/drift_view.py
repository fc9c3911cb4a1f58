"""The "Drift over cycles" section (``report["drift"]``, traceread.compare.drift) for the terminal and HTML.

Kept apart from the main renderers so they can change independently: each renderer calls one
function here, which returns nothing/empty when the report has no drift (a single-cycle report).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from markupsafe import Markup, escape
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from traceread.report_schema import Report

COLUMNS = (("step_us", "step"), ("compute_us", "compute"), ("exposed_comm_us", "exposed comm"),
           ("idle_us", "idle"), ("host_bound_us", "host-bound"))


_CONTROL = dict.fromkeys([*range(0x20), *range(0x7F, 0xA0)], "?")


def _clean(text: str) -> str:
    """Process-group names come from traces: no control character (ESC, BEL...) reaches a terminal."""
    return text.translate(_CONTROL)


def _ms(v: Any) -> str:
    return "n/a" if v is None else f"{float(v) / 1e3:.2f}"


def _straggler(row: dict[str, Any]) -> str:
    s = row.get("straggler")
    if not s or s.get("rank") is None:
        return "-"
    return f"rank {s['rank']} {_ms(s.get('blame_us_per_step'))} ({s.get('cause') or '?'})"


def _pgs(drift: dict[str, Any]) -> list[str]:
    return sorted({pg for row in drift.get("cycles") or [] for pg in (row.get("pg_comm_us") or {})})


def _rows(drift: dict[str, Any]) -> list[list[str]]:
    pgs = _pgs(drift)
    out = []
    for row in drift.get("cycles") or []:
        label = str(row.get("label") or row.get("cycle"))
        steps = row.get("steps")
        where = f"{label} (steps {steps[0]}-{steps[1]})" if steps else label
        if row.get("warmup"):
            where += " warm-up"
        out.append([where, *(_ms(row.get(k)) for k, _ in COLUMNS),
                    *(_ms((row.get("pg_comm_us") or {}).get(pg)) for pg in pgs), _straggler(row)])
    return out


def _header(drift: dict[str, Any]) -> list[str]:
    return ["cycle", *(name for _, name in COLUMNS), *(_clean(f"comm {pg}") for pg in _pgs(drift)), "top straggler"]


def render_terminal(report: Report, console: Console, *, ascii_only: bool = False) -> None:
    """The per-cycle table (ms per step) and the headline; nothing without ``drift``."""
    drift = report.get("drift")
    if not drift:
        return
    t = Table(title="Drift over cycles (ms per step, median over ranks)", title_justify="left",
              box=box.ASCII2 if ascii_only else box.SIMPLE_HEAD)
    for i, h in enumerate(_header(drift)):
        t.add_column(h, justify="left" if i in (0, len(_header(drift)) - 1) else "right", overflow="fold")
    for row in _rows(drift):
        t.add_row(*(Text(c) for c in row))
    console.print(t)
    if drift.get("headline"):
        console.print(Text("DRIFT: ", style="bold magenta") + Text(_clean(str(drift["headline"]))))


def html_section(report: Report) -> Markup:
    """``<section id="drift">`` with the same table; every string escaped; empty without drift."""
    drift = report.get("drift")
    if not drift:
        return Markup("")
    head = "".join(f"<th>{escape(h)}</th>" for h in _header(drift))
    cell = ('<td class="name">{}</td>', "<td>{}</td>")
    body = "".join("<tr>" + "".join(cell[i > 0].format(escape(c)) for i, c in enumerate(row)) + "</tr>"
                   for row in _rows(drift))
    line = f"<p><strong>{escape(drift['headline'])}</strong></p>" if drift.get("headline") else ""
    grown = ""
    g = drift.get("growth") or {}
    if g.get("categories"):
        items = "".join(f"<li>{escape(r['what'])}: {_ms(r['first_us'])} → {_ms(r['last_us'])} ms/step "
                        f"({float(r['delta_us']) / 1e3:+.2f} ms)</li>" for r in g["categories"][:6])
        grown = f"<p>First → last cycle, biggest growth first:</p><ul>{items}</ul>"
    return Markup(f'<section id="drift"><h2>Drift over cycles</h2>{line}'
                  f"<table><tr>{head}</tr>{body}</table>{grown}</section>")
