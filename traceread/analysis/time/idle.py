"""Why the GPU sat idle: the host was late, kernels were merely back to back, or something else.

Idle time alone does not say what to fix. If the GPU drained and the next kernel had not even been
launched yet, the host (Python, data loading, a sync) is the bottleneck; if the launch was already
queued and the gap is tiny, it is launch/scheduling latency between back-to-back kernels.

Classification of one idle gap ``[g0, g1)`` (HTA ``get_idle_time_breakdown``, µs):

* **host_bound** — only the part of the gap before the runtime call that launched the activity
  ending it started: ``[g0, clamp(L, g0, g1))`` with ``L = host.ts[launch_row]``. Until then the
  GPU had nothing queued and the CPU was behind; once the work was launched, the rest of the gap
  is waiting on something else (a dependency, an event, a pipeline peer), never the host. This is
  the step ledger's ``host_bound`` (:mod:`traceread.analysis.ledger.rank`). HTA calls the whole gap
  host-bound; so does the per-stream view below, which reproduces HTA.
* **kernel_gap** — the rest of the gap ``[clamp(L, g0, g1), g1)`` when it is shorter than
  ``kernel_gap_threshold_us`` (default 30 µs — HTA's ``consecutive_kernel_delay``; its docs say
  "30 ns" but its data are µs): launch/scheduling latency between back-to-back kernels.
* **other** — the rest of longer gaps (work already queued: stream/event waits, syncs, ...).

Activities without a launch link (the profiler lost their runtime event) cannot be host_bound; they
fall to the threshold test. (HTA instead joins them to trace row 0 and so usually calls them
host-wait.) A gap after the last activity of the trace has nothing ending it: other.

Two granularities are returned:

* **whole GPU** (the top-level ``*_us`` keys): gaps of the union of every kernel, memcpy and memset
  over all streams, clipped to the window. They split exactly the idle time of
  :func:`traceread.analysis.time.breakdown.rank_breakdown` on the same window:
  host_bound + kernel_gap + other = idle.
* **per stream** (``streams``): HTA's own view — for each stream the gaps between its consecutive
  activities, ignoring the other streams (a stream waiting while another works still counts idle),
  clipped to the window; no gap before a stream's first or after its last activity. Each row's
  three parts sum to its ``idle_us``. These numbers match HTA's per-stream output.

The window defaults to first GPU start .. last GPU end (as for the breakdown).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from traceread import intervals as iv
from traceread.analysis.time.breakdown import device_gpu_rows, snap_ns
from traceread.model import RankTrace, as_float

#: HTA's ``consecutive_kernel_delay`` default, in µs.
KERNEL_GAP_THRESHOLD_US = 30.0

HOST_BOUND, KERNEL_GAP, OTHER = 0, 1, 2


def _launch_ts(rt: RankTrace, gpu: pl.DataFrame) -> np.ndarray:
    """Start time of each GPU row's launching runtime call; NaN when unlinked."""
    out = np.full(gpu.height, np.nan)
    if gpu.height == 0 or rt.host.height == 0:
        return out
    has = gpu["launch_row"].is_not_null().to_numpy()
    rows = gpu["launch_row"].fill_null(-1).to_numpy().astype(np.int64)
    ok = has & (rows >= 0) & (rows < rt.host.height)
    host_ts = rt.host["ts"].to_numpy().astype(np.float64)
    out[ok] = host_ts[rows[ok]]
    return out


def _snapped_gpu(rt: RankTrace) -> tuple[pl.DataFrame, float, np.ndarray, np.ndarray, np.ndarray] | None:
    """This device's GPU rows by start, with start, end and launch time in whole nanoseconds after
    the first activity (as in the breakdown, so the split is exact; NaN launch stays NaN); None
    when there are none."""
    gpu = device_gpu_rows(rt).sort("ts")
    if gpu.height == 0:
        return None
    base = as_float(gpu["ts"].min())
    return (gpu, base, snap_ns(gpu["ts"].to_numpy(), base), snap_ns(gpu["end"].to_numpy(), base),
            snap_ns(_launch_ts(rt, gpu), base))


def _classify(
    gap_start: np.ndarray, gap_len: np.ndarray, next_launch: np.ndarray, threshold: float
) -> np.ndarray:
    """HOST_BOUND / KERNEL_GAP / OTHER per gap (NaN launch = unknown = never host bound)."""
    with np.errstate(invalid="ignore"):
        host = next_launch > gap_start
    return np.where(host, HOST_BOUND, np.where(gap_len < threshold, KERNEL_GAP, OTHER))


def _sum_by_class(
    gap_start: np.ndarray, gap_end: np.ndarray, cls: np.ndarray, lo: float, hi: float
) -> tuple[float, float, float]:
    clipped = np.clip(gap_end, lo, hi) - np.clip(gap_start, lo, hi)
    clipped = np.maximum(clipped, 0.0)
    host, gap, other = (float(clipped[cls == k].sum()) for k in (HOST_BOUND, KERNEL_GAP, OTHER))
    return host, gap, other


def _whole_gpu_gaps(
    ts: np.ndarray, end: np.ndarray, launch: np.ndarray, threshold: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pieces of the gaps of the all-stream union (incl. before the first and after the last
    activity): for each gap its host-bound part and its rest, as (starts, ends, class)."""
    s, e = iv.merge(ts, end)
    # Gap k ends where merged block k starts; its start is the previous block's end.
    g_start = np.concatenate(([-np.inf], e))
    g_end = np.concatenate((s, [np.inf]))
    # The activity ending each gap: among rows starting exactly at the block start, the one
    # launched earliest (if any of them was queued before the gap, the GPU was not starved).
    order = np.lexsort((np.nan_to_num(launch, nan=np.inf), ts))
    ts_sorted = ts[order]
    first = np.searchsorted(ts_sorted, s, side="left")
    starts_here = first < ts_sorted.size
    next_launch = np.full(s.size, np.nan)
    next_launch[starts_here] = launch[order][first[starts_here]]
    next_launch = np.concatenate((next_launch, [np.nan]))
    # Host-bound only until the launch: the gap is cut there and the rest classified by its length.
    with np.errstate(invalid="ignore"):
        cut = np.where(np.isnan(next_launch), g_start, np.clip(next_launch, g_start, g_end))
    cut[-1] = g_start[-1]  # after the last activity: nothing ended the gap
    rest_cls = np.where(g_end - cut < threshold, KERNEL_GAP, OTHER)
    rest_cls[-1] = OTHER
    starts = np.concatenate((g_start, cut))
    ends = np.concatenate((cut, g_end))
    cls = np.concatenate((np.full(g_start.size, HOST_BOUND), rest_cls))
    return starts, ends, cls


def idle_breakdown(
    rt: RankTrace,
    window: tuple[float, float] | None = None,
    *,
    kernel_gap_threshold_us: float = KERNEL_GAP_THRESHOLD_US,
) -> dict[str, Any] | None:
    """Idle time of one rank split into host_bound / kernel_gap / other (module docstring).

    Returns ``{"host_bound_us", "kernel_gap_us", "other_us", "idle_us", "window_us",
    "kernel_gap_threshold_us", "streams": [{"stream", "host_bound_us", "kernel_gap_us",
    "other_us", "idle_us"}, ...]}``, or None when the trace has no GPU events.
    """
    snapped = _snapped_gpu(rt)
    if snapped is None:
        return None
    gpu, base, ts, end, launch = snapped
    threshold = kernel_gap_threshold_us * 1000.0
    lo_us, hi_us = window if window is not None else (base, as_float(gpu["end"].max()))
    lo, hi = float(snap_ns(lo_us, base)), float(snap_ns(hi_us, base))

    g_start, g_end, cls = _whole_gpu_gaps(ts, end, launch, threshold)
    host_b, kgap, other = (x * 1e-3 for x in _sum_by_class(g_start, g_end, cls, lo, hi))

    streams: list[dict[str, Any]] = []
    stream_col = gpu["stream"].fill_null(-1).to_numpy()
    for stream in np.unique(stream_col):
        sel = np.flatnonzero(stream_col == stream)
        s_ts, s_end, s_launch = ts[sel], end[sel], launch[sel]
        if sel.size < 2:
            parts: tuple[float, float, float] = (0.0, 0.0, 0.0)
        else:
            prev_end = np.maximum.accumulate(s_end)[:-1]
            gap_s, gap_e = prev_end, s_ts[1:]
            keep = gap_e > gap_s
            gap_s, gap_e = gap_s[keep], gap_e[keep]
            c = _classify(gap_s, gap_e - gap_s, s_launch[1:][keep], threshold)
            s_host, s_gap, s_other = _sum_by_class(gap_s, gap_e, c, lo, hi)
            parts = (s_host * 1e-3, s_gap * 1e-3, s_other * 1e-3)
        streams.append(
            {
                "stream": int(stream),
                "host_bound_us": parts[0],
                "kernel_gap_us": parts[1],
                "other_us": parts[2],
                "idle_us": float(sum(parts)),
            }
        )
    return {
        "host_bound_us": host_b,
        "kernel_gap_us": kgap,
        "other_us": other,
        "idle_us": host_b + kgap + other,
        "window_us": (hi - lo) * 1e-3,
        "kernel_gap_threshold_us": float(kernel_gap_threshold_us),
        "streams": streams,
    }


def host_bound_per_window(
    rt: RankTrace,
    windows: list[tuple[float, float]],
    *,
    kernel_gap_threshold_us: float = KERNEL_GAP_THRESHOLD_US,
) -> list[float] | None:
    """Host-bound idle (µs) of the whole GPU inside each window (e.g. each step), gaps classified once.

    Same classification as :func:`idle_breakdown` (the gaps of the all-stream union, classified on the
    whole trace and then clipped), so for any window it equals ``idle_breakdown(rt, window)["host_bound_us"]``.
    None when the trace has no GPU events.
    """
    snapped = _snapped_gpu(rt)
    if snapped is None:
        return None
    _gpu, base, ts, end, launch = snapped
    g_start, g_end, cls = _whole_gpu_gaps(ts, end, launch, kernel_gap_threshold_us * 1000.0)
    # The host-bound pieces (each gap's start .. its next launch) are disjoint and sorted: each
    # window binary-searches its own, so a window of thousands of steps stays linear.
    host = cls == HOST_BOUND
    pieces = (g_start[host], g_end[host])
    out: list[float] = []
    for lo_us, hi_us in windows:
        lo, hi = float(snap_ns(lo_us, base)), float(snap_ns(hi_us, base))
        out.append(iv.length(iv.clip_sorted(pieces, lo, hi)) * 1e-3)
    return out
