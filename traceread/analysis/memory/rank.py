"""One rank's ``[memory]`` events -> its memory summary (the map side; plain data for the summary).

Every allocation and free the caching allocator made while the profiler ran with
``profile_memory=True`` is an instant event carrying the device's running totals after it:
``Total Allocated`` (bytes in live tensors) and ``Total Reserved`` (bytes the allocator holds from
the device, live or cached). Per device (``cuda:0``, ``hip:0``, ``cpu``):

* peak allocated = the largest ``Total Allocated``; its time, the step holding it, its offset from
  the step start, the phase (:mod:`.phases`) and the operator that was running (the outermost
  ``cpu_op`` enclosing the event on the allocating thread; the innermost one too);
* fragmentation at the peak = reserved − allocated at that event (cached but unused bytes);
* peak reserved = the largest ``Total Reserved``; headroom = the device's memory
  (``deviceProperties.totalGlobalMem``, else the catalogue's nominal size) − peak reserved;
* per step: allocated at the step start (the level before its first event), its peak; growth per
  step = (last start − first start) ÷ (steps − 1); a leak when the start level rises at every step
  boundary over at least three steps by more than :data:`LEAK_MIN_BYTES` in all (without a baseline
  the first step is left out: it starts from zero);
* live at the peak: allocations made in the window and not freed by the peak (matched by address),
  summed by operator; what was allocated before the window is one line of its own.

Traces from 2021 carry only ``Bytes``: allocated is then their running sum from the window start
(``baseline_known`` false; no headroom). On the CPU, Kineto counts only what was allocated while it
ran (``Total Allocated`` starts from zero) and the CPU allocator reserves nothing: no reserved, no
fragmentation, no headroom.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from traceread.analysis.memory.phases import phase_at, step_phases
from traceread.model import RankTrace

#: c10::DeviceType codes as Kineto writes them in ``Device Type``.
DEVICE_TYPES: dict[int, str] = {0: "cpu", 1: "cuda", 6: "hip", 12: "xpu", 13: "mps", 19: "mtia", 20: "privateuseone"}
#: Points kept per chart line (first, lowest, highest and last of each bucket: the peak survives).
MAX_CHART_POINTS = 800
#: Operators listed in the live-at-the-peak breakdown.
TOP_LIVE = 8
#: Total growth below this over the analysed steps is allocator noise, not a leak.
LEAK_MIN_BYTES = 1 << 20
OPERATOR_CATS = ("cpu_op", "user_annotation", "python_function")
_STEP_PREFIX = "ProfilerStep#"
_NO_ID = -(2**62)


def device_label(device_type: int | None, device_id: int | None) -> str:
    kind = DEVICE_TYPES.get(device_type if device_type is not None else -1, f"device{device_type}")
    return kind if kind == "cpu" else f"{kind}:{device_id}"


def rank_memory(rt: RankTrace, spec_file: Path | None = None) -> dict[str, Any] | None:
    """``{"devices": [...]}`` for a rank with ``[memory]`` events (accelerators first, highest peak
    first), else None."""
    mem = rt.memory
    if mem.height == 0:
        return None
    ops = _OpIndex(rt.host)
    out = []
    keyed = mem.with_columns(pl.col("device_type").fill_null(-1), pl.col("device_id").fill_null(-1))
    for (dtype, did), g in keyed.group_by(["device_type", "device_id"], maintain_order=True):
        out.append(_device(rt, g, int(dtype), int(did), ops, spec_file))
    out.sort(key=lambda d: (d["device_type"] == 0, -(d["peak_allocated_bytes"] or 0)))
    return {"devices": out}


def _device(rt: RankTrace, g: pl.DataFrame, dtype: int, did: int, ops: _OpIndex,
            spec_file: Path | None) -> dict[str, Any]:
    ts = g["ts"].to_numpy()
    nbytes = g["bytes"].fill_null(0).to_numpy().astype(np.int64)
    totals = g["total_allocated"]
    has_totals = totals.null_count() == 0
    alloc = totals.to_numpy().astype(np.int64) if has_totals else np.cumsum(nbytes)
    res_col = g["total_reserved"]
    reserved = (res_col.to_numpy().astype(np.int64)
                if has_totals and res_col.null_count() == 0 and int(res_col.max() or 0) > 0 else None)  # type: ignore[arg-type]
    baseline_known = has_totals and dtype != 0
    start_level = int(alloc[0] - nbytes[0])
    i = int(np.argmax(alloc))
    peak_t = float(ts[i])
    steps = _steps(rt)
    step_of = _step_index(steps, ts)
    si = int(step_of[i])
    phases = step_phases(rt.host, float(steps["ts"][si]), float(steps["end"][si])) if si >= 0 else []
    inner = ops.enclosing(g.slice(i, 1))
    d: dict[str, Any] = {
        "device": device_label(dtype, did), "device_type": dtype, "device_id": did, "events": g.height,
        "totals_recorded": has_totals, "baseline_known": baseline_known, "reserved_recorded": reserved is not None,
        "window_start_allocated_bytes": start_level if baseline_known else None,
        "peak_allocated_bytes": int(alloc[i]), "peak_us": peak_t,
        "peak_step": int(steps["step"][si]) if si >= 0 else None,
        "peak_offset_us": peak_t - float(steps["ts"][si]) if si >= 0 else None,
        "peak_phase": phase_at(phases, peak_t) if si >= 0 else None,
        "peak_operator": ops.operator(int(inner[0]), peak_t), "peak_op_innermost": ops.innermost_op(int(inner[0]), peak_t),
        "peak_context": ops.context(int(inner[0]), peak_t),
        "floor_allocated_bytes": int(min(start_level, int(alloc.min()))),
        "reserved_at_peak_bytes": int(reserved[i]) if reserved is not None else None,
        "fragmentation_bytes": int(reserved[i] - alloc[i]) if reserved is not None else None,
        "fragmentation_pct": (100.0 * float(reserved[i] - alloc[i]) / float(reserved[i])
                              if reserved is not None and reserved[i] > 0 else None),
        "peak_reserved_bytes": int(reserved.max()) if reserved is not None else None,
        "peak_reserved_us": float(ts[int(np.argmax(reserved))]) if reserved is not None else None,
    }
    d.update(_headroom(rt, dtype, did, d, spec_file))
    d["steps"] = _per_step(steps, step_of, ts, nbytes, alloc, reserved)
    d.update(_growth(d["steps"], baseline_known))
    d.update(_live_at_peak(g, i, ops, start_level if baseline_known else None))
    d["timeline"] = _timeline(rt, steps, si, phases, ts, alloc, reserved, start_level)
    return d


# ---- steps -----------------------------------------------------------------------------------------------


def _steps(rt: RankTrace) -> pl.DataFrame:
    return rt.steps.select("step", "ts", "end").sort("ts")


def _step_index(steps: pl.DataFrame, ts: np.ndarray) -> np.ndarray:
    """Row of the host step window [ts, end) holding each time, -1 outside every step."""
    if steps.height == 0:
        return np.full(len(ts), -1, dtype=np.int64)
    starts = steps["ts"].to_numpy()
    ends = steps["end"].to_numpy()
    j = np.searchsorted(starts, ts, side="right") - 1
    ok = (j >= 0) & (ends[np.clip(j, 0, None)] > ts)
    return np.where(ok, j, -1)


def _per_step(steps: pl.DataFrame, step_of: np.ndarray, ts: np.ndarray, nbytes: np.ndarray, alloc: np.ndarray,
              reserved: np.ndarray | None) -> list[dict[str, Any]]:
    out = []
    for j in range(steps.height):
        idx = np.flatnonzero(step_of == j)
        if idx.size == 0:
            continue
        k = idx[int(np.argmax(alloc[idx]))]
        out.append({
            "step": int(steps["step"][j]), "events": int(idx.size),
            "start_allocated_bytes": int(alloc[idx[0]] - nbytes[idx[0]]),
            "peak_allocated_bytes": int(alloc[k]), "peak_offset_us": float(ts[k] - steps["ts"][j]),
            "peak_reserved_bytes": int(reserved[idx].max()) if reserved is not None else None,
        })
    return out


def _growth(steps: list[dict[str, Any]], baseline_known: bool) -> dict[str, Any]:
    """Growth of the start level per step, and whether it is a leak (see the module docstring). Counted
    from the window start (no baseline), the first step starts at 0 while later ones count what it
    allocated and kept (gradients, optimizer state): growth is measured from the second step on."""
    levels = [s["start_allocated_bytes"] for s in steps]
    if not baseline_known:
        levels = levels[1:]
    if len(levels) < 2:
        return {"growth_per_step_bytes": None, "leak": False}
    growth = (levels[-1] - levels[0]) / (len(levels) - 1)
    rising = all(b > a for a, b in zip(levels, levels[1:]))
    return {"growth_per_step_bytes": float(growth),
            "leak": bool(rising and len(levels) >= 3 and levels[-1] - levels[0] > LEAK_MIN_BYTES)}


# ---- headroom -------------------------------------------------------------------------------------------


def _headroom(rt: RankTrace, dtype: int, did: int, d: dict[str, Any], spec_file: Path | None) -> dict[str, Any]:
    cap, source = (None, None) if dtype == 0 else _capacity(rt, did, spec_file)
    used = d["peak_reserved_bytes"] if d["peak_reserved_bytes"] is not None else d["peak_allocated_bytes"]
    if cap is None or not d["baseline_known"]:
        return {"capacity_bytes": cap, "capacity_source": source, "headroom_bytes": None, "headroom_pct": None}
    return {"capacity_bytes": cap, "capacity_source": source, "headroom_bytes": int(cap - used),
            "headroom_pct": 100.0 * (cap - used) / cap}


def _capacity(rt: RankTrace, did: int, spec_file: Path | None) -> tuple[int | None, str | None]:
    """The device's memory: ``deviceProperties.totalGlobalMem`` of that device id, else the catalogue's
    nominal size of the rank's device (``traceread.analysis.hardware``)."""
    from traceread.read.columns import to_int

    for dev in rt.meta.devices or []:
        if isinstance(dev, dict) and to_int(dev.get("id")) == did:
            total = to_int(dev.get("totalGlobalMem"))
            if total:
                return total, "deviceProperties"
    if rt.meta.device_id is None or rt.meta.device_id == did:
        from traceread.analysis.hardware import device_for_meta

        spec = device_for_meta(rt.meta, spec_file).spec
        if spec is not None and spec.memory_bytes:
            return int(spec.memory_bytes), f"catalogue ({spec.variant}, nominal)"
    return None, None


# ---- live at the peak -----------------------------------------------------------------------------------


def _live_at_peak(g: pl.DataFrame, i: int, ops: _OpIndex, before: int | None) -> dict[str, Any]:
    """Allocations of the window still live at event ``i`` (the last event of their address up to it is
    an allocation), summed by operator."""
    upto = g.head(i + 1).with_row_index("_i").filter(pl.col("addr").is_not_null())
    last = upto.group_by("addr").agg(pl.col("_i").max()).get_column("_i")
    live = upto.filter(pl.col("_i").is_in(last.implode()) & (pl.col("bytes") > 0))
    rows = ops.enclosing(live)
    names = [ops.operator(int(r), float(t)) or "(no operator recorded)" for r, t in zip(rows, live["ts"].to_list())]
    by = (pl.DataFrame({"operator": names, "bytes": live["bytes"]}, schema={"operator": pl.Utf8, "bytes": pl.Int64})
          .group_by("operator").agg(pl.col("bytes").sum(), pl.len().alias("allocations"))
          .sort(["bytes", "operator"], descending=[True, False]))
    return {"live_at_peak": [{"operator": o, "bytes": int(b), "allocations": int(n)}
                             for o, b, n in by.head(TOP_LIVE).iter_rows()],
            "live_in_window_bytes": int(live["bytes"].sum() or 0), "live_before_window_bytes": before}


# ---- chart --------------------------------------------------------------------------------------------


def _timeline(rt: RankTrace, steps: pl.DataFrame, si: int, phases: list[dict[str, Any]], ts: np.ndarray,
              alloc: np.ndarray, reserved: np.ndarray | None, start_level: int) -> dict[str, Any]:
    """Allocated (and reserved) over the step holding the peak, µs from its start, as a step function
    (each point holds until the next); the whole window when the peak lies outside every step."""
    if si >= 0:
        lo, hi = float(steps["ts"][si]), float(steps["end"][si])
        step = int(steps["step"][si])
    else:
        lo, hi, step = float(ts[0]), float(ts[-1]), None
    idx = np.flatnonzero((ts >= lo) & (ts < hi)) if si >= 0 else np.arange(len(ts))
    before = np.flatnonzero(ts < lo)
    level0 = int(alloc[before[-1]]) if before.size else start_level
    res0 = int(reserved[before[-1]]) if reserved is not None and before.size else (
        int(reserved[idx[0]]) if reserved is not None and idx.size else None)
    keep = _decimate(alloc[idx]) if idx.size else np.array([], dtype=np.int64)
    sel = idx[keep]
    t = [0.0] + [float(x - lo) for x in ts[sel]] + [hi - lo]
    a = [level0] + [int(x) for x in alloc[sel]] + [int(alloc[idx[-1]]) if idx.size else level0]
    r = None
    if reserved is not None:
        r = [res0] + [int(x) for x in reserved[sel]] + [int(reserved[idx[-1]]) if idx.size else res0]
    return {"step": step, "start_us": lo, "duration_us": hi - lo, "t_us": t, "allocated": a, "reserved": r,
            "phases": [{"name": p["name"], "start_us": float(p["start_us"]) - lo, "end_us": float(p["end_us"]) - lo}
                       for p in phases]}


def _decimate(values: np.ndarray, limit: int = MAX_CHART_POINTS) -> np.ndarray:
    """Indices keeping at most ``limit`` points: per bucket its first, lowest, highest and last."""
    n = len(values)
    if n <= limit:
        return np.arange(n)
    buckets = np.array_split(np.arange(n), max(1, limit // 4))
    keep: set[int] = set()
    for b in buckets:
        v = values[b]
        keep.update((int(b[0]), int(b[int(np.argmin(v))]), int(b[int(np.argmax(v))]), int(b[-1])))
    return np.array(sorted(keep), dtype=np.int64)


# ---- which operator was running ------------------------------------------------------------------------


class _OpIndex:
    """The host call tree, to name the operator that encloses a time on a thread.

    The innermost enclosing event is the last nesting event (``cpu_op``, ``user_annotation``,
    ``python_function``) on that thread that started at or before the time, or the first of its
    ancestors still open then (the reader's nesting rule: starting-time containment)."""

    def __init__(self, host: pl.DataFrame) -> None:
        nest = host.filter(pl.col("cat").is_in(OPERATOR_CATS).fill_null(False))
        self.cand = nest.select(pl.col("pid").fill_null(_NO_ID), pl.col("tid").fill_null(_NO_ID), "ts",
                                pl.col("row").alias("_row")).sort("ts")
        self.cat = host["cat"].fill_null("").to_list()
        self.name = host["name"].fill_null("").to_list()
        self.ts = host["ts"].to_numpy()
        self.end = host["end"].to_numpy()
        self.parent = host["parent"].fill_null(-1).to_numpy()
        self._memo: dict[int, list[int]] = {}

    def enclosing(self, events: pl.DataFrame) -> np.ndarray:
        """Host row of the innermost nesting event enclosing each event (its ``pid``, ``tid``, ``ts``),
        -1 where none."""
        n = events.height
        if n == 0 or self.cand.height == 0:
            return np.full(n, -1, dtype=np.int64)
        q = events.select(pl.col("pid").fill_null(_NO_ID), pl.col("tid").fill_null(_NO_ID), "ts").with_row_index("_q")
        hit = q.sort("ts").join_asof(self.cand, on="ts", by=["pid", "tid"], strategy="backward",
                                     check_sortedness=False).sort("_q")  # both sorted by ts just above
        row = hit["_row"].fill_null(-1).to_numpy().astype(np.int64)
        t = hit["ts"].to_numpy()
        for _ in range(512):  # deeper than any call tree; each pass moves every stale row one level up
            stale = (row >= 0) & (self.end[np.clip(row, 0, None)] <= t)
            if not stale.any():
                break
            row[stale] = self.parent[row[stale]]
        return row

    def _chain(self, row: int, t: float) -> list[int]:
        """``row`` and its ancestors that are open at ``t``, innermost first. The time test matters: the
        reader nests an event that starts where its predecessor ends (``ts + dur`` rounded a hair past
        the next ``ts``) under that predecessor, which is over by ``t``."""
        return [r for r in self._ancestors(row) if self.ts[r] <= t < self.end[r]]

    def _ancestors(self, row: int) -> list[int]:
        """``row`` and all its ancestors, innermost first (memoised: allocations share their operators)."""
        hit = self._memo.get(row)
        if hit is None:
            hit = []
            r = row
            while r >= 0 and len(hit) < 512:
                hit.append(r)
                r = int(self.parent[r])
            self._memo[row] = hit
        return hit

    def _named(self, row: int, t: float) -> list[int]:
        """Operators and annotations open at ``t`` (not the step annotation, which 2021 traces record as
        an operator), innermost first."""
        return [r for r in self._chain(row, t) if self.cat[r] in ("cpu_op", "user_annotation")
                and not self.name[r].startswith(_STEP_PREFIX)]

    def operator(self, row: int, t: float) -> str | None:
        """The outermost ``cpu_op`` open at ``t`` around ``row`` (what the Python code called), else the
        innermost annotation, else None."""
        chain = self._named(row, t)
        ops = [r for r in chain if self.cat[r] == "cpu_op"]
        if ops:
            return self.name[ops[-1]]
        return self.name[chain[0]] if chain else None

    def innermost_op(self, row: int, t: float) -> str | None:
        ops = [r for r in self._named(row, t) if self.cat[r] == "cpu_op"]
        return self.name[ops[0]] if ops else None

    def context(self, row: int, t: float, limit: int = 6) -> list[str]:
        """Enclosing operators and annotations, outermost first (at most ``limit``, the innermost kept)."""
        return [self.name[r] for r in reversed(self._named(row, t)[:limit])]
