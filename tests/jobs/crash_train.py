"""Tiny DDP job (CPU, gloo) that fails on purpose, one way at a time; knows nothing about traceread.

Rank ``--fail-rank`` fails at optimizer step ``--fail-step`` (0-based: after that many steps finished),
between its backward and its all_reduce, with ``--how``:

* ``cuda``: ``RuntimeError: CUDA error: an illegal memory access was encountered`` (the line marked FAIL-CUDA)
* ``memory``: ``MemoryError`` (FAIL-MEMORY)
* ``segv``: ``ctypes.string_at(0)``, a segmentation fault (FAIL-SEGV)
* ``kill``: SIGKILL to itself, as the kernel's OOM killer does (no Python error at all)

``--fail2-rank``/``--fail2-step`` make a second rank raise ``ValueError`` (FAIL-SECOND) ``--fail2-delay``
seconds after the first rank failed (told through the job's own store, not a guess of the machine's speed),
before it reaches the all_reduce that would tell it its peer is gone.
``--first-attempt-only``: fail only when ``TORCHELASTIC_RESTART_COUNT`` is 0 (torchrun ``--max-restarts 1``
then restarts the job, and the second attempt runs to the end). The tests read the marked lines' numbers
from this file, so the truth is the script itself.
"""

import argparse
import ctypes
import datetime
import os
import signal
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def fail(how: str) -> None:
    if how == "cuda":
        raise RuntimeError("CUDA error: an illegal memory access was encountered")  # FAIL-CUDA
    if how == "memory":
        raise MemoryError("unable to allocate 64.0 GiB for the activation buffer")  # FAIL-MEMORY
    if how == "segv":
        ctypes.string_at(0)  # FAIL-SEGV
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)  # FAIL-KILL


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--step-sleep", type=float, default=0.05)
    ap.add_argument("--fail-rank", type=int, default=1)
    ap.add_argument("--fail-step", type=int, default=6)
    ap.add_argument("--how", default="cuda", choices=("cuda", "memory", "segv", "kill", "none"))
    ap.add_argument("--fail2-rank", type=int, default=-1)
    ap.add_argument("--fail2-step", type=int, default=-1)
    ap.add_argument("--fail2-delay", type=float, default=1.5)
    ap.add_argument("--first-attempt-only", action="store_true")
    args = ap.parse_args()

    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    # gloo's full-mesh addresses go under a prefix of their own per attempt: with torchrun's shared store a
    # restarted attempt can otherwise read the dead attempt's addresses ("connectFullMesh failed ... Connection
    # refused"; reproduced here without traceread in 2 of 3 plain torchrun --max-restarts 1 runs)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=dist.PrefixStore(f"crash_train/attempt{attempt}", store),
                            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]),
                            timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    armed = not (args.first_attempt_only and attempt > 0)
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data, target = torch.randn(8, 16), torch.randn(8, 4)
    for step in range(args.steps):
        loss = torch.nn.functional.mse_loss(model(data), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        first_failed = f"crash_train/attempt{attempt}/first_failed"
        if armed and rank == args.fail_rank and step == args.fail_step and args.how != "none":
            if args.fail2_rank >= 0:
                store.set(first_failed, "1")  # the second rank fails after this one, whatever the machine's speed
            fail(args.how)
        if armed and rank == args.fail2_rank and step == args.fail2_step:
            # torchrun tears the job down after the first failure (SIGTERM, SIGKILL 30 s later): ignoring SIGTERM
            # lets this rank fail of its own, --fail2-delay after the first, on any machine
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            store.wait([first_failed], datetime.timedelta(seconds=120))
            time.sleep(args.fail2_delay)
            raise ValueError(f"second failure on rank {rank} at step {step}")  # FAIL-SECOND
        logged = loss.detach().clone()
        dist.all_reduce(logged)
        if rank == 0:
            print(f"step {step} loss {logged.item():.4f}", flush=True)
        time.sleep(args.step_sleep)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
