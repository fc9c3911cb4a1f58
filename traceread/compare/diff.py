"""What changed between two runs between two runs (baseline A, candidate B).

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

from typing import Any

from traceread.report_schema import Finding, Report

DIFF_SCHEMA = "traceread.diff/1"


def _delta(a: float | None, b: float | None) -> dict[str, float | None]:
    d = None if a is None or b is None else b - a
    p = None if d is None or not a else 100.0 * d / a
    return {"a": a, "b": b, "delta": d, "pct": p}


def _steps(rep: Report) -> int:
    from traceread.build.queries import total_steps

    return total_steps(rep)


def _kernel_rows(rep: Report) -> dict[str, float]:
    steps = _steps(rep)
    nr = max(1, len(rep.get("ranks") or []))
    return {str(k["name"]): float(k.get("total_us") or 0.0) / max(int(k.get("ranks") or nr), 1) / steps
            for k in rep.get("kernels") or []}


def _op_rows(rep: Report) -> dict[str, float]:
    """Operator kernel time per step (roofline ops of the detailed rank), keyed by name and shapes."""
    r = rep.get("roofline") or {}
    scale = float(r.get("time_scale") or 1.0 / _steps(rep))
    out: dict[str, float] = {}
    for o in r.get("ops") or []:
        key = f"{o.get('name')} {o.get('shapes') or ''}".strip()
        out[key] = out.get(key, 0.0) + float(o.get("time_us") or o.get("kernel_time_us") or 0.0) * scale
    return out


def _coll_rows(rep: Report) -> dict[tuple[str, int | None], dict[str, Any]]:
    steps = _steps(rep)
    out: dict[tuple[str, int | None], dict[str, Any]] = {}
    for c in rep.get("collectives") or []:
        key = (str(c.get("name")), c.get("bytes"))
        row = out.setdefault(key, {"calls": 0.0, "latency_us": [], "busbw_gbps": []})
        row["calls"] += float(c.get("count") or 0) / steps
        row["latency_us"].append(c.get("latency_us"))
        row["busbw_gbps"].append(c.get("busbw_gbps"))
    return out


def _finding_key(f: Finding) -> str:
    """A finding's identity across two reports: its id, plus the role where several share an id
    (ledger findings: one exposed-communication finding per role, one straggler per rank)."""
    parts = [str(f["id"]), *(str(f[k]) for k in ("role",) if f.get(k))]
    if f["id"] == "straggler" and f.get("rank") is not None:
        parts.append(f"rank{f['rank']}")
    return ":".join(parts)


def _side(rep: Report) -> dict[str, Any]:
    """What one side is: paths, ranks, steps, and the profiling cycle when one was chosen."""
    src = rep.get("source") or {}
    out = {"paths": src.get("paths"), "ranks": len(rep.get("ranks") or []), "steps": _steps(rep)}
    if src.get("cycle"):
        out["cycle"] = src["cycle"].get("label")
    return out


def diff_reports(a: Report, b: Report, top: int = 15) -> dict[str, Any]:
    """The comparison document (definitions in the module docstring)."""
    from traceread.build.queries import med, median_step_us, per_step

    def med_field(rep: Report, field: str) -> float | None:
        return med(per_step(r, field) for r in rep.get("ranks") or [])

    breakdown = {f: _delta(med_field(a, f), med_field(b, f))
                 for f in ("compute_us", "exposed_comm_us", "exposed_memcpy_us", "idle_us", "comm_us")}
    ka, kb = _kernel_rows(a), _kernel_rows(b)
    kernels: list[dict[str, Any]] = [{"name": n, **_delta(ka.get(n), kb.get(n))} for n in set(ka) | set(kb)]
    for k in kernels:  # a kernel that exists in one run only changed by its whole time
        if k["delta"] is None:
            k["delta"] = (k["b"] or 0.0) - (k["a"] or 0.0)
    kernels.sort(key=lambda k: -abs(k["delta"] or 0.0))
    oa, ob = _op_rows(a), _op_rows(b)
    ops: list[dict[str, Any]] = [{"name": n, **_delta(oa.get(n), ob.get(n))} for n in set(oa) | set(ob)]
    for o in ops:
        if o["delta"] is None:
            o["delta"] = (o["b"] or 0.0) - (o["a"] or 0.0)
    ops.sort(key=lambda o: -abs(o["delta"] or 0.0))
    ca, cb = _coll_rows(a), _coll_rows(b)
    colls: list[dict[str, Any]] = []
    for key in set(ca) | set(cb):
        ra, rb = ca.get(key), cb.get(key)
        colls.append({
            "name": key[0], "bytes": key[1],
            "calls_per_step": _delta(ra["calls"] if ra else None, rb["calls"] if rb else None),
            "latency_us": _delta(med(ra["latency_us"]) if ra else None, med(rb["latency_us"]) if rb else None),
            "busbw_gbps": _delta(med(ra["busbw_gbps"]) if ra else None, med(rb["busbw_gbps"]) if rb else None),
        })
    colls.sort(key=lambda c: -abs((c["latency_us"]["delta"] or 0.0)
                                  * (c["calls_per_step"]["b"] or c["calls_per_step"]["a"] or 1.0)))
    fa = {_finding_key(f): f for f in a.get("findings") or []}
    fb = {_finding_key(f): f for f in b.get("findings") or []}
    findings = [{"id": (fa.get(i) or fb[i])["id"], "key": i,
                 "title_a": fa.get(i, {}).get("title"), "title_b": fb.get(i, {}).get("title"),
                 **_delta(fa.get(i, {}).get("impact_us_per_step"), fb.get(i, {}).get("impact_us_per_step"))}
                for i in sorted(set(fa) | set(fb))]
    return {
        "schema": DIFF_SCHEMA,
        "a": _side(a), "b": _side(b),
        "step_us": _delta(median_step_us(a), median_step_us(b)),
        "breakdown": breakdown,
        "operators": ops[:top],
        "kernels": kernels[:top],
        "collectives": colls[:top],
        "findings": findings,
        "warnings": [f"A: {w}" for w in (a.get("warnings") or [])[:5]] + [f"B: {w}" for w in (b.get("warnings") or [])[:5]],
    }
