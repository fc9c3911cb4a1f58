"""Parse many ranks at once in worker processes, with an optional progress bar.

Processes (not threads) because decoding and tabulating are CPU-bound Python. The pool uses the
``spawn`` start method: forking a process that already runs polars' thread pool can deadlock.
Tables travel back through the parquet cache, not the result pipe: each worker writes its cache
entry (a temporary one when caching is off) and the parent reads it, which moves ~20x fewer bytes
than pickling the frames.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from contextlib import ExitStack, contextmanager
from pathlib import Path

from traceread.errors import TraceFileError
from traceread.model import RankTrace
from traceread.reader import cache
from traceread.reader.parse import parse_file

Outcome = RankTrace | TraceFileError
_STORED = "stored"


def parse_and_store(path: str, use_cache: bool, root: str | None) -> Outcome:
    """In-process unit: never raises for a bad file, returns the error instead."""
    try:
        rt = parse_file(path)
    except TraceFileError as exc:
        return exc
    if use_cache and root is not None:
        cache.store(rt, Path(path), Path(root))
    return rt


def _worker(path: str, root: str) -> Outcome | str:
    """Pool entry point: the tables go to the cache entry under ``root``; returns a marker."""
    try:
        rt = parse_file(path)
    except TraceFileError as exc:
        return exc
    return _STORED if cache.store(rt, Path(path), Path(root)) else rt


def default_workers(n_files: int) -> int:
    return max(1, min(os.cpu_count() or 1, n_files))


def run_all(
    files: list[Path],
    *,
    use_cache: bool,
    root: Path | None,
    workers: int | None,
    progress: bool,
) -> dict[Path, Outcome]:
    """Parse ``files``; in-process when one worker suffices, else in a process pool."""
    n_workers = default_workers(len(files)) if workers is None else max(1, workers)
    n_workers = min(n_workers, max(1, len(files)))
    out: dict[Path, Outcome] = {}
    root_s = str(root) if root is not None else None
    with _progress(progress, len(files)) as advance:
        if n_workers == 1 or len(files) <= 1:
            for f in files:
                out[f] = parse_and_store(str(f), use_cache, root_s)
                advance(f)
            return out
        with ExitStack() as stack:
            if use_cache and root is not None:
                transfer = root
            else:
                tmp = tempfile.TemporaryDirectory(prefix="traceread-")
                transfer = Path(stack.enter_context(tmp))
            ctx = multiprocessing.get_context("spawn")
            pool = stack.enter_context(ProcessPoolExecutor(max_workers=n_workers, mp_context=ctx))
            futures: dict[Future[Outcome | str], Path] = {
                pool.submit(_worker, str(f), str(transfer)): f for f in files
            }
            pending = set(futures)
            while pending:
                done, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    f = futures[fut]
                    out[f] = _collect(fut, f, transfer)
                    advance(f)
    return out


def _collect(fut: Future[Outcome | str], f: Path, transfer: Path) -> Outcome:
    try:
        res = fut.result()
    except BrokenProcessPool:
        # Workers could not start or died (e.g. a script without an ``if __name__ ==
        # "__main__"`` guard under spawn, or the OOM killer): read this file here instead.
        return parse_and_store(str(f), transfer is not None, str(transfer))
    except Exception as exc:  # noqa: BLE001 - a crashed worker fails one file, not the run
        msg = f"reader process failed: {type(exc).__name__}: {exc}".splitlines()[0]
        return TraceFileError(msg, str(f))
    if res == _STORED:
        loaded = cache.load(f, transfer)
        if loaded is not None:
            return loaded
        return parse_and_store(str(f), False, None)  # file changed meanwhile: parse here
    return res  # type: ignore[return-value]


@contextmanager
def _progress(enabled: bool, total: int) -> Iterator[Callable[[Path], None]]:
    if not enabled or total == 0:
        yield lambda _f: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from traceread.reports.sanitize import clean

    with Progress(
        TextColumn("reading traces"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.description}", markup=False),  # a file name: no rich markup
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task("", total=total)

        def advance(f: Path) -> None:
            bar.update(task, advance=1, description=clean(f.name))

        yield advance
