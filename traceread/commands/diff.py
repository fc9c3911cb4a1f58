"""``traceread diff A B``: what changed between two runs (baseline A, candidate B).

Both runs are reported with the same analysis as ``traceread report``; the comparison is then made
on per-step numbers so runs with different step counts or rank counts still line up:

* **step** — median over ranks of each rank's mean step time (mean of its ``steps[].duration_us``);
* **breakdown** — median over ranks of compute / exposed comm / exposed memcpy / idle per step, each
  rank's value being the mean over its step entries (never a whole-trace total ÷ steps);
* **operators** — each operator's (name + input shapes) kernel time per step on the detailed rank;
* **kernels** — each kernel's time per step per rank (``total_us ÷ ranks ÷ steps``; the kernel table
  covers the analysed steps), matched by name;
* **collectives** — matched by (collective, message bytes): calls per step, latency, busbw.

``delta`` = B − A; ``pct`` = 100 · delta ÷ A (null when A is 0 or unknown). Rows are sorted by
``|delta|`` so the biggest regressions and wins come first.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import click

from traceread.errors import EXIT_BAD_INPUT, EXIT_NO_TRACES
from traceread.reports.sanitize import clean

DIFF_SCHEMA = "traceread.diff/1"


def _delta(a: float | None, b: float | None) -> dict[str, float | None]:
    d = None if a is None or b is None else b - a
    p = None if d is None or not a else 100.0 * d / a
    return {"a": a, "b": b, "delta": d, "pct": p}


def _steps(rep: dict[str, Any]) -> int:
    from traceread.reports.stats import total_steps

    return total_steps(rep)  # type: ignore[arg-type]


def _kernel_rows(rep: dict[str, Any]) -> dict[str, float]:
    steps = _steps(rep)
    nr = max(1, len(rep.get("ranks") or []))
    return {str(k["name"]): float(k.get("total_us") or 0.0) / max(int(k.get("ranks") or nr), 1) / steps
            for k in rep.get("kernels") or []}


def _op_rows(rep: dict[str, Any]) -> dict[str, float]:
    """Operator kernel time per step (roofline ops of the detailed rank), keyed by name and shapes."""
    r = rep.get("roofline") or {}
    scale = float(r.get("time_scale") or 1.0 / _steps(rep))
    out: dict[str, float] = {}
    for o in r.get("ops") or []:
        key = f"{o.get('name')} {o.get('shapes') or ''}".strip()
        out[key] = out.get(key, 0.0) + float(o.get("time_us") or o.get("kernel_time_us") or 0.0) * scale
    return out


def _coll_rows(rep: dict[str, Any]) -> dict[tuple[str, int | None], dict[str, Any]]:
    steps = _steps(rep)
    out: dict[tuple[str, int | None], dict[str, Any]] = {}
    for c in rep.get("collectives") or []:
        key = (str(c.get("name")), c.get("bytes"))
        row = out.setdefault(key, {"calls": 0.0, "latency_us": [], "busbw_gbps": []})
        row["calls"] += float(c.get("count") or 0) / steps
        row["latency_us"].append(c.get("latency_us"))
        row["busbw_gbps"].append(c.get("busbw_gbps"))
    return out


def _finding_key(f: dict[str, Any]) -> str:
    """A finding's identity across two reports: its id, plus the role where several share an id
    (ledger findings: one exposed-communication finding per role, one straggler per rank)."""
    parts = [str(f["id"]), *(str(f[k]) for k in ("role",) if f.get(k))]
    if f["id"] == "straggler" and f.get("rank") is not None:
        parts.append(f"rank{f['rank']}")
    return ":".join(parts)


def _side(rep: dict[str, Any]) -> dict[str, Any]:
    """What one side is: paths, ranks, steps, and the profiling cycle when one was chosen."""
    src = rep.get("source") or {}
    out = {"paths": src.get("paths"), "ranks": len(rep.get("ranks") or []), "steps": _steps(rep)}
    if src.get("cycle"):
        out["cycle"] = src["cycle"].get("label")
    return out


def diff_reports(a: dict[str, Any], b: dict[str, Any], top: int = 15) -> dict[str, Any]:
    """The comparison document (definitions in the module docstring)."""
    from traceread.reports.stats import med, median_step_us, per_step

    def med_field(rep: dict[str, Any], field: str) -> float | None:
        return med(per_step(r, field) for r in rep.get("ranks") or [])  # type: ignore[arg-type]

    breakdown = {f: _delta(med_field(a, f), med_field(b, f))
                 for f in ("compute_us", "exposed_comm_us", "exposed_memcpy_us", "idle_us", "comm_us")}
    ka, kb = _kernel_rows(a), _kernel_rows(b)
    kernels = [{"name": n, **_delta(ka.get(n), kb.get(n))} for n in set(ka) | set(kb)]
    for k in kernels:  # a kernel that exists in one run only changed by its whole time
        if k["delta"] is None:
            k["delta"] = (k["b"] or 0.0) - (k["a"] or 0.0)
    kernels.sort(key=lambda k: -abs(k["delta"] or 0.0))
    oa, ob = _op_rows(a), _op_rows(b)
    ops = [{"name": n, **_delta(oa.get(n), ob.get(n))} for n in set(oa) | set(ob)]
    for o in ops:
        if o["delta"] is None:
            o["delta"] = (o["b"] or 0.0) - (o["a"] or 0.0)
    ops.sort(key=lambda o: -abs(o["delta"] or 0.0))
    ca, cb = _coll_rows(a), _coll_rows(b)
    colls = []
    for key in set(ca) | set(cb):
        ra, rb = ca.get(key), cb.get(key)
        colls.append({
            "name": key[0], "bytes": key[1],
            "calls_per_step": _delta(ra and ra["calls"], rb and rb["calls"]),
            "latency_us": _delta(ra and med(ra["latency_us"]), rb and med(rb["latency_us"])),
            "busbw_gbps": _delta(ra and med(ra["busbw_gbps"]), rb and med(rb["busbw_gbps"])),
        })
    colls.sort(key=lambda c: -abs((c["latency_us"]["delta"] or 0.0) * (c["calls_per_step"]["b"] or c["calls_per_step"]["a"] or 1.0)))
    fa = {_finding_key(f): f for f in a.get("findings") or []}
    fb = {_finding_key(f): f for f in b.get("findings") or []}
    findings = [{"id": (fa.get(i) or fb[i])["id"], "key": i,
                 "title_a": fa.get(i, {}).get("title"), "title_b": fb.get(i, {}).get("title"),
                 **_delta(fa.get(i, {}).get("impact_us_per_step"), fb.get(i, {}).get("impact_us_per_step"))}
                for i in sorted(set(fa) | set(fb))]
    return {
        "schema": DIFF_SCHEMA,
        "a": _side(a), "b": _side(b),
        "step_us": _delta(median_step_us(a), median_step_us(b)),  # type: ignore[arg-type]
        "breakdown": breakdown,
        "operators": ops[:top],
        "kernels": kernels[:top],
        "collectives": colls[:top],
        "findings": findings,
        "warnings": [f"A: {w}" for w in (a.get("warnings") or [])[:5]] + [f"B: {w}" for w in (b.get("warnings") or [])[:5]],
    }


def _fmt_row(label: str, d: dict[str, Any], unit: str = "ms") -> tuple[str, str, str, str, str]:
    from traceread.reports.stats import ms

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

    from traceread.reports.sanitize import clean_data, clean_lines

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


def split_cycle(arg: str) -> tuple[str, str | None]:
    """``RUN@3`` / ``RUN@2:3`` -> (``RUN``, cycle); a path that exists as written is never split."""
    from pathlib import Path as _P

    if "@" not in arg or _P(arg).exists():
        return arg, None
    path, _, cycle = arg.rpartition("@")
    return (path, cycle) if path and cycle else (arg, None)


@click.command("diff", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("a", type=click.Path())
@click.argument("b", type=click.Path(), required=False)
@click.option("--format", "fmt", type=click.Choice(("text", "json")), default="text", show_default=True)
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="Write here instead of stdout.")
@click.option("--top", type=click.IntRange(1, 1000), default=15, show_default=True, help="Kernel/collective rows.")
@click.option("--no-cache", is_flag=True, help="Re-parse every trace instead of using the parse cache.")
@click.option("--cycles", metavar="N,M", help="Compare two profiling cycles of the one run A (e.g. 1,3; RUN:N works too).")
def diff(a: str, b: str | None, fmt: str, output: str | None, top: int, no_cache: bool, cycles: str | None) -> None:
    """Compare two runs (A = baseline, B = candidate): step time, breakdown, kernels, collectives.

    A and B are run folders, trace files or globs, as for `traceread report`; `RUN@N` is cycle N of a
    folder holding several profiling cycles (`RUN@R:N`: run R's cycle N), and `--cycles N,M` compares
    two cycles of the one folder A. Without a cycle, a multi-cycle folder stands for its latest cycle.

    \b
    Examples:
      traceread diff runs/before runs/after
      traceread diff runs/before/rank0.pt.trace.json.gz runs/after/rank0.pt.trace.json.gz
      traceread diff runs/before runs/after --format json -o diff.json
      traceread diff runs/long --cycles 1,3          # first vs third profiling cycle of one run
      traceread diff runs/long@1 runs/long@3         # the same

    \b
    Exit codes: 0 compared, 2 bad input, 3 no trace found in A or B.
    """
    import orjson

    from traceread.analyze import NothingUsableError, ReportOptions, build_report
    from traceread.reports.json_report import _jsonable

    from dataclasses import replace

    from traceread.reader.cycles import CycleChoiceError

    if cycles:
        parts = [c.strip() for c in cycles.split(",")]
        if b is not None or len(parts) != 2 or not all(parts):
            raise click.UsageError("--cycles takes two cycles of the one folder A, e.g. traceread diff RUN --cycles 1,3")
        (pa, ca), (pb, cb) = (a, parts[0]), (a, parts[1])
    elif b is None:
        raise click.UsageError("give two runs A B, RUN@N RUN@M, or one folder with --cycles N,M")
    else:
        (pa, ca), (pb, cb) = split_cycle(a), split_cycle(b)
    opts = ReportOptions(use_cache=not no_cache)
    try:
        ra = build_report([pa], replace(opts, cycle=ca))
        rb = build_report([pb], replace(opts, cycle=cb))
    except CycleChoiceError as exc:
        click.echo(f"traceread: error: {exc}", err=True)
        click.get_current_context().exit(EXIT_BAD_INPUT)
        return
    except NothingUsableError as exc:
        click.echo(f"traceread: error: {clean(str(exc))}", err=True)
        click.get_current_context().exit(EXIT_BAD_INPUT if exc.bad_input else EXIT_NO_TRACES)
        return
    d = diff_reports(ra, rb, top=top)  # type: ignore[arg-type]
    text = (orjson.dumps(_jsonable(d), option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode() + "\n"
            if fmt == "json" else render_diff(d))
    if output:
        Path(output).write_text(text, encoding="utf-8")
    else:
        click.echo(text, nl=False)
