"""Ground truth of the step ledger and the parallel layout, from the simulator's own schedule.

The rules are those of the shared step-ledger contract (docs/ledger.md); this module computes them
from what the simulator *knows* (which op launched each kernel, when the host launched it, when
every member of a collective arrived), never from ``traceread.analysis``. Whole nanoseconds on the
true clock; each step's parts sum to its window exactly.

Per rank and step ``[s, e)`` (the ``ProfilerStep#N`` window: each simulated step ends with a host
sync after its last GPU work, so it equals the device-aligned window), every instant gets one label,
first rule first:

1. a compute kernel runs → ``compute_bound`` if any running one was launched by a compute-bound op,
   else ``memory_bound`` if any by a memory-bound op, else ``compute_other``. An op's class is its
   arithmetic intensity (FLOPs / bytes of its recorded shapes) against the ridge of the simulator's
   device table (bf16 tensor peak for matrix ops, FP32 rate otherwise, over HBM bandwidth); ops whose
   shapes the trace does not record (``aten::_fused_adamw_``'s TensorLists) are ``compute_other``;
2. no compute, a communication kernel runs → the collective of the one that started first (ties:
   launched first): ``comm_wait:<role>`` before its last member arrived, ``comm_transfer:<role>``
   after; for role ``pp`` the wait is ``bubble:pp``;
3. only memcpy → ``exposed_memcpy``;
4. idle gap ``[a, b)`` ended by the GPU event E starting at ``b`` (launched first when several start
   there), L = start of E's launching runtime call: ``host_bound`` = ``[a, clamp(L, a, b))``, the rest
   ``bubble:pp`` on a rank with pp send/recv in this step, else ``dependency``; a gap that reaches the
   step's end → ``idle_other``.

Job ledger of step k: the critical rank r* has the longest step-k window (ties: lowest rank); its
segments are taken, and each non-pp ``comm_wait`` segment ``[t0, t1)`` is replaced by the late peer's
segments over ``[t0, t1)`` (the member that arrived last, ties: lowest rank), recursively for the
peer's own waits (depth < world size); parts of the interval the peer has no step window over stay
``comm_wait`` of the waiting rank.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass
from typing import Any

from traceread.simulate.comm import ProcessGroup
from traceread.simulate.scenarios import Built
from traceread.simulate.schedule import MAX_GPUS_PER_MACHINE, GpuOp, RankCtx

#: Ledger categories in display order (the contract's order).
CATEGORIES: tuple[str, ...] = (
    "compute_bound", "memory_bound", "compute_other", "comm_transfer", "comm_wait", "bubble",
    "exposed_memcpy", "host_bound", "dependency", "idle_other",
)
#: Roles of the layout, in the order of ``layout.degrees``.
ROLES: tuple[str, ...] = ("dp", "fsdp", "tp", "pp", "cp", "ep")


@dataclass(frozen=True)
class Seg:
    """One labelled piece ``[t0, t1)`` of a rank's step (ns, true clock)."""

    t0: int
    t1: int
    category: str
    role: str | None = None
    peer: int | None = None  # comm_wait: the member that arrived last
    blind: int | None = None  # comm_transfer of a collective with a member whose trace is missing: that rank
    span: str | None = None  # host time: the recorded span covering it (span_truth), None: none
    family: str | None = None  # that span's family

    def key(self) -> str:
        return f"{self.category}:{self.role}" if self.role else self.category


class LedgerModel:
    """What the ledger needs to know about the job: roles of groups, op classes, collective arrivals."""

    def __init__(self, built: Built, missing: frozenset[int] = frozenset()) -> None:
        """``missing``: ranks whose traces are gone: arrivals are then the last *present* member's,
        and the communication of collectives they belong to after that is ``blind``."""
        self.built = built
        self.missing = missing
        self.world = built.knobs.ranks
        self.role_of_pg = group_roles(built)
        dev = built.sim.dev
        self.bound: dict[int, str | None] = {}
        for ctx in built.sim.ranks:
            for rec in ctx.ops:
                cls: str | None = None
                if rec.shapes_in_trace and rec.nbytes > 0:
                    cls = "compute" if rec.flops / rec.nbytes >= dev.ridge(rec.matmul) else "memory"
                for k in rec.kernels:
                    self.bound[id(k)] = cls
        self.last: dict[tuple[Any, ...], tuple[int, int]] = {}  # instance -> (last arrival, late rank)
        self.blind: dict[tuple[Any, ...], int] = {}  # instance -> its first missing member
        members_of: list[tuple[tuple[Any, ...], list[tuple[int, int]]]] = [
            (key, [(m.rank, m.placed_arrival) for m in ms]) for key, ms in built.sim.instances.items()]
        members_of += [(key, [(h.rank, h.arrival) for h in hs]) for key, hs in built.sim.host_instances.items()]
        for key, members in members_of:
            seen = [(r, a) for r, a in members if r not in missing]
            gone = sorted(r for r, _ in members if r in missing)
            if gone:
                self.blind[key] = gone[0]
            if not seen:
                continue
            t = max(a for _, a in seen)
            self.last[key] = (t, min(r for r, a in seen if a == t))

    def role(self, op: GpuOp) -> str:
        assert op.comm is not None
        return self.role_of_pg.get(op.comm.pg_name, "other")

    def pp_steps(self, ctx: RankCtx) -> set[int]:
        """Steps in which this rank ran pp send/recv."""
        return {o.step for o in ctx.gpu if o.comm is not None and o.comm.src_rank is not None
                and self.role(o) == "pp"}


def _compute_label(model: LedgerModel, comps: list[GpuOp]) -> str:
    bounds = {model.bound.get(id(o)) for o in comps}
    if "compute" in bounds:
        return "compute_bound"
    if "memory" in bounds:
        return "memory_bound"
    return "compute_other"


def rank_segments(model: LedgerModel, ctx: RankCtx, s: int, e: int, step: int, split: bool = True) -> list[Seg]:
    """The labelled segments of ``ctx``'s step window ``[s, e)``; ``split=False`` is the one-rank view
    (no comm_wait split: all communication is ``comm_transfer``)."""
    ops = [o for o in ctx.gpu if o.placed_end > s and o.placed_start < e]
    events: list[tuple[int, int, int, GpuOp]] = []
    for i, o in enumerate(ops):
        events.append((max(o.placed_start, s), 1, i, o))
        events.append((min(o.placed_end, e), 0, i, o))
    events.sort(key=lambda x: (x[0], x[1], x[2]))
    times = sorted({s, e} | {t for t, _, _, _ in events})
    active: dict[int, GpuOp] = {}
    raw: list[Seg] = []
    gaps: list[tuple[int, int]] = []
    ei = 0
    pp_steps = model.pp_steps(ctx)
    for t0, t1 in zip(times, times[1:]):
        while ei < len(events) and events[ei][0] <= t0:
            _, kind, i, o = events[ei]
            if kind == 1:
                active[i] = o
            else:
                active.pop(i, None)
            ei += 1
        comps = [o for o in active.values() if o.cls == "comp"]
        comms = [o for o in active.values() if o.cls == "comm"]
        if comps:
            raw.append(Seg(t0, t1, _compute_label(model, comps)))
        elif comms:
            k = min(comms, key=lambda o: (o.start, o.launch.ts if o.launch else 0, o.rank))
            role = model.role(k)
            assert k.comm is not None  # a comm-class op always carries its collective
            last, late = model.last[k.comm.key]
            cut = min(max(last, t0), t1) if split else t0
            if cut > t0:
                raw.append(Seg(t0, cut, "bubble" if role == "pp" else "comm_wait", role,
                               None if role == "pp" else late))
            if t1 > cut:
                raw.append(Seg(cut, t1, "comm_transfer", role,
                               blind=model.blind.get(k.comm.key) if split and role != "pp" else None))
        elif any(o.cls == "memcpy" for o in active.values()):
            raw.append(Seg(t0, t1, "exposed_memcpy"))
        elif gaps and gaps[-1][1] == t0:
            gaps[-1] = (gaps[-1][0], t1)
        else:
            gaps.append((t0, t1))
    for a, b in gaps:
        nxt = [o for o in ctx.gpu if o.start == b] if b < e else []
        if not nxt or all(o.launch is None for o in nxt):
            raw.append(Seg(a, b, "idle_other"))
            continue
        launches = [(o.launch.ts, o.correlation) for o in nxt if o.launch is not None]
        launch = min(max(min(launches)[0], a), b)
        if launch > a:
            raw.append(Seg(a, launch, "host_bound"))
        if b > launch:
            raw.append(Seg(launch, b, "bubble", "pp") if step in pp_steps else Seg(launch, b, "dependency"))
    raw = _host_overlay(model, ctx, raw, split)
    raw.sort(key=lambda g: g.t0)
    merged: list[Seg] = []
    for g in raw:
        if merged and merged[-1].t1 == g.t0 and (merged[-1].category, merged[-1].role, merged[-1].peer,
                                                  merged[-1].blind) == (g.category, g.role, g.peer, g.blind):
            merged[-1] = Seg(merged[-1].t0, g.t1, g.category, g.role, g.peer, g.blind)
        else:
            merged.append(g)
    assert sum(g.t1 - g.t0 for g in merged) == e - s, "ledger identity broken"
    return merged


def _host_overlay(model: LedgerModel, ctx: RankCtx, raw: list[Seg], split: bool) -> list[Seg]:
    """GPU idle (``host_bound`` / ``idle_other``) while this rank's host was inside a host-side (gloo)
    collective is that collective's communication: the span that started first among those running;
    ``comm_wait`` before its last member arrived (peer: that member), ``comm_transfer`` after."""
    spans = sorted((h.arrival, h.end, h.key, h.pg_name) for hs in model.built.sim.host_instances.values()
                    for h in hs if h.rank == ctx.rank and h.end is not None and h.end > h.arrival)
    if not spans:
        return raw
    out: list[Seg] = []
    for g in raw:
        if g.category not in ("host_bound", "idle_other"):
            out.append(g)
            continue
        cuts = sorted({g.t0, g.t1} | {t for a, b, _, _ in spans for t in (a, b) if g.t0 < t < g.t1})
        for x, y in zip(cuts, cuts[1:]):
            cover = [sp for sp in spans if sp[0] <= x and sp[1] >= y]
            if not cover:
                out.append(Seg(x, y, g.category))
                continue
            _a, _b, key, pg = min(cover)
            role = model.role_of_pg.get(pg, "other")
            last, late = model.last[key]
            cut = min(max(last, x), y) if split else x
            if cut > x:
                out.append(Seg(x, cut, "comm_wait", role, late))
            if y > cut:
                out.append(Seg(cut, y, "comm_transfer", role, blind=model.blind.get(key) if split else None))
    return out


def ledger_ns(segs: list[Seg]) -> dict[str, int]:
    """``{key: ns}`` of a rank's step (role-suffixed keys for comm and bubble), non-zero keys only."""
    out: Counter[str] = Counter()
    for g in segs:
        out[g.key()] += g.t1 - g.t0
    return {k: v for k, v in sorted(out.items(), key=lambda kv: _order(kv[0])) if v}


def _order(key: str) -> tuple[int, str]:
    cat, _, role = key.partition(":")
    return CATEGORIES.index(cat), role


class JobLedger:
    """The critical-path ledger of each step across ranks (contract: job ledger)."""

    def __init__(self, segs: dict[int, dict[int, list[Seg]]], windows: dict[int, dict[int, tuple[int, int]]],
                 world: int) -> None:
        self.windows = windows  # rank -> step -> (s, e)
        self.world = world
        self.flat: dict[int, list[Seg]] = {r: sorted((g for st in per.values() for g in st), key=lambda g: g.t0)
                                           for r, per in segs.items()}
        self.starts = {r: [g.t0 for g in v] for r, v in self.flat.items()}
        self.segs = segs
        self.blind: Counter[tuple[int, str | None]] = Counter()  # of the last step_ns: (missing rank, role) -> ns
        #: of the last step_ns: (category, role, rank, family, span) -> ns of host time on the critical path
        self.spans: Counter[tuple[str, str | None, int, str | None, str]] = Counter()

    def step_ns(self, k: int) -> tuple[int, Counter[tuple[str, str | None, int]]]:
        """(critical rank, ns per (category, role, rank)) of step ``k``."""
        ranks = sorted(self.windows)
        crit = min(ranks, key=lambda r: (-(self.windows[r][k][1] - self.windows[r][k][0]), r))
        parts: Counter[tuple[str, str | None, int]] = Counter()
        self.blind = Counter()
        self.spans = Counter()
        for g in self.segs[crit][k]:
            if g.category == "comm_wait" and g.peer is not None and g.peer in self.flat:
                self._expand(parts, g.peer, g.t0, g.t1, 1, (g.category, g.role, crit))
            else:
                parts[(g.category, g.role, crit)] += g.t1 - g.t0
                if g.span is not None:
                    self.spans[(g.category, g.role, crit, g.family, g.span)] += g.t1 - g.t0
                if g.blind is not None:
                    self.blind[(g.blind, g.role)] += g.t1 - g.t0
        s, e = self.windows[crit][k]
        assert sum(parts.values()) == e - s, "job ledger identity broken"
        return crit, parts

    def step(self, k: int) -> dict[str, Any]:
        """The job ledger of step ``k`` in the contract's JSON shape."""
        crit, parts = self.step_ns(k)
        s, e = self.windows[crit][k]
        rows = sorted(((c, ro, r, ns) for (c, ro, r), ns in parts.items() if ns),
                      key=lambda x: (CATEGORIES.index(x[0]), x[1] or "", x[2]))
        return {"step": k, "step_us": _us(e - s), "critical_rank": crit,
                "parts": [{"category": c, "role": ro, "rank": r, "us": _us(ns)} for c, ro, r, ns in rows]}

    def _expand(self, parts: Counter[tuple[str, str | None, int]], peer: int, a: int, b: int, depth: int,
                fallback: tuple[str, str | None, int]) -> None:
        """Add ``peer``'s segments over ``[a, b)``; uncovered time goes to ``fallback``."""
        segs = self.flat.get(peer, [])
        i = max(0, bisect.bisect_right(self.starts.get(peer, []), a) - 1)
        t = a
        while i < len(segs) and segs[i].t0 < b:
            g = segs[i]
            i += 1
            x, y = max(g.t0, a), min(g.t1, b)
            if y <= x:
                continue
            if x > t:
                parts[fallback] += x - t
            if g.category == "comm_wait" and g.peer is not None and g.peer in self.flat and depth < self.world:
                self._expand(parts, g.peer, x, y, depth + 1, (g.category, g.role, peer))
            else:
                parts[(g.category, g.role, peer)] += y - x
                if g.span is not None:
                    self.spans[(g.category, g.role, peer, g.family, g.span)] += y - x
                if g.blind is not None:
                    self.blind[(g.blind, g.role)] += y - x
            t = y
        if b > t:
            parts[fallback] += b - t


def _us(ns: int) -> float:
    return round(ns / 1000.0, 6)


def median_step(job: JobLedger, steps: list[int]) -> int:
    """The step whose critical duration is the lower median (ties: earliest step)."""
    crit = sorted((max(w[k][1] - w[k][0] for w in job.windows.values()), k) for k in steps)
    return crit[(len(crit) - 1) // 2][1]


def job_segments(built: Built, windows: dict[int, dict[int, tuple[int, int]]], split: bool = True,
                 missing: frozenset[int] = frozenset()) -> dict[int, dict[int, list[Seg]]]:
    """rank -> step -> labelled segments of every rank and step (of the present ranks: ``missing`` left out)."""
    from traceread.simulate.span_truth import label

    model = LedgerModel(built, missing)
    return {c.rank: {k: label(c, rank_segments(model, c, *windows[c.rank][k], k, split=split))
                     for k in built.knobs.step_numbers()} for c in built.sim.ranks if c.rank not in missing}


def missing_window_truth(built: Built, windows: dict[int, dict[int, tuple[int, int]]],
                         missing: frozenset[int]) -> dict[str, Any]:
    """The window ledger as the present ranks' traces show it when ``missing`` ranks' traces are gone,
    and ``blind``: per (missing rank, role) the critical path's communication in collectives with
    that rank after every present member had arrived (waiting for it, or transfer)."""
    steps = built.knobs.step_numbers()
    present = {r: w for r, w in windows.items() if r not in missing}
    job = JobLedger(job_segments(built, windows, missing=missing), present, built.knobs.ranks)
    by_step: dict[str, dict[str, Any]] = {}
    blind: Counter[tuple[int, str | None]] = Counter()
    for k in steps:
        by_step[str(k)] = job.step(k)
        blind.update(job.blind)
    win = window_truth(by_step, by_step[str(median_step(job, steps))])
    win["blind"] = [{"rank": m, "role": role, "us": _us(ns)} for (m, role), ns in sorted(blind.items()) if ns]
    return win


def span_rows(acc: Counter[tuple[str, str | None, int, str | None, str]]) -> list[dict[str, Any]]:
    """{category, role, rank, family, span, us} rows of host time by covering span, sorted."""
    return [{"category": c, "role": ro, "rank": r, "family": f, "span": sp, "us": _us(ns)}
            for (c, ro, r, f, sp), ns in sorted(acc.items(), key=lambda kv: (kv[0][2], kv[0][0], kv[0][4])) if ns]


def ledger_truth(built: Built, windows: dict[int, dict[int, tuple[int, int]]]) -> tuple[
        dict[int, dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """(per-rank ``{ledger, ledger_local, ledger_spans}``, job ``ledger`` of the median step, ``ledger_by_step``
    (each step with its ``spans``: host time on the critical path by covering span))."""
    steps = built.knobs.step_numbers()
    segs = job_segments(built, windows)
    local_all = job_segments(built, windows, split=False)
    per_rank: dict[int, dict[str, Any]] = {}
    for ctx in built.sim.ranks:
        local = local_all[ctx.rank]
        per_rank[ctx.rank] = {
            "ledger": {str(k): {key: _us(ns) for key, ns in ledger_ns(segs[ctx.rank][k]).items()} for k in steps},
            "ledger_local": {str(k): {key: _us(ns) for key, ns in ledger_ns(local[k]).items()} for k in steps},
            "ledger_spans": {str(k): span_rows(_seg_spans(segs[ctx.rank][k], ctx.rank)) for k in steps},
        }
    job = JobLedger(segs, windows, built.knobs.ranks)
    by_step = {}
    for k in steps:
        by_step[str(k)] = job.step(k)
        by_step[str(k)]["spans"] = span_rows(job.spans)
    return per_rank, by_step[str(median_step(job, steps))], by_step


def _seg_spans(segs: list[Seg], rank: int) -> Counter[tuple[str, str | None, int, str | None, str]]:
    out: Counter[tuple[str, str | None, int, str | None, str]] = Counter()
    for g in segs:
        if g.span is not None:
            out[(g.category, g.role, rank, g.family, g.span)] += g.t1 - g.t0
    return out


def window_truth(by_step: dict[str, dict[str, Any]], median: dict[str, Any]) -> dict[str, Any]:
    """The window ledger (docs/ledger.md): every step's job ledger summed, µs per (category, role, rank)."""
    acc: Counter[tuple[str, str | None, int]] = Counter()
    total = 0
    for led in by_step.values():
        total += round(led["step_us"] * 1000)
        for p in led["parts"]:
            acc[(p["category"], p["role"], p["rank"])] += round(p["us"] * 1000)
    n = len(by_step)
    rows = sorted(acc.items(), key=lambda kv: (CATEGORIES.index(kv[0][0]), kv[0][1] or "", kv[0][2]))
    spans: Counter[tuple[str, str | None, int, str | None, str]] = Counter()
    for led in by_step.values():
        for p in led.get("spans") or []:
            spans[(p["category"], p["role"], p["rank"], p["family"], p["span"])] += round(p["us"] * 1000)
    return {"spans": span_rows(spans),"steps": n, "total_us": _us(total), "mean_step_us": total / n / 1000.0,
            "median_step": median["step"], "median_step_us": median["step_us"],
            "parts": [{"category": c, "role": ro, "rank": r, "us": _us(ns)} for (c, ro, r), ns in rows if ns]}


# ---- layout ---------------------------------------------------------------------------------------


def all_groups(built: Built) -> list[ProcessGroup]:
    """Every process group in any rank's pg_config (by name), sorted by numeric name."""
    by_name: dict[str, ProcessGroup] = {}
    for pgs in built.pgs:
        for pg in pgs:
            by_name.setdefault(pg.name, pg)
    return sorted(by_name.values(), key=lambda g: int(g.name))


def group_roles(built: Built, recorded_only: bool = False) -> dict[str, str]:
    """pg name -> role: the scenario's design for groups that ran something, ``other`` for idle ones.
    ``recorded_only``: count only collectives the trace attributes to the group (an engine's or EP
    library's own kernels carry no process group: in the trace they belong to no group)."""
    used = {o.comm.pg_name for c in built.sim.ranks for o in c.gpu
            if o.comm is not None and (o.comm.recorded or not recorded_only)}
    used |= {h.pg_name for hs in built.sim.host_instances.values() for h in hs}
    return {g.name: (g.role if g.name in used else "other") for g in all_groups(built)}


#: The layout row of collectives whose kernels carry no process group (analysis.comm.layout.UNNAMED_PG).
UNNAMED_PG = "(unnamed)"


def node_of(built: Built, rank: int) -> int:
    """The machine of ``rank``: its host, split into machines of at most 8 GPUs when a host (one NVLink
    domain) has more, as the traces show it (device indices restart at 0 every 8 GPUs)."""
    per = built.knobs.per_node()
    machines = -(-per // MAX_GPUS_PER_MACHINE)
    return built.sim.host_of(rank) * machines + (rank % per) // MAX_GPUS_PER_MACHINE


def layout_truth(built: Built) -> dict[str, Any]:
    """``layout`` in the contract's shape: degrees and one row per process group."""
    roles = group_roles(built, recorded_only=True)

    def host(r: int) -> int:
        return node_of(built, r)

    groups: list[dict[str, Any]] = []
    for g in all_groups(built):
        role = roles[g.name]
        groups.append({"pg": g.name, "desc": g.desc, "role": role, "size": len(g.ranks), "ranks": list(g.ranks),
                       "nodes": sorted({host(r) for r in g.ranks}),
                       "evidence": g.evidence if role != "other" else "runs no collective in the profiled steps"})
    anon = {o.comm.pg_name for c in built.sim.ranks for o in c.gpu if o.comm is not None and not o.comm.recorded}
    for g in all_groups(built):
        if g.name in anon:  # the trace shows this traffic under no group: one row of its own
            groups.append({"pg": UNNAMED_PG, "desc": None, "role": g.role, "size": len(g.ranks), "ranks": list(g.ranks),
                           "nodes": sorted({host(r) for r in g.ranks}),
                           "evidence": f"{g.evidence} (kernels launched outside c10d: no process group recorded)"})
    degrees = {role: max((x["size"] for x in groups if x["role"] == role), default=1) for role in ROLES}
    return {"degrees": degrees, "groups": groups,
            "node_source": "device index restarts at 0 per node (no run.json, no NCCL log)"}
