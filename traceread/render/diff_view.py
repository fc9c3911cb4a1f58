"""``traceread diff`` as text: the comparison (:mod:`traceread.compare.diff`) in tables."""

from __future__ import annotations

import io
from typing import Any


def _fmt_row(label: str, d: dict[str, Any], unit: str = "ms") -> tuple[str, str, str, str, str]:
    from traceread.fmt import ms

    def f(v: float | None) -> str:
        if unit == "ms":
            return ms(v, 2)
        return "n/a" if v is None else f"{v:.2f}"

    sign = "" if d["delta"] is None or d["delta"] < 0 else "+"
    delta = "n/a" if d["delta"] is None else sign + f(d["delta"])
    pct = "" if d["pct"] is None else f"{d['pct']:+.1f}%"
    return label, f(d["a"]), f(d["b"]), delta, pct


def render_diff(d: dict[str, Any], *, plain: bool = True, width: int = 120) -> str:
    """The comparison as text tables (ASCII when ``plain``)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from traceread.textsafe import clean_data, clean_lines

    d = clean_data(d)  # kernel/op/collective names and paths: no terminal control survives
    buf = io.StringIO()
    con = Console(file=buf, width=width, color_system=None if plain else "auto", force_terminal=not plain,
                  highlight=False)
    bx = box.ASCII2 if plain else box.SIMPLE_HEAD
    step = d["step_us"]
    verdict = "n/a"
    if step["delta"] is not None:
        verdict = f"B is {'slower' if step['delta'] > 0 else 'faster'} by {abs(step['delta']) / 1000:.2f} ms/step"
        if step["pct"] is not None:
            verdict += f" ({step['pct']:+.1f}%)"
    for side in ("a", "b"):
        x = d[side]
        cyc = f", cycle {x['cycle']}" if x.get("cycle") else ""
        con.print(Text(f"{side.upper()}: {', '.join(x['paths'] or [])} ({x['ranks']} ranks, {x['steps']} steps{cyc})"))
    con.print(Text("ANSWER: " + verdict, style="bold"))
    biggest = max(d["breakdown"].items(), key=lambda kv: abs(kv[1]["delta"] or 0.0)) if d["breakdown"] else None
    if biggest and biggest[1]["delta"]:
        con.print(Text(f"largest change: {biggest[0].removesuffix('_us').replace('_', ' ')} "
                       f"{biggest[1]['delta'] / 1000:+.2f} ms/step"))

    def table(title: str, rows: list[tuple[str, str, str, str, str]]) -> None:
        t = Table(title=title, box=bx, title_justify="left")
        t.add_column("", overflow="fold")
        for c in ("A", "B", "B − A", "%"):
            t.add_column(c, justify="right", no_wrap=True)
        for r in rows:
            t.add_row(Text(r[0] if len(r[0]) <= 90 else r[0][:89] + "…"), *r[1:])
        con.print(t)

    table("Per step (median over ranks)", [_fmt_row("step time", step)] + [
        _fmt_row(k.removesuffix("_us").replace("_", " "), v) for k, v in d["breakdown"].items()])
    if d.get("operators"):
        table("Operators — kernel time per step (one rank), biggest change first",
              [_fmt_row(o["name"], o) for o in d["operators"]])
    if d["kernels"]:
        table("Kernels — time per step per rank, biggest change first", [_fmt_row(k["name"], k) for k in d["kernels"]])
    if d["collectives"]:
        rows = []
        for c in d["collectives"]:
            size = "" if c["bytes"] is None else f" {c['bytes'] / 1e6:.1f} MB"
            rows.append(_fmt_row(f"{c['name']}{size} latency", c["latency_us"]))
            rows.append(_fmt_row(f"{c['name']}{size} busbw GB/s", c["busbw_gbps"], unit="num"))
        table("Collectives", rows)
    if d["findings"]:
        table("Findings — time lost per step", [_fmt_row(f.get("key") or f["id"], f) for f in d["findings"]])
    return clean_lines(buf.getvalue())
