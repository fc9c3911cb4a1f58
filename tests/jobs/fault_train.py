"""Tiny DDP job (CPU, gloo) for the collector fault tests; knows nothing about traceread.

--steps N, --step-sleep S (seconds per step, so a signal can land mid-run), --kill-rank R --kill-step K
(that rank SIGKILLs itself in the middle of step K, after backward and before its all_reduce),
--exit-code C (every rank calls sys.exit(C) after the last step), --print-kb K (rank 0 prints K KiB of
numbered lines after step 1, to fill a small disk with the collector's copy of the output).
"""

import argparse
import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--step-sleep", type=float, default=0.0)
    ap.add_argument("--kill-rank", type=int, default=-1)
    ap.add_argument("--kill-step", type=int, default=-1)
    ap.add_argument("--exit-code", type=int, default=0)
    ap.add_argument("--print-kb", type=int, default=0)
    args = ap.parse_args()

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data, target = torch.randn(8, 16), torch.randn(8, 4)
    for step in range(args.steps):
        loss = torch.nn.functional.mse_loss(model(data), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0 and step == 1 and args.print_kb:
            for i in range(args.print_kb * 16):
                print(f"chatter {i:08d} " + "x" * 46, flush=True)  # 64 bytes a line
        if rank == args.kill_rank and step == args.kill_step:
            os.kill(os.getpid(), signal.SIGKILL)
        logged = loss.detach().clone()
        dist.all_reduce(logged)
        if rank == 0:
            print(f"step {step} loss {logged.item():.4f}", flush=True)
        time.sleep(args.step_sleep)
    dist.destroy_process_group()
    sys.exit(args.exit_code)


if __name__ == "__main__":
    main()
