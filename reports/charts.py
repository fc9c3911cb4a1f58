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

from traceread.report_schema import Report
from traceread.reports.explain import bus_factor
from traceread.reports.stats import coll_time, n_steps, per_step, step_us

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


def _layout(title: str, **kw: Any) -> dict[str, Any]:
    base = {"title": {"text": title, "x": 0.0}, "margin": {"l": 70, "r": 20, "t": 40, "b": 50},
            "height": 360, "legend": {"orientation": "h", "y": 1.0, "x": 1.0, "xanchor": "right", "yanchor": "bottom"}, "template": None,
            "font": {"family": "system-ui, sans-serif", "size": 12}}
    base.update(kw)
    return base


def pick_lanes(report: Report, limit: int = MAX_LANES) -> list[dict[str, Any]]:
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
    ranks = [r for r in report.get("ranks") or [] if r.get("window_us") is not None]
    if not ranks:
        return None, "No rank has a GPU time window (CPU-only or empty traces)."
    x = [f"r{r['rank']}" for r in ranks]
    data = []
    for name, field in (("compute", "compute_us"), ("exposed comm", "exposed_comm_us"),
                        ("exposed memcpy", "exposed_memcpy_us"), ("idle", "idle_us")):
        y = [(per_step(r, field) or 0.0) / 1000.0 for r in ranks]
        data.append({"type": "bar", "name": name, "x": x, "y": y, "marker": {"color": COLORS[name]},
                     "hovertemplate": "%{x}: %{y:.2f} ms<extra>" + name + "</extra>"})
    return {"data": data, "layout": _layout("Where each rank's step goes (mean per step)", barmode="stack",
                                            yaxis={"title": {"text": "ms per step"}},
                                            xaxis={"type": "category"})}, None


def timeline_figure(report: Report) -> tuple[Figure | None, str | None]:
    """Steps across ranks on one time axis; each step split into compute/comm/memcpy/idle shares."""
    lanes = [r for r in pick_lanes(report) if r.get("steps")]
    if not lanes:
        return None, "No step windows were found (no ProfilerStep markers and no GPU activity)."
    t0 = min(s["start_us"] for r in lanes for s in r["steps"])
    series: dict[str, dict[str, list[Any]]] = {k: {"x": [], "y": [], "base": [], "text": []}
                                               for k in ("compute", "exposed comm", "exposed memcpy", "idle", "step")}
    for r in lanes:
        y = f"r{r['rank']}"
        for s in r["steps"]:
            start = (s["start_us"] - t0) / 1000.0
            dur = s["duration_us"] / 1000.0
            parts = [("compute", s.get("compute_us")), ("exposed comm", s.get("exposed_comm_us")),
                     ("exposed memcpy", s.get("exposed_memcpy_us")), ("idle", s.get("idle_us"))]
            if all(v is None for _, v in parts):
                parts = [("step", s["duration_us"])]
            pos = start
            for name, v in parts:
                if v is None:
                    continue
                w = min(max(float(v) / 1000.0, 0.0), dur)
                d = series[name]
                d["x"].append(w)
                d["y"].append(y)
                d["base"].append(pos)
                d["text"].append(f"step {s['step']}")
                pos += w
    data = [{"type": "bar", "orientation": "h", "name": k, "x": v["x"], "y": v["y"], "base": v["base"],
             "text": v["text"], "textposition": "none", "marker": {"color": COLORS.get(k, "#999")},
             "hovertemplate": "%{y} %{text}: %{x:.2f} ms<extra>" + k + "</extra>"}
            for k, v in series.items() if v["x"]]
    note = "" if len(lanes) == len(report.get("ranks") or []) else f" ({len(lanes)} of {len(report['ranks'])} ranks)"
    return {"data": data, "layout": _layout("Steps across ranks" + note, barmode="overlay",
                                            height=max(240, 22 * len(lanes) + 120),
                                            xaxis={"title": {"text": "ms since the first step"}},
                                            yaxis={"type": "category", "autorange": "reversed"})}, None


def heatmap_figure(report: Report) -> tuple[Figure | None, str | None]:
    """Rank × step: time each rank waited in collectives (or, without that, time behind the step median)."""
    hm = report.get("straggler_heatmap")
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
            col = [row[j] for row in z if row[j] is not None]
            m = median(col) if col else 0.0
            for row in z:
                if row[j] is not None:
                    row[j] = row[j] - m
        ranks, what = [r["rank"] for r in ranks_e], "step time minus the step's median over ranks (ms)"
    return {"data": [{"type": "heatmap", "z": z, "x": [str(s) for s in steps], "y": [f"r{r}" for r in ranks],
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
    x = [short(f"{c['name']} pg {c.get('pg')} {c.get('bytes', 0) / 1e6:.1f} MB") for c in colls]
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
                                            height=420, xaxis={"type": "log", "title": {"text": "arithmetic intensity (FLOP/byte)"}},
                                            yaxis={"type": "log", "title": {"text": "TFLOP/s"}})}, None


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
            data.append({"type": "bar", "orientation": "h", "name": kind,
                         "x": [(b["end_us"] - b["start_us"]) / 1000.0 for b in sel],
                         "base": [(b["start_us"] - t0) / 1000.0 for b in sel],
                         "y": [f"stage {b['stage']}" for b in sel], "marker": {"color": COLORS.get(kind, "#999")},
                         "hovertemplate": "%{y}: %{base:.2f}+%{x:.2f} ms<extra>" + kind + "</extra>"})
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
    from traceread.analysis.ledger import CATEGORIES
    from traceread.reports.ledger_view import by_category

    led = report.get("ledger")
    if not led:
        return None, "No step ledger: the traces have no GPU steps (CPU-only or empty traces)."
    crit = led.get("critical_rank")
    cols = [("job (critical r%s)" % crit, by_category(led.get("parts") or []))]
    ranks = [r for r in pick_lanes(report) if r.get("ledger")]
    cols += [(f"r{r['rank']}", by_category(r["ledger"]["parts"])) for r in ranks]
    x = [c for c, _ in cols]
    data = []
    for cat in CATEGORIES:
        y = [t.get(cat, 0.0) / 1000.0 for _, t in cols]
        if any(y):
            data.append({"type": "bar", "name": cat, "x": x, "y": y, "marker": {"color": LEDGER_COLORS[cat]},
                         "hovertemplate": "%{x}: %{y:.3f} ms<extra>" + cat + "</extra>"})
    n = len(report.get("ranks") or [])
    title = f"Step ledger of step {led.get('step')}: the job and each rank" + (
        f" ({len(ranks)} of {n} ranks shown)" if len(ranks) < n else "")
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
