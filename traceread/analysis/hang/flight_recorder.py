"""Read PyTorch Flight Recorder (FR) dumps: JSON and pickle, format version "2.10" and neighbours.

FR keeps a ring buffer of the collectives each rank enqueued. A dump is a dict with ``version``,
``pg_config`` (pg name -> {name, desc, ranks}), ``pg_status`` (process-local pg id ->
last_enqueued/started/completed collective seq) and ``entries`` (oldest first). Matching across
ranks uses ``(pg name, collective_seq_id)``: the seq is the per-PG collective counter, identical on
every member for the same collective.

Pickle dumps are untrusted input (a pickle can run code), so they are read with an unpickler whose
``find_class`` refuses every class: only the opcodes that build dicts, lists, tuples, strings and
numbers work, which is all a real dump uses. Gloo dumps carry a broken ``pg_config`` (one key
``''``); :func:`pg_members` rebuilds membership from the entries and the world size instead.
"""

from __future__ import annotations

import io
import json
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

from traceread.errors import TraceFileError

_RANK_RE = re.compile(r"(\d+)(?:\.[A-Za-z]+)*$")


class _NoClassUnpickler(pickle.Unpickler):
    """Builds only plain containers and scalars; any class or function lookup is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: FR dumps hold no classes")


@dataclass
class FREntry:
    """One collective (or p2p op) as the recording rank enqueued it."""

    record_id: int
    pg_name: str
    pg_desc: str
    pg_id: int | None
    seq: int  # collective_seq_id (the cross-rank matching key), or p2p_seq_id for p2p
    op_id: int | None
    profiling_name: str
    backend: str
    op: str  # "all_reduce", "broadcast", ... (profiling_name without backend and p2p meta)
    is_p2p: bool
    input_sizes: list[Any]
    output_sizes: list[Any]
    input_dtypes: list[str]
    output_dtypes: list[str]
    state: str
    time_created_ns: int | None
    retired: bool | None
    timeout_ms: int | None
    duration_ms: float | None
    frames: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class PGStatus:
    """Per-PG counters of one rank; -1 means never."""

    last_enqueued: int
    last_started: int
    last_completed: int


@dataclass
class FRDump:
    """One rank's dump, normalised across JSON/pickle and format versions."""

    rank: int | None
    path: Path
    fmt: str  # "json" | "pickle"
    version: str | None
    comm_lib_version: str | None
    pg_config: dict[str, dict[str, Any]]
    pg_status: dict[str, PGStatus]  # keyed by pg *name* when it could be resolved, else by pg id
    entries: list[FREntry]

    @property
    def backend(self) -> str | None:
        for e in self.entries:
            if e.backend:
                return e.backend
        return None


@overload
def _int(value: Any, default: int) -> int: ...
@overload
def _int(value: Any, default: None = None) -> int | None: ...
def _int(value: Any, default: int | None = None) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def split_profiling_name(name: str) -> tuple[str, str]:
    """``"nccl:all_reduce"`` -> ``("nccl", "all_reduce")``; ``"gloo:send 0->1"`` -> ``("gloo", "send")``."""
    backend, _, rest = name.partition(":") if ":" in name else ("", "", name)
    op = rest.strip().split(" ")[0] if rest.strip() else rest
    return backend, op


def _entry(raw: dict[str, Any]) -> FREntry:
    pg = raw.get("process_group") or ["", ""]
    if not isinstance(pg, (list, tuple)):
        pg = [str(pg), ""]
    pg_name = str(pg[0]) if len(pg) > 0 else ""
    pg_desc = str(pg[1]) if len(pg) > 1 else ""
    is_p2p = bool(raw.get("is_p2p", False))
    prof = str(raw.get("profiling_name", "") or "")
    backend, op = split_profiling_name(prof)
    seq_key = "p2p_seq_id" if is_p2p else "collective_seq_id"
    created = _int(raw.get("time_created_ns"))
    frames = raw.get("frames") or []
    dur = raw.get("duration_ms")
    return FREntry(
        record_id=_int(raw.get("record_id"), -1) or 0,
        pg_name=pg_name,
        pg_desc=pg_desc,
        pg_id=_int(raw.get("pg_id")),
        seq=_int(raw.get(seq_key), -1),
        op_id=_int(raw.get("op_id")),
        profiling_name=prof,
        backend=backend,
        op=op,
        is_p2p=is_p2p,
        input_sizes=list(raw.get("input_sizes") or []),
        output_sizes=list(raw.get("output_sizes") or []),
        input_dtypes=[str(d) for d in raw.get("input_dtypes") or []],
        output_dtypes=[str(d) for d in raw.get("output_dtypes") or []],
        state=str(raw.get("state", "") or ""),
        time_created_ns=created if created else None,
        retired=raw.get("retired") if isinstance(raw.get("retired"), bool) else None,
        timeout_ms=_int(raw.get("timeout_ms")),
        duration_ms=float(dur) if isinstance(dur, (int, float)) else None,
        frames=[f for f in frames if isinstance(f, dict)],
    )


def _load_raw(path: Path) -> tuple[dict[str, Any], str]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TraceFileError(f"cannot read Flight Recorder dump: {exc.strerror or exc}", str(path)) from None
    if data[:1] in (b"{", b"[") or path.suffix == ".json":
        try:
            obj = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise TraceFileError(f"not a Flight Recorder JSON dump ({exc})", str(path)) from None
        fmt = "json"
    else:
        try:
            obj = _NoClassUnpickler(io.BytesIO(data)).load()
        except pickle.UnpicklingError as exc:
            raise TraceFileError(f"unsafe or corrupt Flight Recorder pickle: {exc}", str(path)) from None
        except Exception as exc:  # truncated/garbage bytes raise many types
            raise TraceFileError(f"not a Flight Recorder pickle ({type(exc).__name__})", str(path)) from None
        fmt = "pickle"
    if not isinstance(obj, dict) or not ({"entries", "pg_status", "version"} & set(obj)):
        raise TraceFileError("not a Flight Recorder dump (no entries/pg_status/version)", str(path))
    return obj, fmt


def rank_from_name(path: Path) -> int | None:
    """``rank3.json``, ``rank_3``, ``comm_lib_trace_rank_3``, ``nccl_trace_rank_3.pkl`` -> 3."""
    m = _RANK_RE.search(path.name)
    return int(m.group(1)) if m else None


def read_fr_dump(path: str | Path, rank: int | None = None) -> FRDump:
    """Read one dump (format detected from the bytes). Raises :class:`TraceFileError` on bad input."""
    p = Path(path)
    raw, fmt = _load_raw(p)
    entries_raw = raw.get("entries") or []
    if not isinstance(entries_raw, list):
        raise TraceFileError("Flight Recorder 'entries' is not a list", str(p))
    entries = [_entry(e) for e in entries_raw if isinstance(e, dict)]
    entries.sort(key=lambda e: e.record_id)
    id_to_name: dict[str, str] = {}
    for e in entries:
        if e.pg_id is not None and e.pg_name:
            id_to_name[str(e.pg_id)] = e.pg_name
    status: dict[str, PGStatus] = {}
    for pg_id, st in (raw.get("pg_status") or {}).items():
        if not isinstance(st, dict):
            continue
        status[id_to_name.get(str(pg_id), str(pg_id))] = PGStatus(
            last_enqueued=_int(st.get("last_enqueued_collective"), -1),
            last_started=_int(st.get("last_started_collective"), -1),
            last_completed=_int(st.get("last_completed_collective"), -1),
        )
    cfg = raw.get("pg_config") or {}
    return FRDump(
        rank=rank if rank is not None else rank_from_name(p),
        path=p,
        fmt=fmt,
        version=str(raw["version"]) if raw.get("version") is not None else None,
        comm_lib_version=str(raw.get("comm_lib_version") or "") or None,
        pg_config=cfg if isinstance(cfg, dict) else {},
        pg_status=status,
        entries=entries,
    )


def _recorder_tag(path: Path) -> str:
    """``rank3.cpu.json`` -> ``"cpu"``; ``rank3.json`` -> ``""`` (the collector's second recorder)."""
    parts = path.name.split(".")
    return parts[1] if len(parts) > 2 else ""


def merge_dumps(a: FRDump, b: FRDump) -> FRDump:
    """One rank's NCCL and CPU (gloo) recorder dumps -> one view (they record different PGs)."""
    seen = {(e.pg_name, e.seq, e.is_p2p, e.record_id) for e in a.entries}
    entries = a.entries + [e for e in b.entries if (e.pg_name, e.seq, e.is_p2p, e.record_id) not in seen]
    status = dict(b.pg_status)
    status.update(a.pg_status)
    cfg = {**b.pg_config, **a.pg_config}
    return FRDump(a.rank, a.path, a.fmt, a.version or b.version, a.comm_lib_version or b.comm_lib_version,
                  cfg, status, entries)


def read_fr_dir(folder: str | Path) -> tuple[dict[int, FRDump], list[str]]:
    """Read every dump in ``folder`` (``RUN/fr``): rank -> dump, plus one-line problems.

    When a rank has both a pickle and a JSON dump of one recorder the pickle wins (it also holds
    the Python frames of each enqueue); if the pickle is refused, the JSON is used and the refusal
    is reported. Dumps of a rank's two recorders (``rank3.json`` + ``rank3.cpu.json``) are merged.
    """
    d = Path(folder)
    per_key: dict[tuple[int, str], FRDump] = {}
    problems: list[str] = []
    if not d.is_dir():
        return {}, problems
    files = [f for f in d.iterdir() if f.is_file() and ".tmp" not in f.name and not f.name.endswith((".pipe", ".ack"))]
    # pickles first so they win; JSON fills ranks whose pickle failed or is absent
    files.sort(key=lambda f: (0 if f.suffix in (".pkl", ".pickle", "") else 1, f.name))
    for f in files:
        rank = rank_from_name(f)
        key = (rank, _recorder_tag(f)) if rank is not None else None
        if key is None or key in per_key:
            continue
        try:
            per_key[key] = read_fr_dump(f, rank)
        except TraceFileError as exc:
            problems.append(str(exc))
        except (TypeError, AttributeError, ValueError, KeyError, IndexError) as exc:  # right format, wrong shape
            problems.append(f"{f}: not a Flight Recorder dump ({type(exc).__name__}: {exc})")
    dumps: dict[int, FRDump] = {}
    for (rank, _tag), dump in sorted(per_key.items(), key=lambda kv: (kv[0][0], kv[0][1] != "")):
        dumps[rank] = merge_dumps(dumps[rank], dump) if rank in dumps else dump
    return dumps, problems


def _parse_ranks(value: Any) -> list[int] | None:
    if isinstance(value, (list, tuple)):
        out = [_int(v) for v in value]
        return [v for v in out if v is not None]
    if isinstance(value, str):
        nums = re.findall(r"-?\d+", value)
        return [int(n) for n in nums]
    return None


def pg_members(dumps: dict[int, FRDump], world_size: int | None = None) -> dict[str, list[int]]:
    """Global ranks of every process group seen in the dumps.

    Order of trust: a usable ``pg_config`` entry (NCCL dumps); else the default PG (name ``"0"``)
    spans the world (``world_size`` if given, else every rank that dumped); else the ranks whose
    dumps mention the PG. The last fallback is what repairs gloo dumps, whose ``pg_config`` has a
    single empty key.
    """
    members: dict[str, list[int]] = {}
    for dump in dumps.values():
        for name, cfg in dump.pg_config.items():
            if not name or not isinstance(cfg, dict):
                continue
            ranks = _parse_ranks(cfg.get("ranks"))
            if ranks:
                members.setdefault(str(name), sorted(set(ranks)))
    seen: dict[str, set[int]] = {}
    for rank, dump in dumps.items():
        names = {e.pg_name for e in dump.entries} | set(dump.pg_status)
        for name in names:
            seen.setdefault(name, set()).add(rank)
    world = list(range(world_size)) if world_size else sorted(dumps)
    for name, seen_by in seen.items():
        if name in members:
            continue
        members[name] = sorted(set(world) | seen_by) if name == "0" else sorted(seen_by)
    return members


def pg_descriptions(dumps: dict[int, FRDump]) -> dict[str, str]:
    """pg name -> description (``default_pg``, ``mesh_dp``...), from entries or pg_config."""
    out: dict[str, str] = {}
    for dump in dumps.values():
        for name, cfg in dump.pg_config.items():
            if name and isinstance(cfg, dict) and cfg.get("desc"):
                out.setdefault(str(name), str(cfg["desc"]))
        for e in dump.entries:
            if e.pg_name and e.pg_desc:
                out.setdefault(e.pg_name, e.pg_desc)
    return out
