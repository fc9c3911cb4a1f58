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
from collections.abc import Callable
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


def timed(make_cmd: Callable[[], list[str]], attempts: int = 3) -> float:
    """Seconds the command took; a failed start (a free port taken meanwhile, a gloo connect race on a
    loaded machine) is retried with a fresh port, and counted in neither side."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEREAD_")}
    env["OMP_NUM_THREADS"] = "1"
    for _ in range(attempts):
        cmd = make_cmd()
        t0 = time.perf_counter()
        res = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        dt = time.perf_counter() - t0
        if res.returncode == 0:
            return dt
        print(f"retrying: {' '.join(cmd[:4])}... failed ({res.returncode})", file=sys.stderr)
    raise SystemExit(f"failed {attempts} times: {res.stderr[-2000:]}")


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
                    plain.append(timed(lambda: job(args.steps)))
                else:
                    coll.append(timed(lambda run=run: [sys.executable, "-m", "traceread.cli", "collect", "-o", str(run),
                                               "--overwrite", "--", *job(args.steps)]))
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
