"""Tiny DDP job (CPU, gloo) that compiles its model late; knows nothing about traceread.

``torch.compile(backend="aot_eager")`` wraps the model at step ``--compile-step`` (default 2), so a
profiling window over that step records real compilation (TorchDynamo + AOTAutograd ``dynamo_timed``
spans) and a much slower step: warm-up. aot_eager needs no C++ compiler and compiles in a second.
Knobs: --steps N, --compile-step K.
"""

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--compile-step", type=int, default=2)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)))
    run = model
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    data, target = torch.randn(16, 32), torch.randn(16, 8)
    for step in range(args.steps):
        if step == args.compile_step:
            run = torch.compile(model, backend="aot_eager")
        loss = torch.nn.functional.mse_loss(run(data), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
