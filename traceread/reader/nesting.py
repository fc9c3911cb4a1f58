"""Call-tree nesting of host events per (pid, tid): ``depth``, ``parent`` and the enclosing cpu_op.

A single stack sweep over events sorted by (thread, start, longest first) is linear in the number
of events. The rule for "inside": an event starting before the open event on top of the stack
ends is its child. Starting-time containment (rather than requiring the child's end to be inside
too) keeps trees intact when integer-µs traces round a child's end one µs past its parent.

Only ``cpu_op``, ``user_annotation`` and ``python_function`` events open a level. Other host
events (``cuda_runtime`` launches, syncs, ...) are leaves: they get the innermost enclosing event
as parent and its depth + 1, so a kernel launch can be traced back to the op that issued it.
"""

from __future__ import annotations

import numpy as np
import polars as pl

NESTING_CATEGORIES = ("cpu_op", "user_annotation", "python_function")


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

    depth = np.zeros(n, dtype=np.int64)
    parent = np.full(n, -1, dtype=np.int64)
    _sweep(
        order.tolist(),
        thread.tolist(),
        ts.tolist(),
        (ts + dur).tolist(),
        is_nest.tolist(),
        is_op.tolist(),
        depth,
        parent,
        op_anc,
    )
    host = host.with_columns(
        pl.Series("depth", depth, dtype=pl.Int64),
        pl.Series("parent", parent, dtype=pl.Int64).replace(-1, None),
    )
    return host, op_anc


def _sweep(
    order: list[int],
    thread: list[int],
    start: list[float],
    end: list[float],
    is_nest: list[bool],
    is_op: list[bool],
    depth_out: np.ndarray,
    parent_out: np.ndarray,
    op_out: np.ndarray,
) -> None:
    """The stack sweep; ``order`` groups rows by thread and sorts them by start, parents first."""
    n = len(order)
    depth = [0] * n
    parent = [-1] * n
    opanc = [-1] * n
    stack: list[tuple[float, int, int]] = []  # (end, row, innermost cpu_op at or above row)
    push = stack.append
    pop = stack.pop
    cur = None
    for i in order:
        th = thread[i]
        if th != cur:
            cur = th
            stack.clear()
        s = start[i]
        while stack and stack[-1][0] <= s:
            pop()
        if stack:
            top = stack[-1]
            parent[i] = top[1]
            depth[i] = len(stack)
            up = top[2]
        else:
            up = -1
        if is_nest[i]:
            mine = i if is_op[i] else up
            push((end[i], i, mine))
            opanc[i] = mine
        else:
            opanc[i] = up
    depth_out[:] = depth
    parent_out[:] = parent
    op_out[:] = opanc
