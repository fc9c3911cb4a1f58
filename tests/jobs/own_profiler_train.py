"""Tiny DDP job (CPU, gloo) that runs its OWN torch.profiler, as torchtitan, the Trainer/Lightning
profiler callbacks and Megatron's ``--profile`` do. Knows nothing about traceread.

Loop iteration ``i`` (0-based) ends with optimizer step ``i + 1``. The job profiles iterations
``--first`` .. ``--first + --iters - 1`` with one of four APIs (``--api``):

* ``schedule``: ``torch.profiler.profile(schedule=..., on_trace_ready=tensorboard_trace_handler(DIR))``
  entered before the loop, ``prof.step()`` after every iteration (the profiler's own step count);
* ``startstop``: ``prof.start()`` at iteration ``first``, ``prof.stop()`` + ``export_chrome_trace``
  after the last one;
* ``context``: ``with torch.profiler.profile() as prof:`` around those iterations, then export;
* ``autograd``: the older ``torch.autograd.profiler.profile`` context, then export.

Traces go to ``--trace-dir`` (``rank{R}`` in each file name). Prints ``JOB-TRACE <path>`` per file.
``--cuda``: model and data on the GPU (both ranks share one: gloo moves CUDA tensors), and the job's
profiler records CUDA activity too — the same check where CUPTI is involved (a GPU machine).
"""

from __future__ import annotations

import argparse
import contextlib
import os
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=22)
    ap.add_argument("--api", choices=("schedule", "startstop", "context", "autograd"), default="schedule")
    ap.add_argument("--first", type=int, default=10)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--trace-dir", default="job_traces")
    ap.add_argument("--cuda", action="store_true")
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    dev = torch.device("cuda", 0) if args.cuda else torch.device("cpu")
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if args.cuda else [])
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).to(dev))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data, target = torch.randn(16, 32, device=dev), torch.randn(16, 8, device=dev)
    os.makedirs(args.trace_dir, exist_ok=True)
    export = os.path.join(args.trace_dir, f"rank{rank}.pt.trace.json")

    sched: Any = None
    if args.api == "schedule":
        sched = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(wait=max(0, args.first - 1), warmup=min(1, args.first),
                                             active=args.iters, repeat=1),
            on_trace_ready=torch.profiler.tensorboard_trace_handler(args.trace_dir, worker_name=f"rank{rank}"))
        sched.start()
    manual: Any = None
    ctx: contextlib.ExitStack | None = None
    for i in range(args.steps):
        if i == args.first and args.api == "startstop":
            manual = torch.profiler.profile(activities=activities)
            manual.start()
        if i == args.first and args.api in ("context", "autograd"):
            ctx = contextlib.ExitStack()
            manual = ctx.enter_context(torch.profiler.profile(activities=activities)
                                       if args.api == "context" else torch.autograd.profiler.profile())
        loss = torch.nn.functional.mse_loss(model(data), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if sched is not None:
            sched.step()
        if i == args.first + args.iters - 1 and manual is not None:
            if ctx is not None:
                ctx.close()
            else:
                manual.stop()
            manual.export_chrome_trace(export)
            print(f"JOB-TRACE {export}", flush=True)
        if rank == 0 and i % 5 == 0:
            print(f"step {i} loss {loss.item():.4f}", flush=True)
    if sched is not None:
        sched.stop()
        for name in sorted(os.listdir(args.trace_dir)):
            if name.startswith(f"rank{rank}."):
                print(f"JOB-TRACE {os.path.join(args.trace_dir, name)}", flush=True)
    dist.destroy_process_group()
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
