"""Tiny DDP job (CPU, gloo) that owns SIGUSR2, as SLURM ``--signal=USR2@60`` and checkpoint-on-preemption
handlers do; knows nothing about traceread.

Every rank installs its own SIGUSR2 handler, then at step ``--signal-step`` sends SIGUSR2 to itself and
waits up to 5 s for the handler to run. It prints, per rank, whether the handler fired, the signal mask
of its main thread (``SigBlk``) and that of a child process it starts (masks are inherited across
fork and exec), and whether SIGUSR1 still has its default action (``SigCgt``).
"""

import argparse
import datetime
import os
import signal
import subprocess
import sys
import time

import torch
import torch.distributed as dist

FIRED: list[int] = []


def status_field(text: str, name: str) -> int:
    line = next(x for x in text.splitlines() if x.startswith(name + ":"))
    return int(line.split()[1], 16)


def on_usr2(signum: int, _frame: object) -> None:
    FIRED.append(signum)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--signal-step", type=int, default=3)
    args = ap.parse_args()

    signal.signal(signal.SIGUSR2, on_usr2)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        loss = model(torch.randn(4, 8)).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == args.signal_step:
            os.kill(os.getpid(), signal.SIGUSR2)
            deadline = time.monotonic() + 5
            while not FIRED and time.monotonic() < deadline:
                time.sleep(0.01)
        dist.barrier()
    with open("/proc/self/status") as fh:
        own = fh.read()
    child = subprocess.run([sys.executable, "-S", "-c", "print(open('/proc/self/status').read())"],
                           capture_output=True, text=True, check=True).stdout
    usr1 = 1 << (signal.SIGUSR1 - 1)
    print(f"rank {rank}: handler {'fired' if FIRED else 'did not fire'}; "
          f"SigBlk {status_field(own, 'SigBlk'):#x}; child SigBlk {status_field(child, 'SigBlk'):#x}; "
          f"SIGUSR1 caught {bool(status_field(own, 'SigCgt') & usr1)}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
