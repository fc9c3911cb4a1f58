"""What a GPU's own sensors said over a stretch of time: its clock, why it was lowered, errors it raised.

Input: one GPU's telemetry (:mod:`traceread.read.telemetry`) and a wall-clock range. Definitions
(docs/watch-report.md):

* ``sm_clock_mhz`` — median SM clock of the samples in the range; ``max_sm_clock_mhz`` — the GPU's
  maximum SM clock (its header), else the highest clock it reported in the whole record;
* ``clock_pct`` — ``sm_clock_mhz`` ÷ ``max_sm_clock_mhz`` × 100;
* ``throttled_share`` — share of the samples with at least one *slowing* reason
  (:data:`traceread.collect.telemetry.SLOWING`: power cap, HW slowdown, SW/HW thermal, power brake);
  ``reasons`` — each slowing reason with its share, most frequent first;
* ``throttled`` — ``throttled_share`` ≥ :data:`THROTTLED_SHARE`, or (a GPU that reports no reasons)
  ``clock_pct`` ≤ :data:`LOW_CLOCK_PCT`;
* ``temp_c_max``, ``power_w`` (median) and ``power_limit_w``; ``xids`` — Xid events in the range;
  counter growth (``ecc_uncorrected``, ``retired_pages``, ``pcie_replay``, ``nvlink_errors``) = last − first
  sample in the range.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from traceread.read.telemetry import GpuTelemetry

SLOWING = ("sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
REASON_WORDS = {"sw_power_cap": "power cap", "hw_slowdown": "HW slowdown", "sw_thermal_slowdown": "thermal (software)",
                "hw_thermal_slowdown": "thermal (hardware)", "hw_power_brake_slowdown": "power brake"}
THROTTLED_SHARE = 0.5
LOW_CLOCK_PCT = 85.0
COUNTERS = ("ecc_uncorrected", "retired_pages", "pcie_replay", "nvlink_errors")
#: Samples are ~1 s apart: a range shorter than this is widened so it holds a sample.
MIN_RANGE_NS = 2_000_000_000


def _med(a: np.ndarray) -> float | None:
    a = a[np.isfinite(a)]
    return float(np.median(a)) if len(a) else None


def gpu_state(g: GpuTelemetry, start_ns: int, end_ns: int) -> dict[str, Any] | None:
    """The GPU's state over [start_ns, end_ns] (module docstring); None when no sample falls in it."""
    if end_ns - start_ns < MIN_RANGE_NS:
        mid = (start_ns + end_ns) // 2
        start_ns, end_ns = mid - MIN_RANGE_NS // 2, mid + MIN_RANGE_NS // 2
    idx = g.window(start_ns, end_ns)
    if not len(idx):
        return None
    clocks = g.cols["sm_clock_mhz"]
    peak = g.info.get("max_sm_clock_mhz")
    if not isinstance(peak, (int, float)) or peak <= 0:
        finite = clocks[np.isfinite(clocks)]
        peak = float(finite.max()) if len(finite) else None
    sm = _med(clocks[idx])
    counts: dict[str, int] = {}
    slowed = 0
    reported = 0
    for i in idx:
        names = g.throttle[i]
        if names is None:
            continue
        reported += 1
        hit = [n for n in names if n in SLOWING]
        slowed += bool(hit)
        for n in hit:
            counts[n] = counts.get(n, 0) + 1
    n = len(idx)
    share = slowed / n
    clock_pct = 100.0 * sm / peak if sm is not None and peak else None
    reasons = [{"reason": r, "words": REASON_WORDS.get(r, r), "share": c / n}
               for r, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    growth = {}
    for c in COUNTERS:
        v = g.cols[c][idx]
        v = v[np.isfinite(v)]
        if len(v) >= 2 and v[-1] > v[0]:
            growth[c] = float(v[-1] - v[0])
    temp = g.cols["temp_c"][idx]
    temp = temp[np.isfinite(temp)]
    return {"host": g.host, "gpu": g.gpu, "samples": n, "sm_clock_mhz": sm, "max_sm_clock_mhz": peak,
            "clock_pct": clock_pct, "throttled_share": share, "reasons": reasons,
            "throttled": share >= THROTTLED_SHARE or (not reported and clock_pct is not None and clock_pct <= LOW_CLOCK_PCT),
            "temp_c_max": float(temp.max()) if len(temp) else None, "power_w": _med(g.cols["power_w"][idx]),
            "power_limit_w": _med(g.cols["power_limit_w"][idx]),
            "xids": [{"t_ns": t, "xid": x} for t, x in g.xids if start_ns <= t <= end_ns],
            "counter_growth": growth}


def describe(state: dict[str, Any], others_mhz: float | None = None) -> str:
    """One clause: "its GPU (host h, GPU 1) was throttled (power cap, 100% of samples): SM clock 1,290 MHz
    vs 1,980 MHz max (others 1,980 MHz), 700 W of a 700 W limit, 84 °C"."""
    where = f"GPU {state['gpu']}" + (f" on {state['host']}" if state.get("host") else "")
    why = ", ".join(f"{r['words']}" for r in state["reasons"][:2]) or "clock low, no reason reported"
    parts = [f"{where} was throttled ({why}, {state['throttled_share']:.0%} of samples)"]
    if state.get("sm_clock_mhz") is not None:
        clock = f"SM clock {state['sm_clock_mhz']:,.0f} MHz"
        if state.get("max_sm_clock_mhz"):
            clock += f" vs {state['max_sm_clock_mhz']:,.0f} MHz max"
        if others_mhz is not None:
            clock += f" (other GPUs {others_mhz:,.0f} MHz)"
        parts.append(clock)
    if state.get("power_w") is not None and state.get("power_limit_w"):
        parts.append(f"{state['power_w']:,.0f} W of a {state['power_limit_w']:,.0f} W limit")
    if state.get("temp_c_max") is not None:
        parts.append(f"{state['temp_c_max']:.0f} °C")
    return ": ".join(parts[:1]) + (": " + ", ".join(parts[1:]) if len(parts) > 1 else "")
