"""The job's shape in the terminal and the HTML page: what the job was doing (training, serving,
inference) and the parallel layout table — group, role, size, ranks, nodes, evidence.

Groups that look alike (same role, size, description and node count: the 64 TP groups of a large
job) share one row naming every process group in it, so the table stays readable at any scale;
the JSON keeps every group. Renders the document only (``report["layout"]``, ``report["workload"]``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from markupsafe import Markup, escape
from rich import box
from rich.console import Console
from rich.markup import escape as rich_escape
from rich.table import Table
from rich.text import Text

from traceread.fmt import rank_list

ROLE_NAMES = {"dp": "data parallel", "fsdp": "sharded data parallel", "tp": "tensor parallel",
              "cp": "context parallel", "pp": "pipeline parallel", "ep": "expert parallel",
              "other": "other", "unknown": "unknown"}


def workload_line(report: Mapping[str, Any]) -> str | None:
    """``Workload: serving (vllm), 1 prefill + 5 decode iterations — evidence`` or None."""
    w = report.get("workload") or {}
    if not w.get("kind"):
        return None
    its = w.get("iterations") or {}
    counts = " + ".join(f"{n} {k}" for k, n in sorted(its.items(), key=lambda kv: -kv[1]))
    engine = f" ({w['engine']})" if w.get("engine") else (f" ({w['framework']})" if w.get("framework") else "")
    micro = (f", gradient accumulation: {w['micro_steps']} micro-steps per optimizer step"
             if w.get("micro_steps") else "")
    evidence = "; ".join(str(e) for e in (w.get("evidence"), w.get("framework_evidence")) if e)
    return (f"Workload: {w['kind']}{engine}" + (f", {counts} iteration(s)" if counts else "") + micro
            + (f" — {evidence}" if evidence else ""))


def degrees_line(report: Mapping[str, Any]) -> str | None:
    """``Parallel layout: tp 4 × dp 2 (nodes from device index)`` or None without a layout."""
    lay = report.get("layout") or {}
    if not lay.get("groups"):
        return None
    deg = [f"{r} {n}" for r, n in (lay.get("degrees") or {}).items() if n and n > 1]
    src = f" (nodes from {lay['node_source']})" if lay.get("node_source") else ""
    return "Parallel layout: " + (" × ".join(deg) if deg else "no parallel dimension seen") + src


def rows(report: Mapping[str, Any]) -> list[dict[str, str]]:
    """Table rows: alike groups merged (module docstring), largest groups first."""
    groups = (report.get("layout") or {}).get("groups") or []
    merged: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for g in groups:
        key = (g.get("role"), g.get("size"), g.get("desc"), len(g.get("nodes") or []), g.get("pg") == "(unnamed)")
        merged.setdefault(key, []).append(g)
    out: list[dict[str, Any]] = []
    for (role, size, desc, _n, _u), gs in merged.items():
        first = gs[0]
        names = [str(g.get("pg")) for g in gs]
        label = names[0] if len(names) == 1 else f"{len(names)} groups: " + ", ".join(names[:6]) + \
            (" …" if len(names) > 6 else "")
        if desc:
            label += f" ({desc})"
        nodes = first.get("nodes") or []
        out.append({
            "group": label, "role": str(role), "role_name": ROLE_NAMES.get(str(role), str(role)),
            "size": str(size), "ranks": rank_list(first.get("ranks") or []) + (" (first)" if len(gs) > 1 else ""),
            "nodes": ("n/a" if not nodes else rank_list(nodes)), "evidence": str(first.get("evidence") or ""),
            "_sort": (-(int(size or 0)), role != "other", names[0]),
        })
    out.sort(key=lambda r: (r["role"] in ("other",), r["_sort"]))
    return [{k: v for k, v in r.items() if k != "_sort"} for r in out]


def terminal_table(report: Mapping[str, Any], top: int, bx: box.Box) -> Table | None:
    """The layout table for the terminal summary (None without process groups)."""
    rs = rows(report)
    if not rs:
        return None
    title = degrees_line(report) or "Parallel layout"
    t = Table(title=title + " — process groups", box=bx, title_justify="left")
    for col in ("group", "role", "size", "ranks", "nodes"):
        t.add_column(col, justify="left" if col in ("group", "role", "ranks") else "right", overflow="fold")
    t.add_column("evidence", overflow="fold", ratio=3)
    for r in rs[:top]:
        t.add_row(*(rich_escape(r[c]) for c in ("group", "role", "size", "ranks", "nodes", "evidence")))
    if len(rs) > top:
        t.caption = f"{len(rs) - top} more row(s) in the HTML/JSON (--top to change)"
    return t


def render_terminal(report: Mapping[str, Any], console: Console, top: int, bx: box.Box) -> None:
    """The workload line and the layout table, printed on ``console``."""
    work = workload_line(report)
    if work:
        console.print(Text(work))
    t = terminal_table(report, top, bx)
    if t is not None:
        console.print(t)


def html_section(report: Mapping[str, Any]) -> Markup:
    """``<section id="layout">``: workload line, degrees and the group table; every string escaped."""
    work = workload_line(report)
    deg = degrees_line(report)
    rs = rows(report)
    if not work and not rs:
        return Markup("")
    parts = ['<section id="layout"><h2>Job shape: workload and parallel layout</h2>']
    if work:
        parts.append(f"<p>{escape(work)}</p>")
    if deg:
        parts.append(f"<p><strong>{escape(deg)}</strong></p>")
    if rs:
        head = "".join(f"<th>{h}</th>" for h in ("group", "role", "size", "ranks", "nodes", "evidence"))
        body = "".join(
            f'<tr><td class="name">{escape(r["group"])}</td><td title="{escape(r["role_name"])}">{escape(r["role"])}</td>'
            f'<td>{escape(r["size"])}</td><td class="name">{escape(r["ranks"])}</td><td>{escape(r["nodes"])}</td>'
            f'<td class="name">{escape(r["evidence"])}</td></tr>' for r in rs)
        parts.append(f"<table><tr>{head}</tr>{body}</table>")
        parts.append("<p>Roles, their evidence and their limits: docs/layout.md.</p>")
    else:
        parts.append('<p class="nodata">No process group: the trace was recorded without torch.distributed.</p>')
    parts.append("</section>")
    return Markup("".join(parts))
