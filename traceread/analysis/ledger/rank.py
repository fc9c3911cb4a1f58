"""The step ledger, map side: every nanosecond of each device-aligned step of one rank, labelled once.

Findings must be shares of one accounting of the step, never independent upper bounds that count
the same stall twice. This module cuts each step window ``[s, e)``
(:func:`traceread.analysis.time.steps.device_steps`) into segments, each with exactly one category, by
the first rule that applies at that instant (docs/ledger.md):

1. compute — a compute kernel runs (any kernel or memset the communication-kernel classifier does
   not call communication; memcpy is not compute): ``compute_bound`` if any running compute kernel
   is compute-bound, else ``memory_bound`` if any is memory-bound, else ``compute_other``. A
   kernel's bound is the roofline class of the CPU operator that launched it
   (:func:`traceread.analysis.compute.roofline.operator_table`, reused, not recomputed); unknown →
   ``compute_other``.
2. communication — no compute, a communication kernel runs: ``comm_transfer`` here, with the
   process group and start of the running communication kernel that started first (ties: the one
   launched first). The reduce
   side (:mod:`traceread.analysis.ledger.job`) splits off ``comm_wait`` (before the last member
   arrived) and turns pp waits into ``bubble``: that needs the other ranks.
3. ``exposed_memcpy`` — only memcpy runs.
4. GPU idle: for the idle gap ``[a, b)`` ended by the GPU event that starts at ``b`` (the one
   launched earliest when several start there), with ``L`` the start of its launching runtime call:
   ``host_bound`` = ``[a, clamp(L, a, b))`` (the work had not been launched: the CPU was behind);
   the rest ``dependency`` (launched, but waiting on an event/stream/sync; the reduce side makes it
   ``bubble`` on pipeline stages). A gap reaching the step's end, or whose launch is unknown:
   ``idle_other``.

All arithmetic runs on whole nanoseconds after the rank's first GPU event (``base_us``), so the
segments of a step sum to its window exactly. Adjacent segments with the same label are merged:
the table stays a few rows per kernel boundary that changes the category, small enough to ship to
the reduce side for thousands of ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from traceread import intervals as iv
from traceread.analysis.kinds import comm_mask
from traceread.analysis.time.breakdown import device_gpu_rows, snap_ns
from traceread.model import RankTrace, as_float
from traceread.report_schema import LEDGER_CATEGORIES

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

#: Every category of the ledger, in display order (compute first, idle last).
CATEGORIES = LEDGER_CATEGORIES
#: Categories that are useful work rather than time to recover.
USEFUL: frozenset[str] = frozenset({"compute_bound", "compute_other"})

#: One rank's segment table (times: whole ns after ``base_us``, the rank's trace clock).
SEGMENT_SCHEMA: dict[str, PolarsDataType] = {
    "step": pl.Int32,
    "start_ns": pl.Int64,
    "end_ns": pl.Int64,
    "category": pl.Enum(CATEGORIES),  # one byte per row
    "pg": pl.Utf8,  # communication segments: process group of the kernel that started first
    "kts_ns": pl.Int64,  # communication segments: that kernel's start and stream (to find its collective)
    "stream": pl.Int32,
    "base_us": pl.Float64,  # the rank's ns origin (same on every row)
}

_CB, _MB, _CO, _COMM, _MEM, _IDLE = range(6)
_BUSY_NAMES = ("compute_bound", "memory_bound", "compute_other", "comm_transfer", "exposed_memcpy")


def empty_segments() -> pl.DataFrame:
    return pl.DataFrame(schema=SEGMENT_SCHEMA)


def kernel_bounds(rt: RankTrace, gpu: pl.DataFrame, ops: pl.DataFrame | None) -> np.ndarray:
    """``"compute" | "memory" | None`` per GPU row: the roofline bound of its launching operator.

    A kernel belongs to the nearest operator (itself or an ancestor of ``gpu.op_row``) in the
    roofline's operator table, exactly as the roofline assigned kernel time.
    """
    out = np.full(gpu.height, None, dtype=object)
    if ops is None or ops.height == 0 or rt.host.height == 0:
        return out
    from traceread.analysis.compute.roofline import _parents, propagate_down

    known = ops.filter(pl.col("bound").is_not_null())
    if known.height == 0:
        return out
    own = np.full(rt.host.height, -1, dtype=np.int64)
    rows = known["row"].to_numpy().astype(np.int64)
    own[rows] = rows
    parent, depth = _parents(rt.host)
    owner = propagate_down(parent, depth, own)
    code = np.zeros(rt.host.height, dtype=np.int8)  # per host row: 0 unknown, 1 compute, 2 memory
    code[rows] = np.where(known["bound"].to_numpy() == "compute", 1, 2)
    op_rows = gpu["op_row"].fill_null(-1).to_numpy().astype(np.int64)
    ok = (op_rows >= 0) & (op_rows < owner.size)
    own = np.full(gpu.height, -1, dtype=np.int64)
    own[ok] = owner[op_rows[ok]]
    got = np.where(own >= 0, code[np.clip(own, 0, None)], 0)
    out[got == 1] = "compute"
    out[got == 2] = "memory"
    return out


def _launch_ns(rt: RankTrace, gpu: pl.DataFrame, base: float) -> np.ndarray:
    from traceread.analysis.time.idle import _launch_ts

    return snap_ns(_launch_ts(rt, gpu), base)


def _inside(points: np.ndarray, sets: iv.Intervals) -> np.ndarray:
    """For each point: inside one of the disjoint sorted intervals ``[s, e)``."""
    s, e = sets
    if s.size == 0:
        return np.zeros(points.size, dtype=bool)
    k = np.searchsorted(s, points, side="right") - 1
    kc = np.clip(k, 0, s.size - 1)
    return (k >= 0) & (points < e[kc])


def rank_segments(rt: RankTrace, windows: pl.DataFrame, ops: pl.DataFrame | None = None,
                  comm: pl.DataFrame | None = None) -> pl.DataFrame:
    """The ledger segments of every step window of ``rt`` (``windows``: step, start, end in µs).

    ``comm``: the rank's communication extract (:func:`traceread.analysis.comm.collectives.comm_events`);
    its host-side collectives (gloo) turn GPU idle the host spent in them into communication
    (:func:`host_comm_overlay`). Empty when the rank has no GPU events or no steps. Columns:
    :data:`SEGMENT_SCHEMA`.
    """
    gpu = device_gpu_rows(rt).sort("ts")
    if gpu.height == 0 or windows.height == 0:
        return empty_segments()
    base = as_float(gpu["ts"].min())
    ts, end = snap_ns(gpu["ts"].to_numpy(), base), snap_ns(gpu["end"].to_numpy(), base)
    kind = gpu["kind"].to_numpy()
    is_comm = comm_mask(gpu, rt.host).to_numpy() & (kind == "kernel")
    is_mem = kind == "memcpy"
    is_comp = ~is_comm & ~is_mem
    bound = kernel_bounds(rt, gpu, ops)
    cb = is_comp & (bound == "compute")
    mb = is_comp & (bound == "memory")
    sets = [iv.merge(ts[m], end[m]) for m in (cb, mb, is_comp & ~cb & ~mb, is_comm, is_mem)]

    win = windows.sort("start")
    w_s = snap_ns(win["start"].to_numpy(), base)
    w_e = snap_ns(win["end"].to_numpy(), base)
    w_step = win["step"].to_numpy().astype(np.int64)
    ci = np.flatnonzero(is_comm)
    points = np.unique(np.concatenate([w_s, w_e, ts[ci], end[ci], *[x for st in sets for x in st]]))
    p0, p1 = points[:-1], points[1:]
    k = np.searchsorted(w_s, p0, side="right") - 1
    kc = np.clip(k, 0, max(w_s.size - 1, 0))
    in_step = (k >= 0) & (p0 < w_e[kc])
    p0, p1, kc = p0[in_step], p1[in_step], kc[in_step]

    code = np.full(p0.size, _IDLE, dtype=np.int64)
    for c in (_MEM, _COMM, _CO, _MB, _CB):  # lowest rule number wins: paint it last
        code[_inside(p0, sets[c])] = c
    # communication: the running communication kernel that started first, ties: launched first
    # (paint the latest first, so the first one is painted last and wins).
    launch = _launch_ns(rt, gpu, base)
    who = np.full(p0.size, -1, dtype=np.int64)
    for i in ci[np.lexsort((-np.nan_to_num(launch[ci], nan=np.inf), -ts[ci]))]:
        lo, hi = np.searchsorted(p0, ts[i], side="left"), np.searchsorted(p0, end[i], side="left")
        who[lo:hi] = i
    who[code != _COMM] = -1

    # merge runs of equal (step, code, kernel) that touch
    brk = np.ones(p0.size, dtype=bool)
    brk[1:] = (kc[1:] != kc[:-1]) | (code[1:] != code[:-1]) | (who[1:] != who[:-1]) | (p0[1:] != p1[:-1])
    first = np.flatnonzero(brk)
    last = np.r_[first[1:], p0.size] - 1
    r_s, r_e, r_code, r_who, r_k = p0[first], p1[last], code[first], who[first], kc[first]

    busy = r_code != _IDLE
    cats: list[np.ndarray] = [np.array([_BUSY_NAMES[c] for c in r_code[busy]], dtype=object)]
    starts, ends, ks, whos = [r_s[busy]], [r_e[busy]], [r_k[busy]], [r_who[busy]]

    # idle gaps: host_bound before the next event's launch, then dependency; tail/unknown: idle_other
    g = ~busy
    a, b, gk = r_s[g], r_e[g], r_k[g]
    order = np.lexsort((np.nan_to_num(launch, nan=np.inf), ts))
    ts_sorted, launch_sorted = ts[order], launch[order]
    j = np.searchsorted(ts_sorted, b, side="left")
    jc = np.clip(j, 0, max(ts_sorted.size - 1, 0))
    has_next = (j < ts_sorted.size) & (ts_sorted[jc] == b) & (b < w_e[gk])
    lnext = np.where(has_next, launch_sorted[jc], np.nan)
    known = ~np.isnan(lnext)
    cut = np.clip(np.nan_to_num(lnext), a, b)
    for lo, hi, name, sel in ((a, cut, "host_bound", known), (cut, b, "dependency", known),
                              (a, b, "idle_other", ~known)):
        keep = sel & (hi > lo)
        starts.append(lo[keep])
        ends.append(hi[keep])
        ks.append(gk[keep])
        whos.append(np.full(int(keep.sum()), -1, dtype=np.int64))
        cats.append(np.full(int(keep.sum()), name, dtype=object))

    s_all = np.concatenate(starts)
    o = np.argsort(s_all, kind="stable")
    who_all = np.concatenate(whos)[o]
    pg_col = gpu["pg_name"].to_list()
    pgs = [pg_col[w] if w >= 0 else None for w in who_all.tolist()]
    kts = [int(ts[w]) if w >= 0 else None for w in who_all.tolist()]
    stream_col = gpu["stream"].to_list()
    streams = [stream_col[w] if w >= 0 else None for w in who_all.tolist()]
    frame = pl.DataFrame({
        "step": w_step[np.concatenate(ks)[o]],
        "start_ns": s_all[o].astype(np.int64),
        "end_ns": np.concatenate(ends)[o].astype(np.int64),
        "category": np.concatenate(cats)[o].tolist(),
        "pg": pgs,
        "kts_ns": kts,
        "stream": streams,
        "base_us": np.full(o.size, base),
    }, schema=SEGMENT_SCHEMA)
    spans = host_spans(comm, base)
    frame = host_comm_overlay(frame, spans) if spans is not None else frame
    return label_host_time(frame, rt, _launch_threads(rt, gpu, launch))


@dataclass
class HostSpans:
    """Host-side collectives of one rank (gloo spans): ns after the rank's base, sorted by start."""

    start: np.ndarray
    end: np.ndarray
    pg: list[str | None]
    stream: list[int | None]

    def who(self, p0: np.ndarray, p1: np.ndarray) -> np.ndarray:
        """Per piece ``[p0, p1)`` (inside no span boundary): the covering span that started first, else -1."""
        out = np.full(p0.size, -1, dtype=np.int64)
        for i in np.argsort(-self.start, kind="stable"):  # the first-started span is painted last and wins
            lo, hi = np.searchsorted(p0, self.start[i], side="left"), np.searchsorted(p0, self.end[i], side="left")
            out[lo:hi] = i
        return out


def host_spans(comm: pl.DataFrame | None, base: float) -> HostSpans | None:
    """The host-side collectives of a communication extract (backend ``gloo``), or None."""
    if comm is None or comm.height == 0 or "backend" not in comm.columns:
        return None
    rows = comm.filter((pl.col("backend") == "gloo") & pl.col("ts").is_not_null() & pl.col("end").is_not_null()
                       & (pl.col("end") > pl.col("ts"))).sort("ts")
    if rows.height == 0:
        return None
    return HostSpans(snap_ns(rows["ts"].to_numpy(), base), snap_ns(rows["end"].to_numpy(), base),
                     rows["pg"].to_list(), rows["stream"].to_list())


def _pieces(starts: np.ndarray, ends: np.ndarray, cuts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each interval ``[starts[i], ends[i])`` cut at the ``cuts`` inside it: (piece start, end, interval index)."""
    cuts = np.unique(cuts)
    p0: list[np.ndarray] = []
    p1: list[np.ndarray] = []
    idx: list[np.ndarray] = []
    for i, (a, b) in enumerate(zip(starts.tolist(), ends.tolist())):
        inner = cuts[np.searchsorted(cuts, a, side="right"):np.searchsorted(cuts, b, side="left")]
        edges = np.concatenate([[a], inner, [b]])
        p0.append(edges[:-1])
        p1.append(edges[1:])
        idx.append(np.full(edges.size - 1, i, dtype=np.int64))
    return np.concatenate(p0), np.concatenate(p1), np.concatenate(idx)


def host_comm_overlay(segs: pl.DataFrame, spans: HostSpans) -> pl.DataFrame:
    """GPU idle before the next launch (``host_bound``) or at the step's tail (``idle_other``) while
    the host was inside a host-side collective is communication (``comm_transfer`` of that
    collective's group; the reduce side splits off the wait): the host was not slow, it was
    all-reducing."""
    if segs.height == 0:
        return segs
    cand = segs["category"].cast(pl.Utf8).is_in(["host_bound", "idle_other"]).to_numpy()
    a, b = segs["start_ns"].to_numpy(), segs["end_ns"].to_numpy()
    merged_s, merged_e = iv.merge(spans.start, spans.end)
    k = np.searchsorted(merged_e, a, side="right")
    hit = cand & (k < merged_s.size) & (merged_s[np.clip(k, 0, max(merged_s.size - 1, 0))] < b)
    if not hit.any():
        return segs
    rows = np.flatnonzero(hit)
    p0, p1, idx = _pieces(a[rows].astype(np.float64), b[rows].astype(np.float64),
                          np.concatenate([spans.start, spans.end]).astype(np.float64))
    keep = p1 > p0
    p0, p1, idx = p0[keep], p1[keep], idx[keep]
    order = np.argsort(p0, kind="stable")
    who = np.empty(p0.size, dtype=np.int64)
    who[order] = spans.who(p0[order], p1[order])
    src = segs[rows.tolist()]
    cats = np.array(src["category"].cast(pl.Utf8).to_list(), dtype=object)[idx]
    inside = who >= 0
    new = pl.DataFrame({
        "step": src["step"].to_numpy()[idx],
        "start_ns": p0.astype(np.int64),
        "end_ns": p1.astype(np.int64),
        "category": np.where(inside, "comm_transfer", cats).tolist(),
        "pg": [spans.pg[w] if w >= 0 else None for w in who.tolist()],
        "kts_ns": [int(spans.start[w]) if w >= 0 else None for w in who.tolist()],
        "stream": [spans.stream[w] if w >= 0 else None for w in who.tolist()],
        "base_us": src["base_us"].to_numpy()[idx],
    }, schema=SEGMENT_SCHEMA)
    out = pl.concat([segs.filter(pl.Series(~hit)), new]).sort("start_ns", maintain_order=True)
    return _merge_runs(out)


def _merge_runs(segs: pl.DataFrame) -> pl.DataFrame:
    """Adjacent segments with the same (step, category, pg, kts_ns, stream) become one."""
    same = ((pl.col("step") == pl.col("step").shift(1)) & (pl.col("category") == pl.col("category").shift(1))
            & (pl.col("start_ns") == pl.col("end_ns").shift(1))
            & pl.col("pg").eq_missing(pl.col("pg").shift(1)) & pl.col("kts_ns").eq_missing(pl.col("kts_ns").shift(1))
            & pl.col("stream").eq_missing(pl.col("stream").shift(1)))
    run = (~same.fill_null(False)).cum_sum().alias("_run")
    return (segs.with_columns(run).group_by("_run", maintain_order=True)
            .agg(pl.col("step").first(), pl.col("start_ns").first(), pl.col("end_ns").last(),
                 pl.col("category").first(), pl.col("pg").first(), pl.col("kts_ns").first(),
                 pl.col("stream").first(), pl.col("base_us").first())
            .drop("_run").select(list(SEGMENT_SCHEMA)))


def host_segments(rt: RankTrace, windows: pl.DataFrame, comm: pl.DataFrame | None) -> pl.DataFrame:
    """The ledger of a rank without GPU work (CPU training, gloo): every instant of each host step
    window is ``compute_other`` when some thread runs an operator outside its own collectives,
    else ``comm_transfer`` while a host-side collective is in flight (the one that started first;
    the reduce side splits off the wait), else ``host_bound`` (no recorded operator: Python between
    operators, data loading, sleeping). Columns: :data:`SEGMENT_SCHEMA`."""
    from traceread.analysis.kinds import comm_op_expr

    host = rt.host.filter(pl.col("cat").is_in(["cpu_op", "user_annotation"]) & pl.col("ts").is_not_null()
                          & pl.col("end").is_not_null())
    if windows.height == 0 or host.height == 0:
        return empty_segments()
    base = float(min(float(windows["start"].min()), float(host["ts"].min())))  # type: ignore[arg-type]
    host = host.with_columns(comm_op_expr().alias("_comm"))
    work: list[iv.Intervals] = []
    for (_tid,), t in host.group_by(["tid"]):
        ops = t.filter((pl.col("cat") == "cpu_op") & ~pl.col("_comm"))
        own = t.filter(pl.col("_comm"))
        w = iv.merge(snap_ns(ops["ts"].to_numpy(), base), snap_ns(ops["end"].to_numpy(), base))
        if own.height:
            w = iv.subtract(w, iv.merge(snap_ns(own["ts"].to_numpy(), base), snap_ns(own["end"].to_numpy(), base)))
        work.append(w)
    busy = iv.union(*work) if work else (np.empty(0), np.empty(0))
    spans = host_spans(comm, base)
    cset = iv.merge(spans.start, spans.end) if spans is not None else (np.empty(0), np.empty(0))
    win = windows.sort("start")
    w_s, w_e = snap_ns(win["start"].to_numpy(), base), snap_ns(win["end"].to_numpy(), base)
    w_step = win["step"].to_numpy().astype(np.int64)
    points = np.unique(np.concatenate([w_s, w_e, *busy, *cset]))
    p0, p1 = points[:-1], points[1:]
    k = np.searchsorted(w_s, p0, side="right") - 1
    kc = np.clip(k, 0, max(w_s.size - 1, 0))
    ok = (k >= 0) & (p0 < w_e[kc])
    p0, p1, kc = p0[ok], p1[ok], kc[ok]
    comp = _inside(p0, busy)
    who = spans.who(p0, p1) if spans is not None else np.full(p0.size, -1, dtype=np.int64)
    who[comp] = -1
    cat = np.where(comp, "compute_other", np.where(who >= 0, "comm_transfer", "host_bound"))
    frame = pl.DataFrame({
        "step": w_step[kc],
        "start_ns": p0.astype(np.int64),
        "end_ns": p1.astype(np.int64),
        "category": cat.tolist(),
        "pg": [spans.pg[w] if w >= 0 else None for w in who.tolist()] if spans is not None else [None] * p0.size,
        "kts_ns": [int(spans.start[w]) if w >= 0 else None for w in who.tolist()] if spans is not None else [None] * p0.size,
        "stream": [spans.stream[w] if w >= 0 else None for w in who.tolist()] if spans is not None else [None] * p0.size,
        "base_us": np.full(p0.size, base),
    }, schema=SEGMENT_SCHEMA)
    return label_host_time(_merge_runs(frame), rt, {})


#: Categories whose time is the host's: each piece of it is labelled with the recorded span that
#: covers it (:mod:`traceread.analysis.time.host_spans`).
SPAN_CATEGORIES = ("host_bound", "idle_other")
#: Columns the span labelling adds to a segment table (null outside :data:`SPAN_CATEGORIES`).
SPAN_SCHEMA: dict[str, PolarsDataType] = {"span": pl.Utf8, "family": pl.Utf8, "inner": pl.Utf8}


def _launch_threads(rt: RankTrace, gpu: pl.DataFrame, launch_ns: np.ndarray) -> dict[int, int]:
    """Launch start (ns after base) -> the thread of that runtime call: a ``host_bound`` piece ends
    where the launch of the GPU work that ends its gap began, and that thread is the one that was behind."""
    if gpu.height == 0 or "launch_row" not in gpu.columns or rt.host.height == 0:
        return {}
    rows = gpu["launch_row"].fill_null(-1).to_numpy().astype(np.int64)
    ok = (rows >= 0) & (rows < rt.host.height) & ~np.isnan(launch_ns)
    tids = rt.host["tid"].fill_null(-1).to_numpy()
    out: dict[int, int] = {}
    for t, r in zip(launch_ns[ok].astype(np.int64).tolist(), rows[ok].tolist()):
        out.setdefault(int(t), int(tids[r]))
    return out


def label_host_time(segs: pl.DataFrame, rt: RankTrace, launch_tid: dict[int, int]) -> pl.DataFrame:
    """Cut each :data:`SPAN_CATEGORIES` segment at the host events of its thread and label every piece
    with the span that covers it (``span``, ``family``, ``inner``; null: no recorded span). The
    thread: the one that launched the work ending the gap (``launch_tid``, by the piece's end), else
    the main thread (always for ``idle_other``: nothing was launched). Sums per category are unchanged
    (docs/ledger.md)."""
    from traceread.analysis.time import host_spans as hs

    if segs.height == 0 or rt.host.height == 0:
        return segs.with_columns(*[pl.lit(None, t).alias(c) for c, t in SPAN_SCHEMA.items()])
    cand = segs["category"].cast(pl.Utf8).is_in(list(SPAN_CATEGORIES)).to_numpy()
    if not cand.any():
        return segs.with_columns(*[pl.lit(None, t).alias(c) for c, t in SPAN_SCHEMA.items()])
    base = float(segs["base_us"][0])
    main = hs.main_thread(rt)
    rows = np.flatnonzero(cand)
    a = segs["start_ns"].to_numpy()[rows]
    b = segs["end_ns"].to_numpy()[rows]
    is_hb = segs["category"].cast(pl.Utf8).to_numpy()[rows] == "host_bound"
    m = main if main is not None else -1
    tid = np.array([launch_tid.get(int(e), m) if h else m for e, h in zip(b.tolist(), is_hb.tolist())], dtype=np.int64)
    cats = {n: c for n, c in rt.host.select("name", "cat").unique(subset="name").iter_rows()}
    p0l, p1l, idxl, spanl, innerl = [], [], [], [], []
    for t in np.unique(tid).tolist():
        sel = np.flatnonzero(tid == t)
        cover = iv.merge(a[sel], b[sel])
        te = hs.thread_events(rt, int(t), base, int(a[sel].min()), int(b[sel].max()), cover)
        p0, p1, idx, span, inner = hs.label_pieces(te, a[sel], b[sel])
        p0l.append(p0)
        p1l.append(p1)
        idxl.append(rows[sel][idx])
        spanl += span
        innerl += inner
    idx_all = np.concatenate(idxl)
    src = segs[idx_all.tolist()]
    fam_of = {n: hs.family_of(n, cats.get(n)) for n in set(spanl) if n is not None}
    fams = [fam_of.get(n) if n is not None else None for n in spanl]
    new = src.with_columns(pl.Series("start_ns", np.concatenate(p0l), dtype=pl.Int64),
                           pl.Series("end_ns", np.concatenate(p1l), dtype=pl.Int64),
                           pl.Series("span", spanl, dtype=pl.Utf8), pl.Series("family", fams, dtype=pl.Utf8),
                           pl.Series("inner", innerl, dtype=pl.Utf8))
    rest = segs.filter(pl.Series(~cand)).with_columns(*[pl.lit(None, t).alias(c) for c, t in SPAN_SCHEMA.items()])
    return pl.concat([rest, new.select(rest.columns)]).sort("start_ns", maintain_order=True)


def step_totals(segments: pl.DataFrame) -> pl.DataFrame:
    """µs per (step, category) of one rank's segments — its per-step ledger on one rank alone."""
    return (segments.group_by("step", "category")
            .agg(((pl.col("end_ns") - pl.col("start_ns")).sum() / 1000.0).alias("us"))
            .sort("step", "category"))
