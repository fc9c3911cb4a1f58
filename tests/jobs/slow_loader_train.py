"""DDP on CPU (gloo) fed by a plain PyTorch DataLoader whose dataset is slow on one rank; knows nothing
about traceread.

Each item of rank ``--slow-rank``'s dataset sleeps ``--sleep-ms`` in ``__getitem__`` (decoding, reading a
file: work the host does inside the DataLoader's own span), so that rank's loader takes at least
``--batch`` x ``--sleep-ms`` per batch and the other rank waits for it in the gradient all-reduce.
``--accum N`` accumulates gradients over N batches (micro-steps) per optimizer step, under
``model.no_sync()`` for all but the last.
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset


class Items(Dataset):
    def __init__(self, n: int, sleep_s: float) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 32, generator=g)
        self.y = torch.randn(n, 8, generator=g)
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return self.x.shape[0]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.sleep_s:
            time.sleep(self.sleep_s)  # the slow part of this rank's loading
        return self.x[i], self.y[i]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=9)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--slow-rank", type=int, default=1)
    ap.add_argument("--sleep-ms", type=float, default=10.0)
    ap.add_argument("--accum", type=int, default=1)
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    sleep_s = args.sleep_ms / 1000.0 if rank == args.slow_rank else 0.0
    loader = DataLoader(Items(args.steps * args.batch * args.accum, sleep_s), batch_size=args.batch, num_workers=0)
    for i, (x, y) in enumerate(loader):
        last = (i + 1) % args.accum == 0
        if last:
            loss = torch.nn.functional.mse_loss(model(x), y) / args.accum
            loss.backward()
            opt.step()
            opt.zero_grad()
            if rank == 0:
                print(f"step {i // args.accum} loss {loss.item():.4f}", flush=True)
        else:
            with model.no_sync():
                (torch.nn.functional.mse_loss(model(x), y) / args.accum).backward()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
