"""One rank's trace events, remapped for the merged file.

Every event of the rank's Kineto file is kept as recorded (name, category, args, flows, counters,
instants) except:

* ``pid`` becomes the rank's process (:func:`rank_pid`) and each original (pid, tid) — a host
  thread or a GPU stream — becomes one thread of it, with a globally unique tid
  (``pid * TIDS_PER_PID + k``) named after the original process label and thread
  (``GPU 0 · stream 7``, ``CPU · thread 4102 (python)``); GPU streams sort first;
* ``ts`` is moved onto the report's reference clock (``ts - offset``);
* flow ids get the rank in their high bits so arrows never join two ranks;
* the file's own ``M`` metadata events are replaced by the names above; global instants become
  process-scoped (one rank's "Record Window End" is not a job-wide event).

``--no-host`` keeps only events on GPU processes (and drops flows, whose one end is on the host);
a time window keeps events overlapping it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from traceread.errors import TraceFileError
from traceread.read.decode import decode_top, fix_lone_surrogates, split_events
from traceread.read.inflate import uncompressed_chunks

#: Tids per merged process: tid = pid * TIDS_PER_PID + k.
TIDS_PER_PID = 10_000
#: Flow ids of rank r are (r + 1) * FLOW_ID_STRIDE + original id.
FLOW_ID_STRIDE = 1 << 32
GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "Kernel", "Memcpy",
                            "Memset", "cuda_profiler_range"})
FLOW_PHASES = frozenset({"s", "t", "f"})

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode


class _Head(msgspec.Struct, gc=False):
    """What the first pass needs of an event (args stay undecoded unless it is metadata)."""

    ph: Any = None
    name: Any = None
    cat: Any = None
    pid: Any = None
    tid: Any = None
    args: msgspec.Raw = msgspec.Raw()


_decode_head = msgspec.json.Decoder(_Head).decode


def rank_pid(rank: int) -> int:
    """The merged file's pid of a rank (rank + 1: pid 0 is avoided, some viewers treat it specially)."""
    return rank + 1


@dataclass
class RankEvents:
    """What writing one rank produced besides the events themselves."""

    events: int = 0
    first_ts: float | None = None
    last_end: float | None = None
    threads: dict[int, tuple[str, int]] = field(default_factory=dict)  # tid -> (name, sort index)


def _labels(raws: list[msgspec.Raw]) -> tuple[dict[Any, str], dict[tuple[Any, Any], str], set[Any]]:
    """Original process labels, thread names and the set of GPU pids (first pass, light decode)."""
    pname: dict[Any, str] = {}
    tname: dict[tuple[Any, Any], str] = {}
    gpu: set[Any] = set()
    for raw in raws:
        try:
            e = _decode_head(raw)
        except msgspec.ValidationError:
            continue
        if e.ph == "M":
            args = _decode(e.args) if e.args else {}
            args = args if isinstance(args, dict) else {}
            if e.name == "process_labels" and args.get("labels"):
                pname[e.pid] = str(args["labels"])
            elif e.name == "process_name" and args.get("name") and e.pid not in pname:
                pname[e.pid] = str(args["name"])
            elif e.name == "thread_name" and args.get("name"):
                tname[(e.pid, e.tid)] = str(args["name"])
        elif isinstance(e.cat, str) and e.cat in GPU_CATEGORIES:
            gpu.add(e.pid)
    for p, label in pname.items():
        if label.startswith("GPU"):
            gpu.add(p)
    return pname, tname, gpu


def _thread_label(pid: Any, tid: Any, pname: dict[Any, str], tname: dict[tuple[Any, Any], str], is_gpu: bool) -> str:
    proc = pname.get(pid) or (f"GPU {pid}" if is_gpu else "CPU")
    if is_gpu and proc != "GPU" and not proc.startswith("GPU"):
        proc = f"GPU {pid}"
    thread = (tname.get((pid, tid)) or "").strip() or (f"stream {tid}" if is_gpu else f"thread {tid}")
    return f"{proc} · {thread}"


def _overlaps(e: dict[str, Any], window: tuple[float, float]) -> bool:
    ts = e.get("ts")
    if not isinstance(ts, (int, float)):
        return True
    dur = e.get("dur")
    end = ts + dur if isinstance(dur, (int, float)) else ts
    return end >= window[0] and ts <= window[1]


def rank_events(path: str | Path, rank: int, offset_us: float, *, window: tuple[float, float] | None = None,
                gpu_only: bool = False, info: RankEvents | None = None) -> Iterator[bytes]:
    """The rank's remapped events, JSON-encoded one by one (only this rank's file in memory, and one
    decoded event at a time).

    ``info`` collects the counts, the time span written and the thread names (for the metadata
    events the caller writes after the rank). Raises :class:`traceread.errors.TraceFileError`
    for an unreadable file.
    """
    p = Path(path)
    top = decode_top(fix_lone_surrogates(b"".join(uncompressed_chunks(p))), p)
    raws = split_events(top["traceEvents"], p)
    pname, tname, gpu_pids = _labels(raws)
    info = info if info is not None else RankEvents()
    pid = rank_pid(rank)
    tids: dict[tuple[Any, Any], int] = {}
    for i, raw in enumerate(raws):
        try:
            e = _decode(raw)  # one event as a dict at a time: memory is the file, not its objects
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:  # e.g. a string that is not UTF-8
            raise TraceFileError(f"traceEvents[{i}] is not valid JSON: {str(exc).splitlines()[0]}", str(p)) from None
        if not isinstance(e, dict):
            continue
        ph = e.get("ph")
        if ph == "M":
            continue
        opid, otid = e.get("pid"), e.get("tid")
        is_gpu = opid in gpu_pids
        if gpu_only and (not is_gpu or ph in FLOW_PHASES):
            continue
        if window is not None and not _overlaps(e, window):
            continue
        key = (opid, otid)
        tid = tids.get(key)
        if tid is None:
            tid = pid * TIDS_PER_PID + len(tids)
            tids[key] = tid
            info.threads[tid] = (_thread_label(opid, otid, pname, tname, is_gpu), (0 if is_gpu else 1000) + len(tids))
        e["pid"], e["tid"] = pid, tid
        ts = e.get("ts")
        if isinstance(ts, (int, float)):
            ts = float(ts) - offset_us
            e["ts"] = ts
            dur = e.get("dur")
            end = ts + float(dur) if isinstance(dur, (int, float)) else ts
            info.first_ts = ts if info.first_ts is None else min(info.first_ts, ts)
            info.last_end = end if info.last_end is None else max(info.last_end, end)
        if ph in FLOW_PHASES and "id" in e:
            fid = e["id"]
            e["id"] = (rank + 1) * FLOW_ID_STRIDE + fid if isinstance(fid, int) else f"r{rank}:{fid}"
        if ph == "i" and e.get("s") == "g":
            e["s"] = "p"
        info.events += 1
        yield _encode(e)


def metadata_events(pid: int, process_name: str, sort_index: int, threads: dict[int, tuple[str, int]]) -> Iterator[bytes]:
    """``process_name`` / ``thread_name`` / sort-index metadata for one merged process."""
    yield _encode({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": process_name}})
    yield _encode({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": sort_index}})
    for tid, (name, order) in threads.items():
        yield _encode({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
        yield _encode({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": order}})
