"""One rank's work order and the reading every per-rank task starts with.

:class:`RankTask` is everything a worker anywhere (a local process, a Ray task on another node)
needs to find and read one file; :func:`read_one` reads it through the parse cache (local path,
object URL or a node-local file). :func:`parse_task` is the unit of
:func:`traceread.engine.jobs.read_traces`: parse one file into the parse cache. The report's own
per-rank task (read, then summarise) is :mod:`traceread.assemble.run_map`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traceread.engine import caches
from traceread.errors import TraceFileError

STORED = "stored"


@dataclass(frozen=True)
class RankTask:
    """One rank's work order: which file and how (everything a remote worker needs, all plain data)."""

    file: Any  # pathlib.Path, str or traceread.read.remote.RemoteFile
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
    from traceread.read.ranks import identify

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
    from traceread.read.parse import parse_file

    if isinstance(f, NodeFile):  # on this node's disk: this task was placed here (engine.node_local)
        return _parse_node_file(f, max_rank_bytes)
    if getattr(f, "url", None) is not None:
        from traceread.read.remote import parse_remote

        return parse_remote(f, storage_options, max_rank_bytes=max_rank_bytes)
    p = Path(f)
    if p.is_dir():
        raise TraceFileError("is a folder (read_traces reads every rank in a folder)", str(p))
    if not p.is_file():
        raise TraceFileError("no such file", str(p))
    return parse_file(p, max_rank_bytes=max_rank_bytes)


def _parse_node_file(f: Any, max_rank_bytes: int | None) -> Any:
    from traceread.read.parse import parse_named

    p = Path(f.path)
    try:
        st = p.stat()
    except OSError:
        raise TraceFileError("no such file on this node (was it listed on another one?)", f.url) from None
    if (st.st_size, st.st_mtime_ns) != (f.size, f.mtime_ns):
        raise TraceFileError("changed since it was listed (size or mtime differ)", f.url)
    return parse_named(p, f.url, max_rank_bytes=max_rank_bytes)


def parse_task(path: str, root: str) -> str | TraceFileError:
    """Worker entry point for ``read_traces``: the tables go to the parse cache under ``root``."""
    from traceread.read.parse import parse_file

    p = Path(path)
    try:
        key = caches.parse_key(p)
        rt = parse_file(p)
    except TraceFileError as exc:
        return exc
    except OSError as exc:
        return TraceFileError(f"cannot read: {exc.strerror or exc}", path)
    return STORED if caches.store_tables(rt, p, Path(root), key) else TraceFileError("cannot write the table cache", path)
