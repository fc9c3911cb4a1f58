"""Memory snapshots (``torch.cuda.memory._dump_snapshot``): the largest live allocations at the peak,
grouped by the Python frame that made them — the view ``pytorch.org/memory_viz`` opens, in the report.

A snapshot is a pickled dict (``torch.cuda.memory._snapshot`` documents it): ``segments`` (what the
caching allocator holds when the snapshot is taken: per segment its ``device``, ``address``,
``total_size`` and ``blocks``, each with ``size``, ``state`` and the ``frames`` of the call that
allocated it) and, when ``_record_memory_history`` ran, ``device_traces`` (per device, the last
actions: ``alloc``, ``free_requested``, ``free_completed``, ``segment_alloc``, ``segment_free``,
``oom``, ``snapshot``, each with ``addr``, ``size`` and ``frames``). It is read as plain data only
(:mod:`traceread.read.safe_pickle`): a snapshot that holds any class is refused, never run.

The peak: the live blocks at the end (``active_allocated`` and ``active_awaiting_free``) are replayed
backwards through the history (before an ``alloc`` its block did not exist; before a
``free_completed`` it did), so the allocated total and the live set are known after every action even
when the history ring buffer lost its beginning. The peak is the largest total (the first one when it
repeats); without a history it is the snapshot itself. A block is attributed to the innermost Python
frame of user code in its stack (frames under ``site-packages``/``dist-packages``, the Python library or
PyTorch's own ``torch/`` are library code), else to its innermost Python frame.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from traceread.errors import TraceFileError
from traceread.read.safe_pickle import load_plain

#: Frame groups listed per device.
TOP_FRAMES = 10
LIVE_STATES = ("active_allocated", "active_awaiting_free")
_PY_IN_NAME = re.compile(r"^(?P<file>.+?\.py)\((?P<line>\d+)\): (?P<func>.*)$")  # torch.profiler's frame names
_LIBRARY = re.compile(r"(^|/)(site-packages|dist-packages)/|/lib/python3[.\d]*/|^torch/|^<")
_RANK_RE = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
#: C++ frames that name what allocated when no Python frame did (backward runs on autograd's own threads)
_AUTOGRAD_NODE = re.compile(r"torch::autograd::generated::(?P<node>\w+)::apply\(")
_ATEN_OP = re.compile(r"^at::_ops::(?P<op>\w+)::call\(")

Block = tuple[int, list[dict[str, Any]]]  # size, frames


#: Snapshots read per report: the OOM ones first, then the peak rank's, then by rank (each can be large).
MAX_SNAPSHOTS = 8
SNAPSHOT_SUFFIXES = (".pickle", ".pkl")


def find_snapshots(paths: list[str], run_dir: Path | None, explicit: list[Path]) -> list[Path]:
    """Snapshot files: those named with ``--snapshot``, the run folder's ``memory/`` (``traceread collect
    --memory-snapshot``), and files with "snapshot" in their name directly in a folder the user gave."""
    found: list[Path] = [Path(p) for p in explicit]
    if run_dir is not None:  # RUN/memory, or RUN/<host>/memory with collect's per-host layout
        for folder in [run_dir / "memory", *sorted(run_dir.glob("*/memory"))]:
            if folder.is_dir():
                found += sorted(f for f in folder.iterdir() if f.suffix in SNAPSHOT_SUFFIXES and f.is_file())
    for p in paths:
        if "://" in str(p):
            continue
        q = Path(p)
        if q.is_dir():
            found += sorted(f for f in q.iterdir()
                            if f.suffix in SNAPSHOT_SUFFIXES and "snapshot" in f.name.lower() and f.is_file())
    seen: set[Path] = set()
    out = []
    for f in found:
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out


def choose(files: list[Path], peak_rank: int | None, limit: int = MAX_SNAPSHOTS) -> list[Path]:
    """At most ``limit`` files: names saying OOM first, then the peak rank's, then by rank and name."""
    def key(f: Path) -> tuple[int, int, int, str]:
        r = rank_of(f)
        return (0 if "oom" in f.name.lower() else 1, 0 if r is not None and r == peak_rank else 1,
                r if r is not None else 1 << 30, f.name)

    return sorted(files, key=key)[:limit]


def rank_of(path: Path) -> int | None:
    m = _RANK_RE.search(path.name)
    return int(m.group(1)) if m else None


def read_snapshot(path: str | Path, rank: int | None = None) -> dict[str, Any]:
    """One snapshot file -> ``{"file", "rank", "oom", "devices": [...]}``; bad input raises one
    :class:`TraceFileError` line."""
    p = Path(path)
    data = load_plain(p, "memory snapshot")
    if not isinstance(data, dict) or not isinstance(data.get("segments"), list):
        raise TraceFileError("not a memory snapshot (no 'segments' list)", str(p))
    traces = data.get("device_traces")
    traces = traces if isinstance(traces, list) else []
    live = _live_blocks(data["segments"])
    devices = sorted(set(live) | {d for d, t in enumerate(traces) if isinstance(t, list) and t})
    out = [_device(d, live.get(d, {}), traces[d] if d < len(traces) and isinstance(traces[d], list) else [])
           for d in devices]
    # ``traceread collect`` names the snapshot it takes on an out-of-memory error rank{R}_oom.pickle; a CUDA
    # snapshot also records the failed request as an ``oom`` action.
    oom = any(d["oom"] for d in out) or p.stem.lower().endswith("_oom")
    return {"file": str(p), "rank": rank if rank is not None else rank_of(p), "oom": oom, "devices": out}


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _frames(d: dict[str, Any]) -> list[dict[str, Any]]:
    f = d.get("frames")
    return f if isinstance(f, list) else []


def _live_blocks(segments: list[Any]) -> dict[int, dict[int, Block]]:
    """device -> {address: (size, frames)} of the blocks live when the snapshot was taken. Blocks
    without an ``address`` (snapshots converted from a profile) sit one after the other from the
    segment's address."""
    out: dict[int, dict[int, Block]] = {}
    for seg in segments:
        if not isinstance(seg, dict):
            continue
        dev = _int(seg.get("device")) or 0
        addr = _int(seg.get("address")) or 0
        for b in seg.get("blocks") or []:
            if not isinstance(b, dict):
                continue
            size = _int(b.get("size")) or 0
            here = _int(b.get("address"))
            here = addr if here is None else here
            if b.get("state") in LIVE_STATES and size > 0:
                out.setdefault(dev, {})[here] = (size, _frames(b))
            addr = here + size
    return out


def _device(dev: int, live_end: dict[int, Block], trace: list[Any]) -> dict[str, Any]:
    entries = [e for e in trace if isinstance(e, dict)]
    end_total = sum(s for s, _ in live_end.values())
    peak_at, peak = _peak(live_end, end_total, entries)
    live = _rewind(live_end, entries, peak_at)
    ooms = [e for e in entries if e.get("action") == "oom"]
    return {
        "device": dev, "history_entries": len(entries), "allocated_at_snapshot_bytes": end_total,
        "peak_allocated_bytes": peak,
        "peak_is_snapshot": peak_at == len(entries),  # no earlier state had more allocated
        "oom": bool(ooms), "oom_request_bytes": _int(ooms[-1].get("size")) if ooms else None,
        "live_at_peak_bytes": sum(s for s, _ in live.values()), "live_at_peak_blocks": len(live),
        "top_frames": _by_frame(live),
    }


def _alloc_frames(entries: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """history index of each ``free_completed`` -> the frames of the ``alloc`` it frees: a block put back
    while rewinding is attributed to where it was allocated, not to where it was freed (a backward node's
    ``release_variables``, say)."""
    last: dict[int, list[dict[str, Any]]] = {}
    out: dict[int, list[dict[str, Any]]] = {}
    for k, e in enumerate(entries):
        addr = _int(e.get("addr"))
        if addr is None:
            continue
        act = e.get("action")
        if act == "alloc":
            last[addr] = _frames(e)
        elif act == "free_completed":
            out[k] = last.pop(addr, [])  # no alloc in the history: allocated before it began
    return out


def _step_back(live: dict[int, Block], e: dict[str, Any], origin: list[dict[str, Any]] | None = None) -> int:
    """Undo history entry ``e`` on ``live`` (the state after it -> before it); the change in bytes.
    ``origin``: the frames of the allocation a ``free_completed`` entry frees (else its own frames)."""
    act, addr, size = e.get("action"), _int(e.get("addr")), _int(e.get("size")) or 0
    if addr is None:
        return 0
    if act == "alloc" and addr in live:
        return -live.pop(addr)[0]
    if act == "free_completed" and addr not in live:
        live[addr] = (size, origin if origin is not None else _frames(e))
        return size
    return 0


def _peak(live_end: dict[int, Block], end_total: int, entries: list[dict[str, Any]]) -> tuple[int, int]:
    """(state index, allocated bytes) of the peak; state k = after the first k history entries
    (k = len(entries): the snapshot itself). The earliest state wins a tie."""
    live = dict(live_end)
    total = best = end_total
    at = len(entries)
    for k in range(len(entries) - 1, -1, -1):
        total += _step_back(live, entries[k])
        if total >= best:
            best, at = total, k
    return at, best


def _rewind(live_end: dict[int, Block], entries: list[dict[str, Any]], state: int) -> dict[int, Block]:
    live = dict(live_end)
    origin = _alloc_frames(entries)
    for k in range(len(entries) - 1, state - 1, -1):
        _step_back(live, entries[k], origin.get(k))
    return live


def python_frame(frames: list[Any]) -> tuple[str, str | None]:
    """(the frame a block is attributed to, the innermost ``nn.Module`` around it or None)."""
    py: list[str] = []
    user: str | None = None
    module: str | None = None
    for f in frames:
        if not isinstance(f, dict):
            continue
        name = str(f.get("name") or "")
        file = str(f.get("filename") or "")
        line = f.get("line")
        if module is None and name.startswith("nn.Module: "):
            module = name[len("nn.Module: "):]
        m = _PY_IN_NAME.match(name) if not file.endswith(".py") else None
        if m:
            file, line, name = m.group("file"), m.group("line"), m.group("func")
        if not file.endswith(".py"):
            continue
        label = f"{file}:{line} {name}"
        py.append(label)
        if user is None and not _LIBRARY.search(file):
            user = label
    if user is not None:
        return user, module
    if py:
        return py[0], module
    return _cpp_origin(frames), module


def _cpp_origin(frames: list[Any]) -> str:
    """A block without a Python frame: the autograd node whose backward allocated it (autograd's threads have
    no Python frames), else the outermost ATen op; a block with no frames at all was live before the
    history began."""
    if not frames:  # live before _record_memory_history started: the allocator kept no stack for it
        return "(allocated before memory history recording began)"
    op: str | None = None
    for f in frames:
        name = str(f.get("name") or "") if isinstance(f, dict) else ""
        m = _AUTOGRAD_NODE.search(name)
        if m:
            return f"backward: {m.group('node')} (autograd thread, no Python frame)"
        a = _ATEN_OP.match(name)
        if a:
            op = a.group("op")  # keep the outermost: frames run innermost first
    return f"aten::{op} (no Python frame)" if op else "(no Python frame recorded)"


def _by_frame(live: dict[int, Block]) -> list[dict[str, Any]]:
    groups: dict[str, dict[str, Any]] = {}
    for size, frames in live.values():
        key, module = python_frame(frames)
        g = groups.setdefault(key, {"frame": key, "bytes": 0, "blocks": 0, "module": module})
        g["bytes"] += size
        g["blocks"] += 1
    return sorted(groups.values(), key=lambda g: (-g["bytes"], g["frame"]))[:TOP_FRAMES]
