"""The self-contained HTML report: one file, no network, plotly.js embedded once.

plotly.js is the partial "cartesian" bundle vendored in ``assets/`` (bar, scatter and heatmap are
the only trace types the charts use; ``scripts/fetch-plotly.sh`` fetches it with ``npm pack``): 1.4
MiB instead of the full bundle's 4.6. It is embedded gzipped and base64-encoded (0.63 MiB) and
unpacked by the browser's own ``DecompressionStream`` before the charts are drawn, so a report page
weighs about 0.7 MiB; a browser without it (before Chrome 80, Firefox 113, Safari 16.4) shows every
table and a line saying the charts need a newer browser. Without the asset the full bundle of the
installed plotly package is embedded instead (still offline, just heavier).

Safety: the template is rendered with autoescape, so every trace-derived string (kernel, operator,
process-group names, stack frames, warnings) is text, never markup. Figure JSON goes into a
``<script type="application/json">`` block with ``<``, ``>`` and ``&`` written as ``\\u003c`` etc.,
so no name can close the script element; chart labels are entity-escaped in :mod:`charts`.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import orjson

from traceread import __version__
from traceread.assemble import explain
from traceread.assemble.queries import coll_time, host_bound_per_step, median_step_us, per_step, step_us, total_steps
from traceread.fmt import (
    WHOLE_TRACE,
    elide_templates,
    export_command,
    ms,
    nbytes,
    pct,
    rank_list,
    ranks_words,
    short_name,
    whole_trace,
)
from traceread.render import charts, terminal
from traceread.render.json_report import _jsonable
from traceread.render.ledger_view import CATEGORY_WORDS
from traceread.report_schema import MemoryRank, Report

TEMPLATES = Path(__file__).with_name("templates")
PLOTLY_ASSET = Path(__file__).with_name("assets") / "plotly-cartesian.min.js"
MAX_TABLE_RANKS = 256  # larger jobs list the slowest ranks; the charts and JSON have all of them


@lru_cache(maxsize=1)
def plotly_js() -> str:
    """The vendored partial plotly.js bundle (module docstring); the plotly package's full one without it."""
    try:
        js = PLOTLY_ASSET.read_text(encoding="utf-8")
    except OSError:
        from plotly.offline import get_plotlyjs

        js = get_plotlyjs()
    return js


@lru_cache(maxsize=1)
def plotly_js_packed() -> str:
    """:func:`plotly_js` as the page embeds it: gzip (deterministic: no name, mtime 0), then base64
    (plain ASCII: nothing in it can end the script element). 0.05 s, once per process."""
    import base64
    import gzip

    raw = plotly_js().encode("utf-8")
    return base64.b64encode(gzip.compress(raw, compresslevel=9, mtime=0)).decode("ascii")


#: Significant digits kept for numbers drawn in the charts: 0.1 µs on a 40 ms step, far below a pixel,
#: and about a third of the chart data's bytes (the page must stay under 1.5 MiB with plotly.js inlined).
CHART_DIGITS = 6


def _rounded(obj: Any) -> Any:
    """``obj`` with every float rounded to :data:`CHART_DIGITS` significant digits (drawing only:
    the JSON report keeps full precision)."""
    if isinstance(obj, float):
        return float(f"{obj:.{CHART_DIGITS}g}") if obj == obj and obj not in (float("inf"), float("-inf")) else obj
    if isinstance(obj, dict):
        return {k: _rounded(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_rounded(v) for v in obj]
    return obj


def embed_json(obj: Any) -> str:
    """JSON safe to place inside a <script> element: no '<', '>' or '&' characters at all."""
    text = orjson.dumps(_rounded(_jsonable(obj)), option=orjson.OPT_NON_STR_KEYS).decode()
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                             trim_blocks=True, lstrip_blocks=True)  # no bytecode cache: jinja2 unpickles it (runs code)
    env.filters.update(ms=_undef_none(ms), pct=_undef_none(pct), nbytes=_undef_none(nbytes))
    env.globals.update(per_step=per_step, step_us=step_us, host_bound_per_step=host_bound_per_step, rank_list=rank_list,
                       fmt_num=_undef_none(_fmt_num), short_name=short_name, elide=elide_templates,
                       words=lambda c: CATEGORY_WORDS.get(str(c), str(c)), basename=lambda f: Path(str(f or "")).name or "n/a",
                       ranks_words=ranks_words)
    return env


@dataclass(frozen=True)
class PageSection:
    """One section of the page: its template (``templates/sections/<key>.html.j2``), whether the
    document has anything to show in it, and the findings it supports (a section supporting an
    earlier finding comes earlier on the page)."""

    key: str
    label: str
    has_data: Callable[[Report, dict[str, Any]], str | None]  # None: show it; else why not
    supports: tuple[str, ...] = ()


def _chart_or(key: str, *also: str) -> Callable[[Report, dict[str, Any]], str | None]:
    """Shown when chart ``key`` was drawn or any of the document fields ``also`` is non-empty."""

    def check(report: Report, ctx: dict[str, Any]) -> str | None:
        if ctx["sections"][key]["chart"] or any(report.get(f) for f in also):
            return None
        return str(ctx["sections"][key]["reason"] or "no data")

    return check


def _field(name: str, why: str) -> Callable[[Report, dict[str, Any]], str | None]:
    return lambda report, ctx: None if ctx.get(name) or report.get(name) else why


#: The sections after the findings, in their default order (each template under templates/sections/).
PAGE_SECTIONS: list[PageSection] = [
    PageSection("ledger", "step ledger", _chart_or("ledger")),
    PageSection("breakdown", "time breakdown", lambda r, c: None if c["table_ranks"] else "no rank", ()),
    PageSection("timeline", "step timeline", _chart_or("timeline"),
                ("host_bound", "exposed_memcpy", "dependency_wait")),
    PageSection("stragglers", "stragglers", _chart_or("heatmap", "stragglers"), ("straggler", "comm_wait")),
    PageSection("layout", "parallel layout", _field("layout_html", "no process group and no workload seen"),
                ("tp_across_nodes",)),
    PageSection("collectives", "collectives", _field("collectives", "no collective in the traces"),
                ("exposed_comm", "tp_across_nodes", "comm_wait")),
    PageSection("roofline", "roofline", _chart_or("roofline"), ("memory_bound",)),
    PageSection("kernels", "top kernels", _field("kernels", "no GPU kernel in the traces"), ("low_sm_efficiency",)),
    PageSection("pipeline", "pipeline", _field("pipeline", "no pipeline parallelism detected"), ("pipeline_bubble",)),
    PageSection("slow_steps", "slow steps", _chart_or("slow_steps", "slow_steps"), ("slow_steps",)),
    PageSection("memory", "memory", _field("memory", "no memory events (profile_memory) or snapshot"), ("memory_",)),
    PageSection("nccl", "NCCL", _field("nccl", "no NCCL log next to the traces"), ("nccl_",)),
    PageSection("hang", "hang", _field("hang", "no hang recorded"), ("hang",)),
    PageSection("drift", "drift over cycles", _field("drift", "one profiling cycle")),
    PageSection("warnings", "warnings", _field("warnings", "none")),
]


def _reason(text: str) -> str:
    """A chart's "why not" as a short clause: lower case, no final period."""
    text = text.strip().rstrip(".")
    return text[:1].lower() + text[1:]


def _supports(sec: PageSection, finding_id: str) -> bool:
    return any(finding_id == s or (s.endswith("_") and finding_id.startswith(s)) for s in sec.supports)


#: The chart drawn inside a finding, next to the text it supports (the first finding that names a
#: chart gets it; its section then points back). The step timeline stays in its own section: it is
#: too tall to sit between findings.
FINDING_CHART = {"straggler": "heatmap", "slow_steps": "slow_steps", "pipeline_bubble": "pipeline",
                 "tp_across_nodes": "collectives", "nccl_": "collectives", "memory_bound": "roofline"}


def finding_charts(report: Report, charts_drawn: set[str]) -> list[str | None]:
    """For each finding, the chart shown inside it (or None)."""
    used: set[str] = set()
    out: list[str | None] = []
    for f in report.get("findings") or []:
        fid = str(f.get("id"))
        key = next((c for k, c in FINDING_CHART.items() if fid == k or (k.endswith("_") and fid.startswith(k))), None)
        if key in charts_drawn and key not in used:
            used.add(key)
            out.append(key)
        else:
            out.append(None)
    return out


def section_order(report: Report, ctx: dict[str, Any]) -> tuple[list[str], list[tuple[str, str]], list[list[tuple[str, str]]]]:
    """(sections to show in order, [(section, why left out)], per finding the sections that show it).

    The ledger first (the overview of every finding), then each finding's sections in the findings'
    order, then the rest in :data:`PAGE_SECTIONS` order; warnings last. Sections without data are
    left out and listed with the reason."""
    shown = {s.key: s for s in PAGE_SECTIONS if s.has_data(report, ctx) is None}
    left_out = [(s.key, _reason(str(s.has_data(report, ctx)))) for s in PAGE_SECTIONS
                if s.key not in shown and s.key not in ("drift", "warnings", "hang")]
    order: list[str] = [k for k in ("ledger",) if k in shown]
    see: list[list[tuple[str, str]]] = []
    for f in report.get("findings") or []:
        keys = [s.key for s in PAGE_SECTIONS if s.key in shown and _supports(s, str(f.get("id")))]
        see.append([(k, shown[k].label) for k in keys])
        order += [k for k in keys if k not in order]
    order += [s.key for s in PAGE_SECTIONS if s.key in shown and s.key not in order and s.key != "warnings"]
    if "warnings" in shown:
        order.append("warnings")
    return order, left_out, see


def _undef_none(fn: Any) -> Any:
    """A filter that treats a missing field (jinja Undefined) like None, i.e. prints "n/a"."""

    def wrapped(v: Any, *args: Any) -> Any:
        return fn(None if isinstance(v, jinja2.Undefined) else v, *args)

    return wrapped


def _fmt_num(v: Any, digits: int = 1) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    return str(v)


def _sections(report: Report) -> dict[str, dict[str, Any]]:
    """For each section: chart id or the reason it is empty, and its explanation text."""
    figs = charts.all_figures(report)
    ranks = report.get("ranks") or []
    step = median_step_us(report)
    colls = sorted(report.get("collectives") or [],
                   key=lambda c: -coll_time(c))
    mfu_vals = [v for r in ranks if (v := r.get("mfu_pct")) is not None]
    exp_vals = [v for r in ranks if r.get("exposed_comm_us") is not None and (v := per_step(r, "exposed_comm_us")) is not None]
    ov = [v for r in ranks if (v := r.get("comm_overlap_pct")) is not None]
    sme = [v for r in ranks if (v := r.get("sm_efficiency_pct")) is not None]
    occ = [v for r in ranks if (v := r.get("achieved_occupancy_pct")) is not None]
    dev = next((r.get("device") for r in ranks if r.get("device")), None)
    text = {
        "breakdown": ("Each bar is one rank's mean step on the CPU (the traces hold no GPU), split so the parts add up "
                      "exactly: compute (an operator running with no collective in flight), exposed communication (a "
                      "collective no other thread computed beside), overlapped communication, and idle (no operator "
                      "and no collective: Python outside operators, data loading, sleeping)."
                      if ranks and all(r.get("compute_us") is None and r.get("cpu") for r in ranks) else
                      "Each bar is one rank's mean step, split so the parts add up exactly: compute (any "
                      "non-communication kernel running), exposed communication (collectives with no compute beside "
                      "them), exposed memcpy, and idle (nothing on the GPU). "
                      + (explain.exposed_comm(sorted(exp_vals)[len(exp_vals) // 2], step,
                                              sorted(ov)[len(ov) // 2] if ov else None) + " " if exp_vals else "")
                      + explain.mfu(sorted(mfu_vals)[len(mfu_vals) // 2] if mfu_vals else None, dev)),
        "timeline": _timeline_text(report),
        "heatmap": ("Each cell is how long a rank waited for others in that step. A healthy job is uniformly pale; a "
                    "straggler shows as one pale row (it never waits) while every other row is dark, because they "
                    "all wait for it."),
        "collectives": " ".join(filter(None, [
            explain.ring_allreduce(colls[0]) if colls else None, explain.link_cliff(colls)])) or
        "No collectives were found in the traces.",
        "roofline": explain.roofline(roof) if (roof := report.get("roofline")) else
        "Operator FLOPs and bytes come from recorded input shapes; without them no roofline is drawn.",
        "kernels": explain.sm_efficiency(sorted(sme)[len(sme) // 2] if sme else None,
                                         sorted(occ)[len(occ) // 2] if occ else None,
                                         next((r.get("num_sms") for r in ranks if r.get("num_sms")), None)),
        "pipeline": explain.pipeline(pipe, step) if (pipe := report.get("pipeline")) else
        "Pipeline parallelism splits the model's layers into stages on different GPUs; none was detected here.",
        "ledger": ("The median step split so that every microsecond is counted once (docs/ledger.md): compute "
                   "(compute-bound, memory-bound, other), exposed communication per process-group role (waiting for "
                   "a late peer vs transfer), pipeline bubble, exposed memcpy, host-bound idle (before the next "
                   "kernel was launched), waiting on a dependency, other idle. The job bar follows the critical "
                   "path: where the slowest rank waited for a late peer, the peer's own time is shown. "
                   + (f"Findings account for {ms(cov.get('explained_us'))} of {ms(cov.get('step_us'))} "
                      + (f"of {WHOLE_TRACE}." if whole_trace(report) else "per step.")
                      if (cov := report.get("coverage")) else "")),
        "slow_steps": ("A step is flagged slow when it takes clearly longer than the median step; the cause says "
                       "which part of the breakdown grew (or which rank held everyone up)."),
    }
    from traceread.render import memory_view

    figs["memory"] = memory_view.memory_figure(report)
    text["memory"] = memory_view.explanation(report)
    return {k: {"chart": (k if figs.get(k, (None,))[0] is not None else None),
                "reason": figs.get(k, (None, None))[1], "text": text.get(k, "")}
            for k in text} | {"_figs": {k: f for k, (f, _) in figs.items() if f is not None}}


def _timeline_text(report: Report) -> str:
    tl = report.get("step_timeline") or {}
    clock = (report.get("source") or {}).get("clock") or {}
    eps = clock.get("epsilon_us")
    aligned = eps is not None and clock.get("method") not in (None, "none")
    sync = (f"All ranks are on one clock (the report's alignment, ±{eps:.0f} µs)" if aligned
            else "Each rank is on its own trace clock (no clock alignment was possible)")
    return (f"The median and the slowest step as they really ran: one lane per GPU stream of each rank, and a "
            f"\"GPU\" lane with the gaps where nothing ran (yellow: the host launched the next work late). {sync}. "
            "Black triangles mark the critical path: at each collective, the rank that arrived last — everyone "
            "else waited for it. " + (f"{tl['note']}. " if tl.get("note") else "")
            + f"For every event of every rank, open the merged trace in Perfetto: {export_command(report)}")


def render_html(report: Report, *, title: str | None = None) -> str:
    """The whole page as a string (a few MB: plotly.js is most of it)."""
    sections = _sections(report)
    figs = sections.pop("_figs")
    ranks = list(report.get("ranks") or [])
    table_ranks = ranks
    if len(ranks) > MAX_TABLE_RANKS:
        table_ranks = sorted(ranks, key=lambda r: -(step_us(r) or 0.0))[:MAX_TABLE_RANKS]
    answer, change = terminal.answer(report)
    colls = sorted(report.get("collectives") or [],
                   key=lambda c: -coll_time(c))
    cpu_only = bool(ranks) and all(r.get("compute_us") is None and r.get("cpu") for r in ranks)
    ctx: dict[str, Any] = {
        "sections": sections, "table_ranks": table_ranks, "collectives": colls[:50],
        "kernels": (report.get("kernels") or [])[:30], "ops": ((report.get("roofline") or {}).get("ops") or [])[:30],
        "layout_html": _layout_html(report),
    }
    order, left_out, see = section_order(report, ctx)
    inline = finding_charts(report, {k for k in _drawn(order) if sections.get(k, {}).get("chart")}
                            | ({"heatmap"} if "stragglers" in order and sections["heatmap"]["chart"] else set()))
    tmpl = _env().get_template("report.html.j2")
    return tmpl.render(
        r=report, title=title or "traceread report", headline=terminal.headline(report), answer=answer,
        change=change, figures_json=embed_json({k: f for k, f in figs.items() if k in _drawn(order)}),
        plotly_packed=plotly_js_packed(), hidden_ranks=len(ranks) - len(table_ranks), cpu_only=cpu_only,
        steps=total_steps(report), whole_trace=whole_trace(report), version=__version__, floor_us=charts.busbw_floor_us,
        generated=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        nccl_items=_nccl_items(report.get("nccl")), drift_html=_drift_html(report),
        memory_ranks=_memory_ranks(report), memory_model=_memory_model(report),
        section_order=order, left_out=left_out, see=see, inline=inline,
        inline_at={k: i + 1 for i, k in enumerate(inline) if k}, **ctx,
    )


#: Section -> the charts it draws (only charts of shown sections go into the page).
SECTION_CHARTS = {"stragglers": ("heatmap",)}


def _drawn(order: list[str]) -> set[str]:
    return {c for k in order for c in SECTION_CHARTS.get(k, (k,))}


def _memory_ranks(report: Report) -> list[MemoryRank]:
    """Ranks of the memory table, highest peak first (at most MAX_TABLE_RANKS; the JSON has all)."""
    rows = list((report.get("memory") or {}).get("ranks") or [])
    return sorted(rows, key=lambda r: (-(r.get("peak_allocated_bytes") or 0), r.get("rank", 0)))[:MAX_TABLE_RANKS]


def _memory_model(report: Report) -> list[tuple[str, str]]:
    from traceread.render.memory_view import model_rows

    return model_rows(report)


def _layout_html(report: Report) -> Any:
    from traceread.render.layout_view import html_section

    return html_section(report)


def _drift_html(report: Report) -> Any:
    from traceread.render.drift_view import html_section

    return html_section(report)


NCCL_LABELS: dict[str, str] = {
    "version": "NCCL version", "nodes": "nodes", "nranks": "ranks (largest communicator)",
    "local_ranks": "ranks per node", "network": "network", "net_plugin": "net plugin",
    "ofi_provider": "libfabric provider", "ib_devices": "IB/RoCE devices", "transports": "transports (connections)",
    "gdrdma": "GPUDirect RDMA", "channels": "channels", "trees": "trees", "nvls": "NVLink SHARP",
    "init_time_s": "init time (s)", "nccl_tests_busbw_gbps": "nccl-tests avg busbw (GB/s)",
    "nics": "NICs", "env": "set by environment",
}


def _short(v: Any, limit: int = 16) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{a}: {_short(b, 4)}" for a, b in list(v.items())[:limit]) + (" …" if len(v) > limit else "")
    if isinstance(v, list):
        return ", ".join(_short(x, 4) for x in v[:limit]) + (f" … ({len(v)})" if len(v) > limit else "")
    return str(v)


def _problem(item: Any) -> str:
    if not isinstance(item, dict):
        return str(item)
    if "message" in item:
        return str(item["message"])
    return " ".join(f"{k} {item[k]}" for k in ("rank", "op", "pg", "seq", "ran_for_ms") if item.get(k) is not None)


def _nccl_items(n: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The NCCL log summary as (label, value) rows: topology and transport facts, then problems."""
    if not n:
        return []
    rows = [(label, _short(n[k])) for k, label in NCCL_LABELS.items() if n.get(k) not in (None, [], {}, "")]
    comms = n.get("comms") or []
    if len(comms) > 1:
        rows.append(("communicators", f"{len(comms)}: " + ", ".join(
            f"{c.get('comm_id') or 'split'} ({c.get('nranks')} ranks"
            + (f", init {c['init']['slowest_s']:.2f} s" if c.get("init") else "") + ")" for c in comms[:8])))
    plugin = {k: v for k, v in (n.get("plugin") or {}).items() if v not in (None, False, "")}
    if plugin.get("kind") not in (None, "socket"):
        rows.append(("network plugin", _short(plugin)))
    hw = {k: v for k, v in (n.get("hardware") or {}).items() if k != "log_hints" and v is not None}
    if hw.get("gpu"):
        rows.append(("hardware", _short(hw)))
    ins = n.get("inspector") or {}
    if ins:
        rows.append(("NCCL Inspector", f"{ins.get('records', 0)} collective records in {len(ins.get('files') or [])} "
                     f"file(s), {len(ins.get('comms') or [])} communicator(s), "
                     f"{ins.get('slow_collectives_total', 0)} slow collective(s)"))
    rings = n.get("rings") or {}
    if rings:
        first = next(iter(rings.values()))
        rows.append(("rings", f"{len(rings)} channel(s); ring 0: {_short(first, 32)}"))
    for key, label in (("warnings", "NCCL WARN lines"), ("errors", "errors"), ("timeouts", "collective timeouts")):
        items = n.get(key) or []
        if items:
            msgs = sorted({_problem(i) for i in items})
            rows.append((label, f"{len(items)}: " + " | ".join(msgs[:5])))
    return rows


def write_html(report: Report, path: str | Path, *, title: str | None = None) -> Path:
    p = Path(path)
    p.write_text(render_html(report, title=title), encoding="utf-8")
    return p
