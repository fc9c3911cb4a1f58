"""A real 8-process gloo job with TP2 x PP2 x DP2 process groups that hangs on purpose; dumps taken on timeout.

Run under torchrun (CPU): ``torchrun --standalone --nproc-per-node 8 fr_groups_job.py --out RUN --fault F``.
Knows nothing about traceread; tests/jobs/make_fr_fixtures.py runs it and keeps what it writes.

Layout (Megatron's order, tensor fastest): rank = tp + 2*dp + 4*pp. Every rank creates, in this order,
TP groups [0,1] [2,3] [4,5] [6,7] (``TENSOR_MODEL_PARALLEL_GROUP``), DP groups [0,2] [1,3] [4,6] [5,7]
(``DATA_PARALLEL_GROUP``) and PP groups [0,4] [1,5] [2,6] [3,7] (``PIPELINE_MODEL_PARALLEL_GROUP``).
A step: two micro-batches forward (stage 1 receives each activation from stage 0: a broadcast on the
PP group, since gloo's send/recv are not recorded by Flight Recorder; two TP all-reduces), then
backward in reverse (stage 0 receives the gradient), then the DP all-reduce of the gradients, then a
world all-reduce (the gradient norm).

Faults, at step FAULT_STEP (``--fault``):

* ``stop``  — rank 5 stops itself (SIGSTOP) before its first TP all-reduce: no dump, no stack.
* ``spin``  — rank 2 spins holding the GIL (one long C call) before its DP all-reduce: its Python dump
  thread cannot run; its Flight Recorder is fetched as JSON from its c10d worker server (C++), and
  faulthandler (a C signal handler) still writes its stack.
* ``skip``  — rank 6 skips its DP all-reduce and goes on to the world all-reduce.
* ``order`` — rank 3 issues the world all-reduce before its DP all-reduce.

Dumps on timeout, the way NCCL's watchdog does it: every rank stamps the collective it enters; a
watchdog thread that sees one collective pending for STALL_S seconds declares the hang (creates
``RUN/.hang``); every rank's dump thread then writes its Flight Recorder pickle and JSON
(``_dump_fr_trace``, ``_dump_fr_trace_json``) and ``RUN/truth/rank{R}.json`` (the collective its main
thread is in, by group name and seq, from the job's own count); the declaring rank also sends SIGUSR1
to every rank (faulthandler stacks) and asks every rank's worker server for ``fr_trace_json`` (that
answers while a rank holds the GIL), then writes ``RUN/.done``.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import signal
import socket
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

TP, DP, PP = 2, 2, 2
STEPS = 4
FAULT_STEP = 2
STALL_S = 3.0
FAULTS = {"stop": 5, "spin": 2, "skip": 6, "order": 3}


class State:
    """What the main thread is doing, for the watchdog and the truth file."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.current: dict | None = None
        self.since = time.monotonic()
        self.counts: dict[str, int] = {}


STATE = State()


def group_name(group: dist.ProcessGroup | None) -> str:
    return "0" if group is None else group.group_name


def coll(op: str, tensor: torch.Tensor, group: dist.ProcessGroup | None = None, **kw: object) -> None:
    """Run one collective, stamping which one (group, op, seq) the main thread is in."""
    name = group_name(group)
    with STATE.lock:
        seq = STATE.counts[name] = STATE.counts.get(name, 0) + 1
        STATE.current = {"pg": name, "op": op, "seq": seq}
        STATE.since = time.monotonic()
    getattr(dist, op)(tensor, group=group, **kw)
    with STATE.lock:
        STATE.current = None


def post(sock_path: str, handler: str, timeout: float) -> bytes:
    """POST /handler/<name> to a c10d worker server on a unix socket; the body of the answer."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(sock_path)
        s.sendall(f"POST /handler/{handler} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n"
                  "Connection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(1 << 16):
            data += chunk
    finally:
        s.close()
    head, _, body = data.partition(b"\r\n\r\n")
    if b" 200 " not in head.split(b"\r\n", 1)[0]:
        raise RuntimeError(head[:80])
    return body


def dump_thread(run: Path, rank: int) -> None:
    """Waits for the hang flag, then writes this rank's dumps and truth (needs the GIL)."""
    c10d = torch._C._distributed_c10d
    while not (run / ".hang").exists():
        time.sleep(0.05)
    with STATE.lock:
        cur = dict(STATE.current) if STATE.current else None
    (run / "truth" / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "in": cur}))
    (run / "fr" / f"rank{rank}.pkl").write_bytes(c10d._dump_fr_trace())
    (run / "fr" / f"rank{rank}.json").write_bytes(c10d._dump_fr_trace_json())


def declare(run: Path, rank: int, world: int) -> None:
    """This rank saw a collective pending for STALL_S: signal every rank and collect what can be collected."""
    try:
        fd = os.open(run / ".hang", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.write(fd, str(rank).encode())
    os.close(fd)
    for r in range(world):
        pid = int((run / "pids" / f"rank{r}").read_text())
        os.kill(pid, signal.SIGUSR1)  # faulthandler: every thread's stack (a stopped rank stays silent)
    for r in range(world):
        try:
            body = post(str(run / "sock" / f"rank{r}.sock"), "fr_trace_json", timeout=3.0)
            (run / "fr_ws" / f"rank{r}.json").write_bytes(body)
        except (OSError, RuntimeError):
            pass  # a stopped process does not answer
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if sum(1 for _ in (run / "fr").glob("*.json")) >= world - 1:
            break
        time.sleep(0.1)
    time.sleep(1.0)
    (run / ".done").write_text("")


def watchdog(run: Path, rank: int, world: int) -> None:
    while not (run / ".hang").exists():
        with STATE.lock:
            stuck = STATE.current is not None and time.monotonic() - STATE.since > STALL_S
        if stuck:
            declare(run, rank, world)
            return
        time.sleep(0.1)


def spin_holding_the_gil() -> int:
    return sum(range(10**12))  # one C call: no bytecode boundary, the GIL is never released


def step(s: int, rank: int, fault: str, groups: dict[str, dist.ProcessGroup], pp_src: dict[str, int]) -> None:
    stage = rank // (TP * DP)
    culprit = FAULTS[fault] == rank and s == FAULT_STEP
    x = torch.ones(8)
    for mb in range(2):  # forward
        if stage == 1:
            coll("broadcast", x, groups["pp"], src=pp_src["first"])  # receive the activation
        if culprit and fault == "stop" and mb == 0:
            print(f"rank {rank}: step {s} forward", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        coll("all_reduce", x, groups["tp"])  # attention
        coll("all_reduce", x, groups["tp"])  # MLP
        if stage == 0:
            coll("broadcast", x, groups["pp"], src=rank)  # send the activation
    for _mb in range(2):  # backward
        if stage == 0:
            coll("broadcast", x, groups["pp"], src=pp_src["last"])  # receive the gradient
        coll("all_reduce", x, groups["tp"])
        coll("all_reduce", x, groups["tp"])
        if stage == 1:
            coll("broadcast", x, groups["pp"], src=rank)  # send the gradient
    grads = torch.ones(32)
    norm = torch.ones(1)
    if culprit and fault == "spin":
        print(f"rank {rank}: step {s} reducing gradients", flush=True)
        spin_holding_the_gil()
    if culprit and fault == "skip":
        coll("all_reduce", norm)  # the DP all-reduce is skipped
        return
    if culprit and fault == "order":
        coll("all_reduce", norm)
        coll("all_reduce", grads, groups["dp"])
        return
    coll("all_reduce", grads, groups["dp"])
    coll("all_reduce", norm)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--fault", choices=sorted(FAULTS), required=True)
    args = ap.parse_args()
    run: Path = args.out
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    assert world == TP * DP * PP
    for sub in ("fr", "fr_ws", "stacks", "truth", "pids", "sock"):
        (run / sub).mkdir(parents=True, exist_ok=True)
    (run / "pids" / f"rank{rank}").write_text(str(os.getpid()))
    stack_file = open(run / "stacks" / f"rank{rank}.txt", "w")  # open for the process's life
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    server = torch._C._distributed_c10d._WorkerServer(str(run / "sock" / f"rank{rank}.sock"))  # noqa: F841 - kept alive
    groups: dict[str, dist.ProcessGroup] = {}
    pp_src: dict[str, int] = {}
    tp_of = [[p * TP * DP + d * TP + t for t in range(TP)] for p in range(PP) for d in range(DP)]
    dp_of = [[p * TP * DP + d * TP + t for d in range(DP)] for p in range(PP) for t in range(TP)]
    pp_of = [[p * TP * DP + d * TP + t for p in range(PP)] for d in range(DP) for t in range(TP)]
    for kind, desc, lists in (("tp", "TENSOR_MODEL_PARALLEL_GROUP", tp_of), ("dp", "DATA_PARALLEL_GROUP", dp_of),
                              ("pp", "PIPELINE_MODEL_PARALLEL_GROUP", pp_of)):
        for ranks in lists:
            g = dist.new_group(ranks, group_desc=desc)
            if rank in ranks:
                groups[kind] = g
                if kind == "pp":
                    pp_src = {"first": ranks[0], "last": ranks[-1]}
    threading.Thread(target=dump_thread, args=(run, rank), daemon=True).start()
    threading.Thread(target=watchdog, args=(run, rank, world), daemon=True).start()
    for s in range(STEPS):
        step(s, rank, args.fault, groups, pp_src)
        print(f"rank {rank}: step {s} done", flush=True)
    time.sleep(600)  # a healthy rank waits here to be killed (only after a fault it gets so far)


if __name__ == "__main__":
    main()
