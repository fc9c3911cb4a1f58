"""Every communicator NCCL created, and how long each rank's init of it took.

A process logs one line per communicator it joins (``... comm 0x... rank R nranks N ... - Init
START/COMPLETE``; format strings in NCCL's ``src/init.cc``):

* 2.18: ``comm %p rank %d nranks %d cudaDev %d busId %lx commId 0x%llx - Init COMPLETE``
* 2.19-2.20: ``comm ... nvmlDev %d busId %lx commId 0x%llx - Init START`` / ``COMPLETE``
* 2.21-2.22: ``ncclCommInitRank comm ...`` / ``ncclCommSplit comm ... parent %p color %d key %d
  commId 0x%llx - Init START``
* 2.23+: ``<function> comm ... commId 0x%llx - Init START``, and for a split ``ncclCommSplit comm
  ... parent %p splitCount %d color %d key %d- Init START`` **without** a commId.

2.22+ follows COMPLETE with ``Init timings[ - <function>]: rank R nranks N total T (kernels ...,
[alloc ...,] bootstrap ..., allgathers ..., topo ..., graphs ..., connections ..., rest ...)`` from the
same thread; that line names no communicator, so it is attached to the communicator the same thread
just completed (else the same process's open init of that rank and size). Pointers are per process
and may be reused after a destroy, so a process's view of a communicator is keyed by (host, pid,
pointer) and a new START on a finished pointer opens a new view. Views are joined into one
communicator by commId; a split without commId joins through its parent and colour.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from typing import Any

from traceread.analysis.comm.nccl.lines import LogLine

_HEX = r"0x[0-9a-fA-F]+|\(nil\)"
_INIT = re.compile(
    rf"(?:(?P<func>nccl\w+) )?comm (?P<ptr>{_HEX}) rank (?P<rank>\d+) nranks (?P<nranks>\d+) cudaDev (?P<cuda>\d+)"
    r"(?: nvmlDev \d+)?(?: busId [0-9a-fA-F]+)?"
    rf"(?: parent (?P<parent>{_HEX}))?(?: splitCount (?P<count>\d+))?(?: color (?P<color>-?\d+))?(?: key -?\d+)?"
    r"(?: commId (?P<id>0x[0-9a-fA-F]+))?(?: localSize \d+)?(?: used \d+ bytes)?\s*- Init (?P<phase>START|COMPLETE)"
)
_TOPO = re.compile(r"comm (0x[0-9a-fA-F]+) rank (\d+) nRanks (\d+) nNodes (\d+) localRanks (\d+) localRank (\d+)")
_SPLIT = re.compile(r"bootstrapSplit: comm (0x[0-9a-fA-F]+) parent (0x[0-9a-fA-F]+) rank (\d+) nranks (\d+) color (-?\d+)")
_TIMING = re.compile(r"Init timings(?: - (\w+))?: rank (\d+) nranks (\d+) total ([\d.]+)(?: \(([^)]*)\))?")
_PHASE = re.compile(r"(\w+) ([\d.]+)")


@dataclass(eq=False)
class View:
    """One process's (one GPU's) view of one communicator."""

    order: int
    host_key: str  # host name, or the file for logs without NCCL's prefix
    pid: int | None
    gpu: int | None  # cudaDev
    ptr: str | None
    rank: int | None = None
    nranks: int | None = None
    comm_id: str | None = None
    parent: View | None = None
    parent_ptr: str | None = None
    color: int | None = None
    split_count: int | None = None
    func: str | None = None
    started: bool = False
    completed: bool = False
    nnodes: int | None = None
    local_ranks: int | None = None
    host: str | None = None
    total_s: float | None = None
    phases: dict[str, float] = field(default_factory=dict)
    timing_line: LogLine | None = None
    start_line: LogLine | None = None

    @property
    def gpu_key(self) -> tuple[str, int | None, int | None]:
        return (self.host_key, self.pid, self.gpu)


class CommTracker:
    """Feed it lines; :meth:`finish` returns the communicators and the init-time summary."""

    def __init__(self) -> None:
        self.views: list[View] = []
        self._by_ptr: dict[tuple[str, int | None, str], View] = {}
        self._by_thread: dict[tuple[str, int | None, int | None], View] = {}
        self.nnodes_seen: list[int] = []
        self.local_ranks_seen: list[int] = []

    def _new(self, ln: LogLine, ptr: str | None, gpu: int | None) -> View:
        v = View(order=len(self.views), host_key=ln.host or ln.file, pid=ln.pid, gpu=gpu, ptr=ptr, host=ln.host)
        self.views.append(v)
        if ptr is not None:
            self._by_ptr[(v.host_key, v.pid, ptr)] = v
        return v

    def _view(self, ln: LogLine, ptr: str, gpu: int | None) -> View:
        v = self._by_ptr.get((ln.host or ln.file, ln.pid, ptr))
        return v if v is not None else self._new(ln, ptr, gpu)

    def feed(self, ln: LogLine) -> bool:
        """Take the line if it is about a communicator; True when it was."""
        msg = ln.msg
        if "Init " in msg and (m := _INIT.search(msg)):
            self._init(ln, m)
            return True
        if "nNodes" in msg and (m := _TOPO.search(msg)):
            v = self._view(ln, m.group(1), ln.dev)
            v.rank, v.nranks = int(m.group(2)), int(m.group(3))
            v.nnodes, v.local_ranks = int(m.group(4)), int(m.group(5))
            self.nnodes_seen.append(v.nnodes)
            self.local_ranks_seen.append(v.local_ranks)
            return True
        if "bootstrapSplit" in msg and (m := _SPLIT.search(msg)):
            v = self._view(ln, m.group(1), ln.dev)
            v.parent_ptr = m.group(2)
            v.parent = v.parent or self._by_ptr.get((ln.host or ln.file, ln.pid, m.group(2)))
            v.rank, v.nranks, v.color = int(m.group(3)), int(m.group(4)), int(m.group(5))
            return True
        if "timings" in msg and (m := _TIMING.search(msg)):
            self._timing(ln, m)
            return True
        return False

    def _init(self, ln: LogLine, m: re.Match[str]) -> None:
        ptr, phase, comm_id = m.group("ptr"), m.group("phase"), m.group("id")
        v = self._by_ptr.get((ln.host or ln.file, ln.pid, ptr))
        reused = v is not None and (
            (phase == "START" and (v.started or v.completed)) or (phase == "COMPLETE" and v.completed)
            or (comm_id is not None and v.comm_id is not None and comm_id != v.comm_id))
        if v is None or reused:
            v = self._new(ln, ptr, int(m.group("cuda")))
        v.gpu = int(m.group("cuda"))
        v.rank, v.nranks = int(m.group("rank")), int(m.group("nranks"))
        v.comm_id = comm_id or v.comm_id
        v.func = m.group("func") or v.func
        if m.group("parent") is not None:
            v.parent_ptr = m.group("parent")
            v.parent = v.parent or self._by_ptr.get((ln.host or ln.file, ln.pid, v.parent_ptr))
        if m.group("color") is not None:
            v.color = int(m.group("color"))
        if m.group("count") is not None:
            v.split_count = int(m.group("count"))
        if phase == "START":
            v.started = True
            v.start_line = v.start_line or ln
        else:
            v.completed = True
        self._by_thread[(ln.host or ln.file, ln.pid, ln.tid)] = v

    def _timing(self, ln: LogLine, m: re.Match[str]) -> None:
        rank, nranks, total = int(m.group(2)), int(m.group(3)), float(m.group(4))
        v = self._by_thread.get((ln.host or ln.file, ln.pid, ln.tid))
        if v is None or v.total_s is not None or v.rank != rank or v.nranks != nranks:
            v = next((x for x in reversed(self.views)
                      if x.host_key == (ln.host or ln.file) and x.pid == ln.pid and x.rank == rank
                      and x.nranks == nranks and x.total_s is None), None)
        if v is None:
            v = self._new(ln, None, ln.dev)
            v.rank, v.nranks = rank, nranks
        v.total_s = total
        v.func = v.func or m.group(1)
        v.phases = {k: float(x) for k, x in _PHASE.findall(m.group(5) or "")}
        v.timing_line = ln

    # ---- the reduce ----------------------------------------------------------------------------

    def finish(self) -> tuple[list[Comm], dict[str, Any]]:
        """The communicators in order of first appearance, and the job's init-time summary."""
        comms = _group(self.views)
        return comms, _init_summary(comms)


@dataclass(eq=False)
class Comm:
    """One communicator: every process's view of it."""

    key: tuple[Any, ...]
    views: list[View] = field(default_factory=list)
    index: int = 0

    @property
    def comm_id(self) -> str | None:
        return next((v.comm_id for v in self.views if v.comm_id), None)

    @property
    def nranks(self) -> int | None:
        sizes = [v.nranks for v in self.views if v.nranks]
        return max(sizes) if sizes else None

    def timed(self) -> dict[int, View]:
        """rank -> its slowest timed view (a rank logged twice keeps the slower)."""
        out: dict[int, View] = {}
        for v in self.views:
            if v.total_s is not None and v.rank is not None:
                if v.rank not in out or v.total_s > (out[v.rank].total_s or 0.0):
                    out[v.rank] = v
        return out

    def to_json(self) -> dict[str, Any]:
        ranks = sorted({v.rank for v in self.views if v.rank is not None})
        hosts = sorted({v.host for v in self.views if v.host})
        nnodes = max((v.nnodes for v in self.views if v.nnodes), default=None)
        local = max((v.local_ranks for v in self.views if v.local_ranks), default=None)
        parent = next((v.parent for v in self.views if v.parent is not None), None)
        timed = self.timed()
        init: dict[str, Any] | None = None
        if timed:
            slow = max(timed.values(), key=lambda v: v.total_s or 0.0)
            fast = min(timed.values(), key=lambda v: v.total_s or 0.0)
            evidence: list[str] = [slow.timing_line.quote()] if slow.timing_line else []
            init = {"slowest_s": slow.total_s, "slowest_rank": slow.rank, "fastest_s": fast.total_s,
                    "fastest_rank": fast.rank, "median_s": statistics.median(v.total_s or 0.0 for v in timed.values()),
                    "ranks_timed": len(timed), "phases": dict(slow.phases), "bootstrap_least": None,
                    "evidence": evidence}
            boot = [v for v in timed.values() if "bootstrap" in v.phases]
            if len(boot) > 1:
                late = min(boot, key=lambda v: v.phases["bootstrap"])
                init["bootstrap_least"] = {"rank": late.rank, "bootstrap_s": late.phases["bootstrap"]}
                if late.timing_line and late is not slow:
                    evidence.append(late.timing_line.quote())
        started = {v.rank for v in self.views if v.started and v.rank is not None}
        complete = {v.rank for v in self.views if v.completed and v.rank is not None}
        pending = [v.start_line.quote() for v in self.views
                   if v.started and not v.completed and v.start_line is not None][:2]
        return {
            "index": self.index,
            "comm_id": self.comm_id,
            "kind": "split" if any(v.parent_ptr or v.color is not None for v in self.views) else "init",
            "parent": (parent.comm_id if parent is not None else None),
            "color": next((v.color for v in self.views if v.color is not None), None),
            "nranks": self.nranks,
            "nnodes": nnodes if nnodes is not None else (len(hosts) or None),
            "local_ranks": local,
            "ranks_seen": ranks,
            "init_started": sorted(started),
            "init_complete": sorted(complete),
            "hosts": hosts,
            "init": init,
            "pending_evidence": pending,
        }


def _group(views: list[View]) -> list[Comm]:
    """Views -> communicators: by commId; a split without one through its parent and colour; a view
    with neither joins the only communicator of its size that has an id (else groups by size)."""
    groups: dict[tuple[Any, ...], Comm] = {}
    key_of: dict[int, tuple[Any, ...]] = {}

    def put(v: View, key: tuple[Any, ...]) -> None:
        groups.setdefault(key, Comm(key)).views.append(v)
        key_of[id(v)] = key

    for v in views:
        if v.comm_id:
            put(v, ("id", v.comm_id))
    by_colour: dict[tuple[int | None, int | None], set[tuple[Any, ...]]] = {}
    for key, g in groups.items():
        for v in g.views:
            if v.color is not None:
                by_colour.setdefault((v.color, v.nranks), set()).add(key)
    for v in views:  # splits without commId (NCCL >= 2.23)
        if v.comm_id or v.color is None:
            continue
        known = by_colour.get((v.color, v.nranks), set())
        if len(known) == 1:
            put(v, next(iter(known)))
            continue
        parent = key_of.get(id(v.parent)) if v.parent is not None else None
        put(v, ("split", parent, v.color, v.split_count, v.nranks))
    for v in views:
        if id(v) in key_of:
            continue
        same = [k for k, g in groups.items() if k[0] == "id" and g.nranks == v.nranks]
        put(v, same[0] if len(same) == 1 else ("nranks", v.nranks))
    comms = sorted(groups.values(), key=lambda g: min(v.order for v in g.views))
    for i, c in enumerate(comms):
        c.index = i
    return comms


def _world_rank(comms: list[Comm]) -> dict[tuple[str, int | None, int | None], int]:
    """Each GPU's rank in the largest communicator it belongs to (its global rank, in practice)."""
    best: dict[tuple[str, int | None, int | None], tuple[int, int]] = {}
    for c in comms:
        for v in c.views:
            if v.rank is None or v.pid is None:
                continue
            size = c.nranks or 0
            if v.gpu_key not in best or size > best[v.gpu_key][0]:
                best[v.gpu_key] = (size, v.rank)
    return {k: r for k, (_s, r) in best.items()}


def _init_summary(comms: list[Comm]) -> dict[str, Any]:
    """Per rank the slowest init (and its phases) and the sum over communicators; the slowest overall."""
    world = _world_rank(comms)
    slowest: dict[int, View] = {}
    total: dict[int, float] = {}
    worst: tuple[Comm, View] | None = None
    for c in comms:
        for v in c.timed().values():
            r = world.get(v.gpu_key, v.rank) if v.pid is not None else v.rank
            assert r is not None
            total[r] = total.get(r, 0.0) + (v.total_s or 0.0)
            if r not in slowest or (v.total_s or 0.0) > (slowest[r].total_s or 0.0):
                slowest[r] = v
            if worst is None or (v.total_s or 0.0) > (worst[1].total_s or 0.0):
                worst = (c, v)
    out: dict[str, Any] = {
        "init_timings": {str(r): slowest[r].total_s for r in sorted(slowest)},
        "init_phases": {str(r): dict(slowest[r].phases) for r in sorted(slowest) if slowest[r].phases},
        "init_total_s": {str(r): round(total[r], 6) for r in sorted(total)},
        "init_time_s": max((v.total_s or 0.0 for v in slowest.values()), default=None) if slowest else None,
        "init_slowest": None,
    }
    if worst is not None:
        c, v = worst
        gr = world.get(v.gpu_key, v.rank) if v.pid is not None else v.rank
        out["init_slowest"] = {"comm_index": c.index, "comm_id": c.comm_id, "nranks": c.nranks, "rank": gr,
                               "comm_rank": v.rank, "host": v.host, "total_s": v.total_s, "phases": dict(v.phases)}
    return out
