"""Who called a host span: the Python function around a built-in that grew.

With ``with_stack`` the host trace holds Python functions (``python_function``): a data loader that
waits shows as ``<built-in function sleep>`` (or a socket read, a lock) under the user's own function
(``train.py(23): load_batch``). The built-in's name says *how* the host waited; its caller says *where*.

Definition: for each event named ``name`` inside the rank's step windows, its **caller** is the
nearest ancestor whose name is not a built-in (not starting with ``<``) and not a ``ProfilerStep#``
marker; per caller, the events' summed duration ÷ the steps of the window (µs per step).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from traceread.model import RankTrace

MAX_DEPTH = 64


def is_builtin(name: str) -> bool:
    """A Python built-in or method of a C object (``<built-in function sleep>``, ``<method 'recv' …>``)."""
    return name.startswith("<")


def callers(rt: RankTrace, name: str, windows: pl.DataFrame) -> dict[str, float]:
    """Caller name → µs per step of the events named ``name`` (module docstring)."""
    h = rt.host
    if h.height == 0 or windows.height == 0 or "parent" not in h.columns:
        return {}
    names = h["name"].to_list()
    parent = h["parent"].to_list()
    ts = h["ts"].to_numpy()
    dur = h["dur"].to_numpy()
    starts = windows["start"].to_numpy()
    ends = windows["end"].to_numpy()
    out: dict[str, float] = {}
    for i in np.flatnonzero(h["name"].to_numpy() == name) if h.height else []:
        k = int(np.searchsorted(starts, ts[i], side="right")) - 1
        if k < 0 or ts[i] >= ends[k]:
            continue
        j = parent[i]
        caller = None
        for _ in range(MAX_DEPTH):
            if j is None:
                break
            nm = str(names[j])
            if not is_builtin(nm) and not nm.startswith("ProfilerStep#"):
                caller = nm
                break
            j = parent[j]
        if caller is not None:
            out[caller] = out.get(caller, 0.0) + float(dur[i])
    steps = max(1, windows.height)
    return {k: v / steps for k, v in out.items()}


def readable(caller: str) -> str:
    """``slow_train.py(23): load_batch`` → ``load_batch (slow_train.py:23)``; other names as they are."""
    where, sep, func = caller.partition("): ")
    if sep and "(" in where:
        path, _, line = where.rpartition("(")
        return f"{func} ({path.rsplit('/', 1)[-1]}:{line})"
    return caller
