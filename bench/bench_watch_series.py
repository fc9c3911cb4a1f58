"""The watched run's step series at scale: RANKS ``rank{R}.steps`` files of STEPS lines each, read
into the job's series (:func:`traceread.read.watch.read_series`) and downsampled for the document.

Prints the bytes read, the time, the throughput and the peak RSS of this process (the series keeps
two int64 per step number for the job and 200 bucket means per rank; one rank's file is held at a
time). A 16-hour job at 1 step/s is ~58,000 steps per rank.

    python bench/bench_watch_series.py [--ranks 256] [--steps 100000] [--dir /tmp/tr-watch-bench]
"""

from __future__ import annotations

import argparse
import resource
import shutil
import time
from pathlib import Path

import numpy as np

from traceread.compare.captures import downsample
from traceread.read.watch import read_series


def write(folder: Path, ranks: int, steps: int) -> int:
    (folder / "progress").mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    base = 1_795_000_000_000_000_000 + np.cumsum(rng.normal(15e6, 3e5, steps).astype(np.int64))
    total = 0
    for r in range(ranks):
        ends = base + r * 1000
        text = "".join(f"{s} {t}\n" for s, t in zip(range(1, steps + 1), ends.tolist()))
        (folder / "progress" / f"rank{r}.steps").write_text(text)
        total += len(text)
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/tr-watch-bench"))
    args = ap.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    size = write(args.dir, args.ranks, args.steps)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    series = read_series(args.dir, print)
    doc = downsample(series) if series is not None else None
    dt = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(f"{args.ranks} ranks x {args.steps:,} steps: {size / 1e6:.0f} MB read in {dt:.2f} s "
          f"({size / 1e6 / dt:.0f} MB/s); peak RSS {peak / 1024:.0f} MiB (before reading {before / 1024:.0f} MiB); "
          f"series {len(series.steps) if series else 0:,} steps, {len((doc or {}).get('job_median_us') or []):,} points")
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
