"""Drift over time: how each profiling cycle's step time splits, and what grew from first to last.

Input: one report document per cycle of a run (oldest first), each built by the same analysis as
``traceread report``. Per cycle (definitions as in docs/report.md, per step = mean over a rank's
analysed steps, job value = median over ranks):

* ``step_us`` — the job's step time (``reports.stats.median_step_us``);
* ``compute_us``, ``exposed_comm_us``, ``exposed_memcpy_us``, ``idle_us``, ``host_bound_us`` — the
  per-rank breakdown fields, median over ranks;
* ``pg_comm_us`` — per process group: Σ over its collective rows of calls × (transfer latency +
  mean wait) ÷ steps, the time a member spends per step in that group's collectives;
* ``rank_compute_us`` — each rank's compute per step (to name the rank whose GPU slowed);
* ``straggler`` — the top straggler (rank, blame per step, cause) or None.

``growth`` compares the last cycle with the first: every category and process group with its
delta, sorted by growth; ``rank_compute`` names the rank whose compute grew most when it grew
well beyond the others (:data:`ALONE_FACTOR`); ``straggler_appeared`` when the last cycle has a
straggler blamed ≥ :data:`STRAGGLER_MIN_SHARE` of the step that the first did not. ``headline``
says the biggest of these in one sentence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from traceread.assemble.queries import host_bound_per_step, med, median_step_us, per_step, total_steps
from traceread.report_schema import RankEntry, Report

CATEGORIES = ("compute_us", "exposed_comm_us", "exposed_memcpy_us", "idle_us", "host_bound_us")
#: A rank's compute growth counts as "that rank alone" when it is this many times the median growth.
ALONE_FACTOR = 3.0
#: A straggler "appears" when its blame is at least this share of the last cycle's step time.
STRAGGLER_MIN_SHARE = 0.05
#: Changes smaller than this share of the first cycle's step time are not called growth.
NOISE_SHARE = 0.02


def _cpu_field(rank: RankEntry, field: str) -> float | None:
    """CPU-only ranks keep compute/comm/idle under ``cpu`` (whole window ÷ steps)."""
    cpu = rank.get("cpu") or {}
    key = {"compute_us": "compute_us", "exposed_comm_us": "comm_us", "idle_us": "idle_us"}.get(field)
    v = cpu.get(key) if key else None
    steps = max(1, len(rank.get("steps") or []))
    return None if v is None else float(v) / steps


def _field(rank: RankEntry, field: str) -> float | None:
    if field == "host_bound_us":
        return host_bound_per_step(rank)
    v = per_step(rank, field)
    return v if v is not None else _cpu_field(rank, field)


def cycle_metrics(report: Report) -> dict[str, Any]:
    """One cycle's numbers (see the module docstring)."""
    ranks = report.get("ranks") or []
    steps = total_steps(report)
    pg: dict[str, float] = {}
    for c in report.get("collectives") or []:
        t = float(c.get("count") or 0) * (float(c.get("latency_us") or 0.0) + float(c.get("wait_us") or 0.0))
        pg[str(c.get("pg"))] = pg.get(str(c.get("pg")), 0.0) + t / steps
    top = next(iter(report.get("stragglers") or []), None)
    return {
        "step_us": median_step_us(report),
        **{f: med(_field(r, f) for r in ranks) for f in CATEGORIES},
        "pg_comm_us": pg,
        "rank_compute_us": {str(r["rank"]): _field(r, "compute_us") for r in ranks},
        "straggler": ({"rank": top.get("rank"), "blame_us_per_step": top.get("blame_us_per_step"),
                       "cause": top.get("cause")} if top else None),
        "n_steps": steps,
    }


def _delta(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else b - a


def _growth(first: dict[str, Any], last: dict[str, Any]) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for f in CATEGORIES:
        d = _delta(first[f], last[f])
        if d is not None:
            rows.append({"what": f.removesuffix("_us"), "first_us": first[f], "last_us": last[f], "delta_us": d})
    for pg in sorted(set(first["pg_comm_us"]) | set(last["pg_comm_us"])):
        a, b = first["pg_comm_us"].get(pg, 0.0), last["pg_comm_us"].get(pg, 0.0)
        rows.append({"what": f"comm pg {pg}", "pg": pg, "first_us": a, "last_us": b, "delta_us": b - a})
    rows.sort(key=lambda r: -r["delta_us"])
    out: dict[str, Any] = {"step_delta_us": _delta(first["step_us"], last["step_us"]), "categories": rows,
                           "rank_compute": None, "straggler_appeared": None}
    per_rank = {r: _delta(first["rank_compute_us"].get(r), v) for r, v in last["rank_compute_us"].items()}
    known = {r: d for r, d in per_rank.items() if d is not None}
    if len(known) >= 2:
        worst = max(known, key=lambda r: known[r])
        others = [d for r, d in known.items() if r != worst]
        typical = max(0.0, med(others) or 0.0)
        noise = NOISE_SHARE * (first["step_us"] or 0.0)
        if known[worst] > noise and known[worst] >= ALONE_FACTOR * max(typical, 1e-9):
            out["rank_compute"] = {"rank": int(worst), "delta_us": known[worst], "others_median_delta_us": typical}
    s = last["straggler"]
    if s and s.get("blame_us_per_step") and last["step_us"]:
        share = float(s["blame_us_per_step"]) / float(last["step_us"])
        before = first["straggler"]
        was = float(before["blame_us_per_step"] or 0.0) if before and before.get("rank") == s.get("rank") else 0.0
        if share >= STRAGGLER_MIN_SHARE and float(s["blame_us_per_step"]) > 2 * was:
            out["straggler_appeared"] = dict(s, first_blame_us_per_step=was)
    return out


def _headline(g: dict[str, Any], first: dict[str, Any]) -> str:
    d = g["step_delta_us"]
    if d is None:
        return "step time unknown in the first or last cycle"
    noise = NOISE_SHARE * (first["step_us"] or 0.0)
    head = f"step time {'grew' if d > 0 else 'shrank'} by {abs(d) / 1e3:.2f} ms from the first to the last cycle"
    if abs(d) <= noise:
        return f"step time steady ({d / 1e3:+.2f} ms from the first to the last cycle)"
    parts = []
    if g["rank_compute"]:
        rc = g["rank_compute"]
        parts.append(f"rank {rc['rank']}'s compute +{rc['delta_us'] / 1e3:.2f} ms/step "
                     f"(others {rc['others_median_delta_us'] / 1e3:+.2f} ms)")
    if g["straggler_appeared"]:
        s = g["straggler_appeared"]
        parts.append(f"straggler rank {s['rank']} appeared ({s['cause']}, "
                     f"{float(s['blame_us_per_step']) / 1e3:.2f} ms/step blamed)")
    grown = [r for r in g["categories"] if r["delta_us"] > noise][:2]
    parts.extend(f"{r['what']} +{r['delta_us'] / 1e3:.2f} ms/step" for r in grown)
    return head + (": " + "; ".join(parts) if parts else "")


def drift(cycles: Sequence[tuple[Mapping[str, Any], Report]]) -> dict[str, Any]:
    """``cycles``: (cycle description from ``source.cycle``, that cycle's report), oldest first."""
    rows = []
    for info, rep in cycles:
        m = cycle_metrics(rep)
        rows.append({"cycle": info.get("cycle"), "run": info.get("run"), "label": info.get("label"),
                     "steps": info.get("steps"), "start_ns": info.get("start_ns"),
                     "warmup": info.get("warmup"), **m})
    out: dict[str, Any] = {"cycles": rows, "growth": None, "headline": None}
    if len(rows) >= 2:
        out["growth"] = _growth(rows[0], rows[-1])
        out["headline"] = _headline(out["growth"], rows[0])
    return out
