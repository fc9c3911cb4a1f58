"""Read one PyTorch Flight Recorder (FR) dump into a compact per-rank summary (the map side of ``hang``).

FR keeps a ring buffer of what each rank enqueued. A dump (pickle from ``_dump_fr_trace`` /
``_dump_nccl_trace`` and torch's dump-on-timeout, or JSON from the ``*_json`` variants and the c10d
worker server; format versions "2.x" of torch 2.4–2.13) is a dict with ``version``, ``pg_config``
(pg name → desc, ranks), ``pg_status`` (process-*local* pg id → last enqueued / started / completed
collective seq) and ``entries`` (oldest first). Both recorders use it: NCCL (``nccl:`` ops, CUDA
events give ``scheduled``/``started``/``completed``) and the CPU one (``gloo:`` ops, always
``scheduled``; completion only from ``retired`` and ``pg_status``).

What this module keeps per process group (:class:`GroupView`): the last collective seq the rank
enqueued, started and completed, its *pending* collectives (enqueued, not completed) and the last
few completed ones, and its pending point-to-point ops. That is all the cross-rank attribution
needs, and it stays small at 4,096 ranks × 2,000 entries.

Traps of the format, each handled here:

* ``pg_status`` is keyed by the process-local pg id, not the pg name; the name comes from the
  entries (``pg_id`` + ``process_group``) or, for a group with no entry in the buffer, from the
  order of creation (local ids and numeric names grow together).
* NCCL writes the seq of the last *work* into ``pg_status``, and a send/recv's seq is its p2p seq:
  on a group that mixes both, ``last_enqueued_collective`` may be a p2p number. It is used only
  when the group's newest entry is a collective (or the group has no entry at all).
* gloo's ``last_completed_collective`` lags the truth (measured: 8 while entries 9–11 were
  retired); a retired gloo entry is complete.
* Untrusted bytes: a pickle can run code, so the unpickler refuses every class (only the opcodes
  that build dicts, lists, tuples, strings and numbers work, which is all a dump uses); its memory is
  bounded before it runs (:func:`traceread.read.safe_pickle.pickle_budget`); nested values (sizes, frames) are walked with a
  node budget, so a "billion laughs" of shared references costs nothing; numbers are checked
  (``Infinity``, 10**400, strings).
"""

from __future__ import annotations

import re
import sys
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traceread.analysis.hang.files import decode_json, read_bounded, read_head
from traceread.errors import TraceFileError
from traceread.read.safe_pickle import loads_plain

#: A dump larger than this is refused (2,000 entries with Python frames is about 1 MB; 20,000 about 10 MB).
MAX_DUMP_BYTES = 256 << 20
#: Planned memory of one unpickled dump above which it is refused (:func:`traceread.read.safe_pickle.pickle_budget`).
MAX_PICKLE_MEMORY = 1 << 30
#: Entries read from one dump (FR's buffer is 2,000 by default; torchtitan uses 20,000).
MAX_ENTRIES = 1_000_000
#: Pending ops kept per group and rank: the oldest matter (where the rank is, the first collective it has not
#: completed); the count of the rest is kept, and started ones are kept too.
MAX_PENDING = 8
#: Completed collectives kept per group and rank, newest (for order evidence).
KEEP_COMPLETED = 4
#: Frames read per entry (innermost first).
MAX_FRAMES = 64
#: Completed entries in a row, read back from the newest, after which the rest of a buffer is skipped.
QUIET_TAIL = 256
#: Sizes are cut to this many numbers when printed (an all_to_all of 4,096 splits).
MAX_SIZE_NODES = 256
SNIFF_BYTES = 4096

_MAGIC_GZIP = b"\x1f\x8b"
_INT_BOUND = 1 << 62
_NAME_SUFFIXES = re.compile(r"(\.(json|pkl|pickle|pk|gz|txt|bin|fr|dump|cpu|nccl))+$", re.I)
_RANK_WORD = re.compile(r"rank[_\-.]?(\d+)", re.I)
_TRAILING_INT = re.compile(r"(\d+)$")
_ANY_INT = re.compile(r"\d+")
_P2P_PEER = re.compile(r"(-?\d+)\s*(->|<-)\s*(-?\d+)")

# Frames in these places are never "where the user's code is" (the same rule as stack dumps).
LIBRARY_MARKERS = ("/site-packages/", "/dist-packages/", "/torch/", "/lib/python3", "/lib64/python3",
                   "<frozen ", "<string>", "threading.py")

_OPTYPE = {
    "ALLREDUCE": "all_reduce", "ALLGATHER": "all_gather", "_ALLGATHER_BASE": "all_gather",
    "ALLGATHER_COALESCED": "all_gather", "ALLGATHER_INTO_TENSOR_COALESCED": "all_gather",
    "REDUCE_SCATTER": "reduce_scatter", "_REDUCE_SCATTER_BASE": "reduce_scatter",
    "REDUCE_SCATTER_TENSOR_COALESCED": "reduce_scatter", "BROADCAST": "broadcast", "BARRIER": "barrier",
    "ALLTOALL": "all_to_all", "ALLTOALL_BASE": "all_to_all", "SEND": "send", "RECV": "recv", "RECVANYSOURCE": "recv",
    "REDUCE": "reduce", "GATHER": "gather", "SCATTER": "scatter", "COALESCED": "coalesced",
}
_LOWER = {"allreduce": "all_reduce", "allgather": "all_gather", "_allgather_base": "all_gather",
          "all_gather_into_tensor": "all_gather", "all_gather_into_tensor_coalesced": "all_gather",
          "_reduce_scatter_base": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
          "reduce_scatter_tensor_coalesced": "reduce_scatter", "alltoall": "all_to_all",
          "alltoall_base": "all_to_all", "all_to_all_single": "all_to_all", "allreduce_coalesced": "all_reduce",
          "allgather_coalesced": "all_gather", "reducescatter": "reduce_scatter", "recvanysource": "recv"}


def normalize_op(op: str | None) -> str:
    """``ALLREDUCE``/``_REDUCE_SCATTER_BASE``/``all_reduce``/``allgather`` -> the torch.distributed name."""
    if not op:
        return "unknown"
    if op.isupper() or (op.startswith("_") and op[1:2].isupper()):
        return _OPTYPE.get(op.upper(), op.lower().lstrip("_"))
    low = op.lower()
    return _LOWER.get(low, low)


_LIBRARY_RE = re.compile("|".join(re.escape(m) for m in LIBRARY_MARKERS))
_LIBRARY_SEEN: dict[str, bool] = {}


def is_library(path: str) -> bool:
    """True for torch, site-packages, the standard library and threading frames (``train.py`` is not)."""
    hit = _LIBRARY_SEEN.get(path)
    if hit is None:
        p = path.replace("\\", "/")
        hit = _LIBRARY_RE.search(p if p.startswith("/") else "/" + p) is not None
        if len(_LIBRARY_SEEN) < 1 << 16:
            _LIBRARY_SEEN[path] = hit
    return hit


# ----------------------------------------------------------------------------- the summary


@dataclass(slots=True)
class Op:
    """One enqueued collective or point-to-point op, as much as the attribution needs."""

    record_id: int
    pg: str
    seq: int  # collective_seq_id (cross-rank key) for collectives, p2p_seq_id for p2p
    op: str  # torch.distributed name: all_reduce, all_gather, send, ...
    is_p2p: bool
    state: str  # scheduled | started | completed (gloo: always scheduled)
    started: bool
    completed: bool
    sizes: str  # input sizes, printed ("[[4096, 8192]]"), cut at MAX_SIZE_NODES numbers
    out_sizes: str
    dtypes: str  # "BFloat16" / "Float,Float"
    peer: int | None = None  # p2p: the other side, a rank *of the group* (torch's "send 0->1")
    time_ns: int | None = None  # enqueue wall clock
    timeout_ms: int | None = None
    where: str | None = None  # first frame outside libraries: "train.py:53 in train_step"
    backend: str = ""


@dataclass(slots=True)
class GroupView:
    """One rank's view of one process group."""

    pg: str
    desc: str
    enqueued: int = -1  # last collective seq enqueued (-1: none)
    started: int = -1
    completed: int = -1
    pending: list[Op] = field(default_factory=list)  # collectives enqueued, not completed, by seq
    more_pending: int = 0  # pending collectives beyond MAX_PENDING
    recent: list[Op] = field(default_factory=list)  # newest completed collectives, by seq
    p2p_pending: list[Op] = field(default_factory=list)  # by record_id
    from_status: bool = False  # enqueued/completed known from pg_status only (no entry in the buffer)
    backend: str = ""  # "nccl", "gloo", ... of its entries
    timing: bool = False  # its recorder records start events (state "started" means the GPU is in it)
    ops: dict[str, int] = field(default_factory=dict)  # op -> entries in the buffer (what the group is for)


@dataclass(slots=True)
class RankDump:
    """One dump file, summarised (a rank may have two: the NCCL and the CPU recorder)."""

    path: str
    rank: int | None
    fmt: str  # "pickle" | "json"
    version: str | None
    comm_lib_version: str | None
    backends: list[str]
    timing: bool  # start events recorded (NCCL with TORCH_NCCL_ENABLE_TIMING=1): "started" means something
    groups: dict[str, GroupView]
    pg_config: dict[str, tuple[str, str]]  # pg name -> (desc, ranks text), usable entries only
    entries: int
    newest_ns: int | None  # newest enqueue time: which of two dumps of one recorder is later
    unmapped: int = 0  # pg_status groups whose name could not be found
    notes: list[str] = field(default_factory=list)

    @property
    def recorder(self) -> str:
        """``nccl`` or ``cpu`` (gloo and other CPU backends): dumps of the two recorders are merged."""
        if self.comm_lib_version or any(b not in ("gloo", "mpi", "ucc", "") for b in self.backends):
            return "nccl"
        return "cpu"


# ----------------------------------------------------------------------------- safe values


def to_int(v: Any) -> int | None:
    """An integer from an int, an integral finite float or a digit string; None for anything else
    (``Infinity``, NaN, 10**400, booleans, containers)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if -_INT_BOUND < v < _INT_BOUND else None
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")) or not v.is_integer() or abs(v) >= _INT_BOUND:
            return None
        return int(v)
    if isinstance(v, (str, bytes)) and 0 < len(v) <= 20:
        s = v.decode("ascii", "replace") if isinstance(v, bytes) else v
        s = s.strip()
        if s.lstrip("-").isdigit():
            return to_int(int(s))
    return None


def to_text(v: Any, limit: int = 200) -> str:
    if isinstance(v, str):
        return v[:limit]
    if isinstance(v, bytes):
        return v[:limit].decode("utf-8", "replace")
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return str(v)[:limit]
    return ""


def _plain_shapes(v: Any) -> bool:
    """A short list of short lists of ints (what a dump's sizes almost always are)."""
    if type(v) is not list or len(v) > 16:
        return False
    for x in v:
        if type(x) is not list or len(x) > 16:
            return False
        for y in x:
            if type(y) is not int or not -_INT_BOUND < y < _INT_BOUND:
                return False
    return True


def sizes_text(v: Any, budget: int = MAX_SIZE_NODES) -> str:
    """Nested lists of ints printed compactly, walking at most ``budget`` nodes and 6 levels."""
    if _plain_shapes(v):
        return str(v)  # "[[4096, 1, 8192]]": the same text as the walk below, 10x faster
    out: list[str] = []
    left = [budget]

    def walk(x: Any, depth: int) -> None:
        if left[0] <= 0:
            out.append("…")
            return
        left[0] -= 1
        if isinstance(x, (list, tuple)) and depth < 6:
            out.append("[")
            for i, y in enumerate(x):
                if i:
                    out.append(", ")
                if left[0] <= 0:
                    out.append("…")
                    break
                walk(y, depth + 1)
            out.append("]")
        else:
            n = to_int(x)
            out.append(str(n) if n is not None else "?")

    walk(v, 0)
    return "".join(out)


def _dtypes(v: Any) -> str:
    if not isinstance(v, (list, tuple)):
        return ""
    return ",".join(to_text(d, 24) for d in v[:16])


def _where(frames: Any) -> str | None:
    """``train.py:53 in train_step``: the innermost frame outside libraries."""
    if not isinstance(frames, (list, tuple)):
        return None
    for f in frames[:MAX_FRAMES]:
        if not isinstance(f, dict):
            continue
        fn = to_text(f.get("filename"), 400)
        if fn and not is_library(fn):
            line = to_int(f.get("line"))
            return f"{fn.replace(chr(92), '/').rpartition('/')[2]}:{'?' if line is None else line} in " \
                   f"{to_text(f.get('name'), 80) or '?'}"
    return None


def split_profiling_name(name: str) -> tuple[str, str, str]:
    """``"nccl:all_reduce"`` -> ``("nccl", "all_reduce", "")``; ``"nccl:send 0->1"`` -> ``("nccl", "send", "0->1")``."""
    backend, sep, rest = name.partition(":")
    if not sep:
        backend, rest = "", name
    rest = rest.strip()
    op, _, meta = rest.partition(" ")
    return backend.strip().lower(), op, meta.strip()


# ----------------------------------------------------------------------------- bytes -> dict


def _unpickle(data: bytes, path: str) -> Any:
    return loads_plain(data, "Flight Recorder dump", path, MAX_PICKLE_MEMORY)


def _gunzip(data: bytes, path: str) -> bytes:
    """Decompress a gzipped dump, refusing more than MAX_DUMP_BYTES of output (a bomb stops there)."""
    d = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = d.decompress(data, MAX_DUMP_BYTES + 1)
    except zlib.error as exc:
        raise TraceFileError(f"corrupt gzip ({exc})", path) from None
    if len(out) > MAX_DUMP_BYTES:
        raise TraceFileError(f"gzipped dump expands past {MAX_DUMP_BYTES >> 20} MiB; not read", path)
    return out


def sniff(head: bytes) -> str | None:
    """``"pickle"``/``"json"`` when the first bytes of a file look like a Flight Recorder dump, else None.

    A torch pickle starts with ``\\x80\\x02`` and names ``version`` and ``pg_config`` within its first
    bytes; torch's JSON (sorted keys) starts ``{"comm_lib_version"``; a JSON dump written by other tools
    names entries with ``collective_seq_id``/``profiling_name`` or ``pg_status`` early. Kineto traces
    (``traceEvents``), memory snapshots and other pickles do not match.
    """
    if head[:2] == _MAGIC_GZIP:
        try:
            head = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, SNIFF_BYTES)
        except zlib.error:
            return None
    if head[:1] == b"\x80" and len(head) > 2 and 2 <= head[1] <= 5:
        window = head[:SNIFF_BYTES]
        if b"version" in window and (b"pg_config" in window or b"pg_status" in window or b"entries" in window):
            return "pickle"
        return None
    text = head.lstrip()[:SNIFF_BYTES]
    if not text.startswith(b"{") or b'"traceEvents"' in text or b'"schemaVersion"' in text:
        return None
    if text.startswith(b'{"comm_lib_version"'):
        return "json"
    if (b'"collective_seq_id"' in text or b'"profiling_name"' in text) and b'"entries"' in text:
        return "json"
    if b'"pg_status"' in text and b'"version"' in text:
        return "json"
    return None


def load_raw(path: str | Path) -> tuple[dict[str, Any], str]:
    """The dump as a dict and its format. :class:`TraceFileError` (one line) on anything else."""
    p = str(path)
    data = read_bounded(p, MAX_DUMP_BYTES, "Flight Recorder dump")
    if data[:2] == _MAGIC_GZIP:
        data = _gunzip(data, p)
    kind = sniff(data[:SNIFF_BYTES])
    if kind is None:
        kind = "pickle" if data[:1] == b"\x80" else "json" if data.lstrip()[:1] in (b"{", b"[") else None
    if kind is None:
        raise TraceFileError("not a Flight Recorder dump (neither a pickle nor JSON)", p)
    obj = _unpickle(data, p) if kind == "pickle" else decode_json(data, p)
    del data
    if not isinstance(obj, dict) or not ({"entries", "pg_status", "version"} & set(obj)):
        raise TraceFileError("not a Flight Recorder dump (no entries/pg_status/version)", p)
    return obj, kind


# ----------------------------------------------------------------------------- rank from the name


def rank_from_name(path: str | Path) -> int | None:
    """``rank3.json``, ``rank_3.cpu.json``, ``_dump_12``, ``comm_lib_trace_rank_7``, ``nccl_trace_rank_3.pkl``,
    ``host-a_rank5_fr.json`` -> the rank; ``dump.pkl`` inside a folder ``rank3/`` -> 3; else None."""
    p = Path(path)
    for name in (p.name, p.parent.name):
        m = list(_RANK_WORD.finditer(name))
        if m:
            return int(m[-1].group(1))
        stem = _NAME_SUFFIXES.sub("", name)
        t = _TRAILING_INT.search(stem)
        if t:
            return int(t.group(1))
        if name == p.name:
            ints = _ANY_INT.findall(stem)
            if len(ints) == 1:
                return int(ints[0])
    return None


# ----------------------------------------------------------------------------- dict -> summary


def _op(raw: dict[str, Any], backend: str, op: str, meta: str, pg: str) -> Op:
    is_p2p = raw.get("is_p2p") is True or op in ("send", "recv")
    seq = to_int(raw.get("p2p_seq_id" if is_p2p else "collective_seq_id", raw.get("seq_id")))  # "seq_id": pre-2.4
    state = to_text(raw.get("state"), 16)
    started_ns = to_int(raw.get("time_discovered_started_ns"))
    retired = raw.get("retired") is True
    completed = state == "completed" or (backend == "gloo" and retired)
    peer = None
    if is_p2p and meta:
        m = _P2P_PEER.search(meta)
        if m:
            peer = int(m.group(3))
    created = to_int(raw.get("time_created_ns"))
    return Op(
        record_id=to_int(raw.get("record_id")) or 0,
        pg=pg,
        seq=-1 if seq is None else seq,
        op=normalize_op(op),
        is_p2p=is_p2p,
        state=state,
        started=state in ("started", "completed") or bool(started_ns),
        completed=completed,
        sizes="",
        out_sizes="",
        dtypes="",
        peer=peer,
        time_ns=created if created else None,
        backend=backend,
    )


def _detail(o: Op, raw: dict[str, Any]) -> None:
    """The fields only a kept op needs (printing its sizes and finding its Python line cost the most)."""
    o.sizes = sys.intern(sizes_text(raw.get("input_sizes")))  # interned: a result carries each text once
    o.out_sizes = sys.intern(sizes_text(raw.get("output_sizes")))
    o.dtypes = sys.intern(_dtypes(raw.get("input_dtypes")))
    o.timeout_ms = to_int(raw.get("timeout_ms"))
    o.where = _intern(_where(raw.get("frames")))


def _status(raw: Any) -> dict[str, tuple[int, int, int]]:
    out: dict[str, tuple[int, int, int]] = {}
    if not isinstance(raw, dict):
        return out
    for key, st in list(raw.items())[:100_000]:
        if not isinstance(st, dict):
            continue
        enq, started, done = (to_int(st.get(k)) for k in ("last_enqueued_collective", "last_started_collective",
                                                          "last_completed_collective"))
        out[to_text(key, 40)] = (-1 if enq is None else enq, -1 if started is None else started,
                                 -1 if done is None else done)
    return out


def _pg_config(raw: Any) -> dict[str, tuple[str, str]]:
    out: dict[str, tuple[str, str]] = {}
    if not isinstance(raw, dict):
        return out
    for name, cfg in list(raw.items())[:100_000]:
        name = to_text(name, 200)
        if not name or not isinstance(cfg, dict):
            continue  # gloo writes one entry under '' (a known torch bug): useless
        ranks = cfg.get("ranks")
        text = to_text(ranks, 1 << 20) if isinstance(ranks, str) else sizes_text(ranks, 1 << 16)
        out[sys.intern(name)] = (sys.intern(to_text(cfg.get("desc"), 200)), sys.intern(text))
    return out


def _intern(text: str | None) -> str | None:
    return None if text is None else sys.intern(text)


def _pg_of(e: dict[str, Any]) -> tuple[str, str]:
    pgv = e.get("process_group")
    if type(pgv) is tuple or type(pgv) is list:
        name = pgv[0] if pgv and type(pgv[0]) is str and len(pgv[0]) <= 200 else to_text(pgv[0] if pgv else "", 200)
        desc = pgv[1] if len(pgv) > 1 and type(pgv[1]) is str and len(pgv[1]) <= 200 else \
            to_text(pgv[1] if len(pgv) > 1 else "", 200)
        return name, desc
    return to_text(pgv, 200), ""


def _window(entries: list[Any], want_ids: set[str]) -> tuple[list[int], dict[str, str], dict[str, str]]:
    """Indices of the entries worth reading in full, newest last, and pg id -> name, name -> desc.

    Scans from the newest entry back and stops after :data:`QUIET_TAIL` completed entries in a row:
    what is pending (and the few completed before it) is all the attribution needs, so a 20,000-entry
    buffer costs the same as a 700-entry one. The scan goes on, reading only ``pg_id`` and
    ``process_group``, while a group's id has not been seen (pg_status is keyed by that id)."""
    keep: list[int] = []
    id_to_name: dict[str, str] = {}
    descs: dict[str, str] = {}
    quiet = 0

    def note_group(e: dict[str, Any]) -> None:
        name, desc = _pg_of(e)
        pid = e.get("pg_id")
        if type(pid) is int and name:
            id_to_name.setdefault(str(pid), name)
        if desc and name not in descs:
            descs[name] = desc

    i = len(entries) - 1
    while i >= 0:
        e = entries[i]
        i -= 1
        if type(e) is not dict:
            continue
        note_group(e)
        keep.append(i + 1)
        state = e.get("state")
        done = state == "completed" or (e.get("retired") is True and str(e.get("profiling_name", "")).startswith("gloo"))
        quiet = quiet + 1 if done else 0
        if quiet >= QUIET_TAIL:
            break
    while i >= 0 and not want_ids <= id_to_name.keys():  # names of older groups, while pg_status needs one
        e = entries[i]
        i -= 1
        if type(e) is dict:
            note_group(e)
    keep.reverse()
    return keep, id_to_name, descs


def summarize(raw: dict[str, Any], path: str, fmt: str, rank: int | None) -> RankDump:
    """The compact view of one dump (see the module docstring for the rules)."""
    entries_raw = raw.get("entries") or []
    if not isinstance(entries_raw, list):
        raise TraceFileError("Flight Recorder 'entries' is not a list", path)
    notes: list[str] = []
    if len(entries_raw) > MAX_ENTRIES:
        notes.append(f"{len(entries_raw):,} entries; the last {MAX_ENTRIES:,} were read")
        entries_raw = entries_raw[-MAX_ENTRIES:]
    status = _status(raw.get("pg_status"))
    keep, id_to_name, descs = _window(entries_raw, set(status))
    backends: dict[str, None] = {}
    ops: list[Op] = []
    newest: int | None = None
    timing = False
    raws: dict[int, dict[str, Any]] = {}
    for idx in keep:
        e = entries_raw[idx]
        name, _desc = _pg_of(e)
        backend, opname, meta = _split_cached(e.get("profiling_name"))
        o = _op(e, backend, opname, meta, name)
        ops.append(o)
        raws[id(o)] = e
        if backend:
            backends.setdefault(backend, None)
        if o.time_ns and (newest is None or o.time_ns > newest):
            newest = o.time_ns
        if not timing and backend not in ("gloo", "mpi", "ucc") and (
                o.state == "started" or bool(to_int(e.get("time_discovered_started_ns")))
                or isinstance(e.get("duration_ms"), (int, float))):
            timing = True  # start events exist only with TORCH_NCCL_ENABLE_TIMING (or desync debug)
    if any(a.record_id > b.record_id for a, b in zip(ops, ops[1:])):
        ops.sort(key=lambda o: o.record_id)
    config = _pg_config(raw.get("pg_config"))
    version = raw.get("version")
    comm = to_text(raw.get("comm_lib_version"), 80) or None
    # pg_status ids without an entry: name them by creation order when the count allows it
    unmapped = [k for k in status if k not in id_to_name]
    if unmapped and rank is not None and config:
        member_of = sorted((n for n, (_d, r) in config.items() if _in_ranks(rank, r)), key=_name_order)
        ids = sorted(status, key=lambda k: (to_int(k) is None, to_int(k) or 0))
        if len(member_of) == len(ids) and all(id_to_name.get(i, n) == n for i, n in zip(ids, member_of)):
            id_to_name.update(zip(ids, member_of))
            unmapped = []
    groups: dict[str, GroupView] = {}
    by_pg: dict[str, list[Op]] = {}
    for o in ops:
        by_pg.setdefault(o.pg, []).append(o)
    gloo_like = set(backends) <= {"gloo", "mpi", "ucc"} and not comm
    if not gloo_like and ops and not any(o.started or o.completed for o in ops):
        _p2p_done_from_status(status, id_to_name, by_pg)
    for key, (enq_st, start_st, comp_st) in status.items():
        pg_name = id_to_name.get(key)
        if pg_name is None:
            continue
        g = groups.setdefault(pg_name, GroupView(pg_name, descs.get(pg_name) or config.get(pg_name, ("", ""))[0]))
        mine = by_pg.get(pg_name, [])
        newest_op = mine[-1] if mine else None
        newest_done = next((o for o in reversed(mine) if o.completed), None)
        # a p2p work's seq lands in pg_status on NCCL: trust it only after a collective (or with no entry)
        if newest_op is None or not newest_op.is_p2p or gloo_like:
            g.enqueued = max(g.enqueued, enq_st)
            g.started = max(g.started, start_st)
        if newest_done is None or not newest_done.is_p2p or gloo_like:
            g.completed = max(g.completed, comp_st)
        g.from_status = not mine
        if start_st >= 0 and not gloo_like:
            timing = True
    for name, mine in by_pg.items():
        g = groups.setdefault(name, GroupView(name, descs.get(name) or config.get(name, ("", ""))[0]))
        _fold(g, mine)
        for o in g.pending + g.recent + g.p2p_pending:
            _detail(o, raws[id(o)])
    main_backend = next(iter(backends), "gloo" if gloo_like else "nccl")
    for g in groups.values():
        if not g.backend:
            g.backend = main_backend
        g.timing = timing and g.backend not in ("gloo", "mpi", "ucc")
        if not g.desc and g.pg in config:
            g.desc = config[g.pg][0]
    return RankDump(
        path=path, rank=rank, fmt=fmt, version=to_text(version, 20) if version is not None else None,
        comm_lib_version=comm, backends=list(backends), timing=timing, groups=groups, pg_config=config,
        entries=len(entries_raw), newest_ns=newest, unmapped=len(unmapped), notes=notes)


_SPLITS: dict[str, tuple[str, str, str]] = {}


def _split_cached(name: Any) -> tuple[str, str, str]:
    """:func:`split_profiling_name` with a memo (a dump repeats a handful of names thousands of times)."""
    if type(name) is not str or len(name) > 200:
        return split_profiling_name(to_text(name, 200))
    hit = _SPLITS.get(name)
    if hit is None:
        hit = split_profiling_name(name)
        if len(_SPLITS) < 4096:
            _SPLITS[name] = hit
    return hit


def _p2p_done_from_status(status: dict[str, tuple[int, int, int]], id_to_name: dict[str, str],
                          by_pg: dict[str, list[Op]]) -> None:
    """A dump whose every entry is ``scheduled`` (no CUDA event was queried: ops recorded in a coalescing
    group, or a failed query) says nothing per entry; for collectives ``pg_status`` gives the last completed
    seq, but a send/recv would look pending forever. torch writes a p2p work's seq into ``pg_status``, so in a
    group that holds only p2p entries, those up to its last completed seq completed; in any group whose last
    completed equals its last enqueued, everything did."""
    for key, (enq_st, _start_st, comp_st) in status.items():
        mine = by_pg.get(id_to_name.get(key, ""), [])
        if not mine or comp_st < 0:
            continue
        everything = comp_st >= enq_st >= 0
        only_p2p = all(o.is_p2p for o in mine)
        for o in mine:
            if o.is_p2p and (everything or (only_p2p and 0 <= o.seq <= comp_st)):
                o.completed = True


def _fold(g: GroupView, mine: list[Op]) -> None:
    """Pending and recent ops of one group from its entries (record order)."""
    coll = [o for o in mine if not o.is_p2p and o.seq >= 0]
    if coll:
        g.enqueued = max(g.enqueued, max(o.seq for o in coll))
        done = [o.seq for o in coll if o.completed]
        if done:
            g.completed = max(g.completed, max(done))
        st = [o.seq for o in coll if o.started]
        if st:
            g.started = max(g.started, max(st))
    g.completed = min(g.completed, g.enqueued) if g.enqueued >= 0 else g.completed
    pend = sorted((o for o in coll if o.seq > g.completed and not o.completed), key=lambda o: o.seq)
    g.pending = pend[:MAX_PENDING] + [o for o in pend[MAX_PENDING:] if o.started][:MAX_PENDING]
    g.more_pending = len(pend) - len(g.pending)
    g.recent = sorted((o for o in coll if o.seq <= g.completed), key=lambda o: o.seq)[-KEEP_COMPLETED:]
    g.p2p_pending = [o for o in mine if o.is_p2p and not o.completed][:MAX_PENDING]
    for o in mine:
        g.ops[o.op] = g.ops.get(o.op, 0) + 1
    g.backend = next((o.backend for o in mine if o.backend), "")


def _name_order(name: str) -> tuple[int, int | str]:
    n = to_int(name)
    return (0, n) if n is not None else (1, name)


def _in_ranks(rank: int, text: str) -> bool:
    return rank in parse_ranks(text)


def parse_ranks(text: str | Iterable[int] | None) -> list[int]:
    """``"[0, 1, 2]"`` (torch) or a list -> ranks; bounded by the text's size."""
    if text is None:
        return []
    if not isinstance(text, str):
        return [r for r in (to_int(x) for x in text) if r is not None]
    return [int(x) for x in _ANY_INT.findall(text[: 1 << 20]) if len(x) < 10]


def read_dump(path: str | Path, rank: int | None = None) -> RankDump:
    """Read and summarise one dump; :class:`TraceFileError` on bad input (one line, names the file)."""
    p = str(path)
    raw, fmt = load_raw(p)
    try:
        return summarize(raw, p, fmt, rank if rank is not None else rank_from_name(p))
    except TraceFileError:
        raise
    except (TypeError, AttributeError, ValueError, KeyError, IndexError, RecursionError) as exc:
        raise TraceFileError(f"not a Flight Recorder dump ({type(exc).__name__})", p) from None


def read_dumps(paths: list[str]) -> list[RankDump | str]:
    """Read many dumps (one engine task): a summary, or the one-line problem, per path."""
    out: list[RankDump | str] = []
    for p in paths:
        try:
            out.append(read_dump(p))
        except TraceFileError as exc:
            out.append(str(exc))
        except MemoryError:
            out.append(f"{p}: too large to read")
    return out


def looks_like_snapshot(path: str | Path) -> bool:
    """Whether the file is a CUDA memory snapshot (a pickled dict that opens with ``segments``), which
    collectors name like a dump (``memory/rank0.pickle``): it is passed over, not reported as a bad dump."""
    try:
        head = read_head(path, 64)
    except TraceFileError:
        return False
    return head[:1] == b"\x80" and b"segments" in head and b"entries" not in head


def looks_like_dump(path: str | Path) -> bool:
    """Whether the file's first bytes say Flight Recorder (any name, any folder)."""
    try:
        return sniff(read_head(path, SNIFF_BYTES)) is not None
    except TraceFileError:
        return False


