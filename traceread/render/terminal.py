"""Terminal views of the report: a rich summary for humans and the same content as plain text.

Order is answer-first: the single biggest problem (which rank, which collective, ms per step, what
to change), then the ranked findings, then the per-rank table and the cross-rank tables as
evidence. Long jobs are summarised: at most ``top`` rows per table, slowest ranks first.
"""

from __future__ import annotations

import io

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from traceread.build.queries import coll_time, median_step_us, per_step, step_us, total_steps
from traceread.fmt import ms, nbytes, pct, rank_list
from traceread.render.nccl_summary import nccl_lines
from traceread.report_schema import Report
from traceread.textsafe import clean_data, clean_lines


def headline(report: Report) -> str:
    """One line saying what the job is and how long its step is."""
    src = report.get("source") or {}
    ranks = report.get("ranks") or []
    devices = src.get("devices") or sorted({r.get("device") for r in ranks if r.get("device")})
    dev = ", ".join(str(d) for d in devices[:2]) or "unknown device"
    return (f"{len(ranks)} rank(s) of {src.get('world_size') or '?'} · {src.get('backend') or 'no backend'} · "
            f"{dev} · {total_steps(report)} step(s) · median step {ms(median_step_us(report))}")


def answer(report: Report) -> tuple[str, str | None]:
    """(the top problem in one sentence, the first thing to change) — or a 'nothing found' line."""
    findings = report.get("findings") or []
    if not findings:
        if not report.get("ranks"):
            return "No rank could be analysed (see warnings).", None
        return "No problem costs more than 1% of a step.", None
    f = findings[0]
    share = f" = {pct(f.get('impact_pct'))} of the step" if f.get("impact_pct") is not None else ""
    where = ", ".join(x for x in (f.get("category"), f.get("role") and f"role {f.get('role')}",
                                  f.get("rank") is not None and f"rank {f.get('rank')}") if x) if f["id"] != "hang" else ""

    text = f"{f['title']} [{ms(f['impact_us_per_step'])}/step{share}{'; ' + where if where else ''}]"
    suggestions = f.get("suggestions")
    sugg = suggestions[0] if suggestions else None
    return text, sugg


def _findings_table(report: Report, top: int, bx: box.Box) -> Table:
    t = Table(title="Findings — biggest time lost per step first", box=bx, show_lines=False, expand=False,
              title_justify="left")
    t.add_column("#", justify="right")
    t.add_column("lost/step", justify="right")
    t.add_column("% step", justify="right")
    t.add_column("finding / what to change", overflow="fold")
    for i, f in enumerate((report.get("findings") or [])[:top], 1):
        body = Text(f["title"], style="bold")
        for s in (f.get("suggestions") or [])[:1]:
            body.append("\n→ " + s, style="green")
        t.add_row(str(i), ms(f["impact_us_per_step"]), pct(f.get("impact_pct"), 0), body)
    return t


def _ranks_table(report: Report, top: int, bx: box.Box) -> tuple[Table, str | None]:
    ranks = list(report.get("ranks") or [])
    note = None
    if len(ranks) > top:
        ranks.sort(key=lambda r: -(step_us(r) or 0.0))
        note = f"showing the {top} slowest of {len(ranks)} ranks (--top to change; all ranks are in the HTML/JSON)"
        ranks = ranks[:top]
    t = Table(title="Per rank — mean per step", box=bx, title_justify="left")
    for col in ("rank", "step", "compute", "exposed comm", "exp. memcpy", "idle", "overlap", "SM eff", "occupancy", "MFU"):
        t.add_column(col, justify="right", no_wrap=True)
    for r in ranks:
        cpu = r.get("cpu")
        if r.get("compute_us") is None and cpu:
            # CPU-only ranks: the CPU split covers the whole trace, so it is shown as totals.
            t.add_row(str(r["rank"]), ms(step_us(r)), ms(cpu.get("compute_us")) + " cpu total",
                      ms(cpu.get("comm_us")) + " total", "n/a", ms(cpu.get("idle_us")) + " total",
                      "n/a", "n/a", "n/a", "n/a")
            continue
        t.add_row(str(r["rank"]), ms(step_us(r)), ms(per_step(r, "compute_us")), ms(per_step(r, "exposed_comm_us")),
                  ms(per_step(r, "exposed_memcpy_us")), ms(per_step(r, "idle_us")), pct(r.get("comm_overlap_pct"), 0),
                  pct(r.get("sm_efficiency_pct"), 0), pct(r.get("achieved_occupancy_pct"), 0), pct(r.get("mfu_pct")))
    return t, note


def _collectives_table(report: Report, top: int, bx: box.Box) -> Table | None:
    colls = list(report.get("collectives") or [])
    if not colls:
        return None
    colls.sort(key=lambda c: -coll_time(c))
    t = Table(title="Collectives — most total time first", box=bx, title_justify="left")
    for col in ("collective", "pg", "size", "calls", "latency", "wait", "busbw GB/s", "link peak"):
        if col in ("collective", "pg"):
            t.add_column(col, justify="left", overflow="fold", min_width=10)
        else:
            t.add_column(col, justify="right", no_wrap=True)
    for c in colls[:top]:
        peak = c.get("link_peak_gbps")
        t.add_row(escape(str(c.get("name"))), escape(str(c.get("pg"))), nbytes(c.get("bytes")), str(c.get("count")),
                  ms(c.get("latency_us"), 2), ms(c.get("wait_us"), 2),
                  "n/a" if c.get("busbw_gbps") is None else f"{c['busbw_gbps']:.1f}",
                  "n/a" if peak is None else f"{peak:.0f} ({c.get('link') or '?'})")
    return t


def _other_lines(report: Report, top: int) -> list[str]:
    lines: list[str] = []
    st = [s for s in report.get("stragglers") or [] if s.get("blame_us_per_step")]
    if st:
        lines.append("Stragglers: " + "; ".join(
            (f"rank {s['rank']} costs {ms(s['impact_us_per_step'])}/step, others waited {ms(s['blame_us_per_step'])}/step"
             if s.get("impact_us_per_step") is not None else f"rank {s['rank']} {ms(s['blame_us_per_step'])}/step")
            + f" ({s.get('cause')}, last {s.get('arrived_last')}×)"
            + ("" if s.get("root", True) else " [secondary]") for s in st[:top]))
    p = report.get("pipeline")
    if p:
        lines.append(f"Pipeline: {p.get('stages')} stages × {p.get('microbatches')} micro-batches ({p.get('schedule')}), "
                     f"bubble {pct(p.get('bubble_pct'))} vs theory {pct(p.get('theory_bubble_pct'))}")
    ss = report.get("slow_steps") or []
    if ss:
        lines.append("Slow steps: " + "; ".join(
            f"step {s['step']} +{ms(s.get('excess_us'))} ({s.get('cause')})" for s in ss[:top]))
    h = report.get("hang")
    if h:
        culprits = h.get("culprits") or []
        if culprits:  # one line per culprit first (docs/hang-and-nccl.md)
            lines += [f"HANG: {c.get('summary')}" for c in culprits[:top]]
            if len(culprits) > top:
                lines.append(f"  … {len(culprits) - top} more culprits (traceread hang RUN)")
            if h.get("groups"):
                lines.append(f"  {len(h['groups'])} stuck group(s); {h.get('dumps') or ''}".rstrip("; "))
        else:
            lines.append(f"HANG: {h.get('op')} pg {h.get('pg')} seq {h.get('seq')}: waiting "
                         f"{rank_list(h.get('waiting_ranks') or [])}, missing {rank_list(h.get('missing_ranks') or [])}")
        for r, loc in list((h.get("stacks") or {}).items())[:top]:
            lines.append(f"  rank {r}: {loc}")
    return lines


def _ledger_bars(console: Console, rows: list[tuple[str, dict[str, float]]], ascii_only: bool) -> None:
    """One stacked bar per row (reports.ledger_view), coloured unless ascii_only, legend after."""
    from traceread.render import ledger_view as lv

    width = max((len(c) for c, _ in rows), default=0)
    for caption, totals in rows:
        line = Text(f"  {caption:<{width}} |")
        for cat, n in lv.bar_cells(totals):
            glyph, _label, colour = lv.STYLE[cat]
            line.append(glyph * n, style=None if ascii_only else f"bold {colour}")
        line.append("|")
        console.print(line)


def _ledger_section(report: Report, console: Console, top: int, ascii_only: bool) -> None:
    from traceread.render import ledger_view as lv

    jobs = lv.job_lines(report)
    if not jobs:
        return
    console.print(Text("Step ledger — where the median step's time goes (docs/ledger.md)", style="bold"))
    _ledger_bars(console, jobs, ascii_only)
    console.print(Text("  " + lv.legend(jobs[0][1]), style="dim"))
    note = lv.followed_note(report)
    if note:
        console.print(Text("  " + note, style="dim"))
    cov = lv.coverage_line(report)
    if cov:
        console.print(Text(cov, style="bold"))


def _rank_ledgers(report: Report, console: Console, top: int, ascii_only: bool) -> None:
    from traceread.render import ledger_view as lv

    rows, note = lv.rank_lines(report, top)
    if not rows:
        return
    console.print(Text("Step ledger per rank", style="bold"))
    _ledger_bars(console, rows, ascii_only)
    if note:
        console.print(Text("  " + note, style="dim"))


def render(report: Report, console: Console, *, top: int = 10, ascii_only: bool = False,
           html_path: str | None = None) -> None:
    """Print the summary on ``console`` (rich markup off for every trace-derived string)."""
    report = clean_data(report)  # every trace/log/file-name string: no terminal control survives
    bx = box.ASCII2 if ascii_only else box.SIMPLE_HEAD
    console.print(Text("traceread report — " + headline(report), style="bold"))
    text, sugg = answer(report)
    console.print(Text("ANSWER: ", style="bold red") + Text(text))
    if sugg:
        console.print(Text("CHANGE: ", style="bold green") + Text(sugg))
    console.print()
    _ledger_section(report, console, top, ascii_only)
    if report.get("findings"):
        console.print(_findings_table(report, top, bx))
    _rank_ledgers(report, console, top, ascii_only)
    rt, note = _ranks_table(report, top, bx)
    if report.get("ranks"):
        console.print(rt)
        if note:
            console.print(Text(note, style="dim"))
    ct = _collectives_table(report, top, bx)
    if ct is not None:
        console.print(ct)
    for line in _other_lines(report, top) + nccl_lines(report):
        console.print(Text(line))
    from traceread.render.drift_view import render_terminal as render_drift

    render_drift(report, console, ascii_only=ascii_only)
    warnings = report.get("warnings") or []
    if warnings:
        console.print(Text(f"{len(warnings)} warning(s):", style="yellow"))
        for w in warnings[:top]:
            console.print(Text("  " + w, style="yellow"))
        if len(warnings) > top:
            console.print(Text(f"  … {len(warnings) - top} more in the JSON/HTML report", style="yellow"))
    if html_path:
        console.print(Text("HTML report: ", style="bold") + Text(clean_data(html_path)))
    if len(report.get("ranks") or []) > 1:
        from traceread.fmt import export_command

        console.print(Text("Timeline of every rank (Perfetto): ", style="bold") + Text(clean_data(export_command(report))))


def render_text(report: Report, *, top: int = 10, width: int = 120, html_path: str | None = None) -> str:
    """The same summary as plain ASCII-boxed text without colour (for logs, CI and ``--format text``)."""
    buf = io.StringIO()
    console = Console(file=buf, width=width, color_system=None, force_terminal=False, no_color=True,
                      highlight=False, emoji=False, soft_wrap=False)
    render(report, console, top=top, ascii_only=True, html_path=html_path)
    return clean_lines(buf.getvalue())

