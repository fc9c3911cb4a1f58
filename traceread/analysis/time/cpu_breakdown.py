"""Where a CPU-only rank's time goes (gloo jobs, CPU training): compute, communication, idle.

Without GPU events the GPU breakdown has nothing to measure, yet CPU jobs still lose time to
collectives. This is the same split on host events (µs), for traces with no GPU activity:

* **comm** — |∪ collective spans| over all threads: ``gloo:*`` user annotations (what the gloo
  backend records around each collective, often on its worker threads), ``c10d::*`` cpu_ops
  (``c10d::allreduce_`` ... issued by the training thread) and ``record_param_comms``.
* **compute** — |∪ cpu_op intervals − comm| over all threads: time some thread ran an operator
  while no collective was in flight. The union of all cpu_ops equals the union of top-level ones
  (nested ops lie inside their parents), so nesting never double counts.
* **window** — first start .. last end of any cpu_op, user_annotation or python_function.
* **idle** — window − |∪ (cpu_ops ∪ comm)|: no operator and no collective (Python overhead outside
  ops, data loading without ops, sleeping). Identity: compute + comm + idle = window.
* **exposed_comm** (extra) — |∪comm − ∪work|, where *work* is each thread's cpu_op time outside
  that thread's own collective spans: collective time no other thread spent computing. With
  ``comm_overlap_pct`` = |∪comm ∩ ∪work| / |∪comm| × 100 it tells overlapped (DDP's async
  all-reduce during backward) from blocking communication. comm = exposed + overlapped.
* **per step** (:func:`cpu_step_split`) — the same compute / comm / exposed comm / idle inside each
  host ``ProfilerStep`` window [start, start + duration): compute + comm + idle = the step's duration,
  so a per-rank table shows per-step numbers beside the step time, never whole-trace totals.
* **threads** — per thread id: ``busy_us`` = |∪ (cpu_ops ∪ comm)| on that thread, ``comm_us`` =
  |∪ comm| on that thread; sorted by busy time.
"""

from __future__ import annotations

from typing import Any

import polars as pl

from traceread import intervals as iv
from traceread.analysis.kinds import comm_op_expr
from traceread.model import RankTrace, as_float

SPAN_CATS = ("cpu_op", "user_annotation", "python_function")


def comm_span_expr() -> pl.Expr:
    """True for host rows that are a CPU collective (gloo / c10d / record_param_comms ...: the one
    definition of communication operators, :mod:`traceread.analysis.kinds`)."""
    return pl.col("cat").is_in(["user_annotation", "cpu_op"]) & comm_op_expr()


def _merge(df: pl.DataFrame) -> iv.Intervals:
    return iv.merge(df["ts"].to_numpy(), df["end"].to_numpy())


def cpu_step_split(rt: RankTrace, windows: list[tuple[float, float]]) -> list[dict[str, float]] | None:
    """compute / comm / exposed comm / idle µs of each host step window ``(start, duration)``, on
    the definitions above (the union intervals are built once, then clipped to each window)."""
    if rt.gpu.height > 0 or not windows:
        return None
    host = rt.host.filter(
        pl.col("cat").is_in(SPAN_CATS) & pl.col("ts").is_not_null() & pl.col("end").is_not_null()
    ).with_columns(comm_span_expr().alias("_comm"))
    comm_rows = host.filter(pl.col("_comm"))
    ops = host.filter(pl.col("cat") == "cpu_op")
    comm = _merge(comm_rows)
    cpu = _merge(ops)
    compute = iv.subtract(cpu, comm)
    busy = iv.union(cpu, comm)
    work = [iv.subtract(_merge(ops.filter(pl.col("tid") == t)), _merge(comm_rows.filter(pl.col("tid") == t)))
            for t in host["tid"].unique().drop_nulls().to_list()]
    exposed = iv.subtract(comm, iv.union(*work)) if work else comm
    out = []
    for start, dur in windows:
        lo, hi = float(start), float(start) + float(dur)
        out.append({"cpu_compute_us": iv.length(iv.clip_sorted(compute, lo, hi)),
                    "cpu_comm_us": iv.length(iv.clip_sorted(comm, lo, hi)),
                    "cpu_exposed_comm_us": iv.length(iv.clip_sorted(exposed, lo, hi)),
                    "cpu_idle_us": (hi - lo) - iv.length(iv.clip_sorted(busy, lo, hi))})
    return out


def cpu_breakdown(rt: RankTrace) -> dict[str, Any] | None:
    """CPU time split of a rank without GPU events; None when it has GPU events or no host ops."""
    if rt.gpu.height > 0:
        return None
    host = rt.host.filter(
        pl.col("cat").is_in(SPAN_CATS) & pl.col("ts").is_not_null() & pl.col("end").is_not_null()
    ).with_columns(comm_span_expr().alias("_comm"))
    if host.height == 0:
        return None
    lo = as_float(host["ts"].min())
    hi = as_float(host["end"].max())
    comm_rows = host.filter(pl.col("_comm"))
    ops = host.filter(pl.col("cat") == "cpu_op")
    comm = _merge(comm_rows)
    cpu = _merge(ops)
    comm_us = iv.length(comm)
    compute_us = iv.length(iv.subtract(cpu, comm))
    busy = iv.length(iv.union(cpu, comm))
    threads: list[dict[str, Any]] = []
    work: list[iv.Intervals] = []
    for tid in host["tid"].unique().drop_nulls().to_list():
        t_comm = _merge(comm_rows.filter(pl.col("tid") == tid))
        t_ops = _merge(ops.filter(pl.col("tid") == tid))
        work.append(iv.subtract(t_ops, t_comm))
        threads.append(
            {
                "tid": int(tid),
                "busy_us": iv.length(iv.union(t_ops, t_comm)),
                "comm_us": iv.length(t_comm),
            }
        )
    threads.sort(key=lambda t: (-t["busy_us"], t["tid"]))
    exposed = iv.length(iv.subtract(comm, iv.union(*work))) if work else comm_us
    return {
        "window_us": hi - lo,
        "compute_us": compute_us,
        "comm_us": comm_us,
        "idle_us": (hi - lo) - busy,
        "exposed_comm_us": exposed,
        "comm_overlap_pct": (comm_us - exposed) / comm_us * 100.0 if comm_us > 0 else None,
        "threads": threads,
    }
