"""Public entry points: ``read_rank`` (one file) and ``read_traces`` (a whole job)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Sequence
from pathlib import Path

from traceread.errors import TraceFileError
from traceread.model import RankTrace, ReadFailure, TraceSet
from traceread.reader import cache
from traceread.reader.discover import Found, find
from traceread.reader.parallel import run_all
from traceread.reader.parse import parse_file
from traceread.reader.ranks import assign_ranks, identify, rank_from_name


def read_rank(
    path: str | Path, *, use_cache: bool = True, cache_dir: Path | None = None
) -> RankTrace:
    """Read one trace file into tables. Raises :class:`TraceFileError` (one line) on bad input.

    The rank comes from ``distributedInfo.rank``, else the file name, else 0.
    """
    p = Path(path)
    if p.is_dir():
        raise TraceFileError("is a folder (read_traces reads every rank in a folder)", str(p))
    if not p.is_file():
        raise TraceFileError("no such file", str(p))
    root = cache.cache_root(cache_dir) if use_cache else None
    if root is not None:
        hit = cache.load(p, root)
        if hit is not None:
            identify(hit, single=True)
            return hit
    rt = parse_file(p)
    if root is not None:
        cache.store(rt, p, root)
    return rt


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
    ts = TraceSet(ranks=[], sources=[str(p) for p in paths])
    for m in found.missing:
        ts.failures.append(ReadFailure(file=m, reason="no such file or folder"))
        ts.warnings.append(f"{m}: no such file or folder")
    if found.run_json:
        ts.run_info = _load_run_info(found.run_json[0], ts.warnings)

    root = cache.cache_root(cache_dir) if use_cache else None
    results: dict[Path, RankTrace | TraceFileError] = {}
    hits = _load_cached(found.files, root) if root is not None else {}
    results.update(hits)
    todo = [f for f in found.files if f not in hits]
    results.update(
        run_all(todo, use_cache=use_cache, root=root, workers=workers, progress=progress)
    )

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
    ts.ranks = ok
    return ts


def explain_failure(found: Found, path: Path, reason: str) -> tuple[ReadFailure | None, str]:
    """How an unreadable file is reported, by ``read_traces`` and ``report`` alike.

    A stray non-trace JSON the user did not name is skipped with a note; anything else is a missing
    rank, named from the file when possible, so the user knows whose numbers are absent and why.
    """
    if found.skipped(path, reason):
        return None, f"skipped {path}: {reason}"
    rank = rank_from_name(path)
    return ReadFailure(file=str(path), reason=reason, rank=rank), f"rank {rank if rank is not None else '?'} missing: {path}: {reason}"


def _load_cached(files: list[Path], root: Path) -> dict[Path, RankTrace]:
    """Cache hits, loaded on threads (parquet decoding releases the GIL)."""
    if len(files) <= 1:
        loaded = [cache.load(f, root) for f in files]
    else:
        with ThreadPoolExecutor(max_workers=min(8, len(files))) as pool:
            loaded = list(pool.map(lambda f: cache.load(f, root), files))
    return {f: rt for f, rt in zip(files, loaded) if rt is not None}


def _load_run_info(path: Path, warnings: list[str]) -> dict | None:
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        warnings.append(f"{path}: cannot read run.json ({str(exc).splitlines()[0]})")
        return None
    if not isinstance(info, dict):
        warnings.append(f"{path}: run.json is not a JSON object")
        return None
    return info
