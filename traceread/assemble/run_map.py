"""The report's map, run on the engine: every rank file -> its :class:`RankSummary`.

:func:`summarise_files` takes every file's summary from the summary cache when it still matches
(read-through on the driver) and runs :func:`summarise_task` on an executor for the rest
(:mod:`traceread.engine.executors`: in-process, local processes or Ray), with one progress bar over
the ranks. Ranks already in the parse cache are summarised on the driver's threads while the pool
parses the others, because a spawned worker's start-up (~0.5 s of imports) exceeds their work.

Results are data, never objects: ``{"summary": bytes}`` or ``{"error": "one line"}`` encoded as
msgpack, so a worker process or a Ray task hands back bytes the driver decodes without unpickling
anything of ours. A bad file is an ``error`` result, never an exception: exceptions mean the worker
itself failed, which the executor retries once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec

from traceread.assemble.rank_map import RankSummary, slim_meta, summarise_rank
from traceread.engine import caches, tasks
from traceread.engine.base import TaskFailed
from traceread.engine.executors import make_executor, progress
from traceread.errors import TraceFileError
from traceread.options import ReportOptions
from traceread.read.inflate import max_rank_bytes
from traceread.read.ranks import identify

#: Parse-cached ranks summarised on the driver instead of in a worker (see the module docstring).
IN_PROCESS_CACHED = 64


def summarise(task: tasks.RankTask) -> tuple[Any, bytes | None]:
    """(summary or TraceFileError, its encoded bytes); stores the bytes in the summary cache."""
    root = caches.cache_root(task.cache_dir) if task.use_cache else None
    key = caches.summary_key(task.file, task.spec_file, task.detail) if root is not None else None
    try:
        rt = tasks.read_one(task.file, use_cache=task.use_cache, cache_dir=task.cache_dir,
                      storage_options=task.storage_options, max_rank_bytes=task.max_rank_bytes)
    except TraceFileError as exc:
        return exc, None
    except Exception as exc:  # a reader bug fails one file, not the job
        return TraceFileError(f"reader failed: {type(exc).__name__}: {exc}".splitlines()[0], str(task.file)), None
    identify(rt, single=False)
    summary = summarise_rank(rt, spec_file=Path(task.spec_file) if task.spec_file else None, detail=task.detail)
    del rt
    slim_meta(summary.meta)
    data = caches.encode_summary(summary)
    if key is not None and root is not None:
        caches.store_summary(data, key, root)
    return summary, data


def summarise_task(task: tasks.RankTask) -> bytes:
    """Worker entry point (process pool, Ray): the summary as data bytes (see module docstring)."""
    summary, data = summarise(task)
    notes = caches.take_notes()  # damaged cache entries this worker met: said by the driver
    if isinstance(summary, TraceFileError):
        return msgspec.msgpack.encode({"error": summary.message, "notes": notes})
    return msgspec.msgpack.encode({"summary": data, "notes": notes})


def decode_result(data: bytes, task: tasks.RankTask, store_here: bool = False) -> Any:
    """A worker's bytes -> RankSummary or TraceFileError. ``store_here``: also put the summary in this
    machine's summary cache (a Ray worker on another node filled only its own)."""
    doc = msgspec.msgpack.decode(data)
    for text in doc.get("notes") or []:
        caches.note(str(text))
    if "error" in doc:
        return TraceFileError(str(doc["error"]), str(task.file))
    summary = caches.decode_summary(doc["summary"], RankSummary)
    if store_here and task.use_cache:
        key = caches.summary_key(task.file, task.spec_file, task.detail)
        if key is not None:
            caches.store_summary(doc["summary"], key, caches.cache_root(task.cache_dir))
    return summary


def summarise_files(files: Sequence[Any], opts: ReportOptions) -> dict[Any, Any]:
    """Every file's :class:`RankSummary` (or :class:`TraceFileError`). The first file (in ``files``
    order) also gets the roofline detail."""
    root = caches.cache_root(opts.cache_dir) if opts.use_cache else None
    cache_dir = str(opts.cache_dir) if opts.cache_dir else None
    spec_file = str(opts.device_spec) if opts.device_spec else None
    limit = max_rank_bytes()
    task_of = {f: tasks.RankTask(f, detail=(i == 0), use_cache=opts.use_cache, cache_dir=cache_dir,
                                 spec_file=spec_file, storage_options=opts.storage_options, max_rank_bytes=limit)
               for i, f in enumerate(files)}
    out: dict[Any, Any] = {}
    with progress(opts.progress, len(files), "analysing ranks") as advance:
        if root is not None:
            _load_summaries(files, root, spec_file, out, advance)
        todo = [f for f in files if f not in out]
        if not todo:
            return out
        local: list[Any] = []
        if opts.executor == "local" and root is not None and (opts.workers or 2) > 1 and len(todo) > 1:
            local = [f for f in todo if getattr(f, "url", None) is None and caches.in_parse_cache(f, root)]
            local = local[:IN_PROCESS_CACHED]
        local_set = set(local)
        remote = [f for f in todo if f not in local_set]

        def here() -> None:
            _summarise_here([task_of[f] for f in local], out, advance, threads=2 if not remote else 1)

        def done(i: int, res: Any) -> None:
            f = remote[i]
            if isinstance(res, TaskFailed):
                out[f] = TraceFileError(res.reason, str(f))
            else:
                try:
                    out[f] = decode_result(res, task_of[f], store_here=opts.executor == "ray")
                except Exception as exc:  # a garbled result fails one rank
                    out[f] = TraceFileError(f"unreadable result from the worker: {type(exc).__name__}", str(f))
            advance(task_of[f].name)

        executor = make_executor(opts, remote, alongside=here if local else None)
        executor.map(summarise_task, [(task_of[f],) for f in remote], done)
    return out


def _load_summaries(files: Sequence[Any], root: Path, spec_file: str | None, out: dict[Any, Any],
                    advance: Callable[[str], None]) -> None:
    """Summary-cache hits, decoded on threads (Arrow IPC decoding releases the GIL)."""
    def one(i_f: tuple[int, Any]) -> Any:
        i, f = i_f
        return caches.load_summary(f, root, spec_file, i == 0, RankSummary)

    pairs = list(enumerate(files))
    if len(pairs) > 8:
        with ThreadPoolExecutor(max_workers=4) as pool:
            hits = list(pool.map(one, pairs))
    else:
        hits = [one(p) for p in pairs]
    for (_, f), hit in zip(pairs, hits):
        if hit is not None:
            out[f] = hit
            advance(Path(str(f)).name)


def _summarise_here(work: list[tasks.RankTask], out: dict[Any, Any], advance: Callable[[str], None],
                    threads: int) -> None:
    """Parse-cached ranks on this process's threads (polars and parquet release the GIL)."""
    def one(t: tasks.RankTask) -> Any:
        try:
            return summarise(t)[0]
        except Exception as exc:  # an analysis bug fails one rank
            return TraceFileError(f"analysis failed: {type(exc).__name__}: {exc}".splitlines()[0], str(t.file))

    if threads <= 1 or len(work) <= 1:
        for t in work:
            out[t.file] = one(t)
            advance(t.name)
        return
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for t, res in zip(work, pool.map(one, work)):
            out[t.file] = res
            advance(t.name)
