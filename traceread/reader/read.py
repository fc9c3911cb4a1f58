"""Public entry points: ``read_rank`` (one file) and ``read_traces`` (a whole job).

Both run on the engine (:mod:`traceread.engine`: the parse cache and the one worker pool); it is
imported inside the functions, so importing the reader never pulls in the engine.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from traceread.model import RankTrace, ReadFailure, TraceSet
from traceread.reader.discover import Found, find
from traceread.reader.ranks import assign_ranks, rank_from_name


def read_rank(
    path: str | Path, *, use_cache: bool = True, cache_dir: Path | None = None
) -> RankTrace:
    """Read one trace file into tables. Raises :class:`TraceFileError` (one line) on bad input.

    The rank comes from ``distributedInfo.rank``, else the file name, else 0.
    """
    from traceread.engine.tasks import read_one

    return read_one(Path(path), use_cache=use_cache, cache_dir=cache_dir)


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

    from traceread.engine.executors import read_tables

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
    ts.ranks = ok
    return ts


def explain_failure(found: Found, path: Path, reason: str) -> tuple[ReadFailure | None, str]:
    """How an unreadable file is reported, by ``read_traces`` and ``report`` alike.

    A stray non-trace JSON the user did not name is skipped with a note; anything else is a missing
    rank, named from the file when possible, so the user knows whose numbers are absent and why.
    """
    if found.skipped(path, reason):
        return None, f"skipped {path}: {reason}"
    rank = rank_from_name(str(path))
    return ReadFailure(file=str(path), reason=reason, rank=rank), f"rank {rank if rank is not None else '?'} missing: {path}: {reason}"


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
