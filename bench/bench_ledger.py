"""Step ledger cost: map side on a real trace, reduce side on many simulated ranks.

Map side: ``rank_segments`` on ``../shared/traces/kineto_tb_resnet50_num_workers_0`` (9,096 GPU
events), after the operator table the roofline already builds; prints the time (median of 5), the
segments and the table size. Host spans: on the host-heavy ``hta_df_index_resolver`` trace (101 k host
events), ``rank_segments`` and, of it, the labelling of host time by covering span
(``label_host_time``, median of 5). Reduce side: ``job_ledger.build`` on RANKS copies of a simulated DDP
rank's segments (the critical path follows late peers through the collectives); prints the time.

    python bench/bench_ledger.py [--ranks 256]
"""

from __future__ import annotations

import argparse
import glob
import statistics
import tempfile
import time
from pathlib import Path

import polars as pl

from traceread.analysis.comm.collectives import match_collectives
from traceread.analysis.compute import roofline as rf
from traceread.analysis.hardware import device_for_meta
from traceread.analysis.ledger import job as job_ledger
from traceread.analysis.ledger import rank as ledger
from traceread.analysis.time import steps
from traceread.assemble.rank_map import summarise_rank
from traceread.engine.jobs import read_rank

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"


def map_side() -> None:
    files = glob.glob(str(SHARED / "kineto_tb_resnet50_num_workers_0" / "*.json*"))
    if not files:
        print("map side: ../shared/traces absent, skipped")
        return
    rt = read_rank(files[0])
    w = steps.device_steps(rt).table
    t = time.perf_counter()
    ops = rf.operator_table(rt, device_for_meta(rt.meta, None).spec)
    t_ops = time.perf_counter() - t
    times = []
    for _ in range(5):
        t = time.perf_counter()
        seg = ledger.rank_segments(rt, w, ops)
        times.append(time.perf_counter() - t)
    print(f"map side: {rt.gpu.height} GPU events, {w.height} steps -> {seg.height} segments in "
          f"{statistics.median(times) * 1e3:.1f} ms (operator table {t_ops * 1e3:.1f} ms), "
          f"{seg.estimated_size() / 1e3:.0f} kB")


def span_side() -> None:
    files = glob.glob(str(SHARED / "hta_df_index_resolver" / "*.json*"))
    if not files:
        print("host spans: ../shared/traces absent, skipped")
        return
    rt = read_rank(files[0])
    w = steps.device_steps(rt).table
    total, label = [], []
    for _ in range(5):
        t = time.perf_counter()
        seg = ledger.rank_segments(rt, w)
        total.append(time.perf_counter() - t)
        bare = seg.drop(list(ledger.SPAN_SCHEMA))
        t = time.perf_counter()
        ledger.label_host_time(bare, rt, {})
        label.append(time.perf_counter() - t)
    print(f"host spans: {rt.host.height} host events, {rt.gpu.height} GPU events -> {seg.height} segments in "
          f"{statistics.median(total) * 1e3:.0f} ms, of which labelling host time by span "
          f"{statistics.median(label) * 1e3:.0f} ms")


def reduce_side(n: int) -> None:
    from traceread.simulate import simulate

    with tempfile.TemporaryDirectory() as tmp:
        simulate("ddp", tmp, ranks=8, steps=3, stragglers=[(5, 2000.0, "gpu")])
        sums = [summarise_rank(read_rank(f, use_cache=False)) for f in sorted(Path(tmp).glob("rank*.pt.trace.json.gz"))]
    segs, extracts = {}, []
    for r in range(n):  # tile the 8 simulated ranks into n (each copy a separate group of 8)
        s = sums[r % 8]
        segs[r] = s.ledger_segments
        extracts.append(s.comm.with_columns(pl.lit(r, pl.Int64).alias("rank"),
                                            (pl.col("pg") + f"-{r // 8}").alias("pg")))
    t = time.perf_counter()
    matched = match_collectives(extracts)
    t_match = time.perf_counter() - t
    t = time.perf_counter()
    led = job_ledger.build(segs, extracts, matched, None)
    dt = time.perf_counter() - t
    rows = sum(s.height for s in segs.values())
    print(f"reduce side: {n} ranks, {rows} segments: job ledger in {dt:.2f} s (matching {t_match:.2f} s); "
          f"critical rank {led.job['critical_rank'] if led.job else None}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=256)
    args = ap.parse_args()
    map_side()
    span_side()
    reduce_side(args.ranks)


if __name__ == "__main__":
    main()
