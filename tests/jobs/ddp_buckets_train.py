"""DDP on CPU (gloo) with several gradient buckets per step; knows nothing about traceread.

Knobs: --steps N, --sleep-rank R --sleep-s S (that rank sleeps S seconds before every forward: a
host-side straggler), --layers L --width W (L linear layers of W x W: W*W*4 bytes of gradient each),
--bucket-mb M (DDP bucket_cap_mb: with W=512, M=1 gives one bucket per layer).
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--sleep-rank", type=int, default=-1)
    ap.add_argument("--sleep-s", type=float, default=0.0)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--bucket-mb", type=float, default=1.0)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    layers = [torch.nn.Linear(args.width, args.width) for _ in range(args.layers)]
    model = DDP(torch.nn.Sequential(*layers), bucket_cap_mb=args.bucket_mb)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(32, args.width)
    for _ in range(args.steps):
        if rank == args.sleep_rank:
            time.sleep(args.sleep_s)
        loss = model(data).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    if rank == 0:  # not every step: one rank's own host work per step would be a straggler of its own
        print(f"done {args.steps} steps, loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
