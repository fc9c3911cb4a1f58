"""DeepSpeed job on CPU (gloo), 2 ranks; knows nothing about traceread.

``deepspeed.initialize`` with a ZeRO stage-0 config, gradient accumulation (``--accum`` micro-batches per
optimizer step: ``engine.backward`` / ``engine.step`` per micro-batch, the optimizer steps at the boundary),
a tiny MLP. The fault, with exact truth from this script: at every optimizer step rank ``--gc-rank``
runs ``gc.collect()`` over a big graph of cyclic objects it keeps alive (a cache of parsed records), then
sleeps ``--gc-sleep-ms`` (the rest of a long pause, so the pause has a floor that does not depend on
the machine's speed). The script times each pause and writes the truth (JSON, ``--truth``) per rank:
``pauses_ms[i]`` is the pause after optimizer step ``i + 1``.

Second fault (``--big-batch-rank R --big-batch-factor F``, GC pause off with ``--gc-rank -1``): rank R's
micro-batches are F times larger (an uneven split of the data), so its forward/backward takes longer
and the others wait for it in the gradient all-reduce. ``micro_ms`` times, on this rank, the forward and
backward of every micro-batch that is not the last of its optimizer step (those exchange no gradients,
so no wait for a peer is inside): the rank's own work per micro-batch.
"""

from __future__ import annotations

import argparse
import gc
import json
import time

import deepspeed
import torch


class Record:
    """One parsed record; ``peer`` makes a cycle so only the cyclic collector can free it."""

    def __init__(self, i: int) -> None:
        self.i = i
        self.peer: Record | None = None


def make_graph(n: int) -> list[Record]:
    out = [Record(i) for i in range(n)]
    for a, b in zip(out, out[1:] + out[:1]):
        a.peer = b
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--accum", type=int, default=2)
    ap.add_argument("--micro-batch", type=int, default=8)
    ap.add_argument("--gc-rank", type=int, default=1)
    ap.add_argument("--gc-objects", type=int, default=50_000)
    ap.add_argument("--gc-sleep-ms", type=float, default=80.0)
    ap.add_argument("--big-batch-rank", type=int, default=-1)
    ap.add_argument("--big-batch-factor", type=int, default=1)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--truth", default="")
    ap.add_argument("--shm-op", action="store_true", help="let DeepSpeed build its shared-memory all-reduce")
    ap.add_argument("--local_rank", type=int, default=-1)  # the deepspeed launcher passes it
    args = ap.parse_args()

    if not args.shm_op:
        # DeepSpeed's CPU accelerator JIT-compiles a shared-memory all-reduce (C++, minutes on 2 cores) at
        # init; this job keeps torch.distributed's gloo collectives, as on a machine without a compiler
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
    rank = torch.distributed.get_rank()
    torch.manual_seed(0)
    w = args.width
    model = torch.nn.Sequential(torch.nn.Linear(64, w), torch.nn.ReLU(), torch.nn.Linear(w, w), torch.nn.ReLU(),
                                torch.nn.Linear(w, 64))
    config = {"train_micro_batch_size_per_gpu": args.micro_batch, "gradient_accumulation_steps": args.accum,
              "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
              "zero_optimization": {"stage": 0}, "steps_per_print": 10_000, "wall_clock_breakdown": False}
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    kept = make_graph(args.gc_objects) if rank == args.gc_rank else []  # alive all run
    pauses_ms: list[float] = []
    batch = args.micro_batch * (args.big_batch_factor if rank == args.big_batch_rank else 1)
    x, y = torch.randn(batch, 64), torch.randn(batch, 64)
    micro_ms: list[float] = []
    for _step in range(args.steps):
        for micro in range(args.accum):
            t0 = time.perf_counter()
            loss = torch.nn.functional.mse_loss(engine(x), y)
            engine.backward(loss)
            if micro < args.accum - 1:
                micro_ms.append((time.perf_counter() - t0) * 1e3)
            engine.step()
        if rank == args.gc_rank:
            t0 = time.perf_counter()
            gc.collect()
            time.sleep(args.gc_sleep_ms / 1e3)
            pauses_ms.append((time.perf_counter() - t0) * 1e3)  # the graph stays alive: every collection walks it
        if rank == 0:
            print(f"step {engine.global_steps} loss {loss.item():.4f}", flush=True)
    if args.truth:
        with open(f"{args.truth}.rank{rank}.json", "w", encoding="utf-8") as fh:
            json.dump({"framework": "deepspeed", "late_rank": args.gc_rank, "cause": "gc pause",
                       "gc_sleep_ms_per_step": args.gc_sleep_ms if rank == args.gc_rank else 0.0,
                       "pauses_ms": pauses_ms, "micro_steps_per_step": args.accum, "batch": batch,
                       "big_batch_rank": args.big_batch_rank, "micro_ms": micro_ms}, fh)
    print(f"rank {rank} done ({len(kept)} cached records)", flush=True)


if __name__ == "__main__":
    main()
