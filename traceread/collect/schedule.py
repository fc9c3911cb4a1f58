"""The default profiling window of ``traceread collect``: a steady state, and enough steps to compare.

The profiler starts after the first optimizer step, skips ``wait`` steps, traces ``warmup`` steps it
throws away, then records ``active`` steps. The first steps of a job are not its steady state:

* step 1-2: NCCL communicators are created lazily at the first collective of each process group
  (seconds on many nodes); DDP rebuilds its gradient buckets after the first iteration in the order
  gradients became ready; the CUDA caching allocator grows (cudaMalloc calls, later reused); the
  optimizer allocates its state (Adam moments) at its first step; cuDNN/cuBLAS/Triton autotune each
  new shape (``cudnn.benchmark``); ``torch.compile`` compiles at the first call and recompiles when a
  shape first changes (automatic dynamic shapes), and ``mode="reduce-overhead"`` records its CUDA
  graphs only after warm-up runs;
* data loader workers fill their prefetch queues during the first few batches.

``--wait 5`` skips all of that (steps 2-6 of the job; skipped steps cost nothing), ``--warmup 3``
absorbs the profiler's own start-up (CUPTI activation makes the first traced step slower), and
``--active 10`` records ten steps: enough for a median and to see a slow step that recurs every few
steps (two steps, the old default, cannot tell a slow step from the normal one). Ten steps of a large
transformer are ~20-50 k events per step, tens of MB of JSON per rank before gzip (the H100 sample of
a small transformer: 3.9 k events and 1.2 MB per step, 114 kB gzipped), which the reader streams.
"""

from __future__ import annotations

DEFAULT_WAIT = 5
DEFAULT_WARMUP = 3
DEFAULT_ACTIVE = 10


def steps_needed(wait: int, warmup: int, active: int) -> int:
    """Optimizer steps a job must run for one full trace (the profiler starts after step 1)."""
    return 1 + wait + warmup + active


def first_recorded_step(wait: int, warmup: int) -> int:
    """The optimizer step whose work is the first one recorded (the profiler starts after step 1)."""
    return 1 + wait + warmup + 1


def short_job_active(steps_run: int) -> int:
    """``--active`` that fits a job of ``steps_run`` optimizer steps with ``--wait 0 --warmup 1``."""
    return max(1, steps_run - 2)


def too_short_note(steps_run: int | None, wait: int, warmup: int, active: int) -> str | None:
    """Why no trace was written, when the job ended before the profiler recorded one step (a job
    that ends inside the recorded window keeps the steps it recorded: a partial window)."""
    first = first_recorded_step(wait, warmup)
    if steps_run is None or steps_run >= first:
        return None
    return (f"no trace: the job ran {steps_run} optimizer step(s) and the profiler records from step {first} on "
            f"(--wait {wait} --warmup {warmup}; {steps_needed(wait, warmup, active)} steps for the whole --active "
            f"{active} window); for a short job use e.g. --wait 0 --warmup 1 --active {short_job_active(steps_run)}")
