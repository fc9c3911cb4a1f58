"""Plotly figure dicts for the HTML report, built only from the report document.

Each ``*_figure`` returns ``(figure, None)`` or ``(None, reason)`` so the page can say why a chart is
missing instead of dropping the section. Figures are plain dicts (``{"data": [...], "layout": {...}}``)
so they serialise with orjson and need no plotly Python objects. Every trace-derived label goes
through :func:`label`, which entity-escapes it: plotly interprets a small subset of HTML in text, and a
kernel named ``<b>`` must show as ``<b>``. Big jobs are aggregated: at most :data:`MAX_LANES` ranks are
drawn in per-rank timelines (slowest, fastest and evenly spaced ranks).
"""

from __future__ import annotations

from statistics import median
from typing import Any

from traceread.assemble.explain import bus_factor
from traceread.assemble.queries import coll_time, n_steps, per_step, step_us
from traceread.fmt import NO_MARKER_STEP, WHOLE_TRACE, step_name
from traceread.render.ledger_view import CATEGORY_WORDS
from traceread.report_schema import LEDGER_CATEGORIES, RankEntry, Report

PIPELINE_WORDS = {"fwd": "forward", "bwd": "backward", "p2p": "send/recv", "idle": "idle", "other": "other"}


def _words(category: str) -> str:
    """A step-timeline category in words: ``comm dp`` → ``comm (dp group)``."""
    if category.startswith("comm ") and not category.endswith("group"):
        return f"comm ({category[5:]} group)" if category[5:] in ("dp", "fsdp", "tp", "pp", "cp", "ep") else category
    return category

Figure = dict[str, Any]
MAX_LANES = 32
COLORS = {"compute": "#4C78A8", "exposed comm": "#E45756", "exposed memcpy": "#F58518", "idle": "#BAB0AC",
          "fwd": "#4C78A8", "bwd": "#72B7B2", "p2p": "#E45756", "other": "#BAB0AC"}


def label(text: Any) -> str:
    """A trace-derived string made safe for plotly text (entities shown literally, never as markup)."""
    s = str(text)
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def short(text: Any, n: int = 60) -> str:
    s = str(text)
    return label(s if len(s) <= n else s[: n - 1] + "…")


#: Legend of every chart: a column right of the plot, below the title row. The title (top left)
#: and the mode bar (top right, shown on hover only) share the top margin; the legend never enters
#: it, so nothing overlaps whatever the labels (tests/test_browser.py measures it).
LEGEND = {"orientation": "v", "x": 1.02, "xanchor": "left", "y": 1.0, "yanchor": "top", "bgcolor": "rgba(255,255,255,0)",
          "font": {"size": 11}}
#: Log axes write 10⁻⁶, never SI prefixes ("1µ TFLOP/s").
LOG_AXIS = {"type": "log", "exponentformat": "power", "showexponent": "all", "dtick": 1}


def _layout(title: str, **kw: Any) -> dict[str, Any]:
    base = {"title": {"text": title, "x": 0.0, "xanchor": "left", "y": 1.0, "yanchor": "top", "yref": "container",
                      "pad": {"t": 8}, "font": {"size": 14}},
            "margin": {"l": 70, "r": 20, "t": 48, "b": 50},
            "height": 360, "legend": dict(LEGEND), "template": None,
            "font": {"family": "system-ui, sans-serif", "size": 12}}
    base.update(kw)
    return base


def pick_lanes(report: Report, limit: int = MAX_LANES) -> list[RankEntry]:
    """Ranks to draw one lane each for: all of them when few, else slowest/fastest/evenly spaced."""
    ranks = list(report.get("ranks") or [])
    if len(ranks) <= limit:
        return ranks
    by_time = sorted(ranks, key=lambda r: -(step_us(r) or 0.0))
    chosen = {id(r): r for r in by_time[: limit // 2]}
    for r in by_time[-4:]:
        chosen[id(r)] = r
    stride = max(1, len(ranks) // (limit - len(chosen) + 1))
    for r in ranks[::stride]:
        if len(chosen) >= limit:
            break
        chosen[id(r)] = r
    return sorted(chosen.values(), key=lambda r: r["rank"])


def breakdown_figure(report: Report) -> tuple[Figure | None, str | None]:
    """Per-rank stacked bars: compute + exposed comm + exposed memcpy + idle = mean step time (each a
    mean over the rank's step entries, whose parts add up to each step)."""
    ranks = [r for r in report.get("ranks") or [] if r.get("compute_us") is not None]
    parts: tuple[tuple[str, str], ...] = (("compute", "compute_us"), ("exposed comm", "exposed_comm_us"),
                                          ("exposed memcpy", "exposed_memcpy_us"), ("idle", "idle_us"))
    what = "Where each rank's step goes (mean per step)"
    if not ranks:  # CPU-only ranks (gloo on CPU): the host's split of each step
        ranks = [r for r in report.get("ranks") or [] if per_step(r, "cpu_compute_us") is not None]
        parts = (("compute", "cpu_compute_us"), ("exposed comm", "cpu_exposed_comm_us"),
                 ("overlapped comm", "_overlapped"), ("idle", "cpu_idle_us"))
        what = "Where each rank's step goes on the CPU (mean per step; no GPU in the trace)"
    if not ranks:
        return None, "no rank has a step breakdown (empty traces)"
    x = [f"r{r['rank']}" for r in ranks]
    data = []
    for name, field in parts:
        if field == "_overlapped":
            y = [((per_step(r, "cpu_comm_us") or 0.0) - (per_step(r, "cpu_exposed_comm_us") or 0.0)) / 1000.0 for r in ranks]
        else:
            y = [(per_step(r, field) or 0.0) / 1000.0 for r in ranks]
        if not any(y):
            continue
        data.append({"type": "bar", "name": name, "x": x, "y": y, "marker": {"color": COLORS.get(name, "#72B7B2")},
                     "hovertemplate": "%{x}: %{y:.2f} ms<extra>" + name + "</extra>"})
    if not data:
        return None, "every part of the step is zero"
    return {"data": data, "layout": _layout(what, barmode="stack", yaxis={"title": {"text": "ms per step"}},
                                            xaxis={"type": "category"})}, None


#: Colours of the step timeline's categories; communication colours go by role / group in order.
TIMELINE_COLORS = {"compute": "#4C78A8", "memcpy": "#F58518", "idle": "#D8D4D0", "idle / bubble": "#D8D4D0",
                   "host-bound idle": "#EECA3B"}
COMM_PALETTE = ("#E45756", "#B279A2", "#9D755D", "#FF9DA6", "#54A24B", "#72B7B2", "#79706E")
#: Bars narrower than this share of the step are merged with their same-category neighbours (lighter page).
TIMELINE_RESOLUTION = 1 / 800


def timeline_color(category: str, comm_order: list[str]) -> str:
    """Colour of a timeline category (a function of the row's category column only)."""
    if category in TIMELINE_COLORS:
        return TIMELINE_COLORS[category]
    if category.startswith("comm"):
        return COMM_PALETTE[comm_order.index(category) % len(COMM_PALETTE)] if category in comm_order else COMM_PALETTE[0]
    return "#999999"


def _coarsen(rows: list[tuple[float, float, str]], gap: float) -> list[tuple[float, float, str]]:
    """Merge consecutive same-category bars of one lane closer than ``gap`` (rows sorted by start)."""
    out: list[tuple[float, float, str]] = []
    for s, e, c in rows:
        if out and out[-1][2] == c and s - out[-1][1] <= gap and not c.startswith("comm"):
            out[-1] = (out[-1][0], max(out[-1][1], e), c)
        else:
            out.append((s, e, c))
    return out


def timeline_figure(report: Report) -> tuple[Figure | None, str | None]:
    """The median and the slowest step: every shown rank's GPU streams as bars in real time on the
    report's clock (one lane per stream, plus one "GPU" lane with the idle and host-bound gaps),
    coloured by category, with the critical path (last arrival at each collective) across ranks."""
    tl = report.get("step_timeline")
    if not tl or not tl.get("steps"):
        return None, "No GPU intervals: the traces have no GPU activity inside a step."
    rows = tl["rows"]
    cats = list(dict.fromkeys(rows["category"]))
    comm_order = sorted(c for c in cats if c.startswith("comm"))
    panels = tl["steps"][:2]
    n = len(panels)
    data: list[dict[str, Any]] = []
    layout_axes: dict[str, Any] = {}
    annotations = []
    shown: set[str] = set()
    lane_sets = [sorted({(rows["rank"][j], rows["stream"][j]) for j, st in enumerate(rows["step"]) if st == p["step"]})
                 for p in panels]
    total = sum(len(ls) for ls in lane_sets) or 1
    gap_frac = 0.1 if n > 1 else 0.0
    top = 1.0
    for i, p in enumerate(panels):
        ax = "" if i == 0 else str(i + 1)
        sel = [j for j, st in enumerate(rows["step"]) if st == p["step"]]
        lanes = lane_sets[i]
        idx = {ln: k for k, ln in enumerate(lanes)}
        gap = float(p["duration_us"]) * TIMELINE_RESOLUTION
        per_lane: dict[tuple[int, int], list[tuple[float, float, str]]] = {}
        for j in sorted(sel, key=lambda j: rows["start"][j]):
            per_lane.setdefault((rows["rank"][j], rows["stream"][j]), []).append(
                (rows["start"][j], rows["end"][j], rows["category"][j]))
        by_cat: dict[str, dict[str, list[float]]] = {}
        for ln, items in per_lane.items():
            for s, e, c in _coarsen(items, gap):
                if e - s < gap / 2:
                    continue  # under half of the merge gap (1/1600 of the step): never visible, only bytes in the page
                d = by_cat.setdefault(c, {"x": [], "base": [], "y": []})
                d["x"].append(round((e - s) / 1000.0, 3))
                d["base"].append(round(s / 1000.0, 3))
                d["y"].append(idx[ln])
        for c in sorted(by_cat, key=cats.index):
            d = by_cat[c]
            data.append({"type": "bar", "orientation": "h", "name": label(_words(c)), "legendgroup": label(c),
                         "showlegend": c not in shown, "x": d["x"], "base": d["base"], "y": d["y"], "width": 0.8,
                         "xaxis": "x" + ax, "yaxis": "y" + ax, "marker": {"color": timeline_color(c, comm_order),
                                                                          "line": {"width": 0}},
                         "hovertemplate": "%{base:.3f} ms + %{x:.3f} ms<extra>" + label(c) + "</extra>"})
            shown.add(c)
        crit = [c for c in p.get("critical") or [] if (c["rank"], c["stream"]) in idx]
        if crit:
            # a marker where each collective's last rank arrived (everyone else waited for it): no lines
            # between lanes, which zigzag unreadably across the lanes of a 3-d job
            data.append({"type": "scatter", "mode": "markers", "name": "last arrival (critical path)",
                         "legendgroup": "critical", "showlegend": "critical" not in shown,
                         "x": [round(c["t"] / 1000.0, 3) for c in crit], "y": [idx[(c["rank"], c["stream"])] for c in crit],
                         "text": [f"rank {c['rank']}, process group {label(c['pg'])}" for c in crit],
                         "xaxis": "x" + ax, "yaxis": "y" + ax,
                         "marker": {"size": 8, "color": "#000", "symbol": "triangle-down", "line": {"width": 0}},
                         "hovertemplate": "%{text} arrived last at %{x:.3f} ms<extra></extra>"})
            shown.add("critical")
        bottom = top - (1.0 - gap_frac * (n - 1)) * len(lanes) / total
        layout_axes["xaxis" + ax] = {"anchor": "y" + ax, "title": {"text": "ms from the step's first GPU start"},
                                     "range": [0, float(p["duration_us"]) / 1000.0 * 1.01]}
        layout_axes["yaxis" + ax] = {"domain": [max(bottom, 0.0), top], "autorange": "reversed",
                                     "tickvals": list(range(len(lanes))),
                                     "ticktext": [f"r{r} GPU" if s == -1 else f"r{r} s{s}" for r, s in lanes]}
        step_ms = float(p.get("step_us") or p["duration_us"]) / 1000.0
        named = WHOLE_TRACE if p["step"] == NO_MARKER_STEP else f"{label(p['label'])} {p['step']}"
        annotations.append({"text": f"{named}: {step_ms:.2f} ms (slowest rank's step time)",
                            "xref": "paper", "yref": "paper", "x": 0, "xanchor": "left", "y": top, "yanchor": "bottom",
                            "showarrow": False, "font": {"size": 13}})
        top = bottom - gap_frac
    note = f" ({label(tl['note'])})" if tl.get("note") else ""
    layout = _layout("Real step timeline on one clock" + note, barmode="overlay", bargap=0.25, annotations=annotations,
                     height=max(320, 15 * total + 150 * n + 60), **layout_axes, margin={"l": 70, "r": 20, "t": 90, "b": 50})
    return {"data": data, "layout": layout}, None


def heatmap_figure(report: Report) -> tuple[Figure | None, str | None]:
    """Rank × step: time each rank waited in collectives (or, without that, time behind the step median)."""
    hm = report.get("straggler_heatmap")
    z: list[list[float | None]]
    if hm and hm.get("wait_us"):
        z = [[None if v is None else v / 1000.0 for v in row] for row in hm["wait_us"]]
        ranks, steps, what = hm["ranks"], hm["steps"], "wait in collectives (ms)"
    else:
        ranks_e = [r for r in report.get("ranks") or [] if r.get("steps")]
        if len(ranks_e) < 2:
            return None, "Needs at least two ranks with step windows."
        steps = sorted({s["step"] for r in ranks_e for s in r["steps"]})
        idx = {s: i for i, s in enumerate(steps)}
        z = [[None] * len(steps) for _ in ranks_e]
        for i, r in enumerate(ranks_e):
            for s in r["steps"]:
                z[i][idx[s["step"]]] = s["duration_us"] / 1000.0
        for j in range(len(steps)):
            col = [v for row in z if (v := row[j]) is not None]
            m = median(col) if col else 0.0
            for row in z:
                if (v := row[j]) is not None:
                    row[j] = v - m
        ranks, what = [r["rank"] for r in ranks_e], "step time minus the step's median over ranks (ms)"
    return {"data": [{"type": "heatmap", "z": z, "x": ["whole trace" if s == NO_MARKER_STEP else str(s) for s in steps],
                      "y": [f"r{r}" for r in ranks],
                      "colorscale": "Reds", "colorbar": {"title": {"text": "ms"}},
                      "hovertemplate": "%{y} step %{x}: %{z:.2f} ms<extra></extra>"}],
            "layout": _layout(f"Rank × step: {what}", height=max(260, min(900, 14 * len(ranks) + 120)),
                              xaxis={"title": {"text": "step"}, "type": "category"},
                              yaxis={"type": "category", "autorange": "reversed"})}, None


def collectives_figure(report: Report, top: int = 15) -> tuple[Figure | None, str | None]:
    """Bus bandwidth of the heaviest collectives next to the peak of the link they ran on."""
    colls = [c for c in report.get("collectives") or [] if c.get("busbw_gbps") is not None]
    if not colls:
        return None, "No collective with a known size and group (bandwidth needs both)."
    colls.sort(key=lambda c: -coll_time(c))
    colls = colls[:top]
    x = [short(f"{c['name']} pg {c.get('pg')} {(c.get('bytes') or 0) / 1e6:.1f} MB") for c in colls]
    data = [{"type": "bar", "name": "bus bandwidth", "x": x, "y": [c["busbw_gbps"] for c in colls],
             "marker": {"color": "#4C78A8"}, "hovertemplate": "%{x}: %{y:.1f} GB/s<extra></extra>"}]
    peaks = [c.get("link_peak_gbps") for c in colls]
    if any(p is not None for p in peaks):
        data.append({"type": "scatter", "mode": "markers", "name": "link peak", "x": x, "y": peaks,
                     "marker": {"symbol": "line-ew-open", "size": 28, "color": "#E45756", "line": {"width": 3}},
                     "text": [label(c.get("link") or "?") for c in colls],
                     "hovertemplate": "%{x}: peak %{y:.0f} GB/s (%{text})<extra></extra>"})
    return {"data": data, "layout": _layout("Collective bus bandwidth vs link peak", yaxis={"title": {"text": "GB/s"}},
                                            xaxis={"type": "category", "automargin": True})}, None


def roofline_figure(report: Report) -> tuple[Figure | None, str | None]:
    """Operators at (FLOP/byte, achieved TFLOP/s) under the memory and compute ceilings."""
    r = report.get("roofline")
    if not r:
        return None, "No roofline: the device is unknown or operators have no recorded shapes (record_shapes=True)."
    peak, bw = r.get("peak_tflops"), r.get("peak_gbps")
    ops = [o for o in r.get("ops") or [] if o.get("intensity") and o.get("achieved_tflops")]
    if not peak or not bw:
        return None, "The device's peak FLOP/s or memory bandwidth is unknown (pass --device-spec)."
    if not ops:
        return None, "No operator with both FLOPs and bytes (traces need record_shapes=True)."
    ridge = r.get("ridge_flop_per_byte") or peak * 1e3 / bw
    xs = [min(0.01, min(o["intensity"] for o in ops) / 2), ridge, max(1e4, max(o["intensity"] for o in ops) * 2)]
    ceiling = [min(peak, bw * x / 1000.0) for x in xs]
    data = [
        {"type": "scatter", "mode": "lines", "name": f"ceiling ({label(r.get('ceiling') or 'peak')})", "x": xs,
         "y": ceiling, "line": {"color": "#333"}},
        {"type": "scatter", "mode": "markers+text", "name": "ridge point", "x": [ridge], "y": [peak],
         "text": [f"ridge {ridge:.0f} FLOP/B"], "textposition": "bottom right", "marker": {"size": 10, "color": "#333"}},
    ]
    for bound, color in (("memory", "#E45756"), ("compute", "#4C78A8")):
        sel = [o for o in ops if o.get("bound") == bound] or ([] if bound == "memory" else
                                                             [o for o in ops if o.get("bound") not in ("memory", "compute")])
        if not sel:
            continue
        tmax = max(float(o.get("time_us") or 1) for o in ops)
        data.append({"type": "scatter", "mode": "markers", "name": f"{bound}-bound ops", "x": [o["intensity"] for o in sel],
                     "y": [o["achieved_tflops"] for o in sel], "text": [short(o["name"]) for o in sel],
                     "marker": {"color": color, "size": [8 + 22 * (float(o.get("time_us") or 0) / tmax) ** 0.5 for o in sel]},
                     "hovertemplate": "%{text}<br>%{x:.3g} FLOP/B, %{y:.3g} TFLOP/s<extra></extra>"})
    return {"data": data, "layout": _layout(f"Roofline: {label(r.get('device') or '')} {label(r.get('precision') or '')}",
                                            height=420, xaxis={**LOG_AXIS, "title": {"text": "arithmetic intensity (FLOP/byte)"}},
                                            yaxis={**LOG_AXIS, "title": {"text": "TFLOP/s"}})}, None


def pipeline_figure(report: Report) -> tuple[Figure | None, str | None]:
    """Pipeline schedule per stage (forward/backward/transfer blocks, gaps are the bubble)."""
    p = report.get("pipeline")
    if not p:
        return None, "No pipeline parallelism detected (no stage-to-stage send/recv pattern)."
    tl = p.get("timeline") or []
    if tl:
        t0 = min(b["start_us"] for b in tl)
        data = []
        for kind in ("p2p", "idle", "other", "fwd", "bwd"):  # compute drawn last, on top of waiting transfers
            sel = [b for b in tl if (b.get("kind") or "other") == kind]
            if not sel:
                continue
            data.append({"type": "bar", "orientation": "h", "name": PIPELINE_WORDS.get(kind, kind),
                         "x": [(b["end_us"] - b["start_us"]) / 1000.0 for b in sel],
                         "base": [(b["start_us"] - t0) / 1000.0 for b in sel],
                         "y": [f"stage {b['stage']}" for b in sel], "marker": {"color": COLORS.get(kind, "#999")},
                         "hovertemplate": "%{y}: %{base:.2f}+%{x:.2f} ms<extra>" + PIPELINE_WORDS.get(kind, kind) + "</extra>"})
        return {"data": data, "layout": _layout("Pipeline schedule (gaps are the bubble)", barmode="overlay",
                                                height=max(220, 40 * int(p.get("stages") or 1) + 120),
                                                xaxis={"title": {"text": "ms"}},
                                                yaxis={"type": "category", "autorange": "reversed"})}, None
    per = p.get("per_stage") or []
    if not per:
        return None, "A pipeline was detected but no per-stage timing is available."
    return {"data": [{"type": "bar", "x": [f"stage {s.get('stage')}" for s in per], "y": [s.get("bubble_pct") for s in per],
                      "name": "bubble %", "marker": {"color": "#BAB0AC"}}],
            "layout": _layout("Bubble per stage (%)", xaxis={"type": "category"})}, None


def slow_steps_figure(report: Report) -> tuple[Figure | None, str | None]:
    """Step time (slowest rank) per step; slow steps highlighted, the median as a line."""
    ranks = [r for r in report.get("ranks") or [] if r.get("steps")]
    if not ranks:
        return None, "No step windows."
    by_step: dict[int, float] = {}
    for r in ranks:
        for s in r["steps"]:
            by_step[s["step"]] = max(by_step.get(s["step"], 0.0), s["duration_us"])
    steps = sorted(by_step)
    if len(steps) < 2:
        return None, "Only one step in the trace; slow steps need several."
    slow = {s["step"] for s in report.get("slow_steps") or []}
    m = median(by_step.values()) / 1000.0
    return {"data": [
        {"type": "bar", "name": "step time (slowest rank)", "x": [str(s) for s in steps],
         "y": [by_step[s] / 1000.0 for s in steps],
         "marker": {"color": ["#E45756" if s in slow else "#4C78A8" for s in steps]},
         "hovertemplate": "step %{x}: %{y:.2f} ms<extra></extra>"},
        {"type": "scatter", "mode": "lines", "name": "median", "x": [str(steps[0]), str(steps[-1])], "y": [m, m],
         "line": {"dash": "dash", "color": "#333"}},
    ], "layout": _layout("Step time per step (red: flagged slow)", xaxis={"type": "category", "title": {"text": "step"}},
                         yaxis={"title": {"text": "ms"}})}, None


LEDGER_COLORS = {
    "compute_bound": "#4C78A8", "memory_bound": "#72B7B2", "compute_other": "#9ecae9", "comm_transfer": "#F58518",
    "comm_wait": "#E45756", "bubble": "#B279A2", "exposed_memcpy": "#EECA3B", "host_bound": "#FF9DA6",
    "dependency": "#9D755D", "idle_other": "#BAB0AC",
}


def ledger_figure(report: Report) -> tuple[Figure | None, str | None]:
    """The step ledger as stacked bars: one for the job (the critical path of the median step) and
    one per rank (its own ledger of that step); many ranks are sampled as in the timelines."""
    from traceread.render.ledger_view import by_category

    led = report.get("ledger")
    if not led:
        return None, "No step ledger: the traces have no GPU steps (CPU-only or empty traces)."
    crit = led.get("critical_rank")
    cols = [(f"job (critical r{crit})", by_category(led.get("parts") or []))]
    ranks = [r for r in pick_lanes(report) if r.get("ledger")]
    cols += [(f"r{r['rank']}", by_category(r["ledger"]["parts"])) for r in ranks]
    x = [c for c, _ in cols]
    data = []
    for cat in LEDGER_CATEGORIES:
        y = [t.get(cat, 0.0) / 1000.0 for _, t in cols]
        if any(y):
            data.append({"type": "bar", "name": CATEGORY_WORDS[cat], "x": x, "y": y, "marker": {"color": LEDGER_COLORS[cat]},
                         "hovertemplate": "%{x}: %{y:.3f} ms<extra>" + CATEGORY_WORDS[cat] + "</extra>"})
    n = len(report.get("ranks") or [])
    title = f"Step ledger of {step_name(led.get('step'))}: the job and each rank" + (
        f" ({len(ranks)} of {n} shown)" if len(ranks) < n else "")
    return {"data": data, "layout": _layout(title, barmode="stack", yaxis={"title": {"text": "ms"}},
                                            xaxis={"type": "category"})}, None


def busbw_floor_us(c: dict[str, Any]) -> float | None:
    """Fastest possible time of a collective at its link peak (used by tables)."""
    if not c.get("bytes") or not c.get("link_peak_gbps") or not c.get("group_size"):
        return None
    return float(c["bytes"]) * bus_factor(str(c.get("name")), int(c["group_size"])) / (float(c["link_peak_gbps"]) * 1e3)


def all_figures(report: Report) -> dict[str, tuple[Figure | None, str | None]]:
    """Every chart of the page by section id (a failing builder becomes a 'no data' reason)."""
    builders = {"breakdown": breakdown_figure, "timeline": timeline_figure, "heatmap": heatmap_figure,
                "collectives": collectives_figure, "roofline": roofline_figure, "pipeline": pipeline_figure,
                "slow_steps": slow_steps_figure, "ledger": ledger_figure}
    out: dict[str, tuple[Figure | None, str | None]] = {}
    for key, fn in builders.items():
        try:
            out[key] = fn(report)
        except Exception as exc:  # a malformed extra must not take the page down
            out[key] = (None, f"chart failed: {type(exc).__name__}: {exc}")
    return out


__all__ = ["all_figures", "label", "pick_lanes", "n_steps"]
