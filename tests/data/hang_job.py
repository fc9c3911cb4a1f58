"""A real 2-rank gloo job that hangs on purpose, laid out like a ``traceread collect`` RUN folder.

Usage: ``python hang_job.py RUN_DIR``: rank 1 sleeps in ``train_step`` instead of its 11th
all_reduce (collective #12 of the default PG, after one all_gather) while rank 0 waits in it.

Writes, like the collector would: ``fr/rank{R}.json`` and ``fr/rank{R}.pkl`` (Flight Recorder,
dumped from a helper thread while the main thread is blocked), ``stacks/rank{R}.txt``
(faulthandler, all threads), ``errors/rank{R}.json`` (torchelastic ``ErrorHandler`` format, for
the rank that timed out), ``hang.json`` and ``run.json``. Used by tests/test_hang_*.py; it is
this project's own job, so its small dumps are fine to keep as fixtures.
"""

from __future__ import annotations

import faulthandler
import json
import os
import shutil
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

PG_TIMEOUT_S = 4.0  # rank 0's wait; the dumps are taken long before it expires, even on a loaded machine
DUMP_AFTER_S = 0.5
DUMPED = threading.Event()


def dump_everything(run: Path, rank: int) -> None:
    """What the injected sitecustomize does on a stall: FR dumps (JSON + pickle) and all stacks."""
    import torch

    c10d = torch._C._distributed_c10d
    # stacks first: faulthandler is instant, while the pickle (with Python frames) can take seconds
    with open(run / "stacks" / f"rank{rank}.txt", "w") as fh:
        faulthandler.dump_traceback(file=fh, all_threads=True)
    (run / "fr" / f"rank{rank}.json").write_bytes(c10d._dump_fr_trace_json())
    (run / "fr" / f"rank{rank}.pkl").write_bytes(c10d._dump_fr_trace())
    DUMPED.set()


def train_step(rank: int, step: int, mode: str, run: Path) -> None:
    import torch
    import torch.distributed as dist

    x = torch.ones(16)
    if step == 10 and rank == 1 and mode == "skip":
        deadline = time.time() + 30
        while not (DUMPED.is_set() and (run / "steps" / "rank0.txt").exists()) and time.time() < deadline:
            time.sleep(0.05)  # rank 1 "is busy elsewhere" until it was dumped and rank 0 timed out
        return
    dist.all_reduce(x)


def worker(rank: int, world: int, run: Path, mode: str, port: int) -> None:
    import torch
    import torch.distributed as dist

    os.environ["TORCHELASTIC_ERROR_FILE"] = str(run / "errors" / f"rank{rank}.json")
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=PG_TIMEOUT_S),
    )
    sub = dist.new_group([0, 1])
    dist.broadcast(torch.zeros(4), src=0, group=sub)
    dist.all_gather([torch.zeros(8) for _ in range(world)], torch.ones(8))
    for step in range(10):
        train_step(rank, step, mode, run)
    timer = threading.Timer(DUMP_AFTER_S, dump_everything, args=(run, rank))
    timer.start()
    try:
        train_step(rank, 10, mode, run)
    except Exception as exc:  # the rank that waited times out
        from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

        ErrorHandler().record_exception(exc)
    timer.join(timeout=30)
    (run / "steps" / f"rank{rank}.txt").write_text("9\n")
    os._exit(0)


def main() -> None:
    run = Path(sys.argv[1])
    mode = sys.argv[2] if len(sys.argv) > 2 else "skip"
    for sub in ("fr", "stacks", "errors", "steps"):
        (run / sub).mkdir(parents=True, exist_ok=True)
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    import torch.multiprocessing as mp

    started = time.time()
    ctx = mp.spawn(worker, args=(2, run, mode, port), nprocs=2, join=False)
    ctx.join()
    shutil.rmtree(run / "steps", ignore_errors=True)
    (run / "hang.json").write_text(json.dumps({
        "detected_at": started + DUMP_AFTER_S,
        "timeout_s": DUMP_AFTER_S,
        "answered_ranks": [0, 1],
        "action": "dumped stacks and flight recorder",
        "last_step_per_rank": {"0": 9, "1": 9},
    }))
    (run / "run.json").write_text(json.dumps({
        "command": ["python", "hang_job.py", mode],
        "world_size": 2,
        "exit_code": 0,
    }))


if __name__ == "__main__":
    main()
