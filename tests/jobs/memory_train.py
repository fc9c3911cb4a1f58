"""Tiny DDP training job (CPU, gloo) for the memory tests; knows nothing about traceread.

Knobs: --steps N; --leak-rank R (that rank keeps one 1 MiB tensor per step alive: a leak);
--big-rank R (that rank's batch is 4x larger: more activation memory); --oom-step K (rank 0 asks
for an impossible tensor at step K: a real CPU out-of-memory RuntimeError, uncaught).
"""

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--leak-rank", type=int, default=-1)
    ap.add_argument("--big-rank", type=int, default=-1)
    ap.add_argument("--oom-step", type=int, default=-1)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 16)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = 256 if rank == args.big_rank else 64
    kept = []
    for step in range(args.steps):
        data = torch.randn(batch, 256)
        loss = model(data).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == args.leak_rank:
            kept.append(torch.ones(1 << 18))  # 1 MiB of float32 each step, never released
        if rank == 0 and step == args.oom_step:
            torch.empty(1 << 60, dtype=torch.uint8)  # CPU allocator: "can't allocate memory"
        if rank == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
