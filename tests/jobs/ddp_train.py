"""Tiny DDP training job (CPU, gloo) used by the collect tests; knows nothing about traceread.

Knobs (all optional): --steps N, --sleep-rank R --sleep-s S (that rank sleeps each step: straggler),
--hang-rank R --hang-step K (that rank skips the loss all_reduce at step K and sleeps: deadlock),
--crash-rank R --crash-step K (that rank raises ValueError at step K), --pg-timeout S.
"""

import argparse
import datetime
import os  # noqa: F401 - unused, but sample_traces/cpu_hang_gloo recorded this file's line numbers
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def stuck_in_data_loading(seconds: float) -> None:
    time.sleep(seconds)  # traceread-test: culprit line


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--sleep-rank", type=int, default=-1)
    ap.add_argument("--sleep-s", type=float, default=0.0)
    ap.add_argument("--hang-rank", type=int, default=-1)
    ap.add_argument("--hang-step", type=int, default=-1)
    ap.add_argument("--crash-rank", type=int, default=-1)
    ap.add_argument("--crash-step", type=int, default=-1)
    ap.add_argument("--pg-timeout", type=float, default=120.0)
    args = ap.parse_args()

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.pg_timeout))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(16, 32)
    target = torch.randn(16, 8)
    for step in range(args.steps):
        if rank == args.crash_rank and step == args.crash_step:
            raise ValueError(f"boom at step {step}")
        if rank == args.sleep_rank:
            time.sleep(args.sleep_s)
        loss = torch.nn.functional.mse_loss(model(data), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        logged = loss.detach().clone()
        if rank == args.hang_rank and step == args.hang_step:
            stuck_in_data_loading(3600)
        else:
            dist.all_reduce(logged)
        if rank == 0:
            print(f"step {step} loss {logged.item() / dist.get_world_size():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
