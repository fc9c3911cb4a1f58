"""Runs the per-rank stage: one executor interface, three ways (in-process, local processes, Ray).

:func:`summarise_files` is the report's map: every file's :class:`RankSummary` from the summary cache
when it still matches (read-through on the driver), the rest by :func:`tasks.summarise_task` on an
executor. :func:`read_tables` is the same for :func:`traceread.reader.read_traces` (tables through
the parse cache). Both show one progress bar over the ranks.

Executors run a module-level function over work items and hand each result to a callback as soon
as it is done. A task whose worker fails (crashed process, lost Ray node, out of memory) is retried
once; a second failure becomes that rank's one-line reason (``rank N missing: file: reason``), like a
broken file. Local processes use ``spawn``: forking a process that already runs polars' thread pool
can deadlock. Ranks already in the parse cache are summarised on the driver's threads while the pool
parses the others, because a spawned worker's start-up (~0.5 s of imports) exceeds their work.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, ThreadPoolExecutor, wait
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from traceread.engine import caches, tasks
from traceread.engine.memory import Budget, quiet_allocator
from traceread.errors import TraceFileError
from traceread.options import ReportOptions
from traceread.reader.inflate import max_rank_bytes

#: Parse-cached ranks summarised on the driver instead of in a worker (see the module docstring).
IN_PROCESS_CACHED = 64

Done = Callable[[int, Any], None]


class TaskFailed:
    """A task whose worker failed twice: the reason, for the report's warnings."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


class Executor(Protocol):
    """Runs ``fn(*args)`` for every args tuple; calls ``done(i, result | TaskFailed)`` per item."""

    def map(self, fn: Callable[..., Any], items: Sequence[tuple[Any, ...]], done: Done) -> None: ...


class InProcessExecutor:
    """This process, one item after another (one worker, or a single file)."""

    def map(self, fn: Callable[..., Any], items: Sequence[tuple[Any, ...]], done: Done) -> None:
        for i, args in enumerate(items):
            done(i, _call_twice(fn, args))


class ProcessExecutor:
    """A local pool of spawned processes. ``alongside``: work for this process while the pool runs.
    ``budget``: a task starts only while the planned peaks of the running ones fit in memory
    (:mod:`traceread.engine.memory`); without one, ``workers`` tasks run at a time."""

    def __init__(self, workers: int, alongside: Callable[[], None] | None = None,
                 budget: Budget | None = None) -> None:
        self.workers = workers
        self.alongside = alongside
        self.budget = budget

    def map(self, fn: Callable[..., Any], items: Sequence[tuple[Any, ...]], done: Done) -> None:
        if not items:
            if self.alongside:
                self.alongside()
            return
        quiet_allocator()  # inherited by the workers spawned below
        ctx = multiprocessing.get_context("spawn")
        retry: list[int] = []
        budget = self.budget
        waiting = list(range(len(items)))
        with ProcessPoolExecutor(max_workers=min(self.workers, len(items)), mp_context=ctx) as pool:
            futs: dict[Future[Any], int] = {}

            def submit() -> None:
                # First fit, in order: a rank too large for what is left waits; a smaller one may go.
                for i in list(waiting):
                    if len(futs) >= self.workers:
                        return
                    if budget is None or budget.fits(i, len(futs)):
                        waiting.remove(i)
                        if budget is not None:
                            budget.start(i)
                        futs[pool.submit(fn, *items[i])] = i

            submit()
            if self.alongside:
                self.alongside()
            while futs:
                finished, _ = wait(set(futs), return_when=FIRST_COMPLETED)
                for fut in finished:
                    i = futs.pop(fut)
                    if budget is not None:
                        budget.finish(i)
                    try:
                        done(i, fut.result())
                    except Exception:  # noqa: BLE001 - the worker failed (crash, OOM, pool broken)
                        retry.append(i)
                submit()
        # Second and last try, here: a pool that cannot start (a script without an
        # ``if __name__ == "__main__"`` guard under spawn) or a worker killed by the OOM killer.
        for i in retry:
            done(i, _call_once(fn, items[i], "worker process failed"))


def _call_once(fn: Callable[..., Any], args: tuple[Any, ...], what: str) -> Any:
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - reported as the rank's reason
        return TaskFailed(f"{what}, then failed again here: {type(exc).__name__}: {exc}".splitlines()[0])


def _call_twice(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - one retry, like a lost worker
        return _call_once(fn, args, "analysis failed")


def make_executor(opts: ReportOptions, files: Sequence[Any], alongside: Callable[[], None] | None = None) -> Executor:
    """The executor the options ask for (Ray is imported only here, only when asked for); local
    workers get the memory budget of ``files``."""
    if opts.executor == "ray":
        from traceread.engine.ray_executor import RayExecutor

        return RayExecutor(address=opts.ray_address, alongside=alongside)
    n_tasks = len(files)
    workers = default_workers(n_tasks) if opts.workers is None else max(1, opts.workers)
    if workers <= 1 or n_tasks <= 1:
        return _Sequential(alongside)
    return ProcessExecutor(workers, alongside, Budget.for_files([_local_path(f) for f in files]))


def _local_path(f: Any) -> Any:
    """The local path of a work item's file; None for object URLs and other nodes' files."""
    return None if getattr(f, "url", None) is not None or not isinstance(f, (str, Path)) else f


class _Sequential(InProcessExecutor):
    def __init__(self, alongside: Callable[[], None] | None) -> None:
        self.alongside = alongside

    def map(self, fn: Callable[..., Any], items: Sequence[tuple[Any, ...]], done: Done) -> None:
        if self.alongside:
            self.alongside()
        super().map(fn, items, done)


def default_workers(n_files: int) -> int:
    return max(1, min(os.cpu_count() or 1, n_files))


# ------------------------------------------------------------------------------------------------
# the report's map


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
                    out[f] = tasks.decode_result(res, task_of[f], store_here=opts.executor == "ray")
                except Exception as exc:  # noqa: BLE001 - a garbled result fails one rank
                    out[f] = TraceFileError(f"unreadable result from the worker: {type(exc).__name__}", str(f))
            advance(task_of[f].name)

        executor = make_executor(opts, remote, alongside=here if local else None)
        executor.map(tasks.summarise_task, [(task_of[f],) for f in remote], done)
    return out


def _load_summaries(files: Sequence[Any], root: Path, spec_file: str | None, out: dict[Any, Any],
                    advance: Callable[[str], None]) -> None:
    """Summary-cache hits, decoded on threads (Arrow IPC decoding releases the GIL)."""
    def one(i_f: tuple[int, Any]) -> Any:
        i, f = i_f
        return caches.load_summary(f, root, spec_file, i == 0)

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
            return tasks.summarise(t)[0]
        except Exception as exc:  # noqa: BLE001 - an analysis bug fails one rank
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


# ------------------------------------------------------------------------------------------------
# read_traces' map


def read_tables(files: Sequence[Path], *, use_cache: bool, cache_dir: Path | None, workers: int | None,
                progress_bar: bool) -> dict[Path, Any]:
    """Every file's :class:`RankTrace` (or :class:`TraceFileError`), through the parse cache.

    Tables travel back through the parse cache, not the result pipe: each worker writes its entry (a
    temporary cache when caching is off) and this process reads it (~20x fewer bytes than pickling)."""
    import tempfile

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
        with tempfile.TemporaryDirectory(prefix="traceread-") as tmp:
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


@contextmanager
def progress(enabled: bool, total: int, label: str) -> Iterator[Callable[[str], None]]:
    """A transient progress bar on stderr over ``total`` items (a no-op when disabled)."""
    if not enabled or total == 0:
        yield lambda _d: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from traceread.reports.sanitize import clean

    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}", markup=False), console=Console(stderr=True),
                  transient=True) as bar:
        task = bar.add_task("", total=total)
        yield lambda d: bar.update(task, advance=1, description=clean(d))  # d is a file name
