"""Which recorded host span covers each instant of host time: the data loader, the optimizer step, a
``.item()`` sync, a checkpoint, a user's ``record_function`` — or nothing at all.

The ledger says *that* the host was behind (``host_bound``); the host trace says *with what*. The
answer must come from the spans the trace holds, never from a guess: "outside any operator" only
for time no recorded span covers. Definitions (docs/ledger.md, "Which span covers host time"):

* the **thread** of a piece of host time: on a rank with GPU work, the thread whose runtime call
  launched the GPU work that ended the idle gap (what the CPU was doing instead of launching it);
  on a rank without GPU work, the **main thread** (the one holding ``ProfilerStep#N``, else the one
  with the most recorded time);
* the **covering chain** at instant t: the events of that thread with ``ts <= t < end``
  (``ProfilerStep#N`` excluded: it covers every step and says nothing);
* the **span** at t: the innermost event of the chain whose name has a specific family in
  :data:`FAMILIES` (data loading, optimizer, sync, checkpoint, GC, framework phases); else the
  innermost user annotation (``record_function``); else the innermost event of any kind (Python
  function, operator, runtime call); none when the chain is empty (**uncovered**). Innermost is the
  latest start (ties: the earliest end);
* **inner**: the innermost event of the chain (the detail inside the span: the Python frame or
  operator the time was in), when it differs from the span.

Families are decided by the span's own name (this table, first match wins), and the time by the
structure: which span covers it. Nothing here depends on a case's name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import polars as pl

from traceread.model import RankTrace

#: (family, pattern on the span's name) — first match wins. Generic families (``annotation``,
#: ``python``, ``operator``) come from the event's category when nothing here matches.
FAMILIES: tuple[tuple[str, str], ...] = (
    ("communication", r"^(gloo|nccl|c10d|mpi|ucc):|^c10d::|^record_param_comms$|^nccl:|ProcessGroup"),
    ("data_loading", r"^enumerate\(DataLoader\)|DataLoaderIter|DataLoader\.__next__|_next_data|"
                     r"train_dataloader_next|\[_TrainingEpochLoop\].*dataloader|fetch_batch|get_batch"),
    ("checkpoint", r"(?i)checkpoint|torch\.save|^save_model|_save_checkpoint|state_dict_saver|"
                   r"aten::.*_save|serializ|write_files"),
    ("gc", r"(?i)^(python )?gc(\b|_)|gc\.collect|garbage.collect"),
    ("sync", r"^(cudaStreamSynchronize|cudaDeviceSynchronize|cudaEventSynchronize|cudaMemcpy|hipStreamSynchronize|"
             r"hipDeviceSynchronize|hipMemcpy|aten::item|aten::_local_scalar_dense|aten::is_nonzero|"
             r"aten::nonzero|aten::equal)$"),
    ("optimizer", r"^Optimizer\.(step|zero_grad)#|optimizer_step|\[Strategy\].*optimizer|DeepSpeedEngine\.step|"
                  r"^optimizer\b|clip_grad"),
    ("logging", r"(?i)\blog(ging|_metrics|_dict)?\b|on_log|wandb|tensorboard"),
    ("evaluation", r"(?i)\beval(uat(e|ion))?\b|validation_step|\[_EvaluationLoop\]"),
    ("framework_step", r"^\[(LightningModule|Strategy|Callback|_TrainingEpochLoop|_AutomaticOptimization)\]|"
                       r"^DeepSpeedEngine|^(Trainer|accelerate)\.|training_step|train_step"),
)
#: Families that say what the host did (a named cause), as opposed to generic spans.
SPECIFIC = frozenset(f for f, _ in FAMILIES)
#: Generic families, by event category.
GENERIC = {"user_annotation": "annotation", "python_function": "python"}

#: Host categories whose events can cover host time (GPU-side annotations and instants cannot).
HOST_CATS = ("cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver", "cuda_sync")

_COMPILED = tuple((f, re.compile(p)) for f, p in FAMILIES)


@lru_cache(maxsize=65536)
def specific_family(name: str) -> str | None:
    """The specific family of a span name (:data:`FAMILIES`), None when none matches."""
    for fam, rx in _COMPILED:
        if rx.search(name):
            return fam
    return None


def family_of(name: str, cat: str | None) -> str:
    """A span's family: the table's, else its category's (annotation, python, operator)."""
    return specific_family(name) or GENERIC.get(cat or "", "operator")


@dataclass
class ThreadEvents:
    """One thread's events that can cover host time, sorted by (start, −end), ns after the rank's base."""

    start: np.ndarray
    end: np.ndarray
    name: list[str]
    rank_: np.ndarray  # 0 generic (operator/python/runtime), 1 user annotation, 2 specific family


def thread_events(rt: RankTrace, tid: int, base_us: float, lo_ns: int, hi_ns: int,
                  cover: tuple[np.ndarray, np.ndarray] | None = None) -> ThreadEvents:
    """Events of thread ``tid`` that overlap ``[lo_ns, hi_ns)`` (and, when given, the union of
    intervals ``cover``: only those can be in a chain there)."""
    from traceread.analysis.time.breakdown import snap_ns

    h = rt.host
    sel = (h["tid"] == tid).fill_null(False) & h["cat"].is_in(list(HOST_CATS)).fill_null(False) \
        & h["ts"].is_not_null() & h["end"].is_not_null() & ~h["name"].str.starts_with("ProfilerStep#").fill_null(True)
    ev = h.filter(sel).select("name", "cat", "ts", "end")
    s = snap_ns(ev["ts"].to_numpy(), base_us)
    e = snap_ns(ev["end"].to_numpy(), base_us)
    keep = (e > lo_ns) & (s < hi_ns) & (e > s)
    if cover is not None and cover[0].size:
        cs, ce = cover  # disjoint, sorted: an event overlaps one when the first ending after its start begins before its end
        k = np.searchsorted(ce, s, side="right")
        kc = np.clip(k, 0, cs.size - 1)
        keep &= (k < cs.size) & (cs[kc] < e)
    ev = ev.filter(pl.Series(keep))
    s, e = s[keep], e[keep]
    order = np.lexsort((-e, s))
    ev = ev[order.tolist()] if ev.height else ev
    fams = {n: specific_family(n) for n in ev["name"].unique().to_list()}
    spec = ev["name"].replace_strict(fams, default=None, return_dtype=pl.Utf8).is_not_null().to_numpy()
    ann = (ev["cat"] == "user_annotation").fill_null(False).to_numpy()
    rk = np.where(spec, 2, np.where(ann, 1, 0)).astype(np.int8)
    return ThreadEvents(s[order].astype(np.int64), e[order].astype(np.int64), ev["name"].to_list(), rk)


def _parents(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Enclosing event of each (sorted by start, then longest first; nested on one thread), −1 at the
    top: the nearest earlier event still open at its start, by pointer jumping (a candidate that ended
    before is left for its own enclosing candidate, never past the true parent)."""
    par = np.arange(start.size, dtype=np.int64) - 1
    for _ in range(128):
        live = np.flatnonzero(par >= 0)
        bad = live[end[par[live]] <= start[live]]
        if bad.size == 0:
            break
        par[bad] = par[par[bad]]
    return par


def _nearest(par: np.ndarray, own: np.ndarray) -> np.ndarray:
    """Per event: itself when ``own``, else its nearest enclosing event that is, else −1."""
    out = np.where(own, np.arange(own.size), -2).astype(np.int64)
    ptr = par.copy()
    todo = np.flatnonzero(out == -2)
    for _ in range(256):
        if todo.size == 0:
            break
        p = ptr[todo]
        top = p < 0
        out[todo[top]] = -1
        hit = ~top & own[np.clip(p, 0, None)]
        out[todo[hit]] = p[hit]
        rest = ~top & ~hit
        ptr[todo[rest]] = par[p[rest]]
        todo = todo[rest]
    out[out == -2] = -1
    return out


def label_pieces(te: ThreadEvents, starts: np.ndarray, ends: np.ndarray) -> tuple[
        np.ndarray, np.ndarray, np.ndarray, list[str | None], list[str | None]]:
    """Cut each interval ``[starts[i], ends[i])`` (disjoint) at the thread's event boundaries and label
    each piece with its span and inner event (module docstring). Returns (piece start, piece end,
    interval index, span name or None, inner name or None); adjacent pieces of one interval with the
    same labels are merged. Vectorised: nesting by pointer jumping, no per-event Python."""
    order = np.argsort(starts, kind="stable")
    a, b = starts[order].astype(np.int64), ends[order].astype(np.int64)
    ok = b > a
    order, a, b = order[ok], a[ok], b[ok]
    if a.size == 0:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty, empty, [], []
    cuts = np.concatenate([te.start, te.end]) if te.start.size else np.empty(0, np.int64)
    points = np.unique(np.concatenate([a, b, cuts]))
    p0, p1 = points[:-1], points[1:]
    k = np.searchsorted(a, p0, side="right") - 1
    kc = np.clip(k, 0, a.size - 1)
    inside = (k >= 0) & (p0 < b[kc])
    p0, p1, kc = p0[inside], p1[inside], kc[inside]
    n = te.start.size
    inner = np.full(p0.size, -1, dtype=np.int64)
    span = np.full(p0.size, -1, dtype=np.int64)
    if n:
        par = _parents(te.start, te.end)
        x = np.searchsorted(te.start, p0, side="right") - 1  # last event started by p0, then up while closed
        for _ in range(4096):
            open_ = x >= 0
            closed = np.flatnonzero(open_)[te.end[x[open_]] <= p0[open_]]
            if closed.size == 0:
                break
            x[closed] = par[x[closed]]
        inner = x
        spec = _nearest(par, te.rank_ == 2)
        ann = _nearest(par, te.rank_ == 1)
        has = inner >= 0
        xi = np.clip(inner, 0, None)
        span = np.where(has, np.where(spec[xi] >= 0, spec[xi], np.where(ann[xi] >= 0, ann[xi], inner)), -1)
    # merge by name (two sibling operators of one name in a row are one label)
    _u, code = np.unique(np.array(te.name + [""], dtype=object).astype(str), return_inverse=True)
    code = np.append(code[:-1], -1)  # index -1: no event
    sc, ic = code[span], code[inner]
    brk = np.ones(p0.size, dtype=bool)
    brk[1:] = (kc[1:] != kc[:-1]) | (p0[1:] != p1[:-1]) | (sc[1:] != sc[:-1]) | (ic[1:] != ic[:-1])
    first = np.flatnonzero(brk)
    last = np.r_[first[1:], p0.size] - 1
    names = np.array(te.name + [None], dtype=object)  # index -1: None
    sp, inn = span[first], inner[first]
    span_names = names[sp].tolist()
    same = code[inn] == code[sp]
    inner_names = [None if eq else nm for eq, nm in zip(same.tolist(), names[inn].tolist())]
    return p0[first], p1[last], order[kc[first]], span_names, inner_names


def main_thread(rt: RankTrace) -> int | None:
    """The thread holding ``ProfilerStep#N`` (the training loop's), else the one with the most
    top-level recorded time; None without host events."""
    h = rt.host.filter(pl.col("tid").is_not_null() & pl.col("dur").is_not_null())
    if h.height == 0:
        return None
    ps = h.filter(pl.col("name").str.starts_with("ProfilerStep#"))
    if ps.height:
        return int(ps.group_by("tid").agg(pl.col("dur").sum()).sort(["dur", "tid"], descending=[True, False])["tid"][0])
    top = h.filter(pl.col("parent").is_null() & pl.col("cat").is_in(["cpu_op", "user_annotation"]))
    if top.height == 0:
        top = h
    return int(top.group_by("tid").agg(pl.col("dur").sum()).sort(["dur", "tid"], descending=[True, False])["tid"][0])


#: Schema of the per-rank span times (:func:`span_times`).
SPAN_TIME_SCHEMA = {"name": pl.Utf8, "family": pl.Utf8, "us": pl.Float64, "count": pl.Int64}
#: Span names kept per rank in :func:`span_times` (the largest), so the summary stays small.
KEEP_SPANS = 24


def span_times(rt: RankTrace, windows: pl.DataFrame) -> pl.DataFrame:
    """Per span name with a specific family, or a user annotation, on any host thread: its time inside
    the rank's step windows (µs, nested repeats of the same name counted once, events starting
    inside a window) and how many there were — "the same span on the other ranks"."""
    h = rt.host
    if h.height == 0 or windows.height == 0:
        return pl.DataFrame(schema=SPAN_TIME_SCHEMA)
    ev = h.filter(pl.col("cat").is_in(["cpu_op", "user_annotation", "python_function", "cuda_runtime"])
                  & pl.col("ts").is_not_null() & pl.col("dur").is_not_null()
                  & ~pl.col("name").str.starts_with("ProfilerStep#").fill_null(True))
    if ev.height == 0:
        return pl.DataFrame(schema=SPAN_TIME_SCHEMA)
    names = ev["name"].unique().to_list()
    cats = dict(ev.group_by("name").agg(pl.col("cat").first()).iter_rows())
    fam = {n: family_of(n, cats.get(n)) for n in names}
    keep = [n for n in names if (fam[n] in SPECIFIC and fam[n] != "communication") or fam[n] == "annotation"]
    if not keep:
        return pl.DataFrame(schema=SPAN_TIME_SCHEMA)
    ev = ev.filter(pl.col("name").is_in(keep))
    w = windows.sort("start")
    ws, we = w["start"].to_numpy(), w["end"].to_numpy()
    ts = ev["ts"].to_numpy()
    k = np.searchsorted(ws, ts, side="right") - 1
    kc = np.clip(k, 0, max(ws.size - 1, 0))
    inside = (k >= 0) & (ts < we[kc])
    ev = ev.filter(pl.Series(inside))
    if ev.height == 0:
        return pl.DataFrame(schema=SPAN_TIME_SCHEMA)
    # nested repeats of one name (a recursive record_function) count once: only those whose parent
    # does not carry the same name
    if "parent" in ev.columns:
        parent_name = rt.host["name"].to_numpy()
        par = ev["parent"].fill_null(-1).to_numpy().astype(np.int64)
        ok = par >= 0
        same = np.zeros(ev.height, dtype=bool)
        same[ok] = parent_name[par[ok]] == ev["name"].to_numpy()[ok]
        ev = ev.filter(pl.Series(~same))
    out = (ev.group_by("name").agg(pl.col("dur").sum().alias("us"), pl.len().cast(pl.Int64).alias("count"))
           .with_columns(pl.col("name").replace_strict(fam, default="annotation").alias("family"))
           .sort(["us", "name"], descending=[True, False]).head(KEEP_SPANS))
    return out.select([pl.col(c).cast(t) for c, t in SPAN_TIME_SCHEMA.items()])
