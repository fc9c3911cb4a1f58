"""A watched run's own records: the per-step series every rank writes, and the captured windows.

``traceread collect`` writes, beside the default window in ``RUN/traces/`` (the baseline):

* ``RUN/progress/rank{R}.steps`` — one line ``"<step> <wall_time_ns>\\n"`` per optimizer step of
  rank R (the wall time when the step finished);
* ``RUN/captures/capture{N}/rank{R}.pt.trace.json.gz`` — K consecutive steps recorded when the watch
  (or ``traceread snap``) asked, the same step numbers on every rank, and ``trigger.json`` saying why.

Under the per-host layout each of these is under ``RUN/<host>/``. Definitions (docs/watch-report.md):

* a rank's **step time** of step s = its wall time of step s − its wall time of step s−1 (both lines
  present, consecutive step numbers);
* the **job step time** of step s = the end of step s on the last rank to finish it − the same for
  step s−1 (the job advances at its slowest rank's pace). Steps some rank has not written are
  left out.

Bounded memory: a file is read in blocks; the job keeps two int64 per step number (the latest
and earliest end over ranks) and each rank only :data:`RANK_BUCKETS` bucket means. A damaged file
is one warning naming it, never an exception; lines that are not two integers are skipped and
counted; a last line without its newline is being written and is ignored.
"""

from __future__ import annotations

import os
import re
import stat
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from traceread.read.jsonfile import load_json_object

#: Buckets of the per-rank step-time series (the job's series keeps every step).
RANK_BUCKETS = 200
#: Bytes read per block of a ``.steps`` file.
BLOCK_BYTES = 8 << 20
#: A step number beyond this is damage, not a run (a billion optimizer steps).
MAX_STEP = 1_000_000_000
#: Step numbers per series at most (the job arrays are 16 bytes per step number).
MAX_SPAN = 50_000_000

_RANK_FILE = re.compile(r"^rank(\d+)\.steps$")
_CAPTURE_DIR = re.compile(r"^capture(\d+)$")


@dataclass
class RankSteps:
    """One rank's raw series: step numbers and wall end times (ns), in file order."""

    rank: int
    steps: np.ndarray
    ends_ns: np.ndarray
    bad_lines: int = 0


@dataclass
class StepSeries:
    """The job's step-time series (every step) and each rank's, bucketed (module docstring)."""

    steps: np.ndarray  # step numbers with a job step time, ascending
    job_us: np.ndarray  # job step time of each (µs)
    end_ns: np.ndarray  # wall time the last rank finished each of those steps
    ranks: list[int]
    rank_buckets: dict[int, list[float | None]] = field(default_factory=dict)  # mean step time per bucket (µs)
    bucket_steps: list[tuple[int, int]] = field(default_factory=list)  # (first, last) step of each bucket
    rank_ends: dict[int, tuple[int, int]] = field(default_factory=dict)  # rank -> (last step, its wall ns)

    def between(self, first: int, last: int) -> np.ndarray:
        """Job step times (µs) of the steps ``first``..``last``."""
        m = (self.steps >= first) & (self.steps <= last)
        return self.job_us[m]

    def wall_ns(self, step: int) -> int | None:
        """When the last rank finished ``step`` (wall clock, ns)."""
        i = int(np.searchsorted(self.steps, step))
        return int(self.end_ns[i]) if i < len(self.steps) and self.steps[i] == step else None


def host_dirs(run_dir: Path) -> list[Path]:
    """``RUN`` and, for the per-host layout, every ``RUN/<host>`` that holds collected folders."""
    out = [run_dir]
    try:
        out += sorted(p for p in run_dir.iterdir() if p.is_dir() and not p.name.startswith(".")
                      and ((p / "progress").is_dir() or (p / "captures").is_dir() or (p / "telemetry").is_dir()))
    except OSError:
        pass
    return out


def step_files(run_dir: Path) -> dict[int, Path]:
    """``rank{R}.steps`` files of every host folder, by rank."""
    out: dict[int, Path] = {}
    for d in host_dirs(run_dir):
        try:
            names = sorted((d / "progress").iterdir()) if (d / "progress").is_dir() else []
        except OSError:
            continue
        for p in names:
            m = _RANK_FILE.match(p.name)
            if m:
                out.setdefault(int(m.group(1)), p)
    return out


def _regular(path: Path) -> str | None:
    """Why ``path`` cannot be read as a series (None: it can): a FIFO would block, a folder is not one."""
    try:
        st = os.stat(path)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None if stat.S_ISREG(st.st_mode) else "not a regular file"


def read_rank_steps(path: Path, rank: int) -> RankSteps:
    """Parse one ``.steps`` file in blocks; :class:`ValueError`/:class:`OSError` (one line) when unusable."""
    why = _regular(path)
    if why:
        raise ValueError(why)
    chunks_s: list[np.ndarray] = []
    chunks_t: list[np.ndarray] = []
    bad = 0
    tail = b""
    with open(path, "rb") as fh:
        while True:
            block = fh.read(BLOCK_BYTES)
            if not block:
                break
            block = tail + block
            cut = block.rfind(b"\n")
            if cut < 0:
                tail = block
                if len(tail) > 4096:
                    raise ValueError("no line break in the first 4 KiB: not a step series")
                continue
            tail = block[cut + 1:]
            s, t, b = _parse_lines(block[:cut + 1])
            chunks_s.append(s)
            chunks_t.append(t)
            bad += b
    # a last line without its newline is being written (or was cut by a kill): never read (docs/watch.md)
    steps = np.concatenate(chunks_s) if chunks_s else np.zeros(0, np.int64)
    ends = np.concatenate(chunks_t) if chunks_t else np.zeros(0, np.int64)
    if bad and bad >= len(steps):
        raise ValueError(f"no line of the form '<step> <wall_time_ns>' ({bad} other line(s))")
    return RankSteps(rank, steps, ends, bad)


def _parse_lines(block: bytes) -> tuple[np.ndarray, np.ndarray, int]:
    """(steps, ends, bad lines) of whole lines; the fast path parses the block at once."""
    lines = block.count(b"\n")
    with warnings.catch_warnings():  # numpy warns (and stops) where the text is not numbers: the slow path then
        warnings.simplefilter("ignore")
        try:
            flat = np.fromstring(block, dtype=np.int64, sep=" ")  # text mode: ~10x faster than split + array
        except (ValueError, OverflowError):
            flat = np.zeros(0, np.int64)
    if len(flat) == 2 * lines and lines and block.count(b" ") == lines:  # exactly "<step> <ns>" per line
        a = flat.reshape(-1, 2)
        ok = (a[:, 0] >= 0) & (a[:, 0] <= MAX_STEP) & (a[:, 1] > 0)
        return a[ok, 0], a[ok, 1], int((~ok).sum())
    s: list[int] = []
    t: list[int] = []
    bad = 0
    for line in block.splitlines():
        parts = line.split()
        if not parts:
            continue
        try:
            step, ns = (int(parts[0]), int(parts[1])) if len(parts) == 2 else (-1, 0)
        except ValueError:
            step, ns = -1, 0
        if 0 <= step <= MAX_STEP and 0 < ns < (1 << 63):
            s.append(step)
            t.append(ns)
        else:
            bad += 1
    return np.array(s, np.int64), np.array(t, np.int64), bad


def _durations(rs: RankSteps) -> tuple[np.ndarray, np.ndarray]:
    """(step, step time ns) where the previous line is the previous step number."""
    if len(rs.steps) < 2:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    ok = np.diff(rs.steps) == 1
    d = np.diff(rs.ends_ns)
    ok &= d > 0
    return rs.steps[1:][ok], d[ok]


def read_series(run_dir: Path, warn: Callable[[str], None]) -> StepSeries | None:
    """The job's series from every rank's ``.steps`` file (None when the run has none)."""
    files = step_files(run_dir)
    if not files:
        return None
    ranks_read: dict[int, RankSteps] = {}
    for rank, path in sorted(files.items()):
        try:
            rs = read_rank_steps(path, rank)
        except (OSError, ValueError) as exc:
            reason = getattr(exc, "strerror", None) or str(exc)
            warn(f"{path}: not read ({reason}); the step-time series leaves rank {rank} out")
            continue
        if rs.bad_lines > 1:
            warn(f"{path}: {rs.bad_lines} line(s) are not '<step> <wall_time_ns>'; skipped")
        if len(rs.steps):
            ranks_read[rank] = rs
        del rs
    lo = min((int(r.steps.min()) for r in ranks_read.values() if len(r.steps)), default=None)
    hi = max((int(r.steps.max()) for r in ranks_read.values() if len(r.steps)), default=None)
    if lo is None or hi is None:
        return None
    if hi - lo + 1 > MAX_SPAN:
        warn(f"{run_dir}: step numbers {lo}-{hi} span more than {MAX_SPAN:,} steps; the series keeps the last "
             f"{MAX_SPAN:,}")
        lo = hi - MAX_SPAN + 1
    n = hi - lo + 1
    last_end = np.zeros(n, np.int64)  # 0: no rank wrote that step
    first_end = np.full(n, np.iinfo(np.int64).max, np.int64)
    seen = np.zeros(n, np.int32)
    width = max(1, -(-n // RANK_BUCKETS))
    buckets: dict[int, list[float | None]] = {}
    rank_ends: dict[int, tuple[int, int]] = {}
    for rank, rs in ranks_read.items():
        keep = rs.steps >= lo
        idx = rs.steps[keep] - lo
        ends = rs.ends_ns[keep]
        if len(idx) and bool(np.all(np.diff(idx) > 0)):  # the usual file: each step once, in order
            last_end[idx] = np.maximum(last_end[idx], ends)
            first_end[idx] = np.minimum(first_end[idx], ends)
            seen[idx] += 1
        else:  # a restarted rank wrote some steps twice
            np.maximum.at(last_end, idx, ends)
            np.minimum.at(first_end, idx, ends)
            np.add.at(seen, np.unique(idx), 1)
        st, dur = _durations(rs)
        m = st >= lo
        b = (st[m] - lo) // width
        sums = np.bincount(b, weights=dur[m] / 1e3, minlength=RANK_BUCKETS)[:RANK_BUCKETS]
        cnt = np.bincount(b, minlength=RANK_BUCKETS)[:RANK_BUCKETS]
        buckets[rank] = [float(s / c) if c else None for s, c in zip(sums, cnt)]
        rank_ends[rank] = (int(rs.steps[-1]), int(rs.ends_ns[-1]))
        ranks_read[rank] = RankSteps(rank, np.zeros(0, np.int64), np.zeros(0, np.int64))  # free it
    everyone = seen == len(ranks_read)
    both = everyone[1:] & everyone[:-1]
    steps = np.arange(lo + 1, hi + 1, dtype=np.int64)[both]
    job = (last_end[1:] - last_end[:-1])[both]
    ok = job > 0
    n_buckets = -(-n // width)
    return StepSeries(steps=steps[ok], job_us=job[ok] / 1e3, end_ns=last_end[1:][both][ok],
                      ranks=sorted(ranks_read), rank_buckets={r: v[:n_buckets] for r, v in buckets.items()},
                      bucket_steps=[(lo + i * width, min(hi, lo + (i + 1) * width - 1)) for i in range(n_buckets)],
                      rank_ends=rank_ends)


@dataclass
class Capture:
    """One captured window: its folders (one per host folder that holds it) and its trigger."""

    name: str  # "capture{N}"
    number: int
    dirs: list[Path]
    trigger: dict[str, Any] | None

    @property
    def files(self) -> list[Path]:
        return sorted(p for d in self.dirs for p in d.glob("rank*.pt.trace.json*") if p.is_file())


def find_captures(run_dir: Path, warn: Callable[[str], None]) -> list[Capture]:
    """Every ``captures/capture{N}`` of the run (all host folders), oldest first, with its trigger."""
    found: dict[int, Capture] = {}
    for d in host_dirs(run_dir):
        cap_root = d / "captures"
        if not cap_root.is_dir():
            continue
        try:
            subs = sorted(cap_root.iterdir())
        except OSError as exc:
            warn(f"{cap_root}: not read ({exc.strerror or exc})")
            continue
        for sub in subs:
            m = _CAPTURE_DIR.match(sub.name)
            if not m or not sub.is_dir():
                continue
            n = int(m.group(1))
            cap = found.setdefault(n, Capture(sub.name, n, [], None))
            cap.dirs.append(sub)
            if cap.trigger is None and (sub / "trigger.json").is_file():
                notes: list[str] = []
                cap.trigger = load_json_object(sub / "trigger.json", notes)
                for note in notes:
                    warn(note)
    return [found[n] for n in sorted(found)]
