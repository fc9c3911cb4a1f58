"""Hang diagnosis at scale: ``traceread hang`` on N simulated Flight Recorder dumps (not a test).

Writes (once; reused while its truth.json matches the knobs) a simulated Megatron-like MoE job that hung
(:mod:`traceread.simulate.fr_hang`: TP x PP x DP with expert parallelism, 1F1B with micro-batches in
flight, two GPUs that stop mid-step, NCCL recorder pickles of ``--buffer`` entries each, Python frames
included), then runs ``traceread hang DIR --format json`` in a fresh process and reports its wall time,
the CPU seconds of all its processes (the driver and the engine's workers: the number that does not depend
on what else the machine runs; wall time on N idle cores is about CPU / N), the load average meanwhile,
the peak RSS of its whole process tree (sampled from /proc), and whether the culprits and the stuck
groups equal the simulator's truth.

    python bench/bench_hang.py                          # 4,096 ranks x 2,000 entries, 2 workers
    python bench/bench_hang.py --ranks 256 --workers 2
    python bench/bench_hang.py --keep /scratch/hang4096 # keep the dumps (about 2 GB at 4,096 ranks)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO))

from bench_report import measure  # noqa: E402

from traceread.simulate.fr_hang import HangKnobs, simulate_hang  # noqa: E402

LAYOUTS = {  # ranks -> (tp, pp, dp, ep)
    16: (2, 4, 2, 1), 64: (2, 4, 8, 2), 256: (4, 4, 16, 4), 1024: (8, 4, 32, 8), 4096: (8, 8, 64, 8),
}

CHILD = r"""
import json, os, resource, sys, time
t0 = time.perf_counter()
load0 = os.getloadavg()[0]
from traceread.analysis.hang.diagnose import diagnose
folder, workers = sys.argv[1], int(sys.argv[2])
d = diagnose(folder, workers=workers)
t1 = time.perf_counter()
me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
cpu = me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime
truth = json.load(open(folder + "/truth.json"))
e = d.entry
named = sorted((c["rank"], c["why"]) for c in e["culprits"])
want = sorted((c["rank"], c["why"]) for c in truth["culprits"])
got = {(g["pg"], g["seq"]): sorted(g["waiting"]) for g in e["groups"] if g["op"] not in ("send", "recv")}
stuck = {(s["pg"], s["seq"]): s["waiting"] for s in truth["stuck"]}
print({"diagnose_s": round(t1 - t0, 2), "cpu_s": round(cpu, 1), "load": round((load0 + os.getloadavg()[0]) / 2, 1),
       "culprits_equal_truth": named == want, "culprits": named,
       "stuck_groups": len(stuck), "stuck_groups_equal_truth": got == stuck, "dumps": e["dumps"]})
"""


def _write(args: tuple[str, dict, list[int], bool]) -> None:
    out, knobs, ranks, truth = args
    simulate_hang(out, HangKnobs(**knobs), ranks=ranks, write_truth=truth)


def generate(out: Path, k: HangKnobs, workers: int) -> float:
    """Write the dumps with ``workers`` processes (each simulates the step and writes its share)."""
    t0 = time.perf_counter()
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    ranks = list(range(k.world))
    shares = [ranks[i::workers] for i in range(workers)]
    knobs = asdict(k)
    with mp.get_context("spawn").Pool(workers) as pool:
        pool.map(_write, [(str(out), knobs, s, i == 0) for i, s in enumerate(shares)])
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=4096, choices=sorted(LAYOUTS))
    ap.add_argument("--buffer", type=int, default=2000, help="Flight Recorder entries per rank (TORCH_FR_BUFFER_SIZE)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--keep", type=Path, help="folder for the dumps (kept); default: a temporary folder, removed")
    args = ap.parse_args()
    tp, pp, dp, ep = LAYOUTS[args.ranks]
    k = HangKnobs(tp=tp, pp=pp, dp=dp, ep=ep, microbatches=8, layers=2, buffer=args.buffer,
                  faults=[(args.ranks // 3 + 1, 0.45), (args.ranks - 7, 0.2)])
    out = args.keep or Path(os.environ.get("TMPDIR", "/tmp")) / f"traceread-bench-hang-{args.ranks}"
    truth_file = out / "truth.json"
    fresh = not (truth_file.is_file() and json.loads(truth_file.read_text())["knobs"] == json.loads(json.dumps(asdict(k))))
    gen_s = generate(out, k, args.workers) if fresh else 0.0
    size = sum(f.stat().st_size for f in out.iterdir() if f.name.startswith("nccl_trace_rank_"))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    os.environ.update(env)
    r = measure([sys.executable, "-c", CHILD, str(out), str(args.workers)])
    cli = subprocess.run([sys.executable, "-m", "traceread", "hang", str(out), "-j", str(args.workers)],
                         capture_output=True, text=True, env=env)
    print(f"{args.ranks} ranks x {args.buffer} entries ({tp=} {pp=} {dp=} {ep=}), {size / 2**30:.2f} GiB of pickles"
          + (f", written in {gen_s:.0f} s" if fresh else " (reused)"))
    print("| ranks | entries/rank | workers | wall s | CPU s (all processes) | load avg | peak RSS GiB (tree) | "
          "culprits = truth | stuck groups = truth |")
    print("|---|---|---|---|---|---|---|---|---|")
    print(f"| {args.ranks:,} | {args.buffer:,} | {args.workers} | {r['wall_s']} | {r.get('cpu_s')} | {r.get('load')} | "
          f"{r['peak_gib']} | {r.get('culprits_equal_truth')} | {r.get('stuck_groups_equal_truth')} "
          f"({r.get('stuck_groups')}) |")
    print(cli.stdout.splitlines()[0] if cli.stdout else cli.stderr[-500:])
    if r.get("stderr"):
        print(r["stderr"])
    if not args.keep:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
