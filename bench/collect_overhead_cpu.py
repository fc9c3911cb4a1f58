"""Wall time of a 200-step tiny DDP job (2 ranks, gloo, CPU) with and without ``traceread collect``.

Runs are interleaved and the order alternates (plain/collect, then collect/plain) so a drift in machine
load hits both sides alike; the medians of ``--runs`` runs each are compared. ``collect`` runs with its
defaults (profiling window --wait 5 --warmup 3 --active 10, hang watchdog, NCCL/FR env, logs).

    python bench/collect_overhead_cpu.py --runs 5

Wall time includes torchrun's start-up (process spawn, ``import torch``, rendezvous), as the user sees it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
JOB = REPO / "tests" / "jobs" / "ddp_train.py"


def port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def job(steps: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", port(),
            "--monitor-interval", "0.5", str(JOB), "--steps", str(steps)]


def timed(cmd: list[str]) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEREAD_")}
    env["OMP_NUM_THREADS"] = "1"
    t0 = time.perf_counter()
    res = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    dt = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:6])}... failed ({res.returncode}): {res.stderr[-2000:]}")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="traceread-overhead-"))
    plain: list[float] = []
    coll: list[float] = []
    try:
        for i in range(args.runs):
            run = work / f"run{i}"
            order = ("plain", "collect") if i % 2 == 0 else ("collect", "plain")
            for side in order:
                if side == "plain":
                    plain.append(timed(job(args.steps)))
                else:
                    coll.append(timed([sys.executable, "-m", "traceread.cli", "collect", "-o", str(run), "--",
                                       *job(args.steps)]))
                    assert len(list((run / "traces").glob("rank*.pt.trace.json.gz"))) == 2, "no traces written"
            print(f"run {i}: plain {plain[-1]:.2f} s, collect {coll[-1]:.2f} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    mp, mc = statistics.median(plain), statistics.median(coll)
    out = {"runs": args.runs, "steps": args.steps, "plain_s": plain, "collect_s": coll, "median_plain_s": round(mp, 3),
           "median_collect_s": round(mc, 3), "overhead_pct": round(100 * (mc / mp - 1), 2)}
    print(json.dumps(out))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
