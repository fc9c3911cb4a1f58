"""``traceread diff`` as text: the comparison (:mod:`traceread.compare.diff`) in tables.

The answer first (the verdict, what appeared and what vanished, the part that moved most), then only
the rows that changed beyond noise; a row whose base is about zero reads "new" or "gone" instead of a
percentage, and percentages are capped at ±999 %. Laid out as the report is (:mod:`textfit`).
"""

from __future__ import annotations

from typing import Any

#: Relative changes beyond this are written ">+999%" (the exact value is in the JSON).
PCT_CAP = 999.0


def _pct(d: dict[str, Any]) -> str:
    status = d.get("status")
    if status in ("new", "gone"):
        return status
    p = d.get("pct")
    if p is None:
        return ""
    if abs(p) > PCT_CAP:
        return f">{'+' if p > 0 else '-'}{PCT_CAP:.0f}%"
    return f"{p:+.1f}%"


def _fmt_row(label: str, d: dict[str, Any], unit: str = "ms") -> tuple[str, str, str, str, str]:
    from traceread.fmt import ms

    def f(v: float | None) -> str:
        if unit == "ms":
            return "—" if v is None else ms(v, 2)
        return "—" if v is None else f"{v:.2f}"

    delta = d.get("delta")
    sign = "" if delta is None or delta < 0 else "+"
    return label, f(d["a"]), f(d["b"]), ("n/a" if delta is None else sign + f(delta)), _pct(d)


def render_diff(d: dict[str, Any], *, plain: bool = True, width: int = 120) -> str:
    """The comparison as text tables (ASCII and no colour when ``plain``)."""
    from rich import box
    from rich.text import Text

    from traceread.fmt import short_name
    from traceread.render.textfit import Column, buffer_console, fitted_table, strip_padding
    from traceread.textsafe import clean_data

    d = clean_data(d)  # kernel/op/collective names and paths: no terminal control survives
    con, buf = buffer_console(width, not plain)
    bx = box.ASCII2 if plain else box.SIMPLE_HEAD
    for side in ("a", "b"):
        x = d[side]
        cyc = f", cycle {x['cycle']}" if x.get("cycle") else ""
        con.print(Text(f"{side.upper()}: {', '.join(x['paths'] or [])} ({x['ranks']} ranks, {x['steps']} steps{cyc})"))
    answer = d.get("answer") or ["n/a"]
    con.print(Text.assemble(("ANSWER: ", "bold red"), answer[0], style="bold"))
    for line in answer[1:]:
        con.print(Text("  " + line))
    con.print()

    cols = [Column("", "left", text=True), Column("A"), Column("B"), Column("B − A"), Column("%")]

    def table(title: str, rows: list[tuple[str, str, str, str, str]], unchanged: int = 0) -> None:
        if not rows:
            return
        con.print(fitted_table(title, cols, [[Text(r[0]), *r[1:]] for r in rows], width, bx))
        if unchanged:
            con.print(Text(f"  {unchanged} more unchanged (within noise)", style="dim"))
        con.print()

    step = d["step_us"]
    moved = [(k, v) for k, v in d["breakdown"].items() if v.get("significant")]
    table("Per step (median over ranks)", [_fmt_row("step time", step)] + [
        _fmt_row(k.removesuffix("_us").replace("_", " "), v) for k, v in moved])
    table("Operators — kernel time per step (one rank), biggest change first",
          [_fmt_row(short_name(o["name"], 70), o) for o in d.get("operators") or []], d.get("operators_unchanged", 0))
    table("Kernels — time per step per rank, biggest change first",
          [_fmt_row(short_name(k["name"], 70), k) for k in d.get("kernels") or []], d.get("kernels_unchanged", 0))
    rows = []
    for c in d.get("collectives") or []:
        size = "" if c["bytes"] is None else f" {c['bytes'] / 1e6:.1f} MB"
        for key, what, unit in (("calls_per_step", "calls/step", "num"), ("latency_us", "latency", "ms"),
                                ("busbw_gbps", "busbw GB/s", "num")):
            if c[key].get("significant"):
                rows.append(_fmt_row(f"{c['name']}{size} {what}", c[key], unit=unit))
    table("Collectives", rows, d.get("collectives_unchanged", 0))
    changed = [f for f in d.get("findings") or [] if f.get("significant")]
    table("Findings — time lost per step", [_fmt_row(f.get("key") or f["id"], f) for f in changed],
          len(d.get("findings") or []) - len(changed))
    return strip_padding(buf.getvalue())  # every input string was cleaned above; colour codes are ours
