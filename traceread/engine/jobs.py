"""Reading traces through the engine: ``read_rank`` (one file) and ``read_traces`` (a whole job).

Both go through the parse cache; ``read_traces`` parses the files on the local worker pool
(:func:`read_tables`) and never fails because one rank is broken.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from traceread.engine import caches, tasks
from traceread.engine.base import TaskFailed
from traceread.engine.executors import ProcessExecutor, default_workers, progress
from traceread.engine.memory import Budget
from traceread.errors import TraceFileError
from traceread.model import RankTrace, ReadFailure, TraceSet
from traceread.read.discover import NOT_A_TRACE, Found, find
from traceread.read.jsonfile import load_json_object
from traceread.read.ranks import assign_ranks, rank_from_name


def read_rank(
    path: str | Path, *, use_cache: bool = True, cache_dir: Path | None = None
) -> RankTrace:
    """Read one trace file into tables. Raises :class:`TraceFileError` (one line) on bad input.

    The rank comes from ``distributedInfo.rank``, else the file name, else 0.
    """
    return tasks.read_one(Path(path), use_cache=use_cache, cache_dir=cache_dir)


def read_traces(
    paths: str | Path | Sequence[str | Path],
    *,
    use_cache: bool = True,
    cache_dir: Path | None = None,
    workers: int | None = None,
    progress: bool = False,
) -> TraceSet:
    """Read every rank under ``paths`` (folders, globs, files), sorted by rank.

    A file that cannot be read is listed in ``failures`` with a warning ``rank N missing: ...``
    and the other ranks are returned anyway. JSON files inside a folder that are not traces are
    skipped with a warning. Raises :class:`traceread.errors.RankConflictError` when the files
    cannot be one job (same rank twice, different world sizes/backends).
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    found = find(paths)
    caches.take_notes()  # an earlier call's notes are not this one's
    ts = TraceSet(ranks=[], sources=[str(p) for p in paths])
    for m in found.missing:
        ts.failures.append(ReadFailure(file=m, reason=found.why(m)))
        ts.warnings.append(f"{m}: {found.why(m)}")
    if found.run_json:
        ts.run_info = load_json_object(found.run_json[0], ts.warnings)

    results = read_tables(found.files, use_cache=use_cache, cache_dir=cache_dir, workers=workers,
                          progress_bar=progress)

    ok: list[RankTrace] = []
    for f in found.files:
        res = results[f]
        if isinstance(res, RankTrace):
            ok.append(res)
            continue
        failure, warning = explain_failure(found, f, res.message)
        ts.warnings.append(warning)
        if failure is not None:
            ts.failures.append(failure)
    ts.warnings.extend(assign_ranks(ok))
    ts.warnings.extend(caches.take_notes())
    ts.ranks = ok
    return ts


def explain_failure(found: Found, path: Path, reason: str) -> tuple[ReadFailure | None, str]:
    """How an unreadable file is reported, by ``read_traces`` and ``report`` alike.

    A stray non-trace JSON the user did not name is skipped with a note; anything else is a missing
    rank, named from the file when possible, so the user knows whose numbers are absent and why.
    """
    if found.skipped(path, reason):
        return None, f"skipped {path}: {reason}"
    if reason.startswith(NOT_A_TRACE):  # named explicitly, but not a trace at all: no rank is missing
        return ReadFailure(file=str(path), reason=reason, rank=None), f"{path}: {reason}"
    rank = rank_from_name(str(path))
    said = f"rank {rank if rank is not None else '?'} missing: {path}: {reason}"
    return ReadFailure(file=str(path), reason=reason, rank=rank), said


def read_tables(files: Sequence[Path], *, use_cache: bool, cache_dir: Path | None, workers: int | None,
                progress_bar: bool) -> dict[Path, Any]:
    """Every file's :class:`RankTrace` (or :class:`TraceFileError`), through the parse cache.

    Tables travel back through the parse cache, not the result pipe: each worker writes its entry (a
    temporary cache when caching is off) and this process reads it (~20x fewer bytes than pickling)."""
    root = caches.cache_root(cache_dir) if use_cache else None
    out: dict[Path, Any] = {}
    if root is not None:
        with ThreadPoolExecutor(max_workers=max(1, min(8, len(files)))) as pool:
            for f, hit in zip(files, pool.map(lambda f: caches.load_tables(f, root), files)):
                if hit is not None:
                    out[f] = hit
    todo = [f for f in files if f not in out]
    n = default_workers(len(todo)) if workers is None else max(1, workers)
    with progress(progress_bar, len(todo), "reading traces") as advance:
        if n <= 1 or len(todo) <= 1:
            for f in todo:
                try:
                    out[f] = tasks.read_one(f, use_cache=use_cache, cache_dir=cache_dir)
                except TraceFileError as exc:
                    out[f] = exc
                advance(f.name)
            return out
        with TemporaryDirectory(prefix="traceread-") as tmp:
            transfer = root if root is not None else Path(tmp)

            def done(i: int, res: Any) -> None:
                f = todo[i]
                if isinstance(res, TaskFailed):
                    out[f] = TraceFileError(res.reason, str(f))
                elif isinstance(res, TraceFileError):
                    out[f] = res
                else:
                    out[f] = caches.load_tables(f, transfer) or _read_here(f)  # changed meanwhile: here
                advance(f.name)

            ProcessExecutor(n, budget=Budget.for_files(todo)).map(tasks.parse_task, [(str(f), str(transfer)) for f in todo], done)
    return out


def _read_here(f: Path) -> Any:
    try:
        return tasks.read_one(f, use_cache=False, cache_dir=None)
    except TraceFileError as exc:
        return exc
