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
  part with no peer segments stays r*'s ``comm_wait``. The ledger reported is the one of the step
  whose critical duration is the lower median (ties: lower step number).

Each part is ``{category, role, rank, us}``; role is null except for comm_wait, comm_transfer and
bubble ("pp"). All lengths are whole nanoseconds, so the parts sum to the step exactly.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from traceread.analysis.ledger.rank import CATEGORIES
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

    def shift_to(self, other: RankSegs) -> int:
        """ns to add to a time of this rank to get the same aligned instant on ``other``'s ns."""
        return int(round(((self.base_us - self.offset_us) - (other.base_us - other.offset_us)) * 1000.0))


@dataclass
class JobLedger:
    """Per-rank final segments and the job ledger (see module docstring)."""

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
    """Per (rank, kernel start): the aligned arrival of the last member and who it was."""
    ev = matched.events.select("instance", "rank", "ts", "stream")
    off = pl.DataFrame({"rank": list(offsets), "_o": [float(v) for v in offsets.values()]},
                       schema={"rank": pl.Int64, "_o": pl.Float64})
    ev = ev.join(off, on="rank", how="left").with_columns(pl.col("_o").fill_null(0.0))
    ev = ev.with_columns((pl.col("ts") - pl.col("_o")).alias("_a"))
    last = (ev.sort(["_a", "rank"], descending=[True, False]).group_by("instance", maintain_order=True)
            .agg(pl.col("_a").first().alias("last_a"), pl.col("rank").first().alias("peer"),
                 pl.col("ts").first().alias("peer_ts"), pl.col("_o").first().alias("peer_o")))
    return ev.join(last, on="instance").select("rank", "ts", "stream", "peer", "peer_ts", "peer_o")


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
                   arrivals: pl.DataFrame | None) -> tuple[np.ndarray, np.ndarray]:
    """Per segment: the last member's arrival (this rank's ns) and who it was (-1: not matched).

    A segment's collective is found by its kernel's start and stream (a stage's send and receive of
    one 1F1B slot start together on different streams)."""
    n = segs.height
    last = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
    peer = np.full(n, -1, dtype=np.int64)
    if arrivals is None or arrivals.height == 0:
        return last, peer
    mine = arrivals  # this rank's rows (build partitions them once)
    if mine.height == 0:
        return last, peer
    k = np.round((mine["ts"].to_numpy() - base) * 1000.0).astype(np.int64)
    a = mine["peer_ts"].to_numpy() - mine["peer_o"].to_numpy() + offset_us  # on this rank's clock
    right = pl.DataFrame({"kts_ns": k, "stream": mine["stream"].cast(pl.Int64),
                          "_last": np.round((a - base) * 1000.0).astype(np.int64), "_peer": mine["peer"]})
    left = segs.select(pl.int_range(n, dtype=pl.Int64).alias("_i"), "kts_ns", pl.col("stream").cast(pl.Int64))
    hit = left.join(right.unique(subset=["kts_ns", "stream"], keep="last"), on=["kts_ns", "stream"], how="inner")
    idx = hit["_i"].to_numpy()
    last[idx] = hit["_last"].to_numpy()
    peer[idx] = hit["_peer"].to_numpy()
    return last, peer


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
    roles_of = {pg: role_of(pg) for pg in set(pgs) if pg is not None}
    is_comm = cats == "comm_transfer"
    role = np.array([roles_of.get(pg) if c else None for pg, c in zip(pgs, is_comm.tolist())], dtype=object)
    last, peer = _last_arrivals(rank, segs, base, offset_us, arrivals)
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
    return RankSegs(rank, base, offset_us, np.concatenate([step[wait], step[keep]])[order], s_all[order],
                    np.concatenate([cut[wait], end[keep]])[order], cat_all.tolist(), role_all.tolist(),
                    np.concatenate([w_peer, np.full(int(keep.sum()), -1, np.int64)])[order])


def _expand(ranks: dict[int, RankSegs], r: int, t0: int, t1: int, depth: int,
            acc: dict[tuple[str, str | None, int], int], waits: dict[tuple[int, str | None], int],
            via: tuple[int, str | None] | None) -> None:
    """Add rank r's segments over [t0, t1) (r's ns) to ``acc``; comm_wait pieces follow the late peer."""
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
                _expand(ranks, p, a + sh, b + sh, depth + 1, acc, waits, (p, rs.role[i]))
                _fill_gap(ranks[p], a + sh, b + sh, r, rs.role[i], acc)
            else:
                acc[(rs.category[i], rs.role[i], r)] += b - a
                if via is not None:
                    waits[via] += b - a
        i += 1
    if covered < t1 - t0 and via is None:  # the critical rank has no segment here (cannot happen)
        acc[("idle_other", None, r)] += t1 - t0 - covered


def _fill_gap(peer: RankSegs, t0: int, t1: int, waiter: int, role: str | None,
              acc: dict[tuple[str, str | None, int], int]) -> None:
    """The part of [t0, t1) the peer has no segment for stays the waiter's comm_wait."""
    i = max(int(np.searchsorted(peer.end, t0, side="right")), 0)
    covered = 0
    while i < peer.start.size and peer.start[i] < t1:
        covered += max(0, min(int(peer.end[i]), t1) - max(int(peer.start[i]), t0))
        i += 1
    if covered < t1 - t0:
        acc[("comm_wait", role, waiter)] += t1 - t0 - covered


def _parts(acc: dict[tuple[str, str | None, int], int]) -> list[LedgerPart]:
    order = {c: i for i, c in enumerate(CATEGORIES)}
    items = [(k, v) for k, v in acc.items() if v > 0]
    items.sort(key=lambda kv: (-kv[1], order.get(kv[0][0], 99), kv[0][2]))
    return [{"category": c, "role": role, "rank": rank, "us": v / 1000.0} for (c, role, rank), v in items]


def _rank_step(rs: RankSegs, k: int) -> RankLedger:
    sel = np.flatnonzero(rs.step == k)
    acc: dict[tuple[str, str | None, int], int] = defaultdict(int)
    for i in sel:
        acc[(rs.category[i], rs.role[i], rs.rank)] += int(rs.end[i] - rs.start[i])
    total = int((rs.end[sel] - rs.start[sel]).sum())
    return {"step": int(k), "step_us": total / 1000.0, "parts": _parts(acc)}


def _durations(rs: RankSegs) -> dict[int, int]:
    d: dict[int, int] = defaultdict(int)
    for k, s, e in zip(rs.step.tolist(), rs.start.tolist(), rs.end.tolist()):
        d[k] += e - s
    return d


def _lower_median(items: list[tuple[int, int]]) -> int:
    """Step of the lower median of (duration, step) pairs."""
    items = sorted(items)
    return items[(len(items) - 1) // 2][1]


def build(segments: dict[int, pl.DataFrame], extracts: list[pl.DataFrame], matched: Any = None,
          clock: Any = None, role_of: RoleOf | None = None) -> JobLedger:
    """Per-rank ledgers and the job ledger (module docstring) from the ranks' segment tables."""
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
    durs = {r: _durations(rs) for r, rs in out.ranks.items()}
    common = set.intersection(*(set(d) for d in durs.values()))
    if common:
        crit = {k: max((durs[r][k], -r) for r in out.ranks) for k in common}
        k = _lower_median([(dur, k) for k, (dur, _neg) in crit.items()])
        r_star = -crit[k][1]
        rs = out.ranks[r_star]
        acc: dict[tuple[str, str | None, int], int] = defaultdict(int)
        waits: dict[tuple[int, str | None], int] = defaultdict(int)
        for i in np.flatnonzero(rs.step == k):
            _expand(out.ranks, r_star, int(rs.start[i]), int(rs.end[i]), 0, acc, waits, None)
        out.job = {"step": int(k), "step_us": crit[k][0] / 1000.0, "critical_rank": int(r_star), "parts": _parts(acc)}
        out.waited_on = [{"rank": p, "role": role, "us": v / 1000.0}
                         for (p, role), v in sorted(waits.items(), key=lambda kv: -kv[1])]
        out.job["waited_on"] = out.waited_on
    else:
        k = None
    for r, rs in out.ranks.items():
        d = durs[r]
        kk = k if k is not None and k in d else _lower_median([(v, s) for s, v in d.items()])
        out.per_rank[r] = _rank_step(rs, kk)
    return out
