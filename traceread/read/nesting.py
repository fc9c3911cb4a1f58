"""Call-tree nesting of host events per (pid, tid): ``depth``, ``parent`` and the enclosing cpu_op.

A single stack sweep over events sorted by (thread, start, longest first) is linear in the number
of events. The rule for "inside": an event starting before the open event on top of the stack
ends (by more than :data:`TOUCH_US`: float rounding of ``ts + dur``) is its child. Starting-time
containment (rather than requiring the child's end to be inside too) keeps trees intact when
integer-µs traces round a child's end one µs past its parent.

Only ``cpu_op``, ``user_annotation`` and ``python_function`` events open a level. Other host
events (``cuda_runtime`` launches, syncs, ...) are leaves: they get the innermost enclosing event
as parent and its depth + 1, so a kernel launch can be traced back to the op that issued it.
"""

from __future__ import annotations

from array import array

import numpy as np
import polars as pl

NESTING_CATEGORIES = ("cpu_op", "user_annotation", "python_function")
#: An event starting within this of the open event's end is its next sibling, not its child: ``ts +
#: dur`` in float µs lands a few 1e-7 µs past a neighbour that starts exactly where it ends (1 ns).
TOUCH_US = 1e-3


def nest(host: pl.DataFrame) -> tuple[pl.DataFrame, np.ndarray]:
    """Fill ``depth``/``parent`` of a host table; also return, for every row, the innermost cpu_op
    that encloses it (itself when it is a cpu_op), -1 where none."""
    n = host.height
    op_anc = np.full(n, -1, dtype=np.int64)
    if n == 0:
        return host, op_anc
    thread = (
        host.select(
            pl.struct(pl.col("pid").fill_null(-(2**62)), pl.col("tid").fill_null(-(2**62)))
            .rank("dense")
            .cast(pl.Int64)
        )
        .to_series()
        .to_numpy()
    )
    ts = host["ts"].to_numpy()
    dur = host["dur"].to_numpy()
    cat = host["cat"]
    is_nest = cat.is_in(NESTING_CATEGORIES).fill_null(False).to_numpy()
    is_op = (cat == "cpu_op").fill_null(False).to_numpy()
    # Parents first at equal start: longer first, then nesting events before leaves, then row.
    order = np.lexsort((np.arange(n), ~is_nest, -dur, ts, thread))

    # The sweep reads and writes 8-byte arrays (``array``), not lists: a list holds a 32-byte
    # Python object per float and per large int, ~5x the memory on a rank of millions of events.
    depth_o, parent_o, op_o = _sweep(
        array("q", thread[order].tobytes()),
        array("d", ts[order].tobytes()),
        array("d", (ts + dur)[order].tobytes()),
        array("b", is_nest[order].tobytes()),
        array("b", is_op[order].tobytes()),
    )
    # Results come in sweep order, parents and ops as sweep positions: map back to rows.
    order_ext = np.append(order, -1)  # position -1 -> row -1
    depth = np.empty(n, dtype=np.int64)
    parent = np.empty(n, dtype=np.int64)
    depth[order] = np.frombuffer(depth_o, dtype=np.int64)
    parent[order] = order_ext[np.frombuffer(parent_o, dtype=np.int64)]
    op_anc[order] = order_ext[np.frombuffer(op_o, dtype=np.int64)]
    host = host.with_columns(
        pl.Series("depth", depth, dtype=pl.Int64),
        pl.Series("parent", parent, dtype=pl.Int64).replace(-1, None),
    )
    return host, op_anc


def _sweep(
    thread: array,
    start: array,
    end: array,
    is_nest: array,
    is_op: array,
) -> tuple[array, array, array]:
    """The stack sweep over events already in sweep order (grouped by thread, sorted by start,
    parents first). Returns, per position: depth, the parent's position and the innermost
    cpu_op's position at or above it (-1: none).

    The stack holds positions only: the open event on top is the parent, the depth is the
    parent's depth + 1 (the stack below the parent is exactly the parent's ancestors).
    """
    n = len(start)
    depth = array("q", bytes(8 * n))
    parent = array("q", b"\xff" * (8 * n))  # -1
    opanc = array("q", b"\xff" * (8 * n))
    stack: list[int] = []
    push, pop = stack.append, stack.pop
    cur = None
    k = 0
    for th, s, nst in zip(thread, start, is_nest):
        if th != cur:
            cur = th
            stack.clear()
        while stack and end[stack[-1]] <= s + TOUCH_US:
            pop()
        if stack:
            top = stack[-1]
            parent[k] = top
            depth[k] = depth[top] + 1
            up = opanc[top]
        else:
            up = -1
        if nst:
            if is_op[k]:
                up = k
            push(k)
        opanc[k] = up
        k += 1
    return depth, parent, opanc
