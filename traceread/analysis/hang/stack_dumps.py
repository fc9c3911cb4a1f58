"""Parse per-rank Python stack dumps (faulthandler, py-spy) and find where each rank is stuck.

A hang is explained by the line of *user* code each rank is on: the waiting ranks sit in a
collective call, the culprit is somewhere else (a sleep, a checkpoint save, a data-loader wait).
Library frames (torch, threading, site-packages, the standard library) are skipped so the answer
is the training script's line, not ``distributed_c10d.py:3252``.

Formats:

* faulthandler: ``Thread 0x... (most recent call first):`` / ``Current thread 0x...`` then
  ``  File "path", line N in func`` (innermost first). Several dumps may be appended to one file
  (a repeating ``dump_traceback_later``); the last dump wins.
* py-spy ``dump``: ``Thread 12345 (idle): "MainThread"`` then ``    func (path:line)``, innermost
  first; ``--locals`` adds indented ``Arguments:``/``Locals:`` blocks, which are ignored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from traceread.analysis.hang.files import read_head, read_tail, regular
from traceread.analysis.hang.flight_recorder import is_library
from traceread.errors import TraceFileError

#: The end of a stack file that is parsed (one faulthandler dump of 100 threads is ~100 KB; py-spy with
#: locals a few hundred KB).
MAX_STACK_BYTES = 1 << 20
#: A source file is read up to here to print one of its lines.
MAX_SOURCE_BYTES = 8 << 20

_FH_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]+|\d+)(?: \[[^\]]*\])? \(most recent call first\):")
_FH_FRAME = re.compile(r'^\s+File "(?P<file>[^"]*)", line (?P<line>\d+|\?\?\?) in (?P<func>.+?)\s*$')
_PYSPY_THREAD = re.compile(r'^Thread (0x[0-9a-fA-F]+|\d+) \((?P<state>[^)]*)\)(?:: "(?P<name>[^"]*)")?')
_PYSPY_FRAME = re.compile(r"^\s{4}(?P<func>\S.*?) \((?P<file>[^()]*?):(?P<line>\d+)\)\s*$")
_PYSPY_NATIVE = re.compile(r"^\s{4}(?P<func>\S.*?) \((?P<file>[^():]+)\)\s*$")

_COLLECTIVE_FILES = ("distributed_c10d.py", "c10d_logger.py", "/torch/distributed/")


@dataclass
class Frame:
    file: str
    line: int | None
    func: str

    def short(self) -> str:
        """``train.py:15 in train_step`` (basename: the headline must stay readable)."""
        line = "?" if self.line is None else str(self.line)
        return f"{Path(self.file).name}:{line} in {self.func}"


@dataclass
class ThreadStack:
    ident: str
    name: str | None = None
    current: bool = False  # faulthandler's "Current thread": the thread that wrote the dump
    frames: list[Frame] = field(default_factory=list)  # innermost first


@dataclass
class RankStack:
    rank: int | None
    path: Path | None
    fmt: str  # "faulthandler" | "py-spy"
    threads: list[ThreadStack]

    @property
    def main(self) -> ThreadStack | None:
        return main_thread(self.threads)


def _parse_faulthandler(lines: list[str]) -> list[ThreadStack]:
    """The last dump of the file (only it and the one before it are held: a file of many dumps stays small)."""
    last: list[ThreadStack] = []
    dump: list[ThreadStack] = []
    seen: set[str] = set()
    cur: ThreadStack | None = None
    for line in lines:
        if line.startswith(("Timeout (", "=== ")) or (line.startswith("Fatal Python error") and cur is not None):
            last, dump, seen, cur = (dump or last), [], set(), None
            continue
        m = _FH_THREAD.match(line)
        if m:
            cur = ThreadStack(ident=m.group(1), current=line.startswith("Current"))
            if cur.ident in seen:  # a thread seen again = a new dump appended to the file
                last, dump, seen = (dump or last), [], set()
            seen.add(cur.ident)
            dump.append(cur)
            continue
        m = _FH_FRAME.match(line)
        if m and cur is not None:
            ln = m.group("line")
            cur.frames.append(Frame(m.group("file"), int(ln) if ln.isdigit() else None, m.group("func")))
    return dump or last


def _parse_pyspy(lines: list[str]) -> list[ThreadStack]:
    threads: list[ThreadStack] = []
    cur: ThreadStack | None = None
    for line in lines:
        m = _PYSPY_THREAD.match(line)
        if m:
            cur = ThreadStack(ident=m.group(1), name=m.group("name"))
            threads.append(cur)
            continue
        if cur is None or line.startswith(" " * 8):
            continue  # locals / arguments blocks
        m = _PYSPY_FRAME.match(line)
        if m:
            cur.frames.append(Frame(m.group("file"), int(m.group("line")), m.group("func")))
            continue
        m = _PYSPY_NATIVE.match(line)
        if m:
            cur.frames.append(Frame(m.group("file"), None, m.group("func")))
    return threads


def parse_stack_text(text: str, rank: int | None = None, path: Path | None = None) -> RankStack:
    """Parse a faulthandler or py-spy dump. Raises :class:`TraceFileError` when it is neither."""
    lines = text.splitlines()
    if any(_FH_THREAD.match(line) for line in lines):
        return RankStack(rank, path, "faulthandler", _parse_faulthandler(lines))
    if any(_PYSPY_THREAD.match(line) for line in lines):
        return RankStack(rank, path, "py-spy", _parse_pyspy(lines))
    raise TraceFileError("not a faulthandler or py-spy stack dump", str(path) if path else None)


def read_stack_file(path: str | Path, rank: int | None = None) -> RankStack:
    """Parse the end of a stack file (:data:`MAX_STACK_BYTES`): dumps are appended, the last one wins,
    and a file grown by a runaway ``dump_traceback_later`` is not read whole."""
    p = Path(path)
    data, _cut = read_tail(p, MAX_STACK_BYTES)
    text = data.decode("utf-8", "replace")
    if rank is None:
        m = re.search(r"(\d+)(?:\.\w+)?$", p.name)
        rank = int(m.group(1)) if m else None
    return parse_stack_text(text, rank, p)


def read_stacks_dir(folder: str | Path) -> tuple[dict[int, RankStack], list[str]]:
    """``RUN/stacks/rank{R}.txt`` -> rank -> parsed stack; unreadable files become problems."""
    d = Path(folder)
    out: dict[int, RankStack] = {}
    problems: list[str] = []
    if not d.is_dir():
        return out, problems
    for f in sorted(d.iterdir()):
        if not regular(f) or f.stat().st_size == 0:
            continue  # an empty file = the rank was never asked to dump; a FIFO is never opened
        try:
            rs = read_stack_file(f)
        except TraceFileError as exc:
            problems.append(str(exc))
            continue
        if rs.rank is not None and rs.threads:
            out.setdefault(rs.rank, rs)
    return out, problems


def main_thread(threads: list[ThreadStack]) -> ThreadStack | None:
    """The thread running the training loop.

    py-spy names it ``MainThread``. faulthandler names no thread, but every non-main Python
    thread starts in ``threading.py`` (``_bootstrap``), and the interpreter lists the main thread
    last; so: the last thread whose outermost frame is not in ``threading.py``.
    """
    for t in threads:
        if t.name == "MainThread":
            return t
    candidates = [t for t in threads if t.frames and not t.frames[-1].file.endswith("threading.py")]
    if candidates:
        return candidates[-1]
    return threads[-1] if threads else None


def stuck_frame(thread: ThreadStack) -> Frame | None:
    """Innermost frame in user code (None when every frame is library code)."""
    for f in thread.frames:
        if not is_library(f.file):
            return f
    return None


def collective_call(thread: ThreadStack) -> str | None:
    """Name of the torch.distributed call the thread is blocked in (``all_reduce``), or None."""
    name = None
    for f in thread.frames:
        path = "/" + f.file.replace("\\", "/").lstrip("/")
        if any(m in path for m in _COLLECTIVE_FILES):
            if f.func.split(".")[-1] not in ("wrapper", "_wrap", "wait", "_wait"):
                name = f.func  # keep the outermost public c10d function
        elif name is not None:
            break
    return name


def source_line(frame: Frame) -> str | None:
    """The text of the frame's line when the file is readable here (e.g. ``time.sleep(4)``).

    The path comes from a dump, so it may name anything: only a regular file is opened, and only its
    first :data:`MAX_SOURCE_BYTES` are read (``/dev/zero`` or a FIFO cannot stall or fill memory)."""
    if frame.line is None or frame.line < 1 or not regular(frame.file):
        return None
    try:
        head = read_head(frame.file, MAX_SOURCE_BYTES)
    except TraceFileError:
        return None
    lines = head.split(b"\n", frame.line)
    if len(lines) < frame.line or (len(lines) == frame.line and len(head) >= MAX_SOURCE_BYTES):
        return None
    text = lines[frame.line - 1].decode("utf-8", "replace").strip()
    return text[:200] or None
