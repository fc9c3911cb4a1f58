"""2-rank DDP job (CPU, gloo) whose slowdown starts mid-run: exact truth for the watch tests.

Knows nothing about traceread. Steps are optimizer-step numbers (1 = the first). Every rank sleeps
--base-ms per step in ``compute`` (steps of a known size on any machine, far above scheduling noise).
--slow-rank R (-1: every rank) --slow-steps A:B --slow-ms X --slow-where data|step: in steps A..B the
rank's ``load_batch`` (before the forward: its input pipeline) or ``apply_update`` (between backward
and optimizer step) takes X ms more. --stall-rank R (-1: every rank) --stall-step S --stall-s X: one
long pause in ``wait_for_storage`` before step S. Prints ``step N`` lines from rank 0 every 50 steps.
--device cuda: the model on cuda:LOCAL_RANK, NCCL (tests/jobs/record_watch_gpu.sh).
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def compute(ms: float) -> None:
    time.sleep(ms / 1e3)


def load_batch(extra_ms: float) -> None:
    time.sleep(extra_ms / 1e3)  # traceread-test: slow input pipeline


def apply_update(extra_ms: float) -> None:
    time.sleep(extra_ms / 1e3)  # traceread-test: slow update


def wait_for_storage(seconds: float) -> None:
    time.sleep(seconds)  # traceread-test: stall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=320)
    ap.add_argument("--base-ms", type=float, default=15.0)
    ap.add_argument("--slow-rank", type=int, default=-2)
    ap.add_argument("--slow-steps", default="0:-1")
    ap.add_argument("--slow-ms", type=float, default=0.0)
    ap.add_argument("--slow-where", choices=("data", "step"), default="data")
    ap.add_argument("--stall-rank", type=int, default=-2)
    ap.add_argument("--stall-step", type=int, default=-1)
    ap.add_argument("--stall-s", type=float, default=0.0)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = ap.parse_args()
    slow_a, slow_b = (int(x) for x in args.slow_steps.split(":"))

    cuda = args.device == "cuda"
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).to(device)
    model = DDP(net, device_ids=[device.index] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(16, 32, device=device)
    target = torch.randn(16, 8, device=device)
    for number in range(1, args.steps + 1):
        slow_here = args.slow_rank in (rank, -1) and slow_a <= number <= slow_b
        if args.stall_rank in (rank, -1) and number == args.stall_step:
            wait_for_storage(args.stall_s)
        if slow_here and args.slow_where == "data":
            load_batch(args.slow_ms)
        compute(args.base_ms)
        loss = torch.nn.functional.mse_loss(model(data), target)
        opt.zero_grad()
        loss.backward()
        if slow_here and args.slow_where == "step":
            apply_update(args.slow_ms)
        opt.step()
        if rank == 0 and number % 50 == 0:
            print(f"step {number} loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
