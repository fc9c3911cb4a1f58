"""Reading hang evidence from folders nobody vetted: regular files only, in bounded memory and time.

A run folder can hold anything: a FIFO named ``errors/rank2.json`` (``open`` would block forever), a
1 GiB ``launcher.log``, JSON nested a million levels deep, a symlink loop. Every reader of the hang
diagnosis goes through these helpers:

* :func:`regular` — the path is a regular file (after following a symlink); FIFOs, sockets and
  devices are never opened. The file is opened with ``O_NONBLOCK`` and checked again on the open
  descriptor, so a FIFO swapped in between the two checks does not block either.
* :func:`read_head`, :func:`read_bounded`, :func:`read_tail` — at most ``limit`` bytes.
* :func:`decode_json` — msgspec, with the nesting bound turned into a one-line problem (side files such as
  ``hang.json`` go through :func:`traceread.read.jsonfile.load_json_object`, which has the same bounds).
* :func:`walk` — every regular file under a folder, symlinked folders not followed (no loops), at
  most :data:`MAX_WALK_FILES` files and :data:`MAX_WALK_DEPTH` levels.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec

from traceread.errors import TraceFileError

#: A folder walk stops after this many files (a run folder of 16,000 ranks holds ~10 files per rank).
MAX_WALK_FILES = 400_000
MAX_WALK_DEPTH = 12


def regular(path: str | Path) -> bool:
    """Whether ``path`` is a regular file (symlinks followed; FIFOs, devices and folders are not)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def _open(path: str | Path) -> int:
    """A read descriptor on a regular file; :class:`TraceFileError` for anything else."""
    p = str(path)
    if not regular(p):
        raise TraceFileError("not a regular file", p)
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise TraceFileError(f"cannot open: {exc.strerror or exc}", p) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped for a FIFO between the checks
            raise TraceFileError("not a regular file", p)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read_fd(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    left = limit
    while left > 0:
        b = os.read(fd, min(left, 1 << 20))
        if not b:
            break
        chunks.append(b)
        left -= len(b)
    return b"".join(chunks)


def size_of(path: str | Path) -> int | None:
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def read_head(path: str | Path, limit: int) -> bytes:
    """The first ``limit`` bytes (fewer when the file is shorter)."""
    fd = _open(path)
    try:
        return _read_fd(fd, limit)
    except OSError as exc:
        raise TraceFileError(f"cannot read: {exc.strerror or exc}", str(path)) from None
    finally:
        os.close(fd)


def read_bounded(path: str | Path, limit: int, what: str = "file") -> bytes:
    """The whole file, refused with one line when it is larger than ``limit`` bytes."""
    fd = _open(path)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise TraceFileError(f"{what} of {size:,} bytes is over the {limit:,}-byte bound; not read", str(path))
        data = _read_fd(fd, limit + 1)
    except OSError as exc:
        raise TraceFileError(f"cannot read: {exc.strerror or exc}", str(path)) from None
    finally:
        os.close(fd)
    if len(data) > limit:  # grew while being read
        raise TraceFileError(f"{what} is over the {limit:,}-byte bound; not read", str(path))
    return data


def read_tail(path: str | Path, limit: int) -> tuple[bytes, bool]:
    """The last ``limit`` bytes, and whether the file was longer (the first line is then partial
    and dropped)."""
    fd = _open(path)
    try:
        size = os.fstat(fd).st_size
        cut = size > limit
        if cut:
            os.lseek(fd, size - limit, os.SEEK_SET)
        data = _read_fd(fd, limit)
    except OSError as exc:
        raise TraceFileError(f"cannot read: {exc.strerror or exc}", str(path)) from None
    finally:
        os.close(fd)
    if cut:
        nl = data.find(b"\n")
        data = data[nl + 1:] if nl >= 0 else b""
    return data, cut


def decode_json(data: bytes, path: str | Path) -> Any:
    """Parse JSON bytes; malformed, too deeply nested or non-standard JSON is one line naming the file."""
    try:
        return msgspec.json.decode(data)
    except RecursionError:
        raise TraceFileError("JSON nested too deeply; not read", str(path)) from None
    except msgspec.DecodeError as exc:
        raise TraceFileError(f"not valid JSON ({str(exc).splitlines()[0][:120]})", str(path)) from None


def walk(root: str | Path, max_files: int = MAX_WALK_FILES, max_depth: int = MAX_WALK_DEPTH) -> Iterator[Path]:
    """Regular files under ``root`` (itself when it is a file), sorted per folder, hidden folders and
    symlinked folders skipped, and so is a collected run's ``attempts/`` (torchrun restarts: each attempt's
    dumps are another process's, never merged with attempt 0's), ``captures`` folders and the sub-folders
    of a capture (it holds ``trigger.json``): dumps taken while the job ran are no hang evidence."""
    r = Path(root)
    if regular(r):
        yield r
        return
    if not r.is_dir():
        return
    count = 0
    base = len(r.parts)

    def onerror(_exc: OSError) -> None:
        return None

    run_folder = (r / "run.json").is_file()
    for folder, dirs, files in os.walk(r, followlinks=False, onerror=onerror):
        depth = len(Path(folder).parts) - base
        dirs[:] = [] if "trigger.json" in files else sorted(  # a capture folder: its dumps are no hang evidence
            d for d in dirs if not d.startswith(".") and depth < max_depth and d != "captures"
            and not (run_folder and depth == 0 and d == "attempts"))  # other attempts: read on their own
        for name in sorted(files):
            f = Path(folder) / name
            if not regular(f):
                continue
            yield f
            count += 1
            if count >= max_files:
                return
