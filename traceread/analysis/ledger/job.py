"""The step ledger, reduce side: waits split off with the other ranks, and the job's critical path.

Input: each rank's segments (:func:`traceread.analysis.ledger.rank.rank_segments`), the matched
collectives (:mod:`traceread.analysis.comm.collectives`) and the clock offsets
(:mod:`traceread.analysis.comm.clocks`). Definitions (docs/ledger.md):

* **comm_wait / comm_transfer** — a communication segment of rank r belongs to the kernel that
  started first among those running. Its collective's members arrived (kernel start, aligned
  clock) at different times; the part of the segment before the last member arrived is
  ``comm_wait`` (waiting for a late peer, the member that arrived last), the rest
  ``comm_transfer``. For point-to-point the members are the sender and the receiver. Kernels that
  were not matched stay ``comm_transfer``.
* **bubble** — for process groups with role ``pp`` the wait is ``bubble`` (a stage waiting for its
  neighbour stage), and so is ``dependency`` idle on a rank that ran pipeline send/recv in that step.
* **role** — the role of the segment's process group (``role_of(pg)``: the layout's role, else
  ``pp`` for groups running send/recv, ``ep`` for all-to-all, ``other``).
* **job ledger** — for each step k present on every rank: the critical rank r* has the longest
  step k window (ties: lowest rank). Start from r*'s segments of step k; every ``comm_wait``
  segment is replaced by the late peer's segments over the same aligned interval, recursively
  (a peer's own waits are replaced again; depth ≤ world size), attributed to that peer's rank; a
  part with no peer segments stays r*'s ``comm_wait``. ``ledger`` is the step whose critical
  duration is the lower median (ties: lower step number).
* **window ledger** (``ledger.window``) — every step's job ledger, summed: the findings' budget.
  Per step, each **late rank** (its own work on the critical path, or the critical rank when the
  others waited on it) is charged once: its share, and a saving no larger than the step's bound
  (no other rank's own work can shrink) nor its own work beyond the others'. A late rank is a
  **straggler** when that delay is above the run's step-to-step noise in 3 of every 4 steps.
  Communication of collectives with a member whose trace is missing, after every present member
  arrived, is ``blind`` (the missing rank's wait or the transfer: the traces cannot tell).

Each part is ``{category, role, rank, us}``; role is null except for comm_wait, comm_transfer and
bubble ("pp"). All lengths are whole nanoseconds, so the parts sum to the step (and the window) exactly.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import polars as pl

from traceread.analysis.ledger.rank import CATEGORIES
from traceread.fmt import NO_MARKER_STEP
from traceread.report_schema import Ledger, LedgerPart, RankLedger

RoleOf = Callable[[str | None], str]


@dataclass
class RankSegs:
    """One rank's final segments as arrays (ns after ``base_us``), sorted by start."""

    rank: int
    base_us: float
    offset_us: float
    step: np.ndarray
    start: np.ndarray
    end: np.ndarray
    category: list[str]
    role: list[str | None]
    peer: np.ndarray  # comm_wait: the late peer's rank, else -1
    blind: np.ndarray | None = None  # comm_transfer of a collective with a member whose trace is missing: that rank, else -1
    span: list[str | None] | None = None  # host time: the recorded span covering it (host_spans), else None
    family: list[str | None] | None = None  # that span's family

    def shift_to(self, other: RankSegs) -> int:
        """ns to add to a time of this rank to get the same aligned instant on ``other``'s ns."""
        return int(round(((self.base_us - self.offset_us) - (other.base_us - other.offset_us)) * 1000.0))


@dataclass
class JobLedger:
    """Per-rank final segments, the job ledger of the median step and the window ledger (module docstring)."""

    ranks: dict[int, RankSegs] = field(default_factory=dict)
    job: Ledger | None = None
    per_rank: dict[int, RankLedger] = field(default_factory=dict)
    waited_on: list[dict[str, Any]] = field(default_factory=list)


def fallback_roles(extracts: list[pl.DataFrame]) -> RoleOf:
    """Roles from the collectives alone, until a layout says better: send/recv → pp, all-to-all → ep."""
    roles: dict[str | None, str] = {}
    for ex in extracts:
        for pg, op in ex.select("pg", "op").unique().iter_rows():
            if op in ("send", "recv", "sendrecv"):
                roles[pg] = "pp"
            elif op == "alltoall" and roles.get(pg) != "pp":
                roles[pg] = "ep"
    return lambda pg: roles.get(pg, "other")


def _arrivals(matched: Any, offsets: dict[int, float]) -> pl.DataFrame:
    """Per (rank, kernel start): the aligned arrival of the last member, who it was, and the first
    member whose trace is missing (-1: none; its arrival is unknown)."""
    ev = matched.events.select("instance", "rank", "ts", "stream")
    off = pl.DataFrame({"rank": list(offsets), "_o": [float(v) for v in offsets.values()]},
                       schema={"rank": pl.Int64, "_o": pl.Float64})
    ev = ev.join(off, on="rank", how="left").with_columns(pl.col("_o").fill_null(0.0))
    ev = ev.with_columns((pl.col("ts") - pl.col("_o")).alias("_a"))
    last = (ev.sort(["_a", "rank"], descending=[True, False]).group_by("instance", maintain_order=True)
            .agg(pl.col("_a").first().alias("last_a"), pl.col("rank").first().alias("peer"),
                 pl.col("ts").first().alias("peer_ts"), pl.col("_o").first().alias("peer_o")))
    inst = getattr(matched, "instances", None)
    if inst is None:
        inst = pl.DataFrame({"instance": ev["instance"].unique()})
    if "missing" in inst.columns:
        miss = inst.select("instance", pl.col("missing").list.first().fill_null(-1).cast(pl.Int64).alias("missing"))
    else:
        miss = inst.select("instance", pl.lit(-1, pl.Int64).alias("missing"))
    return (ev.join(last, on="instance").join(miss, on="instance", how="left")
            .with_columns(pl.col("missing").fill_null(-1))
            .select("rank", "ts", "stream", "peer", "peer_ts", "peer_o", "missing"))


def _p2p_steps(extracts: list[pl.DataFrame], role_of: RoleOf) -> set[tuple[int, int]]:
    """(rank, step) pairs in which the rank ran send/recv in a pp-role group."""
    out: set[tuple[int, int]] = set()
    frames = [ex.select("rank", "step", "pg", "op") for ex in extracts if ex.height]
    if not frames:
        return out
    sub = pl.concat(frames, how="vertical_relaxed").filter(pl.col("op").is_in(["send", "recv", "sendrecv"]))
    for r, s, pg in sub.select("rank", "step", "pg").unique().iter_rows():
        if role_of(pg) == "pp" and s is not None:
            out.add((int(r), int(s)))
    return out


def _last_arrivals(rank: int, segs: pl.DataFrame, base: float, offset_us: float,
                   arrivals: pl.DataFrame | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per segment: the last member's arrival (this rank's ns), who it was (-1: not matched) and a
    member whose trace is missing (-1: none).

    A segment's collective is found by its kernel's start and stream (a stage's send and receive of
    one 1F1B slot start together on different streams)."""
    n = segs.height
    last = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    peer = np.full(n, -1, dtype=np.int64)
    miss = np.full(n, -1, dtype=np.int64)
    if arrivals is None or arrivals.height == 0:
        return last, peer, miss
    mine = arrivals  # this rank's rows (build partitions them once)
    k = np.round((mine["ts"].to_numpy() - base) * 1000.0).astype(np.int64)
    a = mine["peer_ts"].to_numpy() - mine["peer_o"].to_numpy() + offset_us  # on this rank's clock
    right = pl.DataFrame({"kts_ns": k, "stream": mine["stream"].cast(pl.Int64),
                          "_last": np.round((a - base) * 1000.0).astype(np.int64), "_peer": mine["peer"],
                          "_miss": mine["missing"]})
    left = segs.select(pl.int_range(n, dtype=pl.Int64).alias("_i"), "kts_ns", pl.col("stream").cast(pl.Int64))
    hit = left.join(right.unique(subset=["kts_ns", "stream"], keep="last"), on=["kts_ns", "stream"], how="inner")
    idx = hit["_i"].to_numpy()
    last[idx] = hit["_last"].to_numpy()
    peer[idx] = hit["_peer"].to_numpy()
    miss[idx] = hit["_miss"].to_numpy()
    return last, peer, miss


def finalise_rank(rank: int, segs: pl.DataFrame, offset_us: float, arrivals: pl.DataFrame | None,
                  role_of: RoleOf, pp_steps: set[tuple[int, int]]) -> RankSegs:
    """Split this rank's communication segments into wait and transfer, assign roles and bubbles
    (vectorised: each segment gives its wait piece, if any, and the rest). ``arrivals``: this
    rank's rows of :func:`_arrivals`."""
    base = float(segs["base_us"][0])
    step = segs["step"].to_numpy().astype(np.int64)
    start = segs["start_ns"].to_numpy().astype(np.int64)
    end = segs["end_ns"].to_numpy().astype(np.int64)
    cats = np.array(segs["category"].cast(pl.Utf8).to_list(), dtype=object)
    pgs = segs["pg"].to_list()
    roles_of = {pg: role_of(pg) for pg in set(pgs)}  # None: traffic no group name was recorded for
    is_comm = cats == "comm_transfer"
    role = np.array([roles_of.get(pg) if c else None for pg, c in zip(pgs, is_comm.tolist())], dtype=object)
    last, peer, miss = _last_arrivals(rank, segs, base, offset_us, arrivals)
    wait = is_comm & (peer >= 0) & (peer != rank) & (last > start)
    cut = np.where(wait, np.minimum(last, end), start)
    pp = role == "pp"
    # the wait piece [start, cut): comm_wait of the role with its late peer, or bubble on pp
    w_cat = np.where(pp, "bubble", "comm_wait")[wait]
    w_peer = np.where(pp, -1, peer)[wait]
    # the rest [cut, end): comm_transfer, a pp stage's launched-but-waiting idle as bubble, or as is
    in_pp_step = np.array([(rank, k) in pp_steps for k in step.tolist()], dtype=bool) if pp_steps else \
        np.zeros(step.size, dtype=bool)
    dep_bubble = (cats == "dependency") & in_pp_step
    r_cat = np.where(dep_bubble, "bubble", cats)
    r_role = np.where(dep_bubble, "pp", role)
    keep = end > cut
    s_all = np.concatenate([start[wait], cut[keep]])
    order = np.argsort(s_all, kind="stable")
    cat_all = np.concatenate([w_cat, r_cat[keep]])[order]
    role_all = np.concatenate([role[wait], r_role[keep]])[order]
    spans = fams = None
    if "span" in segs.columns and segs["span"].is_not_null().any():
        none = np.full(int(wait.sum()), None, dtype=object)
        spans = np.concatenate([none, np.array(segs["span"].to_list(), dtype=object)[keep]])[order].tolist()
        fams = np.concatenate([none, np.array(segs["family"].to_list(), dtype=object)[keep]])[order].tolist()
    return RankSegs(rank, base, offset_us, np.concatenate([step[wait], step[keep]])[order], s_all[order],
                    np.concatenate([cut[wait], end[keep]])[order], cat_all.tolist(), role_all.tolist(),
                    np.concatenate([w_peer, np.full(int(keep.sum()), -1, np.int64)])[order],
                    np.concatenate([np.full(int(wait.sum()), -1, np.int64),
                                    np.where(is_comm & ~pp, miss, -1)[keep]])[order], spans, fams)


Key = tuple[str, str | None, int]  # (category, role, rank)
SpanKey = tuple[str, str | None, int, str | None, str]  # (category, role, rank, family, span)

#: Categories that are communication: on a late peer they are its collective's time, not its own work.
COMM_CATEGORIES = frozenset({"comm_transfer", "comm_wait", "bubble"})
#: A late rank is a straggler when its delay per step (median over the window's steps) exceeds the
#: run's own step-to-step spread (this many robust standard deviations of the step time) ...
SPREAD_SIGMAS = 1.0
#: ... the clock uncertainty, and this share of the median step ...
MIN_DELAY_FRACTION = 0.01
#: With a single recorded step (no spread to measure) the delay must exceed this share of it.
ONE_STEP_FRACTION = 0.05
#: ... in at least this share of the steps (a rank late only now and then is noise or a slow step).
MIN_LATE_SHARE = 0.75
#: Rounds of the transitive wait closure (a wait on a rank that waited on L is a wait on L).
CLOSURE_ROUNDS = 4


@dataclass
class _Walk:
    """Accumulators of one step's critical path."""

    acc: dict[Key, int] = field(default_factory=lambda: defaultdict(int))
    waits: dict[tuple[int, str | None], int] = field(default_factory=lambda: defaultdict(int))
    blind: dict[tuple[int, str | None], int] = field(default_factory=lambda: defaultdict(int))
    spans: dict[SpanKey, int] = field(default_factory=lambda: defaultdict(int))


def _expand(ranks: dict[int, RankSegs], r: int, t0: int, t1: int, depth: int, w: _Walk,
            via: tuple[int, str | None] | None) -> None:
    """Add rank r's segments over [t0, t1) (r's ns) to ``w``; comm_wait pieces follow the late peer."""
    rs = ranks[r]
    i = max(int(np.searchsorted(rs.end, t0, side="right")), 0)
    covered = 0
    while i < rs.start.size and rs.start[i] < t1:
        a, b = max(int(rs.start[i]), t0), min(int(rs.end[i]), t1)
        if b > a:
            covered += b - a
            p = int(rs.peer[i])
            if rs.category[i] == "comm_wait" and p in ranks and p != r and depth < len(ranks):
                sh = rs.shift_to(ranks[p])
                _expand(ranks, p, a + sh, b + sh, depth + 1, w, (p, rs.role[i]))
                _fill_gap(ranks[p], a + sh, b + sh, r, rs.role[i], w.acc)
            else:
                w.acc[(rs.category[i], rs.role[i], r)] += b - a
                if rs.span is not None and rs.span[i] is not None:
                    w.spans[(rs.category[i], rs.role[i], r, (rs.family or [None] * len(rs.span))[i], str(rs.span[i]))] += b - a
                if via is not None:
                    w.waits[via] += b - a
                if rs.blind is not None and rs.blind[i] >= 0:
                    w.blind[(int(rs.blind[i]), rs.role[i])] += b - a
        i += 1
    if covered < t1 - t0 and via is None:  # the critical rank has no segment here (cannot happen)
        w.acc[("idle_other", None, r)] += t1 - t0 - covered


def _fill_gap(peer: RankSegs, t0: int, t1: int, waiter: int, role: str | None, acc: dict[Key, int]) -> None:
    """The part of [t0, t1) the peer has no segment for stays the waiter's comm_wait."""
    i = max(int(np.searchsorted(peer.end, t0, side="right")), 0)
    covered = 0
    while i < peer.start.size and peer.start[i] < t1:
        covered += max(0, min(int(peer.end[i]), t1) - max(int(peer.start[i]), t0))
        i += 1
    if covered < t1 - t0:
        acc[("comm_wait", role, waiter)] += t1 - t0 - covered


def _parts(acc: dict[Key, int]) -> list[LedgerPart]:
    order = {c: i for i, c in enumerate(CATEGORIES)}
    items = [(k, v) for k, v in acc.items() if v > 0]
    items.sort(key=lambda kv: (-kv[1], order.get(kv[0][0], 99), kv[0][2]))
    return [{"category": c, "role": role, "rank": rank, "us": v / 1000.0} for (c, role, rank), v in items]


def _span_parts(spans: dict[SpanKey, int]) -> list[dict[str, Any]]:
    """The span breakdown of parts: {category, role, rank, family, span, us}, largest first (time of a
    part no span covers is the part less these)."""
    items = sorted(((k, v) for k, v in spans.items() if v > 0), key=lambda kv: (-kv[1], kv[0][2], kv[0][4]))
    return [{"category": c, "role": role, "rank": rank, "family": fam, "span": sp, "us": v / 1000.0}
            for (c, role, rank, fam, sp), v in items]


def _rank_step(rs: RankSegs, k: int) -> RankLedger:
    sel = np.flatnonzero(rs.step == k)
    acc: dict[Key, int] = defaultdict(int)
    for i in sel:
        acc[(rs.category[i], rs.role[i], rs.rank)] += int(rs.end[i] - rs.start[i])
    total = int((rs.end[sel] - rs.start[sel]).sum())
    return {"step": int(k), "step_us": total / 1000.0, "parts": _parts(acc)}


@dataclass
class _RankSteps:
    """Per step of one rank: duration, comm_wait per late peer, own work per category (ns)."""

    dur: dict[int, int]
    waits: dict[int, dict[int, int]]
    cats: dict[int, dict[str, int]]
    spans: dict[int, dict[tuple[str, str | None, str], int]] = field(default_factory=dict)  # (category, family, span)


def _rank_steps(rs: RankSegs) -> _RankSteps:
    length = rs.end - rs.start
    dur: dict[int, int] = defaultdict(int)
    waits: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    cats: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for k, n, c, p in zip(rs.step.tolist(), length.tolist(), rs.category, rs.peer.tolist()):
        dur[k] += n
        cats[k][c] += n
        if c == "comm_wait" and p >= 0 and p != rs.rank:
            waits[k][p] += n
    spans: dict[int, dict[tuple[str, str | None, str], int]] = defaultdict(lambda: defaultdict(int))
    if rs.span is not None:
        fams = rs.family or [None] * len(rs.span)
        for k, n, c, sp, f in zip(rs.step.tolist(), length.tolist(), rs.category, rs.span, fams):
            if sp is not None:
                spans[k][(c, f, sp)] += n
    return _RankSteps(dict(dur), {k: dict(v) for k, v in waits.items()}, {k: dict(v) for k, v in cats.items()},
                      {k: dict(v) for k, v in spans.items()})


def _lower_median(items: list[tuple[int, int]]) -> int:
    """Step of the lower median of (duration, step) pairs."""
    items = sorted(items)
    return items[(len(items) - 1) // 2][1]


def _waited_on(steps: dict[int, _RankSteps], k: int, late: int) -> dict[int, int]:
    """ns each rank waited in step k on ``late``, directly or through ranks that waited on it (a wait
    on q counts as a wait on ``late`` up to what q itself waited on it)."""
    direct = {r: (st.waits.get(k) or {}) for r, st in steps.items()}
    reach = {r: w.get(late, 0) for r, w in direct.items()}
    for _ in range(CLOSURE_ROUNDS):
        nxt = {}
        for r, w in direct.items():
            v = w.get(late, 0) + sum(min(ns, reach.get(q, 0)) for q, ns in w.items() if q != late and q != r)
            nxt[r] = min(v, sum(w.values()))
        if nxt == reach:
            break
        reach = nxt
    reach[late] = 0
    return reach


def _held_back(steps: dict[int, _RankSteps], k: int, r: int, late: int, waited: int) -> int:
    """Communication rank r had exposed in step k only because ``late`` held the collectives back: its
    exposed transfer beyond the late rank's own (a rank that never waits has only the transfer its
    compute cannot hide), at most what it waited on ``late``."""
    if waited <= 0:
        return 0
    xfer = (steps[r].cats.get(k) or {}).get("comm_transfer", 0)
    ref = (steps[late].cats.get(k) or {}).get("comm_transfer", 0)
    return min(max(0, xfer - ref), waited)


def _bound(steps: dict[int, _RankSteps], k: int, late: int, step_ns: int) -> int:
    """How much step k could shrink if ``late`` were on time: it cannot get shorter than any other
    rank's own work (its step minus what it waited on ``late`` and the transfer that waiting exposed)."""
    waited = _waited_on(steps, k, late)
    own = max((st.dur[k] - waited.get(r, 0) - _held_back(steps, k, r, late, waited.get(r, 0))
               for r, st in steps.items() if r != late and k in st.dur), default=None)
    if own is None:
        return 0
    return max(0, step_ns - own)


def _span_excess(steps: dict[int, _RankSteps], k: int, late: int) -> dict[tuple[str, str | None, str], int]:
    """The late rank's host time in step k per (category, family, span) above the other ranks' median
    of the same span (>0 only): which recorded span its extra host time was in."""
    mine = steps[late].spans.get(k) or {}
    others = [st.spans.get(k) or {} for r, st in steps.items() if r != late and k in st.dur]
    out: dict[tuple[str, str | None, str], int] = {}
    for key, ns in mine.items():
        ref = sorted(o.get(key, 0) for o in others)
        base = ref[(len(ref) - 1) // 2] if ref else 0
        if ns - base > 0:
            out[key] = ns - base
    return out


def _excess(steps: dict[int, _RankSteps], k: int, late: int) -> dict[str, int]:
    """The late rank's own work in step k above the other ranks' median, per category (>0 only;
    communication is not own work)."""
    mine = steps[late].cats.get(k) or {}
    others = [st.cats.get(k) or {} for r, st in steps.items() if r != late and k in st.cats]
    out: dict[str, int] = {}
    for c, ns in mine.items():
        if c in COMM_CATEGORIES:
            continue
        ref = sorted(o.get(c, 0) for o in others)
        base = ref[(len(ref) - 1) // 2] if ref else 0
        if ns - base > 0:
            out[c] = ns - base
    return out


@dataclass
class _Late:
    """A rank the critical path waited on (or, being critical, the others waited on), over the window."""

    rank: int
    share: int = 0  # ns of its own work on the critical path (or, when critical, its excess claimed)
    saving: int = 0  # ns the steps could shrink without its delay: per step min(share, bound)
    delays: dict[int, int] = field(default_factory=dict)  # step -> that step's saving
    claims: dict[Key, int] = field(default_factory=lambda: defaultdict(int))
    roles: dict[str | None, int] = field(default_factory=lambda: defaultdict(int))
    critical_steps: int = 0
    excess: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # its own work above the others'
    span_excess: dict[tuple[str, str | None, str], int] = field(default_factory=lambda: defaultdict(int))


def _late_in_step(steps: dict[int, _RankSteps], k: int, crit: int, step_ns: int, w: _Walk,
                  late: dict[int, _Late]) -> None:
    """Charge each late rank once for step k: its own work on the critical path (capped by the bound
    for the saving), or, when it is the critical rank and the others waited on it, its excess work."""
    own: dict[int, dict[Key, int]] = defaultdict(dict)
    for key, ns in w.acc.items():
        if key[2] != crit and key[0] not in COMM_CATEGORIES and ns > 0:
            own[key[2]][key] = ns
    for r, keys in own.items():
        e = late.setdefault(r, _Late(r))
        roles = {role: ns for (p, role), ns in w.waits.items() if p == r}
        # the critical rank's transfer exposed only because r held the collectives back is r's too
        held = _held_back(steps, k, crit, r, _waited_on(steps, k, r).get(crit, 0))
        role = max(roles, key=lambda ro: roles[ro]) if roles else None
        xfer = ("comm_transfer", role, crit)
        held = min(held, w.acc.get(xfer, 0))
        keys = dict(keys)
        if held > 0:
            keys[xfer] = held
        share = sum(keys.values())
        ex = _excess(steps, k, r)
        # it cannot save more than the step's bound, nor more than its own work beyond the others'
        d = min(share, _bound(steps, k, r, step_ns), sum(ex.values()))
        e.share += share
        e.saving += d
        e.delays[k] = d
        for key, ns in keys.items():
            e.claims[key] += ns
        for ro, ns in roles.items():
            e.roles[ro] += ns
        for c, ns in ex.items():
            e.excess[c] += ns
        if d > 0:
            for sk, sns in _span_excess(steps, k, r).items():
                e.span_excess[sk] += sns
    if any((st.waits.get(k) or {}).get(crit) for r, st in steps.items() if r != crit):
        ex = _excess(steps, k, crit)
        d = min(_bound(steps, k, crit, step_ns), sum(ex.values()))
        if d > 0:
            e = late.setdefault(crit, _Late(crit))
            for c, ns in ex.items():
                e.excess[c] += ns
            for sk, sns in _span_excess(steps, k, crit).items():
                e.span_excess[sk] += sns
            e.critical_steps += 1
            e.share += d
            e.saving += d
            e.delays[k] = d
            left = d
            for c, ns in sorted(ex.items(), key=lambda kv: -kv[1]):
                take = min(ns, left)
                if take > 0:
                    e.claims[(c, None, crit)] += take
                    left -= take


#: Own-work categories that are the GPU's (the rest of a late rank's excess is the host's).
GPU_WORK = frozenset({"compute_bound", "memory_bound", "compute_other"})


def _cause(e: _Late, gpu_ranks: set[int]) -> str:
    """Why the late rank was late, from its own work above the other ranks' in the same steps: ``gpu``
    when most of it is GPU compute (only where GPU work is measured), ``host`` when it is time the
    GPU waited for the host; on a CPU-only rank, whose operators run on the host, ``cpu_ops`` when most
    of it is its operators (more work, or a slower CPU) and ``host`` when it is time outside them
    (a data loader, a sleep); ``unknown`` without any excess."""
    ops = sum(ns for c, ns in e.excess.items() if c in GPU_WORK)
    host = sum(ns for c, ns in e.excess.items() if c not in GPU_WORK)
    if ops + host <= 0:
        return "unknown"
    if ops < host:
        return "host"
    return "gpu" if e.rank in gpu_ranks else "cpu_ops"


def _spread(durations: list[int]) -> float:
    """Robust standard deviation of the step times (1.4826 x median absolute deviation), ns."""
    if len(durations) < 2:
        return 0.0
    a = np.asarray(durations, dtype=np.float64)
    return float(1.4826 * np.median(np.abs(a - np.median(a))))


def build(segments: dict[int, pl.DataFrame], extracts: list[pl.DataFrame], matched: Any = None,
          clock: Any = None, role_of: RoleOf | None = None, host_only: set[int] | None = None) -> JobLedger:
    """Per-rank ledgers, the job ledger of the median step and the window ledger (module docstring).
    ``host_only``: ranks without GPU work (their ledger is the host's, never a "gpu" cause)."""
    role_of = role_of or fallback_roles(extracts)
    offsets = dict(getattr(clock, "offsets_us", None) or {})
    arrivals = _arrivals(matched, offsets) if matched is not None and matched.events.height else None
    by_rank = ({int(k[0]): v for k, v in arrivals.partition_by("rank", as_dict=True).items()}
               if arrivals is not None else {})
    pp_steps = _p2p_steps(extracts, role_of)
    out = JobLedger()
    for r, segs in sorted(segments.items()):
        if segs is not None and segs.height:
            out.ranks[r] = finalise_rank(r, segs, float(offsets.get(r, 0.0)), by_rank.get(r), role_of, pp_steps)
    if not out.ranks:
        return out
    steps = {r: _rank_steps(rs) for r, rs in out.ranks.items()}
    common = set.intersection(*(set(st.dur) for st in steps.values()))
    k_med = None
    if common:
        eps_ns = 1000.0 * float(getattr(clock, "epsilon_us", 0.0) or 0.0)
        job, k_med = _window(out.ranks, steps, sorted(common), eps_ns, set(out.ranks) - (host_only or set()))
        out.job = cast(Ledger, job)
        out.waited_on = job["waited_on"]
        if job["window"]["blind"] and matched is not None:
            _blind_evidence(job["window"]["blind"], matched, offsets, role_of)
    for r, rs in out.ranks.items():
        d = steps[r].dur
        kk = k_med if k_med is not None and k_med in d else _lower_median([(v, s) for s, v in d.items()])
        out.per_rank[r] = _rank_step(rs, kk)
    return out


def _role_of_waits(ranks: dict[int, RankSegs], k: int, late: int) -> dict[str | None, int]:
    """ns the other ranks waited on ``late`` in step k, per role of the collective."""
    out: dict[str | None, int] = defaultdict(int)
    for r, rs in ranks.items():
        if r == late:
            continue
        sel = np.flatnonzero((rs.step == k) & (rs.peer == late))
        for i in sel:
            out[rs.role[i]] += int(rs.end[i] - rs.start[i])
    return out


def _window(ranks: dict[int, RankSegs], steps: dict[int, _RankSteps], common: list[int],
            eps_ns: float, gpu_ranks: set[int] | None = None) -> tuple[dict[str, Any], int]:
    """The job ledger of every step, the median step's (the document's ``ledger``) and the window's."""
    total: dict[Key, int] = defaultdict(int)
    blind: dict[tuple[int, str | None], int] = defaultdict(int)
    late: dict[int, _Late] = {}
    by_step: list[dict[str, Any]] = []
    span_total: dict[SpanKey, int] = defaultdict(int)
    walks: dict[int, tuple[int, int, _Walk]] = {}
    for k in common:
        dur, neg = max((steps[r].dur[k], -r) for r in ranks)
        crit = -neg
        rs = ranks[crit]
        w = _Walk()
        for i in np.flatnonzero(rs.step == k):
            _expand(ranks, crit, int(rs.start[i]), int(rs.end[i]), 0, w, None)
        walks[k] = (crit, dur, w)
        for key, ns in w.acc.items():
            total[key] += ns
        for missing, ns in w.blind.items():
            blind[missing] += ns
        for sk, ns in w.spans.items():
            span_total[sk] += ns
        before = late[crit].critical_steps if crit in late else 0
        _late_in_step(steps, k, crit, dur, w, late)
        if crit in late and late[crit].critical_steps > before:
            for role, ns in _role_of_waits(ranks, k, crit).items():
                late[crit].roles[role] += ns
        by_step.append({"step": int(k), "step_us": dur / 1000.0, "critical_rank": int(crit), "parts": _parts(w.acc),
                        "spans": _span_parts(w.spans)})
    k_med = _lower_median([(walks[k][1], k) for k in common])
    crit, dur, w = walks[k_med]
    waited_on = [{"rank": p, "role": role, "us": v / 1000.0} for (p, role), v in sorted(w.waits.items(), key=lambda kv: -kv[1])]
    durations = [walks[k][1] for k in common]
    n = len(common)
    med_ns = sorted(durations)[(n - 1) // 2]
    spread = _spread(durations)
    # one step has no step-to-step spread to measure: a straggler must then cost a clear share of it
    noise = max(SPREAD_SIGMAS * spread, eps_ns, (MIN_DELAY_FRACTION if n > 1 else ONE_STEP_FRACTION) * med_ns)
    late_out = []
    gpu_ranks = set(ranks) if gpu_ranks is None else gpu_ranks
    for e in sorted(late.values(), key=lambda e: -e.saving):
        ds = sorted(e.delays.get(k, 0) for k in common)
        typical = ds[(n - 1) // 2] if n % 2 else (ds[n // 2 - 1] + ds[n // 2]) / 2
        steady = sum(1 for d in ds if d > noise) >= math.ceil(MIN_LATE_SHARE * n)
        role = max(e.roles, key=lambda ro: e.roles[ro]) if e.roles else None
        late_out.append({
            "rank": e.rank, "role": role, "share_us": e.share / 1000.0, "saving_us": e.saving / 1000.0,
            "delay_us": typical / 1000.0, "steps_late": sum(1 for k in common if e.delays.get(k, 0) > 0),
            "critical_steps": e.critical_steps, "straggler": bool(typical > noise and steady), "cause": _cause(e, gpu_ranks),
            "excess": [{"category": c, "us": ns / 1000.0} for c, ns in sorted(e.excess.items(), key=lambda kv: -kv[1])],
            "claims": [{"category": c, "role": ro, "rank": rk, "us": ns / 1000.0}
                       for (c, ro, rk), ns in sorted(e.claims.items(), key=lambda kv: -kv[1]) if ns > 0],
            "spans": [{"category": c, "family": f, "span": sp, "us": ns / 1000.0}
                      for (c, f, sp), ns in sorted(e.span_excess.items(), key=lambda kv: (-kv[1], kv[0][2])) if ns > 0],
        })
    window = {
        "steps": n, "total_us": sum(durations) / 1000.0, "mean_step_us": sum(durations) / n / 1000.0,
        "median_step_us": med_ns / 1000.0, "median_step": int(k_med), "spread_us": spread / 1000.0,
        "noise_us": noise / 1000.0, "parts": _parts(total), "by_step": by_step, "late": late_out,
        "blind": [{"rank": m, "role": role, "us": ns / 1000.0}
                  for (m, role), ns in sorted(blind.items(), key=lambda kv: -kv[1]) if ns > 0],
        "spans": _span_parts(span_total),
    }
    if n == 1 and k_med == NO_MARKER_STEP:  # no step markers: the one window is the whole trace
        window["whole_trace"] = True
    job = {"step": int(k_med), "step_us": dur / 1000.0, "critical_rank": int(crit), "parts": _parts(w.acc),
           "waited_on": waited_on, "window": window}
    return job, k_med


def _blind_evidence(blind: list[dict[str, Any]], matched: Any, offsets: dict[int, float], role_of: RoleOf) -> None:
    """What the present members of the collectives with a missing rank did: how many instances, how
    close together the present members arrived (median of last − first), how long they then stayed
    (median of end − last present arrival) and how many members were present (fewest), per (missing
    rank, role)."""
    inst = getattr(matched, "instances", None)
    if inst is None or "missing" not in inst.columns:
        return
    miss = inst.filter(pl.col("missing").list.len() > 0).select(
        "instance", "pg", pl.col("missing").list.first().alias("m"))
    if miss.height == 0:
        return
    off = pl.DataFrame({"rank": list(offsets), "_o": [float(v) for v in offsets.values()]},
                       schema={"rank": pl.Int64, "_o": pl.Float64})
    ev = (matched.events.select("instance", "rank", "ts", "end").join(miss, on="instance")
          .join(off, on="rank", how="left").with_columns(pl.col("_o").fill_null(0.0)))
    per = (ev.group_by("instance", "m", "pg")
           .agg(((pl.col("ts") - pl.col("_o")).max() - (pl.col("ts") - pl.col("_o")).min()).alias("spread"),
                ((pl.col("end") - pl.col("_o")).max() - (pl.col("ts") - pl.col("_o")).max()).alias("after"),
                pl.len().alias("present")))
    stats: dict[tuple[int, str | None], tuple[int, float, float, int]] = {}
    for (m, role), grp in per.with_columns(
            pl.col("pg").map_elements(lambda pg: role_of(pg), return_dtype=pl.Utf8).alias("role")
    ).group_by("m", "role"):
        stats[(int(m), role)] = (grp.height, float(grp["spread"].median()), float(grp["after"].median()),
                                 int(grp["present"].min()))
    for b in blind:
        got = stats.get((int(b["rank"]), b.get("role")))
        if got is not None:
            b["instances"], b["present_spread_us"], b["after_us"], b["present"] = got
