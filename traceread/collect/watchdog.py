"""Hang watchdog run by the launcher: no optimizer step anywhere for too long -> ask every rank to dump.

Ranks write ``progress/rank{R}`` (``"<step> <time_ns> <pid>"``) from the global optimizer-step hook.
The launcher polls those files; a *stall* is the time since any local rank last advanced its step,
measured on the launcher's monotonic clock (immune to wall-clock jumps). Detection is armed after the
first completed step (start-up can legitimately take minutes; ``startup_timeout`` covers it when set).

Timeout: fixed when ``timeout_s`` is given, else adaptive
``max(floor_s, factor × median step time)`` where the median is over the recent per-rank step
intervals (wall time between two observed steps of a rank divided by the steps made).

Dump protocol (per rank listed in ``ranks/rank{R}.json`` on this host; first, on NCCL builds, one
byte into each ``fr/pipe_rank{R}.pipe`` FIFO makes the rank's C++ side dump its NCCL Flight Recorder
to ``fr/rank{R}`` without needing the GIL): one byte into the rank's dump FIFO (``dump_trigger`` in
its rank file) -> the rank's dump thread writes stacks + Flight Recorder, then ``inject/rank{R}.ack``;
ranks that did not ack within ``grace_s`` get the real-time signal their faulthandler registered
(``stack_signal``) -> a C-level all-thread stack dump (works even if the GIL is held). The job's own
signals (SIGUSR1, SIGUSR2, ...) are never used, and a signal is never sent to a process that did not
register it (it would kill it).
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traceread.collect.runinfo import iso, read_json, read_progress, write_json

DEFAULT_FLOOR_S = 300.0
DEFAULT_FACTOR = 10.0


@dataclass
class RankProgress:
    """Last progress seen for one rank."""

    rank: int
    step: int
    time_ns: int  # rank's wall clock at that step
    pid: int
    changed_at: float  # launcher monotonic time when ``step`` last changed


@dataclass
class Watchdog:
    """Polls progress files of one host folder and decides when the job is hung."""

    host_dir: Path
    timeout_s: float | None = None
    floor_s: float = DEFAULT_FLOOR_S
    factor: float = DEFAULT_FACTOR
    startup_timeout_s: float | None = None
    grace_s: float = 10.0
    progress: dict[int, RankProgress] = field(default_factory=dict)
    intervals: deque = field(default_factory=lambda: deque(maxlen=256))
    started_at: float = field(default_factory=time.monotonic)
    fired: bool = False  # a hang was reported and no progress since

    # ---------------------------------------------------------------------------------- progress
    def poll(self, now: float | None = None) -> bool:
        """Read progress; True exactly once per stall when the stall exceeds the timeout."""
        now = time.monotonic() if now is None else now
        advanced = False
        for path in latest_per_rank(self.host_dir, "progress", "rank*"):
            if not path.name[4:].isdigit():
                continue
            got = read_progress(path)
            if got is None:
                continue
            rank, (step, t_ns, pid) = int(path.name[4:]), got
            prev = self.progress.get(rank)
            if prev is None or prev.pid != pid:
                self.progress[rank] = RankProgress(rank, step, t_ns, pid, now)
                advanced |= step > 0
            elif step > prev.step:
                if prev.step > 0 and t_ns > prev.time_ns:
                    self.intervals.append((t_ns - prev.time_ns) / 1e9 / (step - prev.step))
                prev.step, prev.time_ns, prev.changed_at = step, t_ns, now
                advanced = True
        if advanced:
            self.fired = False
        if self.fired:
            return False
        stalled, limit = self.stall_s(now), self.effective_timeout_s()
        if stalled is not None and limit is not None and stalled > limit:
            self.fired = True
            return True
        return False

    def armed(self) -> bool:
        return any(p.step > 0 for p in self.progress.values())

    def stall_s(self, now: float) -> float | None:
        """Seconds since any rank last completed a step (or since start, before the first step)."""
        if self.armed():
            return now - max(p.changed_at for p in self.progress.values() if p.step > 0)
        return now - self.started_at if self.startup_timeout_s else None

    def median_step_s(self) -> float | None:
        return statistics.median(self.intervals) if self.intervals else None

    def effective_timeout_s(self) -> float | None:
        """Fixed timeout, or ``max(floor, factor × median step time)``; start-up timeout before step 1."""
        if not self.armed():
            return self.startup_timeout_s
        if self.timeout_s is not None:
            return self.timeout_s
        med = self.median_step_s()
        return max(self.floor_s, self.factor * med) if med is not None else self.floor_s

    # ---------------------------------------------------------------------------------- dumping
    def local_ranks(self) -> dict[int, dict[str, Any]]:
        """Rank files of processes on this host that installed the dump signals."""
        host = socket.gethostname()
        out = {}
        for path in latest_per_rank(self.host_dir, "ranks", "rank*.json"):
            doc = read_json(path)
            if doc and isinstance(doc.get("rank"), int) and doc.get("host") == host and doc.get("pid"):
                out[doc["rank"]] = dict(doc, home=str(path.parent.parent))  # its attempt's folder (acks land there)
        return out

    def dump_all(self, reason: str, signal_fallback: bool = True) -> dict[str, Any]:
        """Ask every local rank to dump; wait for acks; C-level stack fallback for the silent ones
        (``signal_fallback=False``: never signal a rank; the watch's dumps of a running job use that, since a
        rank tearing down may no longer handle the signal, and its default action ends the process)."""
        ranks = self.local_ranks()
        sent_ns = time.time_ns()
        asked = [r for r, info in ranks.items() if _alive(info["pid"]) and poke_fifo(info.get("dump_trigger"))]
        pipes = [p for d in attempt_dirs(self.host_dir) for p in poke_nccl_pipes(d / "fr")]
        acks: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline and len(acks) < len(asked):
            for r in asked:
                if r not in acks:
                    ack = read_json(Path(ranks[r].get("home") or self.host_dir) / "inject" / f"rank{r}.ack")
                    if ack and ack.get("time_ns", 0) >= sent_ns - 1_000_000:
                        acks[r] = ack
            time.sleep(0.05)
        fallback = []
        for r, info in ranks.items():
            signum = info.get("stack_signal")
            if (signal_fallback and r not in acks and isinstance(signum, int) and _stack_signal_ok(signum)
                    and _alive(info["pid"])):
                try:
                    os.kill(info["pid"], signum)
                    fallback.append(r)
                except OSError:
                    pass
        if fallback:
            time.sleep(1.0)  # faulthandler writes synchronously in the signal handler
        return {"reason": reason, "requested_at": iso(sent_ns), "requested_at_ns": sent_ns,
                "asked_ranks": sorted(asked), "answered_ranks": sorted(acks),
                "unanswered_ranks": sorted(set(ranks) - set(acks)), "stack_fallback_ranks": sorted(fallback),
                "nccl_pipes_poked": pipes,
                "acks": {str(r): a for r, a in sorted(acks.items())}}

    def hang_record(self, action: str, dump: dict[str, Any], now: float | None = None) -> dict[str, Any]:
        """The ``hang.json`` document (contract in agent brief + the evidence used)."""
        now = time.monotonic() if now is None else now
        med = self.median_step_s()
        return {
            "detected_at": dump["requested_at"],
            "detected_at_ns": dump["requested_at_ns"],
            "host": socket.gethostname(),
            "timeout_s": self.effective_timeout_s(),
            "timeout_source": "fixed" if self.timeout_s is not None else "adaptive",
            "median_step_s": med,
            "stalled_for_s": self.stall_s(now),
            "answered_ranks": dump["answered_ranks"],
            "unanswered_ranks": dump["unanswered_ranks"],
            "stack_fallback_ranks": dump["stack_fallback_ranks"],
            "action": action,
            "last_step_per_rank": {str(r): p.step for r, p in sorted(self.progress.items())},
            "last_step_time_per_rank": {str(r): iso(p.time_ns) for r, p in sorted(self.progress.items()) if p.step},
            "files": {"stacks": "stacks/rank{R}.txt", "fr": "fr/rank{R}.json|.pkl", "acks": "inject/rank{R}.ack"},
            "acks": dump["acks"],
        }

    def write_hang(self, record: dict[str, Any]) -> Path:
        path = self.host_dir / "hang.json"
        write_json(path, record)
        return path


def attempt_dirs(host_dir: Path) -> list[Path]:
    """The folders ranks write into, oldest attempt first: ``RUN`` (torchrun's attempt 0, or no torchrun)
    then ``RUN/attempts/attempt{K}`` for each elastic restart K (docs/collect.md, "Restarts")."""
    found = []
    for d in (host_dir / "attempts").glob("attempt*"):
        if d.is_dir() and d.name[7:].isdigit():
            found.append((int(d.name[7:]), d))
    return [host_dir] + [d for _k, d in sorted(found)]


def latest_per_rank(host_dir: Path, sub: str, pattern: str) -> list[Path]:
    """Each rank's file of ``sub`` from the latest attempt that has one (the live attempt's progress, pid)."""
    out: dict[str, Path] = {}
    for d in attempt_dirs(host_dir):
        for path in (d / sub).glob(pattern):
            out[path.name] = path
    return [out[n] for n in sorted(out)]


def poke_nccl_pipes(fr_dir: Path) -> list[str]:
    """Write one byte into each NCCL debug-info FIFO (``pipe_rank<R>.pipe``): a GIL-free FR dump request.

    Only NCCL builds create these FIFOs (``TORCH_NCCL_DEBUG_INFO_PIPE_FILE``).
    """
    return [path.name for path in sorted(fr_dir.glob("pipe_rank*.pipe")) if poke_fifo(path)]


def poke_fifo(path: str | Path | None) -> bool:
    """One byte into a FIFO; False when it is not a FIFO or nobody holds it open.

    Non-blocking open: a FIFO whose reader is gone fails at once (ENXIO) instead of blocking the
    launcher; a regular file with that name is never written.
    """
    if not path:
        return False
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
        os.write(fd, b"1")
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _stack_signal_ok(signum: int) -> bool:
    """Only a real-time signal: never one of the job's ordinary signals, whatever a rank file says."""
    return signal.SIGRTMIN <= signum <= signal.SIGRTMAX


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False
