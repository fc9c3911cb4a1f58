"""Record real NCCL failure logs on one GPU, for the failure catalogue (docs/hang-and-nccl.md).

Run on a machine with an NVIDIA GPU and a CUDA torch (not in CI):

    python tests/jobs/nccl_failures_gpu.py OUT_DIR

Each case runs two ranks with torch.multiprocessing and NCCL_DEBUG=INFO, writes OUT_DIR/<case>.log (both
ranks' stderr), and prints what `traceread report` answers on it. Cases and the diagnosis each must get:

* ``no_interface``: NCCL_SOCKET_IFNAME names no interface -> ``no_socket_interface`` (names the setting)
* ``duplicate_gpu``: both ranks on cuda:0 -> ``duplicate_gpu``
* ``healthy``: one rank, a real all-reduce -> "No problem found in NCCL's own records: ..."
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CASES = {
    "no_interface": ({"NCCL_SOCKET_IFNAME": "=doesnotexist0"}, 2, "no_socket_interface"),
    "duplicate_gpu": ({"SAME_GPU": "1"}, 2, "duplicate_gpu"),
    "healthy": ({}, 1, None),
}

WORKER = r"""
import os, sys, torch, torch.distributed as dist
rank, world = int(sys.argv[1]), int(sys.argv[2])
torch.cuda.set_device(0 if os.environ.get("SAME_GPU") else rank % torch.cuda.device_count())
dist.init_process_group("nccl", rank=rank, world_size=world, init_method="tcp://127.0.0.1:29533")
x = torch.ones(1 << 20, device="cuda")
dist.all_reduce(x)
torch.cuda.synchronize()
dist.destroy_process_group()
"""


def run(case: str, extra: dict[str, str], world: int, out: Path) -> Path:
    env = dict(os.environ, NCCL_DEBUG="INFO", **extra)
    log = out / f"{case}.log"
    with open(log, "w") as fh:
        procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(r), str(world)], env=env, stdout=fh,
                                  stderr=subprocess.STDOUT) for r in range(world)]
        for p in procs:
            try:
                p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
    return log


def main() -> None:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "nccl_failure_logs")
    out.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    try:
        from traceread.analysis.comm.nccl import parse_nccl_logs
    except ImportError as exc:  # a GPU image without traceread's report dependencies: record, judge elsewhere
        print(f"recording only ({exc}); judge the logs with traceread report on another machine")
        parse_nccl_logs = None

    ok = True
    for case, (extra, world, want) in CASES.items():
        log = run(case, extra, world, out)
        if parse_nccl_logs is None:
            print(f"recorded {case} -> {log}")
            continue
        s = parse_nccl_logs([log])
        got = next((d["id"] for d in s["diagnoses"] if d["severity"] != "info"), None)
        good = got == want
        ok &= good
        print(f"{'ok ' if good else 'BAD'} {case}: want {want}, got {got} ({s['version']}, {s['problems_total']} "
              f"problem lines) -> {log}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
