"""Parallel layout at scale: infer_layout on synthetic per-rank extracts of a TP × DP job.

No traces are read: each rank contributes its compact ``pg_config`` (world, its TP group, its DP
group, torch's generic "undefined" descriptions) and a ``comm_events``-shaped extract with
TP_CALLS per-layer all-reduces spread over the step's compute and DP_CALLS gradient all-reduces in
the second half, for STEPS steps. Prints the time, the degrees found and the JSON size.

    python bench/bench_layout.py [--ranks 1024] [--tp 8]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import polars as pl

from traceread.analysis.comm.collectives import EXTRACT_SCHEMA
from traceread.analysis.comm.layout import compact_groups, infer_layout

STEPS, TP_CALLS, DP_CALLS, STEP_US, COMPUTE_US = 5, 64, 8, 1000.0, 900.0


def extract(world: int, tp: int) -> pl.DataFrame:
    per_step = TP_CALLS + DP_CALLS
    rank = np.repeat(np.arange(world), STEPS * per_step)
    i = np.tile(np.arange(per_step), world * STEPS)
    step = np.tile(np.repeat(np.arange(STEPS), per_step), world)
    is_tp = i < TP_CALLS
    j = np.where(is_tp, i, i - TP_CALLS)
    offset = np.where(is_tp, 5.0 + j * 14.0, 500.0 + j * 50.0)
    busy = np.where(is_tp, 5.0 + j * 12.6, 450.0 + j * 40.0)
    pg = np.where(is_tp, 1 + rank // tp, 1 + world // tp + rank % tp).astype(str)
    df = pl.DataFrame({"rank": rank, "step": step, "ts": step * STEP_US + offset, "busy_at_start": busy, "pg": pg})
    return df.with_columns(
        (pl.col("ts") + 3.0).alias("end"), pl.col("busy_at_start").alias("busy_at_end"),
        pl.lit("allreduce").alias("op"), pl.lit(False).alias("p2p"), pl.lit("undefined").alias("pg_desc"),
    ).select([(pl.col(c) if c in df.columns or c in ("end", "busy_at_end", "op", "p2p", "pg_desc")
               else pl.lit(None)).cast(t).alias(c) for c, t in EXTRACT_SCHEMA.items()])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--tp", type=int, default=8)
    a = ap.parse_args()
    w, tp = a.ranks, a.tp
    ev = extract(w, tp)
    groups = []
    for r in range(w):
        t, d = r // tp, r % tp
        groups += compact_groups([
            {"pg_name": "0", "pg_desc": "default_pg", "pg_size": w, "ranks": list(range(w))},
            {"pg_name": str(1 + t), "pg_desc": "undefined", "pg_size": tp, "ranks": list(range(t * tp, (t + 1) * tp))},
            {"pg_name": str(1 + w // tp + d), "pg_desc": "undefined", "pg_size": w // tp, "ranks": list(range(d, w, tp))},
        ])
    windows = {r: pl.DataFrame({"step": list(range(STEPS)), "start": [k * STEP_US for k in range(STEPS)],
                                "end": [(k + 1) * STEP_US for k in range(STEPS)]}) for r in range(w)}
    compute = {(r, k): COMPUTE_US for r in range(w) for k in range(STEPS)}
    t0 = time.perf_counter()
    lay = infer_layout(ev, groups, windows=windows, devices={r: r % 8 for r in range(w)}, world_size=w, compute=compute)
    dt = time.perf_counter() - t0
    print(f"ranks {w}, collectives {ev.height}: infer_layout {dt:.2f} s; degrees {lay.degrees}; "
          f"{len(lay.groups)} groups, JSON {len(json.dumps(lay.to_json())) / 1e3:.0f} kB")


if __name__ == "__main__":
    main()
