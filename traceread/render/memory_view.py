"""The memory section (docs/memory.md): one terminal line, the HTML chart of memory over the peak
rank's step (allocated and reserved, with the step's phases) and the rows of its tables.

Everything here reads ``report["memory"]`` only; without memory events and snapshots that is null and
nothing is drawn (no "no data" box: the section is simply absent).
"""

from __future__ import annotations

from typing import Any

from traceread.fmt import ms, nbytes, pct
from traceread.render.charts import Figure, _layout, label
from traceread.report_schema import MemoryRank, Report

PHASE_COLORS = {"forward": "rgba(76,120,168,0.10)", "backward": "rgba(114,183,178,0.16)",
                "optimizer": "rgba(245,133,24,0.14)"}
#: Draw the device's memory as a line when the peak uses at least this share of it.
CAPACITY_LINE_SHARE = 0.5
#: Zoom the time axis to the allocations when the last one comes before this share of the step.
ZOOM_BELOW = 0.5


def _where(r: MemoryRank) -> str:
    bits = []
    if r.get("peak_step") is not None:
        bits.append(f"step {r['peak_step']} +{ms(r.get('peak_offset_us'))}")
    if r.get("peak_phase"):
        bits.append(f"in {r['peak_phase']}")
    if r.get("peak_operator"):
        bits.append(f"during {r['peak_operator']}")
    return " ".join(bits)


def peak_row(report: Report) -> MemoryRank | None:
    m = report.get("memory") or {}
    return next((r for r in m.get("ranks") or [] if r.get("rank") == m.get("peak_rank")), None)


def terminal_line(report: Report) -> str | None:
    """``Memory: ...`` in one line; None without a memory section."""
    m = report.get("memory")
    if not m:
        return None
    r = peak_row(report)
    parts: list[str] = []
    if r is not None:
        rel = "" if r.get("baseline_known") else " (counted from the window start)"
        res = f" / {nbytes(r['peak_reserved_bytes'])} reserved" if r.get("peak_reserved_bytes") is not None else ""
        cap = f" of {nbytes(r['capacity_bytes'])}" if r.get("capacity_bytes") and r.get("baseline_known") else ""
        parts.append(f"peak {nbytes(r['peak_allocated_bytes'])} allocated{res}{cap}{rel} on rank {r['rank']} "
                     f"({r.get('device')}), {_where(r)}".rstrip(", "))
        if r.get("headroom_bytes") is not None:
            parts.append(f"headroom {nbytes(r['headroom_bytes'])} ({pct(r.get('headroom_pct'), 0)})")
        if r.get("fragmentation_bytes"):
            parts.append(f"fragmentation {nbytes(r['fragmentation_bytes'])} at the peak")
        if len(m.get("ranks") or []) > 1:
            parts.append(f"median rank {nbytes(m.get('median_peak_allocated_bytes'))} "
                         f"(+{nbytes(m.get('imbalance_bytes'))} on the peak rank)")
        growth = [x for x in m.get("ranks") or [] if x.get("leak")]
        if growth:
            worst = max(growth, key=lambda x: x.get("growth_per_step_bytes") or 0.0)
            parts.append(f"grows {nbytes(worst['growth_per_step_bytes'])}/step on rank {worst['rank']} (leak)")
    model = m.get("model")
    if model:
        est = model["estimate"]
        parts.append(f"model {nbytes(est['total_bytes'])} weights+grads+optimizer (ZeRO-{est['zero_stage']}), "
                     f"{nbytes(max(model['activations_and_buffers_bytes'], 0.0))} activations and buffers")
    snaps = m.get("snapshots") or []
    if snaps:
        oom = sum(1 for s in snaps if s.get("oom"))
        parts.append(f"{len(snaps)} snapshot(s)" + (f", {oom} after an OOM" if oom else ""))
    return "Memory: " + "; ".join(parts)


def memory_figure(report: Report) -> tuple[Figure | None, str | None]:
    """Allocated and reserved over the peak rank's step (GB = 1e9 bytes), phases shaded, the peak marked."""
    m = report.get("memory") or {}
    tl = m.get("timeline")
    if not tl or not tl.get("t_us"):
        return None, "no memory events (record with profile_memory=True / traceread collect --profile-memory)"
    x = [t / 1000.0 for t in tl["t_us"]]
    alloc = [a / 1e9 for a in tl["allocated"]]
    data: list[dict[str, Any]] = [{"type": "scatter", "mode": "lines", "name": "allocated", "x": x, "y": alloc,
                                   "line": {"shape": "hv", "color": "#4C78A8", "width": 1.5}, "fill": "tozeroy",
                                   "fillcolor": "rgba(76,120,168,0.15)",
                                   "hovertemplate": "%{x:.3f} ms: %{y:.3f} GB allocated<extra></extra>"}]
    if tl.get("reserved"):
        data.append({"type": "scatter", "mode": "lines", "name": "reserved", "x": x,
                     "y": [v / 1e9 for v in tl["reserved"]], "line": {"shape": "hv", "color": "#E45756", "dash": "dot"},
                     "hovertemplate": "%{x:.3f} ms: %{y:.3f} GB reserved<extra></extra>"})
    top = max(range(len(alloc)), key=lambda i: (alloc[i], -i))
    data.append({"type": "scatter", "mode": "markers", "name": "peak", "x": [x[top]], "y": [alloc[top]],
                 "marker": {"color": "#000", "size": 8, "symbol": "diamond"},
                 "hovertemplate": "peak %{y:.3f} GB at %{x:.3f} ms<extra></extra>"})
    r = peak_row(report) or {}
    cap = r.get("capacity_bytes")
    top_y = max(alloc + [v / 1e9 for v in tl.get("reserved") or []])
    if cap and r.get("baseline_known") and top_y >= CAPACITY_LINE_SHARE * cap / 1e9:
        data.append({"type": "scatter", "mode": "lines", "name": "device memory", "x": [x[0], x[-1]],
                     "y": [cap / 1e9, cap / 1e9], "line": {"color": "#000", "dash": "dash", "width": 1},
                     "hoverinfo": "skip"})
    # The host often runs ahead of the GPU and then waits: when every allocation lies early in the step,
    # the axis shows them (the level then holds to the step's end, said in the axis title).
    span = x[-1]
    last = x[-2] if len(x) > 2 else span
    shown = span if last >= ZOOM_BELOW * span else last * 1.05 or span
    phases = tl.get("phases") or []
    shapes = [{"type": "rect", "xref": "x", "yref": "paper", "x0": p["start_us"] / 1000.0, "x1": p["end_us"] / 1000.0,
               "y0": 0, "y1": 1, "fillcolor": PHASE_COLORS.get(p["name"], "rgba(0,0,0,0.05)"), "line": {"width": 0},
               "layer": "below"} for p in phases]
    notes = [{"x": (max(p["start_us"], 0.0) + min(p["end_us"], shown * 1000.0)) / 2000.0, "y": 1.0, "xref": "x",
              "yref": "paper", "yanchor": "bottom", "text": label(p["name"]), "showarrow": False,
              "font": {"size": 11, "color": "#555"}}
             for p in phases if (min(p["end_us"], shown * 1000.0) - p["start_us"]) / 1000.0 >= 0.08 * shown]
    step = f"step {tl['step']}" if tl.get("step") is not None else "the recorded window"
    title = f"Memory over {step} on rank {tl.get('rank')} ({label(tl.get('device'))}), the rank with the highest peak"
    axis = "ms from the step start (host clock)" + (f"; the last allocation is at {last:.3g} ms of {span:.3g}"
                                                    if shown < span else "")
    return {"data": data, "layout": _layout(title, shapes=shapes, annotations=notes,
                                            xaxis={"title": {"text": axis}, "range": [0.0, shown]},
                                            yaxis={"title": {"text": "GB"}, "rangemode": "tozero"})}, None


def explanation(report: Report) -> str:
    m = report.get("memory") or {}
    r = peak_row(report)
    text = ("Each allocation and free the caching allocator made while the profiler ran (profile_memory=True). "
            "Allocated is memory in live tensors; reserved is what the allocator holds from the device, cached "
            "blocks included (reserved - allocated is fragmentation). Headroom = the device's memory - peak "
            "reserved; the CUDA context and other processes also need some of it. ")
    if r is not None:
        text += (f"The highest peak is rank {r['rank']}'s: {nbytes(r['peak_allocated_bytes'])} allocated, "
                 f"{_where(r)}. ")
        if len(m.get("ranks") or []) > 1:
            text += (f"The median rank peaks at {nbytes(m.get('median_peak_allocated_bytes'))}: a batch size that fits "
                     "the highest rank leaves the difference unused on the others. ")
    if m.get("model"):
        text += ("The model rows are the guide's per-GPU training state (weights, gradients, optimizer state) for "
                 "the --params given; what the peak holds beyond it is activations and buffers.")
    return text


def model_rows(report: Report) -> list[tuple[str, str]]:
    model = (report.get("memory") or {}).get("model")
    if not model:
        return []
    est = model["estimate"]
    rows = [
        ("parameters per GPU", f"{est['params_per_gpu']:.4g} of {est['params_total']:.4g} "
                               f"(TP x PP = {est['model_parallel']})"),
        ("ZeRO stage", f"{est['zero_stage']} ({model['zero_stage_source']}); sharded over {est['shard_degree']} ranks "
                       f"({model['shard_degree_source']})"),
        ("dtype / optimizer", f"{est['dtype']} weights and gradients, {est['optimizer']}"
                              + (" + fp32 master weights" if est["master_weights"] else "")),
        ("weights", nbytes(est["weights_bytes"])), ("gradients", nbytes(est["gradients_bytes"])),
        ("optimizer state", nbytes(est["optimizer_bytes"])), ("training state (model)", nbytes(est["total_bytes"])),
        (f"measured peak (rank {model['rank']})", nbytes(model["measured_peak_allocated_bytes"])),
        ("activations and buffers (peak - model)", nbytes(model["activations_and_buffers_bytes"])),
    ]
    for w in model.get("what_if") or []:
        saved = nbytes(w["saving_bytes"]) if w.get("saving_bytes") is not None else "not in the trace"
        rows.append((f"what if: {w['change']}", f"saves {saved}" + (f" ({w['note']})" if w.get("note") else "")))
    return rows
