"""NCCL records at scale: an NCCL Inspector dump and NCCL_DEBUG logs of a big job, read the way the report reads them.

    python bench/bench_nccl.py --ranks 64 --collectives 2000      # 128 000 Inspector records, 64 logs

Writes into a temporary folder (deleted afterwards) and prints wall time and peak RSS of each read.
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path

from traceread.analysis.comm.nccl import parse_nccl_logs, read_inspector


def write_inspector(out: Path, ranks: int, colls: int) -> list[Path]:
    files = []
    for r in range(ranks):
        f = out / f"node{r // 8}-pid{1000 + r}.log"
        with open(f, "w") as fh:
            for sn in range(colls):
                us = 20_000 + (r * 37 + sn * 11) % 500
                rec = {"header": {"id": "0xabc", "rank": r, "n_ranks": ranks, "nnodes": ranks // 8},
                       "metadata": {"inspector_output_format_version": "v4.0", "git_rev": "", "rec_mechanism":
                                    "nccl_profiler_interface", "dump_timestamp_us": 1_750_000_000_000_000 + sn,
                                    "hostname": f"node{r // 8}", "pid": 1000 + r},
                       "coll_perf": {"coll": "AllReduce", "coll_sn": sn, "coll_msg_size_bytes": 1 << 28,
                                     "coll_exec_time_us": us, "coll_timing_source": "kernel_gpu",
                                     "coll_algobw_gbs": 13.4, "coll_busbw_gbs": 26.0}}
                fh.write(json.dumps(rec, separators=(",", ":")) + "\n")
        files.append(f)
    return files


def write_logs(out: Path, ranks: int) -> list[Path]:
    files = []
    for r in range(ranks):
        f = out / f"nccl.node{r // 8}.{1000 + r}.log"
        p = f"node{r // 8}:{1000 + r}:{2000 + r} [{r % 8}] NCCL INFO"
        lines = [f"{p} NCCL version 2.27.5+cuda12.9", f"{p} Using network IB"]
        for c in range(20):  # 20 communicators per rank (world, dp/tp/pp splits, ...)
            lines += [f"{p} ncclCommInitRankConfig comm 0x{c + 1:x}000 rank {r} nranks {ranks} cudaDev {r % 8} nvmlDev "
                      f"{r % 8} busId 1000 commId 0x{c + 100:x} - Init START"]
            lines += [f"{p} Channel {ch:02d}/0 : {r}[{r % 8}] -> {(r + 1) % ranks}[{(r + 1) % 8}] via P2P/CUMEM/read"
                      for ch in range(16)]
            lines += [f"{p} ncclCommInitRankConfig comm 0x{c + 1:x}000 rank {r} nranks {ranks} cudaDev {r % 8} nvmlDev "
                      f"{r % 8} busId 1000 commId 0x{c + 100:x} - Init COMPLETE",
                      f"{p} Init timings - ncclCommInitRankConfig: rank {r} nranks {ranks} total 1.20 (kernels 0.1, alloc 0.0, "
                      "bootstrap 0.5, allgathers 0.1, topo 0.2, graphs 0.1, connections 0.2, rest 0.0)"]
        f.write_text("\n".join(lines) + "\n")
        files.append(f)
    return files


def timed(label: str, fn) -> None:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    fn()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{label}: {time.perf_counter() - t0:.2f} s, peak RSS so far {rss:.0f} MiB")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=64)
    ap.add_argument("--collectives", type=int, default=2000)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        ins = write_inspector(out, a.ranks, a.collectives)
        logs = write_logs(out, a.ranks)
        size = sum(f.stat().st_size for f in ins) / 2**20
        print(f"Inspector: {a.ranks} files, {a.ranks * a.collectives} records, {size:.0f} MiB; "
              f"logs: {len(logs)} files, {sum(f.stat().st_size for f in logs) / 2**20:.1f} MiB")
        timed("read_inspector", lambda: read_inspector(ins))
        timed("parse_nccl_logs", lambda: parse_nccl_logs(logs))


if __name__ == "__main__":
    main()
