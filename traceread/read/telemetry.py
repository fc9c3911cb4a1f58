"""Read ``RUN/telemetry/gpu{i}.jsonl`` (written by :mod:`traceread.collect.telemetry` or the simulator).

One :class:`GpuTelemetry` per file: the header (``kind: gpu``), the samples as columns (numpy, so a
week at 1 Hz stays a few MB per GPU) and the Xid events. A line that is not JSON is skipped and
counted; a file that cannot be read is one warning naming it. Per-host layout: ``RUN/<host>/telemetry``.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from traceread.read.watch import host_dirs

#: A telemetry file larger than this is not read whole (about 2 years of 1 Hz samples).
MAX_TELEMETRY_BYTES = 4 << 30
NUMERIC = ("sm_clock_mhz", "mem_clock_mhz", "temp_c", "power_w", "power_limit_w", "util_pct",
           "ecc_corrected", "ecc_uncorrected", "retired_pages", "pcie_replay", "nvlink_errors")
_GPU_FILE = re.compile(r"^gpu(\d+)\.jsonl$")
_decode = msgspec.json.Decoder()


@dataclass
class GpuTelemetry:
    """One GPU's record: where it is, its samples (columns, NaN where absent) and its Xid events."""

    host: str | None
    gpu: int
    path: Path
    info: dict[str, Any] = field(default_factory=dict)
    t_ns: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    cols: dict[str, np.ndarray] = field(default_factory=dict)
    throttle: list[list[str] | None] = field(default_factory=list)  # None: the sample reports no reasons
    xids: list[tuple[int, int]] = field(default_factory=list)  # (t_ns, xid)
    bad_lines: int = 0

    def window(self, start_ns: int, end_ns: int) -> np.ndarray:
        """Indices of the samples taken in [start_ns, end_ns]."""
        lo = int(np.searchsorted(self.t_ns, start_ns, side="left"))
        hi = int(np.searchsorted(self.t_ns, end_ns, side="right"))
        return np.arange(lo, hi)


def read_gpu_file(path: Path, host: str | None) -> GpuTelemetry:
    """Parse one file; :class:`ValueError`/:class:`OSError` when it cannot be read at all."""
    m = _GPU_FILE.match(path.name)
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise ValueError("not a regular file")
    if st.st_size > MAX_TELEMETRY_BYTES:
        raise ValueError(f"{st.st_size:,} bytes: larger than any telemetry file traceread writes")
    g = GpuTelemetry(host=host, gpu=int(m.group(1)) if m else -1, path=path)
    t: list[int] = []
    vals: dict[str, list[float]] = {k: [] for k in NUMERIC}
    with open(path, "rb") as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                rec = _decode.decode(line)
            except msgspec.DecodeError:
                g.bad_lines += 1
                continue
            if not isinstance(rec, dict) or not isinstance(rec.get("t_ns"), int):
                g.bad_lines += 1
                continue
            kind = rec.get("kind")
            if kind == "gpu":
                g.info = {k: v for k, v in rec.items() if k not in ("kind",)}
                if isinstance(rec.get("gpu"), int):
                    g.gpu = rec["gpu"]
                if isinstance(rec.get("host"), str):  # the sampler's hostname (a per-host folder may be host.N)
                    g.host = rec["host"]
            elif kind == "sample":
                t.append(rec["t_ns"])
                for k in NUMERIC:
                    v = rec.get(k)
                    vals[k].append(float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else np.nan)
                th = rec.get("throttle")
                g.throttle.append([str(x) for x in th] if isinstance(th, list) else None)
            elif kind == "xid" and isinstance(rec.get("xid"), int):
                g.xids.append((rec["t_ns"], rec["xid"]))
    order = np.argsort(np.array(t, np.int64), kind="stable")
    g.t_ns = np.array(t, np.int64)[order]
    g.cols = {k: np.array(v, np.float64)[order] for k, v in vals.items()}
    g.throttle = [g.throttle[i] for i in order]
    g.xids.sort()
    return g


def read_telemetry(run_dir: Path, warn: Callable[[str], None]) -> list[GpuTelemetry]:
    """Every GPU file of the run (all host folders); [] when telemetry was off or absent."""
    out: list[GpuTelemetry] = []
    for d in host_dirs(run_dir):
        tdir = d / "telemetry"
        if not tdir.is_dir():
            continue
        host = None if d == run_dir else d.name
        for p in sorted(tdir.glob("gpu*.jsonl")):
            try:
                g = read_gpu_file(p, host)
            except (OSError, ValueError) as exc:
                warn(f"{p}: not read ({getattr(exc, 'strerror', None) or exc}); telemetry of that GPU left out")
                continue
            if g.bad_lines:
                warn(f"{p}: {g.bad_lines} line(s) are not telemetry records; skipped")
            out.append(g)
    return out
