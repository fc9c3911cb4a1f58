"""The per-rank units of work, as plain module-level functions any executor can run anywhere.

:func:`summarise_task` is the map of the report: read one trace file (through the parse cache),
summarise it (:func:`traceread.summary.summarise_rank`) and return the summary as data
(:func:`caches.encode_summary`), storing the same bytes in the summary cache. :func:`parse_task`
is the map of :func:`traceread.reader.read_traces`: parse one file into the parse cache.

Results are data, never objects: ``{"summary": bytes}`` or ``{"error": "one line"}`` encoded as
msgpack, so a worker process or a Ray task hands back bytes the driver decodes without unpickling
anything of ours. A bad file is an ``error`` result, never an exception: exceptions mean the worker
itself failed, which the executor retries once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from traceread.engine import caches
from traceread.errors import TraceFileError

STORED = "stored"


@dataclass(frozen=True)
class RankTask:
    """One rank's work order: which file and how (everything a remote worker needs, all plain data)."""

    file: Any  # pathlib.Path, str or traceread.reader.remote.RemoteFile
    detail: bool = False  # also the roofline (the first rank only)
    use_cache: bool = True
    cache_dir: str | None = None
    spec_file: str | None = None
    storage_options: dict[str, Any] = field(default_factory=dict)
    #: ``--max-rank-bytes`` as the driver resolved it: travels with the task because a Ray worker on
    #: another node does not share the driver's environment.
    max_rank_bytes: int | None = None

    @property
    def name(self) -> str:
        return Path(str(self.file)).name


def read_one(f: Any, *, use_cache: bool, cache_dir: str | Path | None,
             storage_options: dict[str, Any] | None = None, max_rank_bytes: int | None = None) -> Any:
    """One file's :class:`RankTrace` through the parse cache (local path or object URL).
    Raises :class:`TraceFileError` (one line) on bad input."""
    from traceread.reader.ranks import identify

    root = caches.cache_root(cache_dir) if use_cache else None
    key = None
    if root is not None:
        try:
            key = caches.parse_key(f)
        except OSError:
            key = None
        hit = caches.load_tables(f, root) if key is not None else None
        if hit is not None:
            identify(hit, single=True)
            return hit
    rt = _parse(f, storage_options or {}, max_rank_bytes)
    if root is not None and key is not None:
        caches.store_tables(rt, f, root, key)
    return rt


def _parse(f: Any, storage_options: dict[str, Any], max_rank_bytes: int | None) -> Any:
    from traceread.engine.node_local import NodeFile
    from traceread.reader.parse import parse_file

    if isinstance(f, NodeFile):  # on this node's disk: this task was placed here (engine.node_local)
        return _parse_node_file(f, max_rank_bytes)
    if getattr(f, "url", None) is not None:
        from traceread.reader.remote import parse_remote

        return parse_remote(f, storage_options, max_rank_bytes=max_rank_bytes)
    p = Path(f)
    if p.is_dir():
        raise TraceFileError("is a folder (read_traces reads every rank in a folder)", str(p))
    if not p.is_file():
        raise TraceFileError("no such file", str(p))
    return parse_file(p, max_rank_bytes=max_rank_bytes)


def _parse_node_file(f: Any, max_rank_bytes: int | None) -> Any:
    from traceread.reader.parse import parse_named

    p = Path(f.path)
    try:
        st = p.stat()
    except OSError:
        raise TraceFileError("no such file on this node (was it listed on another one?)", f.url) from None
    if (st.st_size, st.st_mtime_ns) != (f.size, f.mtime_ns):
        raise TraceFileError("changed since it was listed (size or mtime differ)", f.url)
    return parse_named(p, f.url, max_rank_bytes=max_rank_bytes)


def summarise(task: RankTask) -> tuple[Any, bytes | None]:
    """(summary or TraceFileError, its encoded bytes); stores the bytes in the summary cache."""
    from traceread.reader.ranks import identify
    from traceread.summary import slim_meta, summarise_rank

    root = caches.cache_root(task.cache_dir) if task.use_cache else None
    key = caches.summary_key(task.file, task.spec_file, task.detail) if root is not None else None
    try:
        rt = read_one(task.file, use_cache=task.use_cache, cache_dir=task.cache_dir,
                      storage_options=task.storage_options, max_rank_bytes=task.max_rank_bytes)
    except TraceFileError as exc:
        return exc, None
    except Exception as exc:  # noqa: BLE001 - a reader bug fails one file, not the job
        return TraceFileError(f"reader failed: {type(exc).__name__}: {exc}".splitlines()[0], str(task.file)), None
    identify(rt, single=False)
    summary = summarise_rank(rt, spec_file=Path(task.spec_file) if task.spec_file else None, detail=task.detail)
    del rt
    slim_meta(summary.meta)
    data = caches.encode_summary(summary)
    if key is not None and root is not None:
        caches.store_summary(data, key, root)
    return summary, data


def summarise_task(task: RankTask) -> bytes:
    """Worker entry point (process pool, Ray): the summary as data bytes (see module docstring)."""
    summary, data = summarise(task)
    if isinstance(summary, TraceFileError):
        return msgspec.msgpack.encode({"error": summary.message})
    return msgspec.msgpack.encode({"summary": data})


def decode_result(data: bytes, task: RankTask, store_here: bool = False) -> Any:
    """A worker's bytes -> RankSummary or TraceFileError. ``store_here``: also put the summary in this
    machine's summary cache (a Ray worker on another node filled only its own)."""
    doc = msgspec.msgpack.decode(data)
    if "error" in doc:
        return TraceFileError(str(doc["error"]), str(task.file))
    summary = caches.decode_summary(doc["summary"])
    if store_here and task.use_cache:
        key = caches.summary_key(task.file, task.spec_file, task.detail)
        if key is not None:
            caches.store_summary(doc["summary"], key, caches.cache_root(task.cache_dir))
    return summary


def parse_task(path: str, root: str) -> str | TraceFileError:
    """Worker entry point for ``read_traces``: the tables go to the parse cache under ``root``."""
    from traceread.reader.parse import parse_file

    p = Path(path)
    try:
        key = caches.parse_key(p)
        rt = parse_file(p)
    except TraceFileError as exc:
        return exc
    except OSError as exc:
        return TraceFileError(f"cannot read: {exc.strerror or exc}", path)
    return STORED if caches.store_tables(rt, p, Path(root), key) else TraceFileError("cannot write the table cache", path)
