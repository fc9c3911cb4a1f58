"""Simulated GPU telemetry with exact truth: a throttled GPU over a time range, an Xid at time T.

Writes ``telemetry/gpu{i}.jsonl`` exactly as :mod:`traceread.collect.telemetry` does (header, one sample
per ``interval_ns``, Xid events), on the clock of a simulated trace: a trace time ``ts`` (µs) is the
wall time ``BASE_TIME_NS + ts × 1000`` (:mod:`traceread.simulate.kineto`), so
:func:`trace_wall_ns` turns a simulated step's start into the instant the telemetry must cover.
The truth is what was written: which GPU, from when to when, which reason, which clock.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traceread.simulate.kineto import BASE_TIME_NS

#: Reason → the NVML bit the collector would have decoded it from.
REASON_BITS = {"sw_power_cap": 0x4, "hw_slowdown": 0x8, "sw_thermal_slowdown": 0x20,
               "hw_thermal_slowdown": 0x40, "hw_power_brake_slowdown": 0x80}
GPU_SPECS: dict[str, dict[str, Any]] = {"H100": {"name": "NVIDIA H100 80GB HBM3", "max_sm": 1980, "mem": 2619, "limit_w": 700.0},
             "A100": {"name": "NVIDIA A100-SXM4-80GB", "max_sm": 1410, "mem": 1593, "limit_w": 400.0},
             "B200": {"name": "NVIDIA B200", "max_sm": 1965, "mem": 3996, "limit_w": 1000.0}}


def trace_wall_ns(ts_us: float) -> int:
    """The wall-clock ns of a simulated trace time (µs)."""
    return BASE_TIME_NS + int(round(ts_us * 1000))


@dataclass
class Throttle:
    """GPU ``gpu`` ran at ``sm_clock_mhz`` for ``reason`` from ``start_ns`` to ``end_ns``."""

    gpu: int
    start_ns: int
    end_ns: int
    reason: str = "sw_power_cap"
    sm_clock_mhz: int = 1290


@dataclass
class Xid:
    gpu: int
    t_ns: int
    xid: int = 79


@dataclass
class TelemetryPlan:
    gpus: int
    start_ns: int
    end_ns: int
    interval_ns: int = 1_000_000_000
    device: str = "H100"
    host: str = "sim-host0"
    throttles: list[Throttle] = field(default_factory=list)
    xids: list[Xid] = field(default_factory=list)


def write_telemetry(run_dir: Path | str, plan: TelemetryPlan) -> dict[str, Any]:
    """Write ``run_dir/telemetry/gpu{i}.jsonl``; returns the truth (what was written)."""
    spec = GPU_SPECS.get(plan.device.upper(), GPU_SPECS["H100"])
    tdir = Path(run_dir) / "telemetry"
    tdir.mkdir(parents=True, exist_ok=True)
    for i in range(plan.gpus):
        lines = [{"kind": "gpu", "t_ns": plan.start_ns, "gpu": i, "vendor": "nvidia", "host": plan.host,
                  "library": "simulated", "name": spec["name"], "uuid": f"GPU-sim-{i:04d}",
                  "pci_bus_id": f"00000000:{0x18 + i:02X}:00.0", "max_sm_clock_mhz": spec["max_sm"],
                  "max_mem_clock_mhz": spec["mem"], "power_limit_w": spec["limit_w"]}]
        events = sorted((x.t_ns, x.xid) for x in plan.xids if x.gpu == i)
        t = plan.start_ns
        while t <= plan.end_ns:
            while events and events[0][0] <= t:
                et, xid = events.pop(0)
                lines.append({"kind": "xid", "t_ns": et, "gpu": i, "xid": xid})
            th = next((x for x in plan.throttles if x.gpu == i and x.start_ns <= t <= x.end_ns), None)
            reasons = [th.reason] if th else []
            thermal = th is not None and "thermal" in th.reason
            lines.append({"kind": "sample", "t_ns": t, "gpu": i,
                          "sm_clock_mhz": th.sm_clock_mhz if th else spec["max_sm"], "mem_clock_mhz": spec["mem"],
                          "temp_c": 88 if thermal else 62,
                          "power_w": spec["limit_w"] if th and not thermal else 0.7 * spec["limit_w"],
                          "power_limit_w": spec["limit_w"], "util_pct": 100, "throttle": reasons,
                          "throttle_mask": REASON_BITS.get(th.reason, 0) if th else 0,
                          "ecc_corrected": 0, "ecc_uncorrected": 0, "retired_pages": 0, "pcie_replay": 0,
                          "nvlink_errors": 0})
            t += plan.interval_ns
        lines += [{"kind": "xid", "t_ns": et, "gpu": i, "xid": xid} for et, xid in events]
        (tdir / f"gpu{i}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return {"gpus": plan.gpus, "host": plan.host, "device": spec["name"], "max_sm_clock_mhz": spec["max_sm"],
            "throttles": [vars(x) for x in plan.throttles], "xids": [vars(x) for x in plan.xids]}
