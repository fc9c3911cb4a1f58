"""Load a pickle as plain data only: the one way traceread reads pickles it did not write.

A pickle is a program: ``find_class`` lets it import any callable and ``REDUCE`` calls it. The
unpickler here refuses every class and function lookup, so only the opcodes that build dicts, lists,
tuples, sets, strings, bytes, numbers, booleans and None work. That is all PyTorch's Flight Recorder
dumps and memory snapshots (``torch.cuda.memory._dump_snapshot``) contain; anything else is refused
with one line, never run.

Memory is bounded before the unpickler runs: the file size is capped, and the memory the load could
take is planned from the bytes (:func:`pickle_budget`), so a small file made of nothing but container
opcodes (a "billion laughs") is refused instead of filling memory. Every failure is one
:class:`TraceFileError` line naming the file.
"""

from __future__ import annotations

import gc
import io
import pickle
from pathlib import Path
from typing import Any

from traceread.errors import TraceFileError

#: Largest pickle read (bytes on disk); a memory snapshot with a long history is tens of MB.
MAX_PICKLE_BYTES = 2 << 30
#: Planned memory of one unpickled object above which it is refused (see :func:`pickle_budget`).
MAX_PICKLE_MEMORY = 1 << 30


class NoClassUnpickler(pickle.Unpickler):
    """Builds only plain containers and scalars; any class or function lookup is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refusing to load {module[:80]}.{name[:80]}: only plain data is read")


def pickle_budget(data: bytes) -> int:
    """An upper bound, in bytes, of the memory unpickling ``data`` can take.

    Every opcode that makes a container is one byte (``}`` ``]`` ``)`` ``(`` and the tuple/frozenset
    ones), so counting those bytes (string payloads included: an over-estimate) bounds the number of
    containers; each costs at most ~120 bytes plus its references. Strings and numbers cost at most a
    few times their bytes. A hostile file of container opcodes plans tens of times its size and is
    refused before the unpickler runs; a real dump plans about ten times its size.
    """
    containers = sum(data.count(b) for b in (b"}", b"]", b")", b"(", b"\x85", b"\x86", b"\x87", b"\x8f"))
    return 4 * len(data) + 120 * containers


def loads_plain(data: bytes, what: str, path: str, max_memory: int = MAX_PICKLE_MEMORY) -> Any:
    """Plain data from pickle bytes (``what`` names the kind of file, ``path`` the file, in errors)."""
    # below this size even a file of nothing but container opcodes fits the bound: no need to count
    plan = pickle_budget(data) if len(data) * 124 > max_memory else 0
    if plan > max_memory:
        raise TraceFileError(f"pickle would need up to {plan >> 20:,} MiB to load (bound {max_memory >> 20:,} MiB); "
                             f"not a {what}", path)
    was = gc.isenabled()
    gc.disable()  # a dump is a tree of fresh containers: the cycle collector only slows the load 3x
    try:
        return NoClassUnpickler(io.BufferedReader(io.BytesIO(data), 1 << 20)).load()
    except pickle.UnpicklingError as exc:
        raise TraceFileError(f"unsafe or corrupt {what} pickle: {str(exc)[:200]}", path) from None
    except RecursionError:
        raise TraceFileError("pickle nested too deeply", path) from None
    except MemoryError:
        raise TraceFileError("pickle too large to load", path) from None
    except Exception as exc:  # truncated/garbage bytes raise many types (EOFError, ValueError, KeyError...)
        raise TraceFileError(f"not a {what} pickle ({type(exc).__name__})", path) from None
    finally:
        if was:
            gc.enable()


def load_plain(path: str | Path, what: str, max_bytes: int = MAX_PICKLE_BYTES,
               max_memory: int = 4 * MAX_PICKLE_MEMORY) -> Any:
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
    return loads_plain(data, what, str(p), max_memory)
