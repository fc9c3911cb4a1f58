"""Cross-rank analyses at scale: match, clocks, collectives table and stragglers on synthetic extracts.

No traces are read: each rank is represented by its :func:`traceread.analysis.comm.collectives.comm_events`
extract (what the report keeps per rank), built here for RANKS ranks x COLLS all-reduces, with every
odd 8-rank host's clock 3 ms ahead and one rank 200 µs late to each collective. Prints the time of
each stage and the straggler found (rank 517 by default).

    python bench/bench_cross_rank.py [--ranks 1024] [--colls 300]
"""

from __future__ import annotations

import argparse
import resource
import time

import numpy as np
import polars as pl

from traceread.analysis.comm.clocks import estimate_offsets
from traceread.analysis.comm.collectives import EXTRACT_SCHEMA, match_collectives
from traceread.analysis.comm.perf import collective_table
from traceread.analysis.comm.stragglers import attribute


def extracts(n: int, colls: int, late: int, per_step: int = 100) -> pl.DataFrame:
    rng = np.random.default_rng(0)
    rank = np.repeat(np.arange(n), colls)
    k = np.tile(np.arange(colls), n)
    ts = k * 1000.0 + rng.normal(0.0, 3.0, rank.size) + np.where(rank == late, 200.0, 0.0)
    df = pl.DataFrame({"rank": rank, "k": k, "ts": ts}).with_columns(
        (pl.col("ts").max().over("k") + 100.0).alias("end"))
    skew = pl.Series(np.where((rank // 8) % 2 == 1, 3000.0, 0.0))
    df = df.with_columns(pl.col("ts") + skew, pl.col("end") + skew)
    return df.select(
        "rank", pl.lit("nccl").alias("backend"), pl.lit(7).alias("stream"),
        pl.lit("ncclDevKernel_AllReduce_Sum_bf16").alias("kernel"), pl.lit("allreduce").alias("op"),
        pl.lit(False).alias("p2p"), pl.lit("0").alias("pg"), pl.lit("default_pg").alias("pg_desc"),
        pl.lit(None).alias("pg_ranks"), pl.lit(n).alias("group_size"), pl.lit("BFloat16").alias("dtype"),
        pl.lit(1 << 24).alias("in_nelems"), pl.lit(1 << 24).alias("out_nelems"), (pl.col("k") + 1).alias("seq"),
        pl.lit(None).alias("comms_id"), pl.lit(None).alias("src_rank"), pl.lit(None).alias("dst_rank"),
        "ts", "end", (pl.col("ts") - 20.0).alias("launch_ts"), (pl.col("k") // per_step).alias("step"),
        pl.lit(None).alias("busy_at_start"), pl.lit(None).alias("busy_at_end"),
    ).cast(EXTRACT_SCHEMA)  # type: ignore[arg-type]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--colls", type=int, default=300)
    ap.add_argument("--late", type=int, default=517)
    a = ap.parse_args()
    ev = extracts(a.ranks, a.colls, a.late)
    t = time.perf_counter()
    m = match_collectives(ev)
    t1 = time.perf_counter()
    clock = estimate_offsets(m)
    t2 = time.perf_counter()
    collective_table(m, clock)
    t3 = time.perf_counter()
    res = attribute(m, None, clock)
    t4 = time.perf_counter()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("| ranks | collectives | rows | match s | clocks s | table s | stragglers s | peak RSS MB |")
    print("|---|---|---|---|---|---|---|---|")
    print(f"| {a.ranks} | {a.colls} | {ev.height} | {t1 - t:.2f} | {t2 - t1:.2f} | {t3 - t2:.2f} | "
          f"{t4 - t3:.2f} | {rss:.0f} |")
    print(f"clocks: {clock.method}, {len(set(clock.offsets_us.values()))} offsets, ε = {clock.epsilon_us:.0f} µs")
    print("stragglers:", [(e["rank"], round(e["blame_us_per_step"]), e["cause"]) for e in res.entries])


if __name__ == "__main__":
    main()
