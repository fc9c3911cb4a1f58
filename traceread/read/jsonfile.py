"""Small JSON side files (``run.json``, ``hang.json``, torchelastic error files, rank records): one loader.

A side file only adds to a report, so a missing, half-written or foreign one is never an error:
the loader returns None and, where the caller keeps warnings, says in one line which file and
what is wrong with it.

A run folder is only a folder: a damaged disk, a hand edit or a hostile copy may have put anything
there. Whatever the bytes, reading one is bounded in memory and time: a FIFO or device is refused
without being opened for reading (it would block forever), a file over :data:`MAX_SIDE_JSON_BYTES`
is not read, and JSON nested too deeply for Python's parser (``RecursionError``) is one line like
any other. Numbers no run could hold are the caller's to refuse; :func:`plausible_rank` and
:func:`plausible_world_size` are the common bounds.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

#: A run.json of 16,384 ranks is ~10 MB; a file over this bound is not one traceread collect wrote.
MAX_SIDE_JSON_BYTES = 64 << 20
#: More ranks than any job has run (the largest are ~10^5 GPUs): a bigger rank or world size is damage.
MAX_RANKS = 1 << 22


def read_json_value(path: str | Path, max_bytes: int = MAX_SIDE_JSON_BYTES) -> Any:
    """The JSON value in ``path``; :class:`ValueError` (one line) or :class:`OSError` when it has none.
    Invalid UTF-8 is replaced, not fatal: the rest still counts."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once instead of blocking
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_size > max_bytes:
            raise ValueError(f"{st.st_size:,} bytes: larger than any file traceread collect writes "
                             f"({max_bytes:,} bytes at most)")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(min(st.st_size, max_bytes) + 1)  # read(n) allocates n bytes up front
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise ValueError(f"grew past {max_bytes:,} bytes while being read")
    try:
        return json.loads(data.decode("utf-8", errors="replace"))
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def load_json_object(path: Path, warnings: list[str] | None) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when it cannot be read, is not JSON or is not an object,
    with ``<path>: <what is wrong>`` appended to ``warnings`` (``None``: say nothing, e.g. a rank's
    record that may be mid-write)."""
    try:
        doc = read_json_value(path)
    except (OSError, ValueError) as exc:
        if warnings is not None:
            warnings.append(f"{path}: cannot read ({(str(exc).splitlines() or [type(exc).__name__])[0]})")
        return None
    if not isinstance(doc, dict):
        if warnings is not None:
            warnings.append(f"{path}: not a JSON object")
        return None
    return doc


def plausible_rank(value: Any) -> int | None:
    """``value`` as a rank (an int, or a string of digits as in a JSON key) when it could be one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if 0 <= value < MAX_RANKS else None
    if isinstance(value, str) and value.isdigit() and len(value) <= 8:
        n = int(value)
        return n if n < MAX_RANKS else None
    return None


def plausible_world_size(value: Any) -> int | None:
    """``value`` as a world size when it could be one (1 to :data:`MAX_RANKS`), else None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if 0 < value <= MAX_RANKS else None
