"""Runs a per-rank function over many files: one executor interface, three ways (in-process, local
processes, Ray).

Executors run a module-level function over work items and hand each result to a callback as soon
as it is done; they know nothing of what the function computes (the report's map passes its own:
:mod:`traceread.assemble.run_map`; ``read_traces`` passes the parser: :mod:`traceread.engine.jobs`).
A task whose worker fails (crashed process, lost Ray node, out of memory) is retried once; a second
failure becomes that rank's one-line reason (``rank N missing: file: reason``), like a broken file.
Local processes use ``spawn``: forking a process that already runs polars' thread pool can deadlock.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from traceread.engine.base import Done, Executor, TaskFailed
from traceread.engine.memory import Budget, quiet_allocator
from traceread.options import ReportOptions


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
        with ProcessPoolExecutor(max_workers=min(self.workers, len(items)), mp_context=ctx,
                                 initializer=die_with_parent, initargs=(os.getpid(),)) as pool:
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
                    except Exception:  # the worker failed (crash, OOM, pool broken)
                        retry.append(i)
                submit()
        # Second and last try, here: a pool that cannot start (a script without an
        # ``if __name__ == "__main__"`` guard under spawn) or a worker killed by the OOM killer.
        for i in retry:
            done(i, _call_once(fn, items[i], "worker process failed"))


def die_with_parent(parent: int) -> None:
    """Worker initializer: end this worker when the process that started it ends, however it ends.

    A ``traceread report`` stopped by SIGTERM or SIGKILL runs no clean-up: without this its workers
    (~125 MB each) and, through them, the resource tracker lived on for minutes holding its
    stdout/stderr, so whoever waited for the report's output waited for them. Linux: the kernel
    sends SIGKILL on the parent's death (``PR_SET_PDEATHSIG``); elsewhere a thread watches the
    parent's pid. A parent already gone before this ran is caught by the ``getppid`` check."""
    armed = False
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            armed = libc.prctl(1, signal.SIGKILL, 0, 0, 0) == 0  # PR_SET_PDEATHSIG = 1
        except (OSError, AttributeError):
            armed = False
    if os.getppid() != parent:
        os._exit(1)
    if not armed:
        threading.Thread(target=_watch_parent, args=(parent,), name="traceread-parent-watch", daemon=True).start()


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(1)


def _call_once(fn: Callable[..., Any], args: tuple[Any, ...], what: str) -> Any:
    try:
        return fn(*args)
    except Exception as exc:  # reported as the rank's reason
        return TaskFailed(f"{what}, then failed again here: {type(exc).__name__}: {exc}".splitlines()[0])


def _call_twice(fn: Callable[..., Any], args: tuple[Any, ...]) -> Any:
    try:
        return fn(*args)
    except Exception:  # one retry, like a lost worker
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


@contextmanager
def progress(enabled: bool, total: int, label: str) -> Iterator[Callable[[str], None]]:
    """A transient progress bar on stderr over ``total`` items (a no-op when disabled)."""
    if not enabled or total == 0:
        yield lambda _d: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from traceread.textsafe import clean

    with Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}", markup=False), console=Console(stderr=True),
                  transient=True) as bar:
        task = bar.add_task("", total=total)
        yield lambda d: bar.update(task, advance=1, description=clean(d))  # d is a file name
