"""Two profilers never run at once in a rank: traceread steps aside when the job starts its own.

Kineto holds one profiler session per process. A job that starts ``torch.profiler`` while traceread's
window is open (torchtitan, the Trainer/Lightning profiler callbacks, Megatron's ``--profile``) swaps
the session under traceread's, and traceread's export later reads freed state: SIGSEGV in both ranks
(issue #36). So every profiler start in the rank is observed where all of torch's front-ends meet —
the module-level ``_prepare_profiler`` / ``_enable_profiler`` that ``torch.autograd.profiler`` calls
(``torch.profiler.profile``, ``_KinetoProfile``, ``torch.autograd.profiler.profile``, ``emit_nvtx``,
``emit_itt``) and ``_enable_profiler_legacy`` of ``torch.autograd.profiler_legacy`` — and before the
job's first call goes on, ``on_job_profiler`` (the rank module) closes traceread's window (the same
functions are also wrapped where ``torch.autograd`` exposes them). traceread's own calls run inside
:func:`ours` and pass straight through.

Where the job's traces go is read from its profiler's ``on_trace_ready`` (``tensorboard_trace_handler``'s
``dir_name`` in the closure) and from every ``export_chrome_trace`` the job calls, so the report can read
them when traceread has none. Stdlib only; torch is the module the job imported. Nothing here raises
into the job: an observation that fails is logged and the job's call runs as it would have.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from types import FrameType

_LOCAL = threading.local()
#: at most this many trace files are remembered per rank (a job that profiles every N steps forever)
MAX_FILES = 64
#: closure variables whose string value names where a trace handler writes
_PATH_NAMES = ("dir", "path", "file", "folder", "output")


@contextlib.contextmanager
def ours() -> Iterator[None]:
    """traceread's own profiler calls: the guard lets them through unobserved."""
    depth = getattr(_LOCAL, "ours", 0)
    _LOCAL.ours = depth + 1
    try:
        yield
    finally:
        _LOCAL.ours = depth


def _is_ours() -> bool:
    return getattr(_LOCAL, "ours", 0) > 0


class Guard:
    """What the rank knows about the job's own profiler; calls back into the rank module."""

    def __init__(self, on_job_profiler: Callable[[dict[str, Any]], None],
                 on_paths: Callable[[list[str], list[str]], None], log: Callable[[str], None]) -> None:
        self.on_job_profiler = on_job_profiler  # once, before the job's first profiler start goes on
        self.on_paths = on_paths  # (trace folders, trace files) whenever either grows
        self.log = log
        self.seen = False
        self.starts = 0
        self.dirs: list[str] = []
        self.files: list[str] = []
        self.patched: list[tuple[Any, str, Any]] = []

    def observe(self, entry: str) -> None:
        """The job (not traceread) is starting a profiler session through ``entry``."""
        try:
            self.starts += 1
            prof = _calling_profiler()
            grew = self._add_dirs(_handler_dirs(getattr(prof, "on_trace_ready", None)))
            if not self.seen:
                self.seen = True
                api = f"{type(prof).__module__}.{type(prof).__qualname__}" if prof is not None else entry
                self.on_job_profiler({"api": api, "entry": entry, "trace_dirs": list(self.dirs)})
            elif grew:
                self.on_paths(list(self.dirs), list(self.files))
        except BaseException as exc:  # never into the job's profiler call
            self.log(f"FAILED observing the job's profiler start ({entry}): {exc!r}")

    def exported(self, path: Any) -> None:
        """The job exported a trace to ``path``."""
        try:
            full = os.path.abspath(os.fspath(path))
            if full in self.files:
                return
            self.files = [*self.files, full][-MAX_FILES:]
            self._add_dirs([os.path.dirname(full)])
            self.on_paths(list(self.dirs), list(self.files))
        except BaseException as exc:
            self.log(f"FAILED recording the job's trace {path!r}: {exc!r}")

    def _add_dirs(self, dirs: list[str]) -> bool:
        new = [d for d in dirs if d not in self.dirs]
        self.dirs = [*self.dirs, *new][-MAX_FILES:]
        return bool(new)


def install(torch: Any, guard: Guard) -> Guard:
    """Patch the profiler entry points of ``torch`` (already imported by the job) to report to ``guard``."""
    autograd_prof = sys.modules.get("torch.autograd.profiler") or getattr(torch.autograd, "profiler", None)
    legacy = sys.modules.get("torch.autograd.profiler_legacy")
    starts = [(autograd_prof, "_prepare_profiler"), (autograd_prof, "_enable_profiler"),
              (legacy, "_enable_profiler_legacy")]
    # the same functions where torch.autograd exposes them, for code that calls them there directly
    starts += [(torch.autograd, n) for n in ("_prepare_profiler", "_enable_profiler", "_enable_profiler_legacy")]
    for module, name in starts:
        orig = getattr(module, name, None) if module is not None else None
        if callable(orig):
            _patch(guard, module, name, _wrap_start(guard, orig, f"{getattr(module, '__name__', '?')}.{name}"))
    kineto = getattr(sys.modules.get("torch.profiler.profiler"), "_KinetoProfile", None)
    for cls in (kineto, getattr(autograd_prof, "profile", None), getattr(legacy, "profile", None)):
        orig = getattr(cls, "export_chrome_trace", None) if cls is not None else None
        if callable(orig):
            _patch(guard, cls, "export_chrome_trace", _wrap_export(guard, orig))
    return guard


def _patch(guard: Guard, owner: Any, name: str, new: Any) -> None:
    guard.patched.append((owner, name, getattr(owner, name)))
    setattr(owner, name, new)


def uninstall(guard: Guard) -> None:
    """Put the original entry points back (tests; a rank never needs it)."""
    while guard.patched:
        owner, name, orig = guard.patched.pop()
        setattr(owner, name, orig)


def _wrap_start(guard: Guard, orig: Callable[..., Any], entry: str) -> Callable[..., Any]:
    @functools.wraps(orig)
    def start(*args: Any, **kwargs: Any) -> Any:
        if not _is_ours():
            guard.observe(entry)
        return orig(*args, **kwargs)

    return start


def _wrap_export(guard: Guard, orig: Callable[..., Any]) -> Callable[..., Any]:
    """``export_chrome_trace`` recorded at the outermost call (``_KinetoProfile``'s calls the autograd
    profile's with a temporary file when the name ends in ``.gz``)."""

    @functools.wraps(orig)
    def export_chrome_trace(self: Any, *args: Any, **kwargs: Any) -> Any:
        outer = not _is_ours() and not getattr(_LOCAL, "exporting", False)
        if not outer:
            return orig(self, *args, **kwargs)
        _LOCAL.exporting = True
        try:
            result = orig(self, *args, **kwargs)
        finally:
            _LOCAL.exporting = False
        path = args[0] if args else kwargs.get("path")
        if path is not None:
            guard.exported(path)
        return result

    return export_chrome_trace


def _calling_profiler() -> Any:
    """The profiler object whose start is under way: the outermost ``torch.profiler`` profile on the
    stack (it holds ``on_trace_ready``), else the autograd profile; None when neither is found."""
    torch_prof = sys.modules.get("torch.profiler.profiler")
    autograd_prof = sys.modules.get("torch.autograd.profiler")
    kinds = tuple(c for c in (getattr(torch_prof, "_KinetoProfile", None), getattr(autograd_prof, "profile", None),
                              getattr(sys.modules.get("torch.autograd.profiler_legacy"), "profile", None))
                  if isinstance(c, type))
    found = None
    frame: FrameType | None = sys._getframe(2)
    for _ in range(16):
        if frame is None:
            break
        obj = frame.f_locals.get("self")
        if kinds and isinstance(obj, kinds):
            found = obj
            if torch_prof is not None and isinstance(obj, torch_prof._KinetoProfile):
                break
        frame = frame.f_back
    return found


def _handler_dirs(handler: Any) -> list[str]:
    """Folders a trace handler writes to: string closure variables named like a path
    (``tensorboard_trace_handler``'s ``dir_name``), through ``functools.partial`` and nested closures."""
    out: list[str] = []
    todo: list[Any] = [handler]
    seen: set[int] = set()
    while todo and len(seen) < 16:
        fn = todo.pop()
        if fn is None or id(fn) in seen:
            continue
        seen.add(id(fn))
        if isinstance(fn, functools.partial):
            todo.append(fn.func)
            values = [("path", a) for a in fn.args] + list(fn.keywords.items())
        else:
            code, cells = getattr(fn, "__code__", None), getattr(fn, "__closure__", None) or ()
            values = []
            for name, cell in zip(getattr(code, "co_freevars", ()), cells):
                try:
                    values.append((name, cell.cell_contents))
                except ValueError:  # an empty cell
                    continue
        for name, value in values:
            if isinstance(value, (str, os.PathLike)) and any(k in name.lower() for k in _PATH_NAMES):
                text = os.fspath(value)
                if isinstance(text, str) and text:
                    out.append(os.path.abspath(text))
            elif callable(value):
                todo.append(value)
    return out
