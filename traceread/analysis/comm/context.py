"""Where each communication event was launched from: forward, backward or after backward, and by
which framework or engine (the map side of the parallel layout's evidence).

A process group's role shows in *when* its collectives run relative to the model's forward and
backward, and in *who* issues them, better than in how its calls spread over the step (a DDP
buffer broadcast at the start of forward makes a gradient all-reduce group look spread over the
whole step). Per event, from the host table alone:

* ``phase`` — ``bwd`` when the launch is inside the autograd engine: an ancestor is an
  ``autograd::engine::evaluate_function:*`` node, or the launching thread is a backward thread
  (a thread that runs ``evaluate_function`` nodes and holds no ``ProfilerStep``: the engine's
  device thread, where DDP/FSDP hooks and TP backward collectives run); ``post`` when it is after
  the last backward node of its step (optimizer, ``finish_grad_sync``); ``fwd`` otherwise in a step
  that has a backward; ``nobwd`` in a step without any backward node (inference, serving, or a
  backward the profiler did not record); null when the host table cannot say.
* ``launcher`` — ``ddp`` when an ancestor is DistributedDataParallel's (``DistributedDataParallel``,
  ``reducer::``, ``DDP::``), ``fsdp`` for FullyShardedDataParallel's (``FullyShardedDataParallel``,
  ``FSDP::``, ``FSDP.``), else the engine-level collective operator that issued it
  (``vllm::all_reduce``, ``sglang::…``, ``<ns>::fused_allreduce_rmsnorm``: any communication
  operator of :mod:`traceread.analysis.kinds` outside torch's own ``c10d`` / ``_c10d_functional`` /
  ``record_param_comms`` / ``nccl:`` / ``gloo:`` / ``symm_mem`` layer), else null.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import polars as pl

from traceread.analysis.kinds import is_comm_op_name

EVAL_PREFIX = "autograd::engine::evaluate_function:"
_STEP_RE = re.compile(r"^ProfilerStep#\d+$")
_DDP_RE = re.compile(r"DistributedDataParallel|^reducer::|^DDP::|^ddp\.", re.IGNORECASE)
_FSDP_RE = re.compile(r"FullyShardedDataParallel|^FSDP::|^FSDP\.|^fsdp::", re.IGNORECASE)
#: torch's own communication layer: operators below the framework or engine that called them.
_TORCH_COMM_RE = re.compile(r"^(?:record_param_comms$|nccl:|gloo:|ucc:|mpi:|c10d::|_?c10d_functional::|symm_mem::)",
                            re.IGNORECASE)
MAX_HOPS = 64


def _launchers(names: list[str | None], parents: np.ndarray, rows: Sequence[int | None]) -> list[str | None]:
    """Per start row, the nearest ancestor naming DDP / FSDP, else the outermost engine collective op."""
    n = len(names)
    out: list[str | None] = []
    memo: dict[int, str | None] = {}
    for start in rows:
        if start is None or not 0 <= start < n:
            out.append(None)
            continue
        if start in memo:
            out.append(memo[start])
            continue
        row, hops, found, engine = start, 0, None, None
        while 0 <= row < n and hops < MAX_HOPS:
            nm = names[row] or ""
            if _DDP_RE.search(nm):
                found = "ddp"
                break
            if _FSDP_RE.search(nm):
                found = "fsdp"
                break
            if not _TORCH_COMM_RE.search(nm) and is_comm_op_name(nm):
                engine = nm  # keep climbing: the outermost engine op names the engine's API
            row = int(parents[row])
            hops += 1
        memo[start] = found or engine
        out.append(found or engine)
    return out


def _under_eval(names: list[str | None], parents: np.ndarray, rows: Sequence[int | None]) -> list[bool]:
    n = len(names)
    out = []
    for start in rows:
        row, hops, hit = start if start is not None else -1, 0, False
        while 0 <= row < n and hops < MAX_HOPS:
            if (names[row] or "").startswith(EVAL_PREFIX):
                hit = True
                break
            row = int(parents[row])
            hops += 1
        out.append(hit)
    return out


def event_context(host: pl.DataFrame, rows: Sequence[int | None], ts: Sequence[float],
                  steps: pl.DataFrame | None = None) -> tuple[list[str | None], list[str | None]]:
    """``(phase, launcher)`` of each communication event (see the module docstring).

    ``rows``: the host row that launched each event (the runtime launch call for a kernel, the
    ``c10d::*`` op for a gloo span; None when unknown); ``ts``: its launch time (host clock);
    ``steps``: the host ``ProfilerStep`` windows (``RankTrace.steps``: step, ts, end).
    """
    k = len(rows)
    if host.height == 0 or k == 0:
        return [None] * k, [None] * k
    names = host["name"].to_list()
    parents = host["parent"].fill_null(-1).to_numpy().astype(np.int64)
    tids = host["tid"].fill_null(-1).to_numpy()
    name_s = host["name"].fill_null("")
    is_eval = name_s.str.starts_with(EVAL_PREFIX).to_numpy()
    launcher = _launchers(names, parents, rows)
    if not is_eval.any():  # no backward recorded anywhere: inference, serving, or forward-only windows
        return [("nobwd" if t == t else None) for t in ts], launcher
    step_tids = set(host.filter(name_s.str.contains(_STEP_RE.pattern))["tid"].drop_nulls().to_list())
    eval_tids = set(tids[is_eval].tolist())
    if not step_tids:  # no ProfilerStep: the main thread is the one with the most top-level operators
        top = host.filter(pl.col("parent").is_null() & (pl.col("cat") == "cpu_op") & ~name_s.str.starts_with(EVAL_PREFIX))
        counts = top.group_by("tid").len().sort("len", descending=True)
        step_tids = {counts["tid"][0]} if counts.height else set()
    bwd_tids = eval_tids - step_tids
    ev_ts = host["ts"].to_numpy()[is_eval]
    ev_end = host["end"].to_numpy()[is_eval]
    under = _under_eval(names, parents, rows)
    # per step window: the last end of a backward node (a step without one is forward-only)
    if steps is not None and steps.height:
        st = steps.sort("ts")
        s0, s1 = st["ts"].to_numpy().astype(np.float64), st["end"].to_numpy().astype(np.float64)
    else:
        s0, s1 = np.array([-np.inf]), np.array([np.inf])
    last_bwd = np.full(s0.size, -np.inf)
    idx = np.clip(np.searchsorted(s0, ev_ts, side="right") - 1, 0, s0.size - 1)
    inside = (ev_ts >= s0[idx]) & (ev_ts < s1[idx])
    if inside.any():
        np.maximum.at(last_bwd, idx[inside], ev_end[inside])
    phase: list[str | None] = []
    for row, t, in_eval in zip(rows, ts, under):
        tid = tids[row] if row is not None and 0 <= row < host.height else None
        if in_eval or (tid is not None and tid in bwd_tids):
            phase.append("bwd")
            continue
        if t is None or t != t:  # NaN: launched before the profiler started
            phase.append(None)
            continue
        i = int(np.clip(np.searchsorted(s0, t, side="right") - 1, 0, s0.size - 1))
        if not s0[i] <= t < s1[i]:
            phase.append(None)
        elif last_bwd[i] == -np.inf:
            phase.append("nobwd")
        elif t > last_bwd[i]:
            phase.append("post")
        else:
            phase.append("fwd")
    return phase, launcher
