"""Write Flight Recorder dumps the way torch 2.13's NCCL recorder does (pickle, format version "2.10").

The simulator's hangs (:mod:`traceread.simulate.fr_hang`) end here: one dict per rank with the keys and
value types torch writes (``version``, ``pg_config``, ``comm_lib_version``, ``pg_status``, ``entries``),
pickled with protocol 2 like torch's C++ pickler (dicts, lists, tuples, strings, ints, floats, None,
bools; strings memoised). Quirks kept on purpose, because real dumps have them:

* ``pg_status`` is keyed by the process-*local* pg id (the order in which this rank created its groups),
  and its ``last_*_collective`` is the seq of the last *work*: after a send/recv it is a p2p seq.
* A p2p entry carries the group's current ``collective_seq_id`` unchanged and its own ``p2p_seq_id``;
  its ``profiling_name`` is ``nccl:send 0->1`` / ``nccl:recv 1<-0`` in ranks *of the group*.
* ``state`` is ``scheduled``/``started``/``completed``; ``started`` and ``time_discovered_started_ns``
  exist only with start events (``TORCH_NCCL_ENABLE_TIMING=1``); ``duration_ms`` only then, on
  completed entries.
* The buffer is a ring: only the last ``buffer`` entries survive, ``record_id`` keeps counting.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

VERSION = "2.10"
NCCL_VERSION = "2.27.5"
C10D = "/usr/local/lib/python3.12/dist-packages/torch/distributed/distributed_c10d.py"
LOGGER = "/usr/local/lib/python3.12/dist-packages/torch/distributed/c10d_logger.py"
C10D_LINE = {"all_reduce": 2869, "all_gather": 3907, "reduce_scatter": 4387, "all_to_all": 4528, "broadcast": 2766,
             "send": 2445, "recv": 2507}
C10D_FUNC = {"all_gather": "all_gather_into_tensor", "reduce_scatter": "reduce_scatter_tensor",
             "all_to_all": "all_to_all_single", "send": "isend", "recv": "irecv"}


@dataclass
class Entry:
    """One recorded op of one rank, as the recorder sees it at dump time."""

    pg: str  # group name
    local_id: int  # process-local pg id
    desc: str
    op: str  # all_reduce, send, ...
    coll_seq: int
    p2p_seq: int
    op_id: int
    is_p2p: bool
    peer: tuple[int, int] | None  # (my group rank, peer group rank) for p2p
    sizes: list[list[int]]
    dtype: str
    created_ns: int
    started_ns: int | None  # when the GPU started it (None: not started)
    completed_ns: int | None
    timeout_ms: int = 600_000
    where: tuple[str, str, int] = ("train_step", "/workspace/pretrain.py", 1)  # (function, file, line)


@dataclass
class RankRecorder:
    """What one rank's recorder holds at dump time."""

    rank: int
    groups: list[tuple[str, str, list[int]]]  # (name, desc, members) in this rank's creation order
    entries: list[Entry] = field(default_factory=list)  # oldest first: the ring's content (or more: cut to buffer)
    first_record_id: int = 0  # record_id of entries[0] (earlier ones fell out of the ring)
    prior: dict[str, tuple[int, int, int]] = field(default_factory=dict)  # pg -> status before entries[0]


def _frames(e: Entry) -> list[dict[str, Any]]:
    fn = C10D_FUNC.get(e.op, e.op)
    return [{"name": fn, "filename": C10D, "line": C10D_LINE.get(e.op, 2000)},
            {"name": "wrapper", "filename": LOGGER, "line": 83},
            {"name": e.where[0], "filename": e.where[1], "line": e.where[2]},
            {"name": "train_step", "filename": "/workspace/Megatron-LM/megatron/training/training.py", "line": 1187}]


def _state(e: Entry, timing: bool) -> str:
    if e.completed_ns is not None:
        return "completed"
    if timing and e.started_ns is not None:
        return "started"
    return "scheduled"


def dump_dict(rec: RankRecorder, *, timing: bool, buffer: int = 2000, frames: bool = True,
              stateless: bool = False) -> dict[str, Any]:
    """The dict torch's ``_dump_nccl_trace()`` would unpickle to, for this rank.

    ``stateless``: every entry is ``scheduled`` with no start/completion time and not retired, as torch
    writes an entry recorded without CUDA events (``record(..., nullptr, nullptr, ...)`` inside a
    coalescing group) or whose event query failed; ``pg_status`` still follows the watchdog."""
    kept = rec.entries[-buffer:] if buffer else []
    first_id = rec.first_record_id + len(rec.entries) - len(kept)
    tid = str(140_000_000_000_000 + rec.rank)
    entries: list[dict[str, Any]] = []
    for i, e in enumerate(kept):
        name = f"nccl:{e.op}"
        if e.is_p2p and e.peer is not None:
            name += f" {e.peer[0]}->{e.peer[1]}" if e.op == "send" else f" {e.peer[0]}<-{e.peer[1]}"
        d: dict[str, Any] = {}
        if frames:
            d["frames"] = _frames(e)
        d.update({
            "record_id": first_id + i, "pg_id": e.local_id, "process_group": (e.pg, e.desc), "thread_name": "pt_main_thread",
            "thread_id": tid, "collective_seq_id": e.coll_seq, "p2p_seq_id": e.p2p_seq, "op_id": e.op_id,
            "profiling_name": name, "time_created_ns": e.created_ns})
        if timing and not stateless and e.completed_ns is not None and e.started_ns is not None:
            d["duration_ms"] = (e.completed_ns - e.started_ns) / 1e6
        state = "scheduled" if stateless else _state(e, timing)
        d.update({
            "input_sizes": e.sizes, "input_dtypes": [e.dtype], "output_sizes": e.sizes, "output_dtypes": [e.dtype],
            "state": state,
            "time_discovered_started_ns": e.started_ns if timing and e.started_ns is not None and not stateless else None,
            "time_discovered_completed_ns": None if stateless else e.completed_ns,
            "retired": e.completed_ns is not None and not stateless, "timeout_ms": e.timeout_ms, "is_p2p": e.is_p2p})
        entries.append(d)
    status: dict[str, dict[str, int]] = {}
    local = {name: i for i, (name, _d, _m) in enumerate(rec.groups)}
    for name, i in local.items():
        enq, started, done = rec.prior.get(name, (-1, -1, -1))
        status[str(i)] = {"last_enqueued_collective": enq, "last_started_collective": started if timing else -1,
                          "last_completed_collective": done}
    for e in rec.entries:  # pg_status follows every work ever enqueued (not only the kept ones)
        st = status[str(local[e.pg])]
        seq = e.p2p_seq if e.is_p2p else e.coll_seq  # torch writes the work's seq: a p2p one after a send/recv
        st["last_enqueued_collective"] = seq
        if timing and e.started_ns is not None:
            st["last_started_collective"] = seq
        if e.completed_ns is not None:
            st["last_completed_collective"] = seq
    config = {name: {"name": name, "desc": desc, "ranks": "[" + ", ".join(map(str, members)) + "]"}
              for name, desc, members in rec.groups}
    return {"version": VERSION, "pg_config": config, "comm_lib_version": NCCL_VERSION, "pg_status": status,
            "entries": entries}


def write_dump(path: str | Path, rec: RankRecorder, *, timing: bool, buffer: int = 2000, frames: bool = True,
               stateless: bool = False) -> int:
    """Pickle one rank's dump to ``path`` (protocol 2, as torch does); the bytes written."""
    data = pickle.dumps(dump_dict(rec, timing=timing, buffer=buffer, frames=frames, stateless=stateless), protocol=2)
    Path(path).write_bytes(data)
    return len(data)


def write_dumps(out: str | Path, recorders: Sequence[RankRecorder], *, timing: bool, buffer: int = 2000,
                frames: bool = True, prefix: str = "nccl_trace_rank_") -> list[Path]:
    """One dump per rank, named like torch's ``TORCH_FR_DUMP_TEMP_FILE`` prefix + global rank."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for rec in recorders:
        p = folder / f"{prefix}{rec.rank}"
        write_dump(p, rec, timing=timing, buffer=buffer, frames=frames)
        paths.append(p)
    return paths
