"""Load a pickle as plain data only: the one way traceread reads pickles it did not write.

A pickle is a program: ``find_class`` lets it import any callable and ``REDUCE`` calls it. The
unpickler here refuses every class and function lookup, so only the opcodes that build dicts, lists,
tuples, sets, strings, bytes, numbers, booleans and None work. That is all PyTorch's Flight Recorder
dumps and memory snapshots (``torch.cuda.memory._dump_snapshot``) contain; anything else is refused
with one line, never run. The size is capped before reading so a huge file cannot exhaust memory.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

from traceread.errors import TraceFileError

#: Largest pickle read (bytes on disk); a memory snapshot with a long history is tens of MB.
MAX_PICKLE_BYTES = 2 << 30


class NoClassUnpickler(pickle.Unpickler):
    """Builds only plain containers and scalars; any class or function lookup is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: only plain data is read")


def loads_plain(data: bytes) -> Any:
    """Plain data from pickle bytes; raises :class:`pickle.UnpicklingError` for a class or function
    and other exceptions for truncated or garbage bytes."""
    return NoClassUnpickler(io.BytesIO(data)).load()


def load_plain(path: str | Path, what: str, max_bytes: int = MAX_PICKLE_BYTES) -> Any:
    """Plain data from the pickle file ``path``; every failure is one :class:`TraceFileError` line
    (``what`` names the kind of file in it, e.g. "memory snapshot")."""
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > max_bytes:
            raise TraceFileError(f"{what} is {size / 2**30:.1f} GiB, more than the {max_bytes / 2**30:.0f} GiB read",
                                 str(p))
        data = p.read_bytes()
    except OSError as exc:
        raise TraceFileError(f"cannot read {what}: {exc.strerror or exc}", str(p)) from None
    try:
        return loads_plain(data)
    except pickle.UnpicklingError as exc:
        raise TraceFileError(f"unsafe or corrupt {what} pickle: {exc}", str(p)) from None
    except Exception as exc:  # truncated/garbage bytes raise many types
        raise TraceFileError(f"not a {what} pickle ({type(exc).__name__})", str(p)) from None
