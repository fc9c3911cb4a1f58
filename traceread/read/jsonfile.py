"""Small JSON side files (``run.json``, ``hang.json``, torchelastic error files, rank records): one loader.

A side file only adds to a report, so a missing, half-written or foreign one is never an error:
the loader returns None and, where the caller keeps warnings, says in one line which file and
what is wrong with it.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

#: A side file larger than this is not read (a run.json of 16,000 ranks is ~10 MB).
MAX_SIDE_BYTES = 64 << 20


def _read_regular(path: Path) -> bytes:
    """The bytes of a regular file of at most MAX_SIDE_BYTES; OSError/ValueError otherwise. A FIFO or a
    device named like a side file is never opened for reading (``open`` on a FIFO blocks forever)."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise ValueError("not a regular file")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError("not a regular file")
        chunks: list[bytes] = []
        left = MAX_SIDE_BYTES + 1
        while left > 0 and (data := os.read(fd, min(left, 1 << 20))):
            chunks.append(data)
            left -= len(data)
    finally:
        os.close(fd)
    out = b"".join(chunks)
    if len(out) > MAX_SIDE_BYTES:
        raise ValueError(f"larger than {MAX_SIDE_BYTES >> 20} MiB")
    return out


def load_json_object(path: Path, warnings: list[str] | None) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when it cannot be read, is not JSON or is not an object,
    with ``<path>: <what is wrong>`` appended to ``warnings`` (``None``: say nothing, e.g. a rank's
    record that may be mid-write). Invalid UTF-8 is replaced, not fatal: the rest still counts.
    Only regular files up to MAX_SIDE_BYTES are read; JSON nested too deeply is "not JSON"."""
    try:
        doc = json.loads(_read_regular(path).decode("utf-8", errors="replace"))
    except RecursionError:
        if warnings is not None:
            warnings.append(f"{path}: cannot read (JSON nested too deeply)")
        return None
    except (OSError, ValueError) as exc:
        if warnings is not None:
            warnings.append(f"{path}: cannot read ({(str(exc).splitlines() or [type(exc).__name__])[0]})")
        return None
    if not isinstance(doc, dict):
        if warnings is not None:
            warnings.append(f"{path}: not a JSON object")
        return None
    return doc
