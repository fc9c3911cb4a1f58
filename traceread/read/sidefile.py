"""The small JSON files beside the traces (``run.json``, ``hang.json``, rank files): read them safely.

They come from ``traceread collect`` but a run folder is only a folder: anyone (a damaged disk, a
hand edit, a hostile copy) may have put anything there. Whatever the bytes, reading one gives a
value or a one-line :class:`ValueError`, in bounded memory and time: not a regular file (a FIFO
would block forever), over :data:`MAX_SIDE_JSON_BYTES`, not UTF-8 JSON, or nested too deeply for
Python's parser (``RecursionError``). Numbers that no run could hold are the caller's to refuse;
:func:`plausible_rank` is the common bound.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

#: A run.json of 16,384 ranks is ~10 MB; a file over this bound is not one traceread wrote.
MAX_SIDE_JSON_BYTES = 64 << 20
#: More ranks than any job has run (the largest are ~10^5 GPUs): a bigger rank or world size is damage.
MAX_RANKS = 1 << 22


def read_side_json(path: str | Path, max_bytes: int = MAX_SIDE_JSON_BYTES) -> Any:
    """The JSON value in ``path``; :class:`ValueError` (one line) or :class:`OSError` when it has none."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once instead of blocking
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file")
        if st.st_size > max_bytes:
            raise ValueError(f"{st.st_size:,} bytes: larger than any file traceread collect writes "
                             f"({max_bytes:,} bytes at most)")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise ValueError(f"grew past {max_bytes:,} bytes while being read")
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None
    except ValueError as exc:
        raise ValueError(f"not JSON ({str(exc).splitlines()[0]})") from None


def read_side_object(path: str | Path, max_bytes: int = MAX_SIDE_JSON_BYTES) -> dict[str, Any]:
    """:func:`read_side_json` that must be a JSON object."""
    doc = read_side_json(path, max_bytes)
    if not isinstance(doc, dict):
        raise ValueError(f"a JSON {type(doc).__name__}, not an object")
    return doc


def plausible_rank(value: Any) -> int | None:
    """``value`` as a rank (an int or a string of digits) when it could be one, else None."""
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
