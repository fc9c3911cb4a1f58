"""The run folder as the channel for captures: step series, capture requests, capture folders.

Shared by the launcher's watch and ``traceread snap`` (which may run on another host that sees the
run folder), and read by ``traceread watch``. No torch here. Format: docs/watch.md.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traceread.collect.runinfo import iso, read_json, write_json
from traceread.collect.watchdog import read_progress

REQUEST_NAME = "capture.request"
CAPTURES = "captures"
WARMUP_STEPS = 1  # the rank traces one step before the first recorded one (profiler start-up)
MIN_LEAD_STEPS = 3
_CAPTURE_DIR = re.compile(r"^capture(\d+)$")


# ------------------------------------------------------------------------------------ step series


@dataclass
class SeriesReader:
    """Reads what ranks appended to ``progress/rank{R}.steps`` since the last call (bounded work)."""

    host_dir: Path
    offsets: dict[int, int] = field(default_factory=dict)
    inodes: dict[int, int] = field(default_factory=dict)
    max_bytes: int = 4 << 20  # per file and call: a launcher that fell behind catches up in slices

    def read_new(self) -> dict[int, list[tuple[int, int]]]:
        """``{rank: [(step, time_ns), ...]}`` of the complete lines appended since the last call."""
        out: dict[int, list[tuple[int, int]]] = {}
        for path in sorted((self.host_dir / "progress").glob("rank*.steps")):
            try:
                rank = int(path.name[4:-6])
            except ValueError:
                continue
            try:
                with open(path, "rb") as fh:
                    st_ino = _inode(fh)
                    if self.inodes.get(rank) != st_ino:  # a new (restarted) rank process truncated it
                        self.inodes[rank], self.offsets[rank] = st_ino, 0
                    fh.seek(self.offsets.get(rank, 0))
                    data = fh.read(self.max_bytes)
            except OSError:
                continue
            end = data.rfind(b"\n")
            if end < 0:
                continue
            self.offsets[rank] = self.offsets.get(rank, 0) + end + 1
            points = []
            for line in data[:end].split(b"\n"):
                parts = line.split()
                if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
                    points.append((int(parts[0]), int(parts[1])))
            if points:
                out[rank] = points
        return out


def _inode(fh: Any) -> int:
    import os

    return os.fstat(fh.fileno()).st_ino


def read_series(path: Path, max_lines: int = 2_000_000) -> list[tuple[int, int]]:
    """Every complete ``(step, time_ns)`` line of one series file (bounded)."""
    out: list[tuple[int, int]] = []
    try:
        with open(path, "rb") as fh:
            for line in fh:
                if not line.endswith(b"\n") or len(out) >= max_lines:
                    break
                parts = line.split()
                if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
                    out.append((int(parts[0]), int(parts[1])))
    except OSError:
        return []
    return out


def current_steps(host_dir: Path) -> dict[int, tuple[int, int]]:
    """``{rank: (step, time_ns)}`` from the in-place progress files (the freshest view)."""
    out = {}
    for path in (host_dir / "progress").glob("rank*"):
        if not path.name[4:].isdigit():
            continue
        got = read_progress(path)
        if got is not None:
            out[int(path.name[4:])] = (got[0], got[1])
    return out


# ------------------------------------------------------------------------------------- requests


def host_dirs(run_dir: Path) -> list[Path]:
    """The folders ranks write into: ``RUN`` (flat layout) or each ``RUN/<host>`` (per-host layout)."""
    if (run_dir / "progress").is_dir() or (run_dir / "inject").is_dir():
        return [run_dir]
    return sorted(p for p in run_dir.iterdir() if p.is_dir() and (p / "inject").is_dir()) if run_dir.is_dir() else []


def capture_ids(host_dir: Path) -> list[int]:
    try:
        names = [p.name for p in (host_dir / CAPTURES).iterdir()]
    except OSError:
        return []
    return sorted(int(m.group(1)) for n in names if (m := _CAPTURE_DIR.match(n)))


def allocate(host_dirs_: list[Path], at_least: int = 1) -> int:
    """A new capture id, created (``mkdir``) in every host folder: atomic against a concurrent watch/snap."""
    n = max([at_least - 1, *(i for h in host_dirs_ for i in capture_ids(h))]) + 1
    while True:
        try:
            for i, host in enumerate(host_dirs_):
                (host / CAPTURES).mkdir(exist_ok=True)
                (host / CAPTURES / f"capture{n}").mkdir(exist_ok=i > 0)
            return n
        except FileExistsError:
            n += 1


def lead_steps(step_s: float | None, lead_s: float) -> int:
    """Steps between now and the capture's first step: time for every rank to read the request."""
    if not step_s or step_s <= 0:
        return MIN_LEAD_STEPS
    return max(MIN_LEAD_STEPS, math.ceil(lead_s / step_s) + 1)


def start_step(host_dirs_: list[Path], step_s: float | None, lead_s: float, not_before: int = 0) -> int:
    """The first step to record: after every rank's current step (warm-up step included) + the lead."""
    now = max((s for h in host_dirs_ for s, _ in current_steps(h).values()), default=0)
    return max(now + WARMUP_STEPS + lead_steps(step_s, lead_s), not_before)


def write_request(host_dir: Path, req: dict[str, Any]) -> None:
    write_json(host_dir / "inject" / REQUEST_NAME, req)


def read_request(host_dir: Path) -> dict[str, Any] | None:
    return read_json(host_dir / "inject" / REQUEST_NAME)


def make_request(cid: int, start: int, steps: int, kind: str, requested_by: str, ranks: list[int] | None,
                 dump: bool) -> dict[str, Any]:
    now = time.time_ns()
    return {"id": cid, "start_step": start, "steps": steps, "ranks": ranks, "kind": kind,
            "requested_by": requested_by, "dump": dump, "requested_at": iso(now), "requested_at_ns": now}


def capture_dir(host_dir: Path, cid: int) -> Path:
    return host_dir / CAPTURES / f"capture{cid}"


def write_trigger(host_dir: Path, cid: int, trigger: dict[str, Any]) -> None:
    write_json(capture_dir(host_dir, cid) / "trigger.json", trigger)


def rank_outcomes(host_dir: Path, cid: int) -> dict[int, dict[str, Any]]:
    """``{rank: captures/capture{N}/rank{R}.json}`` written so far."""
    out = {}
    for path in capture_dir(host_dir, cid).glob("rank*.json"):
        doc = read_json(path)
        if doc and isinstance(doc.get("rank"), int):
            out[doc["rank"]] = doc
    return out


def known_ranks(host_dir: Path) -> list[int]:
    """Ranks that described themselves in ``ranks/rank{R}.json`` (the ones a request reaches)."""
    out = []
    for path in (host_dir / "ranks").glob("rank*.json"):
        doc = read_json(path)
        if doc and isinstance(doc.get("rank"), int):
            out.append(doc["rank"])
    return sorted(set(out))


def captures_bytes(host_dir: Path) -> int:
    total = 0
    for path in (host_dir / CAPTURES).rglob("*"):
        try:
            if path.is_file():
                total += path.stat().st_size
        except OSError:
            pass
    return total


# ---------------------------------------------------------------------------------------- dumps


def take_dump(host_dir: Path, cid: int, dump: Callable[[str], dict[str, Any]]) -> tuple[str | None, str | None]:
    """Stacks + Flight Recorder of every local rank now (the watchdog's dump), moved into the capture's
    folder: ``stacks/`` and ``fr/`` are left as they were, so a hang's evidence is never overwritten and
    a capture is never mistaken for a hang. Returns the capture's ``stacks`` and ``fr`` folders (relative)."""
    folder = capture_dir(host_dir, cid)
    stacks_dir, fr_dir = host_dir / "stacks", host_dir / "fr"
    sizes = {p.name: p.stat().st_size for p in stacks_dir.glob("rank*.txt") if p.is_file()}
    kept = []
    for path in fr_dir.glob("rank*"):
        if path.is_file():
            backup = path.with_name(f".keep.{path.name}")
            path.rename(backup)
            kept.append((backup, path))
    stacks = fr = None
    try:
        dump(f"capture{cid}")
    finally:
        for path in stacks_dir.glob("rank*.txt"):
            try:
                old = sizes.get(path.name, 0)
                with open(path, "rb") as fh:
                    fh.seek(old)
                    data = fh.read(16 << 20)
                if data.strip():
                    (folder / "stacks").mkdir(exist_ok=True)
                    (folder / "stacks" / path.name).write_bytes(data)
                    stacks = str((folder / "stacks").relative_to(host_dir))
                os.truncate(path, old)  # faulthandler appends (O_APPEND): its later writes still go to the end
            except OSError:
                pass
        for path in fr_dir.glob("rank*"):
            try:
                if path.is_file():
                    (folder / "fr").mkdir(exist_ok=True)
                    shutil.move(str(path), folder / "fr" / path.name)
                    fr = str((folder / "fr").relative_to(host_dir))
            except OSError:
                pass
        for backup, path in kept:  # a hang's or SIGUSR1's dump goes back where it was
            try:
                backup.rename(path)
            except OSError:
                pass
    return stacks, fr
