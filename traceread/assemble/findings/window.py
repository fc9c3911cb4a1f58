"""The window ledger as the findings engine reads it, from any document.

Findings are shares of the recorded window (docs/ledger.md): every step's critical-path ledger,
summed. A document built by this version carries it in ``ledger.window``
(:mod:`traceread.analysis.ledger.job`). Two older shapes are read too, so one engine serves every
document:

* a ``ledger`` without ``window`` (documents from before the window ledger): the median step is the
  whole window (one step);
* no ``ledger`` at all (hand-built documents, a ledger that failed): a coarse window from the ranks'
  per-step breakdowns (``ranks[].steps``): in each step the rank with the longest step is critical,
  its compute is ``compute_other``, its exposed communication ``comm_transfer`` (of the role of the
  layout's busiest group), exposed memcpy, host-bound idle and the rest of its idle ``idle_other``;
  a listed root straggler's impact is the part of the critical rank's exposed communication above
  the straggler's own (the time spent waiting for it).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from traceread.report_schema import Report

Key = tuple[str, str | None, int]  # (category, role, rank)


@dataclass
class Window:
    """The recorded window: its steps, the parts of all of them together, and the late ranks."""

    n: int  # steps in the window
    total_us: float  # sum of the steps' critical durations
    median_step_us: float
    median_step: int | None
    parts: dict[Key, float]  # µs over the whole window per (category, role, rank)
    by_step: list[dict[str, Any]] = field(default_factory=list)  # {step, step_us, critical_rank, parts}
    late: list[dict[str, Any]] = field(default_factory=list)  # ledger.window.late entries
    blind: list[dict[str, Any]] = field(default_factory=list)  # comm with a missing member: {rank, role, us}
    noise_us: float = 0.0
    source: str = "ledger"  # "ledger" | "median step" | "per-rank steps"
    notes: list[str] = field(default_factory=list)  # what could not be read (reported as warnings)
    spans: list[dict[str, Any]] = field(default_factory=list)  # host time by covering span (ledger.window.spans)

    @property
    def mean_step_us(self) -> float:
        return self.total_us / self.n if self.n else 0.0


def parts_by_key(parts: Iterable[Mapping[str, Any]] | None) -> dict[Key, float]:
    out: dict[Key, float] = defaultdict(float)
    for p in parts or []:
        out[(str(p["category"]), p.get("role"), int(p["rank"]))] += float(p["us"])
    return dict(out)


def window_of(report: Report) -> Window | None:
    """The document's window ledger (module docstring); None when it has no steps at all."""
    led = report.get("ledger")
    if led and led.get("window"):
        w = led["window"]
        return Window(int(w["steps"]), float(w["total_us"]), float(w["median_step_us"]), w.get("median_step"),
                      parts_by_key(w.get("parts")), list(w.get("by_step") or []), list(w.get("late") or []),
                      list(w.get("blind") or []), float(w.get("noise_us") or 0.0), spans=list(w.get("spans") or []))
    if led and led.get("step_us"):
        step = float(led["step_us"])
        late = [{"rank": int(x["rank"]), "role": x.get("role"), "share_us": float(x["us"]), "saving_us": None,
                 "straggler": True, "critical_steps": 0,
                 "claims": [p for p in led.get("parts") or [] if int(p["rank"]) == int(x["rank"])
                            and p["category"] not in ("comm_transfer", "comm_wait", "bubble")]}
                for x in led.get("waited_on") or []]
        return Window(1, step, step, led.get("step"), parts_by_key(led.get("parts")),
                      [{"step": led.get("step"), "step_us": step, "critical_rank": led.get("critical_rank"),
                        "parts": led.get("parts") or []}], late, [], 0.0, "median step")
    return coarse_window(report)


def step_durations(report: Report) -> dict[int, dict[int, float]]:
    """step -> rank -> duration (µs) of the steps every rank has."""
    per: dict[int, dict[int, float]] = defaultdict(dict)
    ranks = report.get("ranks") or []
    for r in ranks:
        for s in r.get("steps") or []:
            if s.get("duration_us") is not None:
                per[int(s["step"])][int(r["rank"])] = float(s["duration_us"])
    return {k: v for k, v in per.items() if len(v) == len(ranks)}


def _busiest_role(report: Report) -> str:
    lay: Mapping[str, Any] = report.get("layout") or {}
    roles = {str(g["pg"]): g.get("role") or "other" for g in lay.get("groups") or []}
    time: dict[str, float] = defaultdict(float)
    for c in report.get("collectives") or []:
        pg = str(c.get("pg")).split(" ")[0]
        time[roles.get(pg, "other")] += float(c.get("latency_us") or 0) * int(c.get("count") or 1)
    return max(time, key=lambda k: time[k]) if time else "other"


def coarse_window(report: Report) -> Window | None:
    """The window from the ranks' per-step breakdowns (module docstring)."""
    durs = step_durations(report)
    if not durs:
        return None
    entry: dict[tuple[int, int], Mapping[str, Any]] = {
        (int(r["rank"]), int(st["step"])): st for r in report.get("ranks") or [] for st in r.get("steps") or []}
    role = _busiest_role(report)
    roots: list[tuple[int, float]] = []
    notes: list[str] = []
    for x in report.get("stragglers") or []:
        try:
            if x.get("root", True):
                v = x.get("impact_us_per_step")
                roots.append((int(x["rank"]), float(v if v is not None else x.get("blame_us_per_step") or 0.0)))
        except (TypeError, ValueError, AttributeError) as exc:
            notes.append(f"stragglers: entry {x!r} skipped ({type(exc).__name__})")
    parts: dict[Key, float] = defaultdict(float)
    by_step: list[dict[str, Any]] = []
    late: dict[int, dict[str, Any]] = {}
    for k in sorted(durs):
        dur, neg = max((d, -r) for r, d in durs[k].items())
        crit = -neg
        s = entry[(crit, k)]
        step_parts: dict[Key, float] = defaultdict(float)
        comm = float(s.get("exposed_comm_us") or 0.0)
        idle = float(s.get("idle_us") or 0.0)
        host = min(float(s.get("host_bound_us") or 0.0), idle)
        pieces: list[tuple[Key, float]] = [
                        (("compute_other", None, crit), float(s.get("compute_us") or 0.0)),
                        (("comm_transfer", role, crit), comm),
                        (("exposed_memcpy", None, crit), float(s.get("exposed_memcpy_us") or 0.0)),
                        (("host_bound", None, crit), host), (("idle_other", None, crit), idle - host)]
        for key, us in pieces:
            if us > 0:
                step_parts[key] += us
        rest = dur - sum(step_parts.values())
        if rest > 1e-9:
            step_parts[("idle_other", None, crit)] += rest
        for rank, impact in roots:
            if rank == crit:
                continue
            own = float(entry[(rank, k)].get("exposed_comm_us") or 0.0) if (rank, k) in entry else 0.0
            wait = max(0.0, min(impact, comm - own))
            if wait > 0:
                e = late.setdefault(rank, {"rank": rank, "role": role, "share_us": 0.0, "saving_us": 0.0,
                                           "straggler": True, "critical_steps": 0, "claims": []})
                e["share_us"] += wait
                e["saving_us"] += wait
                e["claims"].append({"category": "comm_transfer", "role": role, "rank": crit, "us": wait})
        for key, us in step_parts.items():
            parts[key] += us
        by_step.append({"step": k, "step_us": dur, "critical_rank": crit,
                        "parts": [{"category": c, "role": ro, "rank": rk, "us": us} for (c, ro, rk), us in step_parts.items()]})
    steps = sorted(by_step, key=lambda b: (b["step_us"], b["step"]))
    med = steps[(len(steps) - 1) // 2]
    return Window(len(by_step), sum(b["step_us"] for b in by_step), med["step_us"], med["step"], dict(parts), by_step,
                  list(late.values()), [], 0.0, "per-rank steps", notes)
