"""What changed between two runs (baseline A, candidate B).

Both runs are reported with the same analysis as ``traceread report``; the comparison is then made
on per-step numbers so runs with different step counts or rank counts still line up:

* **step** — median over ranks of each rank's mean step time (mean of its ``steps[].duration_us``);
* **breakdown** — median over ranks of compute / exposed comm / exposed memcpy / idle per step, each
  rank's value being the mean over its step entries (never a whole-trace total ÷ steps);
* **operators** — each operator's (name + input shapes) kernel time per step on the detailed rank;
* **kernels** — each kernel's time per step per rank (``total_us ÷ ranks ÷ steps``; the kernel table
  covers the analysed steps), matched by name;
* **collectives** — matched by (collective, message bytes): calls per step, latency, busbw.

``delta`` = B − A; ``pct`` = 100 · delta ÷ A (null when A is 0 or unknown, and for rows that are
``new``/``gone``). Rows are sorted by ``|delta|`` so the biggest regressions and wins come first.

Noise (what "changed" means):

* the step changed when |delta| > max(1 % of A's step, 2 × the standard error of the difference of
  the two mean step times, from each run's per-step job times); otherwise the verdict is
  ``same`` and the answer says "no significant change";
* a time row (breakdown, operator, kernel, finding) changed when |delta| ≥ the row floor (0.5 % of
  A's step, at least 1 µs) and ≥ 5 % of the larger side; a collective's latency with the floor ÷ its
  calls per step (a latency change is paid at every call); busbw rows when
  ≥ 5 % of the larger side; calls per step when they differ by at least 0.5. Only changed rows are
  listed (``*_unchanged`` counts the others);
* ``status``: ``new`` when the row is absent or below the floor in A and not in B, ``gone`` the other
  way round, else ``up`` / ``down`` / ``same``.

What appeared or vanished — findings (by id, role and rank), stragglers (by rank) and process
groups (by name, from the layout or the collectives) — is listed in ``appeared`` / ``vanished``
and named in the ``answer`` sentences.
"""

from __future__ import annotations

from statistics import median, stdev
from typing import Any

from traceread.report_schema import Finding, Report

DIFF_SCHEMA = "traceread.diff/1"
#: The step changed when it moved by more than this share of A's step (and more than the noise).
STEP_FLOOR = 0.01
#: A time row changed when it moved by this share of A's step at least (and REL_FLOOR of itself).
ROW_FLOOR = 0.005
REL_FLOOR = 0.05


def _delta(a: float | None, b: float | None) -> dict[str, Any]:
    d = None if a is None or b is None else b - a
    p = None if d is None or not a else 100.0 * d / a
    return {"a": a, "b": b, "delta": d, "pct": p}


def _judge(row: dict[str, Any], floor: float, *, rel: float = REL_FLOOR, absolute: bool = True) -> dict[str, Any]:
    """Add ``status`` and ``significant`` to a delta row (definitions in the module docstring)."""
    a, b = row["a"], row["b"]
    small_a = a is None or abs(a) < floor
    small_b = b is None or abs(b) < floor
    if row["delta"] is None and (a is not None or b is not None):
        row["delta"] = (b or 0.0) - (a or 0.0)
    d = row["delta"] or 0.0
    big = max(abs(a or 0.0), abs(b or 0.0))
    row["significant"] = bool(abs(d) >= rel * big and (not absolute or abs(d) >= floor) and d != 0.0)
    if small_a and not small_b:
        row["status"], row["pct"] = "new", None
    elif small_b and not small_a:
        row["status"], row["pct"] = "gone", None
    elif not row["significant"]:
        row["status"] = "same"
    else:
        row["status"] = "up" if d > 0 else "down"
    if row["status"] in ("new", "gone"):
        row["significant"] = abs(d) >= floor if absolute else True
    return row


def _steps(rep: Report) -> int:
    from traceread.assemble.queries import total_steps

    return total_steps(rep)


def _job_steps(rep: Report) -> list[float]:
    """The job's time of each analysed step: median over ranks of that step's duration."""
    by_step: dict[int, list[float]] = {}
    for r in rep.get("ranks") or []:
        for s in r.get("steps") or []:
            if s.get("duration_us") is not None:
                by_step.setdefault(int(s["step"]), []).append(float(s["duration_us"]))
    return [median(v) for _, v in sorted(by_step.items())]


def _std_error(values: list[float]) -> float:
    return stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0


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


def _groups(rep: Report) -> dict[str, str]:
    """Process groups by name → what to call them (role from the layout when known)."""
    out: dict[str, str] = {}
    layout = rep.get("layout")
    for g in (layout["groups"] if layout else []):
        out[str(g.get("pg"))] = f"{g.get('role')} group {g.get('pg')} ({g.get('size')} ranks)"
    for c in rep.get("collectives") or []:
        out.setdefault(str(c.get("pg")), f"process group {c.get('pg')}")
    return out


def _side(rep: Report) -> dict[str, Any]:
    """What one side is: paths, ranks, steps, and the profiling cycle when one was chosen."""
    src = rep.get("source") or {}
    out = {"paths": src.get("paths"), "ranks": len(rep.get("ranks") or []), "steps": _steps(rep)}
    if src.get("cycle"):
        out["cycle"] = src["cycle"].get("label")
    return out


def _changes(a: Report, b: Report, fa: dict[str, Finding], fb: dict[str, Finding],
             floor: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """What appeared in B and what vanished from A: findings, stragglers, process groups."""
    from traceread.fmt import ms

    appeared: list[dict[str, Any]] = []
    vanished: list[dict[str, Any]] = []
    sa = {int(s["rank"]): s for s in a.get("stragglers") or [] if s.get("blame_us_per_step")}
    sb = {int(s["rank"]): s for s in b.get("stragglers") or [] if s.get("blame_us_per_step")}
    for key in sorted(set(fa) | set(fb)):
        f = fb.get(key) or fa[key]
        r = f.get("rank")
        if f["id"] == "straggler" and r is not None and int(r) in set(sa) ^ set(sb):
            continue  # named once, as the straggler below
        ia = (fa.get(key) or {}).get("impact_us_per_step") or 0.0
        ib = (fb.get(key) or {}).get("impact_us_per_step") or 0.0
        if key in fb and (key not in fa or ia < floor) and ib >= floor:
            appeared.append({"kind": "finding", "key": key, "text": f"{fb[key]['title']} ({ms(ib)}/step)"})
        elif key in fa and (key not in fb or ib < floor) and ia >= floor:
            vanished.append({"kind": "finding", "key": key, "text": f"{fa[key]['title']} ({ms(ia)}/step)"})
    for r in sorted(set(sb) - set(sa)):
        appeared.append({"kind": "straggler", "key": f"rank{r}",
                         "text": f"straggler rank {r} ({sb[r].get('cause')}; others wait {ms(sb[r]['blame_us_per_step'])}/step)"})
    for r in sorted(set(sa) - set(sb)):
        vanished.append({"kind": "straggler", "key": f"rank{r}", "text": f"straggler rank {r} ({sa[r].get('cause')})"})
    ga, gb = _groups(a), _groups(b)
    for g in sorted(set(gb) - set(ga)):
        appeared.append({"kind": "group", "key": g, "text": gb[g]})
    for g in sorted(set(ga) - set(gb)):
        vanished.append({"kind": "group", "key": g, "text": ga[g]})
    return appeared, vanished


def _answer(step: dict[str, Any], breakdown: dict[str, dict[str, Any]], appeared: list[dict[str, Any]],
            vanished: list[dict[str, Any]]) -> list[str]:
    """The answer in sentences: the verdict, what appeared and vanished, the biggest part that moved."""
    from traceread.fmt import ms

    if step["delta"] is None:
        lines = ["Step time not comparable (one side has no step time)."]
    elif not step["significant"]:
        sign = "+" if step["delta"] >= 0 else "−"
        lines = [f"No significant change in step time: {sign}{ms(abs(step['delta']))}/step"
                 + (f" ({step['pct']:+.1f}%)" if step["pct"] is not None else "")
                 + f", under the {ms(step['threshold_us'])} threshold ({100 * STEP_FLOOR:.0f}% of the step; "
                 f"step-to-step noise ±{ms(step['noise_us'])})."]
    else:
        lines = [f"B is {'slower' if step['delta'] > 0 else 'faster'} by {ms(abs(step['delta']))}/step"
                 + (f" ({step['pct']:+.1f}%)." if step["pct"] is not None else ".")]
    order = {"straggler": 0, "finding": 1, "group": 2}
    if appeared:
        lines.append("New in B: " + "; ".join(x["text"] for x in sorted(appeared, key=lambda x: order[x["kind"]])[:4]) + ".")
    if vanished:
        lines.append("Gone in B: " + "; ".join(x["text"] for x in sorted(vanished, key=lambda x: order[x["kind"]])[:4]) + ".")
    moved = [(k, v) for k, v in breakdown.items() if v.get("significant") and k != "comm_us"]
    if moved:
        k, v = max(moved, key=lambda kv: abs(kv[1]["delta"] or 0.0))
        lines.append(f"Largest part that moved: {k.removesuffix('_us').replace('_', ' ')} "
                     f"{'+' if v['delta'] > 0 else '−'}{ms(abs(v['delta']))}/step.")
    return lines


def diff_reports(a: Report, b: Report, top: int = 15) -> dict[str, Any]:
    """The comparison document (definitions in the module docstring)."""
    from traceread.assemble.queries import med, median_step_us, per_step

    def med_field(rep: Report, field: str) -> float | None:
        return med(per_step(r, field) for r in rep.get("ranks") or [])

    step = _delta(median_step_us(a), median_step_us(b))
    sa, sb = _job_steps(a), _job_steps(b)
    step["noise_us"] = 2.0 * (_std_error(sa) ** 2 + _std_error(sb) ** 2) ** 0.5
    base = step["a"] or step["b"] or 0.0
    step["threshold_us"] = max(STEP_FLOOR * base, step["noise_us"])
    step["significant"] = bool(step["delta"] is not None and abs(step["delta"]) > step["threshold_us"])
    verdict = "n/a" if step["delta"] is None else "same" if not step["significant"] else (
        "slower" if step["delta"] > 0 else "faster")
    floor = max(ROW_FLOOR * base, 1.0)

    breakdown = {f: _judge(_delta(med_field(a, f), med_field(b, f)), floor)
                 for f in ("compute_us", "exposed_comm_us", "exposed_memcpy_us", "idle_us", "comm_us")}

    def rows(ra: dict[str, float], rb: dict[str, float]) -> tuple[list[dict[str, Any]], int]:
        out = [_judge({"name": n, **_delta(ra.get(n), rb.get(n))}, floor) for n in set(ra) | set(rb)]
        changed = sorted((r for r in out if r["significant"]), key=lambda r: (-abs(r["delta"] or 0.0), r["name"]))
        return changed[:top], len(out) - len(changed)

    kernels, kernels_same = rows(_kernel_rows(a), _kernel_rows(b))
    ops, ops_same = rows(_op_rows(a), _op_rows(b))
    ca, cb = _coll_rows(a), _coll_rows(b)
    colls: list[dict[str, Any]] = []
    for key in set(ca) | set(cb):
        ra, rb = ca.get(key), cb.get(key)

        def side(row: dict[str, Any] | None, field: str) -> float | None:
            if row is None:
                return None
            return float(row["calls"]) if field == "calls" else med(row[field])

        calls = _judge(_delta(side(ra, "calls"), side(rb, "calls")), 0.5, rel=0.0)
        per_step_calls = max(1.0, float((rb or ra or {"calls": 1.0})["calls"]))  # a latency change is paid per call
        lat = _judge(_delta(side(ra, "latency_us"), side(rb, "latency_us")), floor / per_step_calls)
        bw = _judge(_delta(side(ra, "busbw_gbps"), side(rb, "busbw_gbps")), 0.0, absolute=False)
        colls.append({"name": key[0], "bytes": key[1], "calls_per_step": calls, "latency_us": lat, "busbw_gbps": bw,
                      "significant": calls["significant"] or lat["significant"] or bw["significant"]})
    changed_colls = [c for c in colls if c["significant"]]
    changed_colls.sort(key=lambda c: -abs((c["latency_us"]["delta"] or 0.0)
                                          * (c["calls_per_step"]["b"] or c["calls_per_step"]["a"] or 1.0)))
    fa = {_finding_key(f): f for f in a.get("findings") or []}
    fb = {_finding_key(f): f for f in b.get("findings") or []}
    findings = [_judge({"id": (fa.get(i) or fb[i])["id"], "key": i,
                        "title_a": fa.get(i, {}).get("title"), "title_b": fb.get(i, {}).get("title"),
                        **_delta(fa.get(i, {}).get("impact_us_per_step"), fb.get(i, {}).get("impact_us_per_step"))}, floor)
                for i in sorted(set(fa) | set(fb))]
    appeared, vanished = _changes(a, b, fa, fb, floor)
    return {
        "schema": DIFF_SCHEMA,
        "a": _side(a), "b": _side(b),
        "verdict": verdict,
        "answer": _answer(step, breakdown, appeared, vanished),
        "appeared": appeared, "vanished": vanished,
        "step_us": step,
        "breakdown": breakdown,
        "operators": ops, "operators_unchanged": ops_same,
        "kernels": kernels, "kernels_unchanged": kernels_same,
        "collectives": changed_colls[:top], "collectives_unchanged": len(colls) - len(changed_colls),
        "findings": findings,
        "noise": {"step_floor_pct": 100 * STEP_FLOOR, "row_floor_us": floor, "rel_floor_pct": 100 * REL_FLOOR,
                  "step_noise_us": step["noise_us"], "steps_a": len(sa), "steps_b": len(sb)},
        "warnings": [f"A: {w}" for w in (a.get("warnings") or [])[:5]] + [f"B: {w}" for w in (b.get("warnings") or [])[:5]],
    }


__all__ = ["DIFF_SCHEMA", "diff_reports"]
