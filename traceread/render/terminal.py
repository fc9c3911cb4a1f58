"""Terminal views of the report: a rich summary for humans and the same content as plain text.

Order is answer-first: the single biggest problem (which rank, which collective, ms per step, what
to change), then the ranked findings, then the per-rank table and the cross-rank tables as
evidence. Long jobs are summarised: at most ``top`` rows per table, slowest ranks first.

The page is a list of section functions (:data:`SECTIONS`), each given the document and a
:class:`View` (console, width, row limit) and printing nothing when it has nothing to say; a new
part of the document gets a new function in that list. Layout follows :mod:`textfit`: laid out for
the width given, no padding, wide tables folded; names are shortened to their readable core
(:func:`traceread.fmt.short_name`; the full names are in the JSON and HTML).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.text import Text

from traceread.assemble.queries import coll_time, per_step, step_figure, step_us
from traceread.fmt import WHOLE_TRACE, elide_templates, ms, nbytes, pct, rank_list, short_name, whole_trace
from traceread.render.ledger_view import CATEGORY_WORDS
from traceread.render.nccl_summary import nccl_lines
from traceread.render.textfit import Column, buffer_console, fitted_table, output_width, strip_padding, use_color
from traceread.report_schema import Report
from traceread.textsafe import clean_data, clean_lines


@dataclass
class View:
    """Where and how a section prints: the console, its width, rows per table, ASCII or not."""

    console: Console
    top: int = 10
    ascii_only: bool = False
    html_path: str | None = None
    verbose: bool = False

    @property
    def width(self) -> int:
        return self.console.width

    @property
    def box(self) -> box.Box:
        return box.ASCII2 if self.ascii_only else box.SIMPLE_HEAD

    def line(self, text: str | Text, style: str | None = None) -> None:
        self.console.print(text if isinstance(text, Text) else Text(text, style=style or ""))


Section = Callable[[Report, View], None]


def headline(report: Report) -> str:
    """One line saying what the job is and how long its step is."""
    src = report.get("source") or {}
    ranks = report.get("ranks") or []
    devices = src.get("devices") or sorted({r.get("device") for r in ranks if r.get("device")})
    cpu_only = bool(ranks) and all(_is_cpu(r) for r in ranks)
    dev = ", ".join(str(d) for d in devices[:2]) or ("CPU" if cpu_only else "unknown device")
    mean, n, _median = step_figure(report)
    steps = f"{WHOLE_TRACE} {ms(mean)}" if whole_trace(report) else f"{n} step(s) · mean step {ms(mean)}"
    return (f"{len(ranks)} rank(s) of {src.get('world_size') or '?'} · {src.get('backend') or 'no backend'} · "
            f"{dev} · {steps}")


def missing_line(report: Report) -> str | None:
    """Which ranks are missing and what the answer cannot see (``source.missing_note``)."""
    note = (report.get("source") or {}).get("missing_note")
    return str(note) if note else None


def nccl_nothing_found(n: dict[str, Any]) -> str:
    """The healthy answer for NCCL logs alone, saying what was read and looked for."""
    files = len(n.get("files") or [])
    text = (f"No problem found in NCCL's own records: {n.get('lines_parsed') or 0} line(s) of {files} file(s) read, "
            "no WARN, error return, CUDA/system failure or timeout among them")
    benign = [d for d in n.get("diagnoses") or [] if d.get("severity") == "info" and d.get("first_line")]
    if benign:
        text += f"; {len(benign)} WARN kind(s) NCCL also prints on healthy machines ({benign[0]['first_line']})"
    return text + " (no trace to measure the step with)."


def answer(report: Report) -> tuple[str, str | None]:
    """(the top problem in one sentence, the first thing to change) — or a 'nothing found' line."""
    findings = report.get("findings") or []
    if not findings:
        if not report.get("ranks"):
            if report.get("nccl"):
                return nccl_nothing_found(report.get("nccl") or {}), None
            return "No rank could be analysed (see warnings).", None
        return "No problem costs more than 1% of a step.", None
    f = findings[0]
    title = elide_templates(str(f["title"]))
    if f["id"] == "hang":
        text = f"{title} [the job stopped there: every later step is lost]"
    elif f["id"] == "failure":
        text = f"{title} [" + ("a later attempt ran to the end; the window below is its own]" if f.get("recovered")
                               else "the job died: every later step is lost]")
    elif f.get("category") == "memory":  # memory findings cost no step time: they say what they hold
        text = f"{title} [memory{', rank ' + str(f['rank']) if f.get('rank') is not None else ''}]"
    elif f["id"].startswith("nccl_") and f.get("severity") == "error" and not f.get("impact_us_per_step"):
        text = f"{title} [from the NCCL log: the job failed or stalled there]"
    elif not f.get("impact_us_per_step"):
        text = f"{title} [outside the median step]"
    else:
        share = f" = {pct(f.get('impact_pct'))} of the recorded steps" if f.get("impact_pct") is not None else ""
        where = ", ".join(x for x in (CATEGORY_WORDS.get(str(f.get("category")), f.get("category")),
                                      f.get("role") and f"{f.get('role')} group",
                                      f.get("rank") is not None and f"rank {f.get('rank')}") if x)
        text = f"{title} [{ms(f['impact_us_per_step'])}/step{share}{'; ' + where if where else ''}]"
    suggestions = f.get("suggestions") or []
    return text, (suggestions[0] if suggestions else None)


# ------------------------------------------------------------------------------------------ sections


def answer_section(report: Report, v: View) -> None:
    v.line(Text("traceread report — " + headline(report), style="bold"))
    miss = missing_line(report)
    if miss:
        v.line(Text.assemble(("MISSING: ", "bold red"), miss))
    text, sugg = answer(report)
    v.line(Text.assemble(("ANSWER: ", "bold red"), text))
    if sugg:
        v.line(Text.assemble(("CHANGE: ", "bold green"), sugg))
    v.console.print()


def _ledger_bars(v: View, rows: list[tuple[str, dict[str, float]]]) -> None:
    """One stacked bar per row (ledger_view), coloured unless ASCII, sized to the width; the caption
    goes on its own line when caption and a 20-cell bar do not fit side by side."""
    from traceread.render import ledger_view as lv

    cap = max((len(c) for c, _ in rows), default=0)
    beside = cap + 6 + lv.BAR_WIDTH <= v.width
    bar = max(10, min(lv.BAR_WIDTH, v.width - 6))
    for caption, totals in rows:
        if beside:
            line = Text(f"  {caption:<{cap}} |")
        else:
            v.line(f"  {caption}")
            line = Text("    |")
        for cat, n in lv.bar_cells(totals, bar):
            glyph, _label, colour = lv.STYLE[cat]
            line.append(glyph * n, style=None if v.ascii_only else f"bold {colour}")
        line.append("|")
        v.line(line)


def ledger_section(report: Report, v: View) -> None:
    from traceread.render import ledger_view as lv

    jobs = lv.job_lines(report)
    if not jobs:
        return
    v.line(Text(lv.title_line(report), style="bold"))
    _ledger_bars(v, jobs)
    v.line(Text("  " + lv.legend(jobs[0][1]), style="dim"))
    note = lv.followed_note(report)
    if note:
        v.line(Text("  " + note, style="dim"))
    cov = lv.coverage_line(report)
    if cov:
        v.line(Text(cov, style="bold"))
    v.console.print()


def findings_section(report: Report, v: View) -> None:
    found = report.get("findings") or []
    if not found:
        return
    rows = []
    for i, f in enumerate(found[: v.top], 1):
        body = Text(elide_templates(str(f["title"])), style="bold")
        for s in (f.get("suggestions") or [])[:1]:
            body.append("\n→ " + elide_templates(str(s)), style="green")
        if f["id"] in ("hang", "failure"):
            lost, share = ("job stopped" if f["id"] == "hang" else "restarted" if f.get("recovered")
                           else "job died"), "all"
        elif f.get("category") == "memory":  # no step time: the bytes at stake instead
            lost, share = "memory", nbytes(f.get("memory_bytes"))
        elif not f.get("impact_us_per_step"):
            lost, share = "—", "—"  # not a share of the median step (e.g. slow steps outside it)
        else:
            lost, share = ms(f["impact_us_per_step"]), pct(f.get("impact_pct"), 0)
        rows.append([str(i), lost, share, body])
    cols = [Column("#", key=True), Column("lost/step"), Column("% time"), Column("finding / what to change", "left", text=True)]
    v.console.print(fitted_table("Findings — biggest time lost per step first", cols, rows, v.width, v.box))
    if len(found) > v.top:
        v.line(Text(f"… {len(found) - v.top} more finding(s) in the JSON/HTML report (--top to show more)", style="dim"))
    v.console.print()


def rank_ledgers_section(report: Report, v: View) -> None:
    from traceread.render import ledger_view as lv

    rows, note = lv.rank_lines(report, v.top)
    if not rows:
        return
    v.line(Text("Step ledger per rank", style="bold"))
    _ledger_bars(v, rows)
    if note:
        v.line(Text("  " + note, style="dim"))
    v.console.print()


def _is_cpu(r: Any) -> bool:
    return r.get("compute_us") is None and bool(r.get("cpu"))


def ranks_section(report: Report, v: View) -> None:
    """Per rank, mean per step: GPU ranks by the GPU breakdown; CPU-only ranks (gloo on CPU) by the
    CPU split of each step (``steps[].cpu_*_us``), never whole-trace totals beside a step time."""
    ranks = list(report.get("ranks") or [])
    if not ranks:
        return
    note = None
    if len(ranks) > v.top:
        ranks.sort(key=lambda r: -(step_us(r) or 0.0))
        note = f"showing the {v.top} slowest of {len(ranks)} ranks (--top to change; all ranks are in the HTML/JSON)"
        ranks = ranks[: v.top]
    if all(_is_cpu(r) for r in ranks):
        cols = [Column("rank", key=True), Column("step"), Column("cpu compute"), Column("comm"), Column("exposed comm"),
                Column("idle"), Column("overlap")]
        rows = [[str(r["rank"]), ms(step_us(r)), ms(per_step(r, "cpu_compute_us")), ms(per_step(r, "cpu_comm_us")),
                 ms(per_step(r, "cpu_exposed_comm_us")), ms(per_step(r, "cpu_idle_us")),
                 pct((r.get("cpu") or {}).get("comm_overlap_pct"), 0)] for r in ranks]
        title = "Per rank — mean per step (CPU: no GPU in the trace)"
    else:
        cols = [Column("rank", key=True), Column("step"), Column("compute"), Column("exposed comm"), Column("exp. memcpy"),
                Column("idle"), Column("overlap"), Column("SM eff"), Column("occupancy"), Column("MFU")]
        rows = [[str(r["rank"]), ms(step_us(r)), ms(per_step(r, "compute_us")), ms(per_step(r, "exposed_comm_us")),
                 ms(per_step(r, "exposed_memcpy_us")), ms(per_step(r, "idle_us")), pct(r.get("comm_overlap_pct"), 0),
                 pct(r.get("sm_efficiency_pct"), 0), pct(r.get("achieved_occupancy_pct"), 0), pct(r.get("mfu_pct"))]
                for r in ranks]
        title = "Per rank — mean per step"
    v.console.print(fitted_table(title, cols, rows, v.width, v.box))
    if note:
        v.line(Text(note, style="dim"))
    v.console.print()


def collectives_section(report: Report, v: View) -> None:
    colls = sorted(report.get("collectives") or [], key=lambda c: -coll_time(c))
    if not colls:
        return
    cols = [Column("collective", "left", key=True), Column("pg", "left"), Column("size"), Column("calls"),
            Column("latency"), Column("wait"), Column("busbw GB/s"), Column("link peak")]
    rows = []
    for c in colls[: v.top]:
        peak = c.get("link_peak_gbps")
        rows.append([escape(short_name(c.get("name"), 32)), escape(short_name(c.get("pg"), 28)), nbytes(c.get("bytes")),
                     str(c.get("count")), ms(c.get("latency_us"), 2), ms(c.get("wait_us"), 2),
                     "n/a" if c.get("busbw_gbps") is None else f"{c['busbw_gbps']:.1f}",
                     "n/a" if peak is None else f"{peak:.0f} ({c.get('link') or '?'})"])
    v.console.print(fitted_table("Collectives — most total time first", cols, rows, v.width, v.box))
    v.console.print()


def hang_lines(h: dict[str, Any], top: int = 10) -> list[str]:
    """The hang in words: who waits, in which collective, for whom, and where each rank was."""
    waiting, missing = h.get("waiting_ranks") or [], h.get("missing_ranks") or []
    seq = f" #{h.get('seq')}" if h.get("seq") is not None else ""
    who = f"rank{'s' if len(waiting) != 1 else ''} {rank_list(waiting)}" if waiting else "no rank recorded"
    lines = [f"HANG: {who} {'wait' if len(waiting) != 1 else 'waits'} in {h.get('op') or 'a collective'}{seq} "
             f"on process group {h.get('pg')}"
             + (f" for rank{'s' if len(missing) != 1 else ''} {rank_list(missing)}, which never joined it" if missing else "")]
    for r, loc in list((h.get("stacks") or {}).items())[:top]:
        lines.append(f"  rank {r} was at {loc}")
    return lines


def notes_section(report: Report, v: View) -> None:
    """Stragglers, pipeline, slow steps and the hang, one line each (details are in the findings)."""
    lines: list[str] = []
    st = [s for s in report.get("stragglers") or [] if s.get("blame_us_per_step")]
    if st:
        lines.append("Stragglers: " + "; ".join(
            (f"rank {s['rank']} costs {ms(s['impact_us_per_step'])}/step, others waited {ms(s['blame_us_per_step'])}/step"
             if s.get("impact_us_per_step") is not None else f"rank {s['rank']} {ms(s['blame_us_per_step'])}/step")
            + f" ({s.get('cause')}, last {s.get('arrived_last')}×)"
            + ("" if s.get("root", True) else " [secondary]") + (" [within the run's noise]" if s.get("noise") else "")
            for s in st[: v.top]))
    p = report.get("pipeline")
    if p:
        lines.append(f"Pipeline: {p.get('stages')} stages × {p.get('microbatches')} micro-batches ({p.get('schedule')}), "
                     f"bubble {pct(p.get('bubble_pct'))} vs theory {pct(p.get('theory_bubble_pct'))}")
    ss = report.get("slow_steps") or []
    if ss:
        lines.append("Slow steps: " + "; ".join(
            f"step {s['step']} +{ms(s.get('excess_us'))} ({s.get('cause')})" for s in ss[: v.top]))
    h = report.get("hang")
    if h:
        culprits = h.get("culprits") or []
        if culprits:  # one line per culprit first (docs/hang-and-nccl.md)
            lines += [f"HANG: {c.get('summary')}" for c in culprits[: v.top]]
            if len(culprits) > v.top:
                lines.append(f"  … {len(culprits) - v.top} more culprits (traceread hang RUN)")
            if h.get("groups"):
                lines.append(f"  {len(h['groups'])} stuck group(s); {h.get('dumps') or ''}".rstrip("; "))
            for r, loc in list((h.get("stacks") or {}).items())[: v.top]:
                lines.append(f"  rank {r} was at {loc}")
        else:
            lines += hang_lines(h, v.top)  # type: ignore[arg-type]
    from traceread.render.memory_view import terminal_line

    memory = terminal_line(report)
    for ln in lines + ([memory] if memory else []) + nccl_lines(report):
        v.line(Text(ln))


def layout_section(report: Report, v: View) -> None:
    """The workload line and the parallel layout table (render.layout_view)."""
    from traceread.render.layout_view import render_terminal as render_layout

    render_layout(report, v.console, v.top, v.box)


def drift_section(report: Report, v: View) -> None:
    from traceread.render.drift_view import render_terminal as render_drift

    render_drift(report, v.console, ascii_only=v.ascii_only)


def warnings_section(report: Report, v: View) -> None:
    warnings = report.get("warnings") or []
    if not warnings:
        return
    limit = len(warnings) if v.verbose else v.top
    v.line(Text(f"{len(warnings)} warning(s):", style="yellow"))
    for w in warnings[:limit]:
        v.line(Text("  " + w, style="yellow"))
    if len(warnings) > limit:
        v.line(Text(f"  … {len(warnings) - limit} more in the JSON/HTML report (-v lists them all)", style="yellow"))


def footer_section(report: Report, v: View) -> None:
    if v.html_path:
        v.line(Text.assemble(("HTML report: ", "bold"), clean_data(v.html_path)))
    if len(report.get("ranks") or []) > 1:
        from traceread.fmt import export_command

        v.line(Text.assemble(("Timeline of every rank (Perfetto): ", "bold"), clean_data(export_command(report))))


#: The summary, top to bottom. Each prints nothing when its part of the document is empty.
SECTIONS: list[Section] = [answer_section, ledger_section, findings_section, rank_ledgers_section, ranks_section,
                           collectives_section, layout_section, notes_section, drift_section, warnings_section, footer_section]


def render(report: Report, console: Console, *, top: int = 10, ascii_only: bool = False,
           html_path: str | None = None, quiet: bool = False, verbose: bool = False) -> None:
    """Print the summary on ``console`` (rich markup off for every trace-derived string). ``quiet``:
    the answer alone."""
    report = clean_data(report)  # every trace/log/file-name string: no terminal control survives
    view = View(console, top=top, ascii_only=ascii_only, html_path=html_path, verbose=verbose)
    if quiet:
        text, sugg = answer(report)
        view.line(Text.assemble(("ANSWER: ", "bold red"), text))
        if sugg:
            view.line(Text.assemble(("CHANGE: ", "bold green"), sugg))
        return
    for section in SECTIONS:
        section(report, view)


def render_to(report: Report, stream: IO[str], *, color: str = "auto", width: int | None = None, **kw: Any) -> None:
    """The summary written to ``stream``, laid out for its width (:mod:`textfit`), colour per ``color``
    (auto / always / never), without padding."""
    colored = use_color(stream, color)
    console, buf = buffer_console(width or output_width(stream), colored)
    render(report, console, ascii_only=False, **kw)
    stream.write(strip_padding(buf.getvalue()))
    stream.flush()


def render_text(report: Report, *, top: int = 10, width: int = 120, html_path: str | None = None,
                quiet: bool = False, verbose: bool = False) -> str:
    """The same summary as plain ASCII-boxed text without colour (for logs, CI and ``--format text``)."""
    console, buf = buffer_console(width, False)
    render(report, console, top=top, ascii_only=True, html_path=html_path, quiet=quiet, verbose=verbose)
    return strip_padding(clean_lines(buf.getvalue()))
