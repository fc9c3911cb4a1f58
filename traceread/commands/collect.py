"""``traceread collect``: wrap a training command, unchanged, and collect traces, logs and hang dumps."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from traceread.collect.schedule import DEFAULT_ACTIVE, DEFAULT_WAIT, DEFAULT_WARMUP
from traceread.errors import TraceReadError


def _timeout(value: str | None) -> float | None:
    if value is None or value.strip().lower() in ("", "auto"):
        return None
    try:
        out = float(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a number of seconds or 'auto'") from None
    if out <= 0:
        raise click.BadParameter("must be > 0")
    return out


def _ranks(value: str) -> str:
    value = value.strip()
    if value in ("all", "*"):
        return "all"
    try:
        return ",".join(str(int(r)) for r in value.split(",") if r.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r}: use 'all' or a comma list such as 0,3") from None


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False,
                                 "help_option_names": ["-h", "--help"]})
@click.option("-o", "--output", "run_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="RUN folder to write (created; shared folder with several hosts -> RUN/<host>/).")
@click.option("--wait", default=DEFAULT_WAIT, show_default=True, type=click.IntRange(0),
              help="Profiler schedule: steps skipped after the first optimizer step (start-up: lazy NCCL init, "
                   "DDP bucket rebuild, allocator growth, torch.compile/autotuning, optimizer state).")
@click.option("--warmup", default=DEFAULT_WARMUP, show_default=True, type=click.IntRange(0),
              help="Profiler schedule: steps traced but discarded (profiler start-up cost).")
@click.option("--active", default=DEFAULT_ACTIVE, show_default=True, type=click.IntRange(1),
              help="Profiler schedule: steps recorded (enough for slow-step statistics): optimizer steps "
                   "2 + wait + warmup on (10-19 by default). A job that ends inside the window keeps the "
                   "steps it recorded (a partial window, marked so).")
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(1),
              help="Profiler cycles; with more than 1, each is kept in traces/cycle{C}/ (see --max-cycles).")
@click.option("--every", default=0, show_default=True, type=click.IntRange(0), metavar="N",
              help="Periodic mode for long jobs: record --active steps every N steps, for the whole job "
                   "(0: off). Traces in traces/cycle{C}/.")
@click.option("--max-cycles", default=10, show_default=True, type=click.IntRange(1),
              help="Keep at most this many cycles on disk per rank: the first and the latest.")
@click.option("--ranks", default="all", show_default=True, help="Ranks to profile: 'all' or e.g. 0,3.")
@click.option("--record-shapes/--no-record-shapes", default=True, show_default=True)
@click.option("--with-stack/--no-with-stack", default=False, show_default=True, help="Python stacks per op (slower).")
@click.option("--profile-memory/--no-profile-memory", default=False, show_default=True,
              help="Record every allocation and free in the window ([memory] events: peak, headroom, leaks).")
@click.option("--memory-snapshot", is_flag=True,
              help="Also write a memory snapshot (torch.cuda.memory._dump_snapshot format) to RUN/memory/ at the end "
                   "of the window and on an out-of-memory error; implies --profile-memory (CPU-only jobs: --with-stack too).")
@click.option("--no-profile", is_flag=True, help="Keep hang watchdog/logs/FR but do not run the profiler.")
@click.option("--no-inject", is_flag=True, help="Do not inject into ranks (env + logs only; no traces, no dumps).")
@click.option("--hang-timeout", default=None, metavar="SECONDS|auto",
              help="No optimizer step on any rank for this long = hang. Default auto: "
                   "max(--hang-floor, --hang-factor x median step time).")
@click.option("--hang-floor", default=300.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Lower bound of the automatic hang timeout, seconds.")
@click.option("--hang-factor", default=10.0, show_default=True, type=click.FloatRange(min=1.0),
              help="Automatic hang timeout in median step times.")
@click.option("--startup-timeout", default=None, type=click.FloatRange(min=0.1),
              help="Also call it a hang when no rank finishes its FIRST step within this many seconds.")
@click.option("--on-hang", type=click.Choice(["dump", "kill"]), default="dump", show_default=True,
              help="dump: write stacks + Flight Recorder and keep running; kill: then terminate, exit non-zero.")
@click.option("--dump-grace", default=10.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Seconds to wait for ranks to answer a dump request.")
@click.option("--layout", type=click.Choice(["auto", "flat", "per-host"]), default="auto", show_default=True,
              help="per-host writes RUN/<host>/...; auto picks it under multi-node srun/mpirun.")
@click.option("--fr-buffer", default=20000, show_default=True, type=click.IntRange(0),
              help="Flight Recorder entries (TORCH_FR_BUFFER_SIZE) unless already set.")
@click.option("--overwrite", is_flag=True, help="Replace an earlier run collected in the same folder.")
@click.option("--no-watch", is_flag=True,
              help="Do not watch step times for slowdowns (captures asked by `traceread snap` still work).")
@click.option("--watch-factor", default=1.5, show_default=True, type=click.FloatRange(min=1.05),
              help="A step is slow when it takes at least this many times the baseline median (and is beyond "
                   "--watch-mads of the run's own noise).")
@click.option("--watch-steps", default=5, show_default=True, type=click.IntRange(1),
              help="... for this many steps in a row, one normal step in between tolerated (job-wide "
                   "slowdown, or one rank late).")
@click.option("--watch-min-time", default=1.0, show_default=True, type=click.FloatRange(min=0.0), metavar="SECONDS",
              help="... and the slow stretch lasts at least this long (a sub-second burst is no slowdown).")
@click.option("--watch-mads", default=3.0, show_default=True, type=click.FloatRange(min=0.0),
              help="Noise margin: median + this many robust standard deviations (1.4826 x MAD).")
@click.option("--watch-stall", default=10.0, show_default=True, type=click.FloatRange(min=0.1), metavar="SECONDS",
              help="A stall: no step anywhere for max(this, 10 x median step).")
@click.option("--capture-steps", default=10, show_default=True, type=click.IntRange(1, 200), metavar="K",
              help="Steps recorded on every rank when the watch catches a slowdown.")
@click.option("--max-captures", default=5, show_default=True, type=click.IntRange(0),
              help="Captures the watch may take in the whole run (traceread snap not counted).")
@click.option("--watch-cooldown", default=60.0, show_default=True, type=click.FloatRange(min=0.0), metavar="SECONDS",
              help="Minimum time between two captures of the watch.")
@click.option("--watch-max-disk", default=2048.0, show_default=True, type=click.FloatRange(min=0.0), metavar="MB",
              help="The watch stops capturing once RUN/captures holds this much.")
@click.option("--watch-dump/--no-watch-dump", default=True, show_default=True,
              help="With each capture of the watch, stacks + Flight Recorder of every rank at the moment of detection.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def collect(run_dir: Path, wait: int, warmup: int, active: int, repeat: int, every: int, max_cycles: int, ranks: str,
            record_shapes: bool, with_stack: bool, profile_memory: bool, memory_snapshot: bool, no_profile: bool,
            no_inject: bool, hang_timeout: str | None, hang_floor: float, hang_factor: float, startup_timeout: float | None,
            on_hang: str,
            dump_grace: float, layout: str, fr_buffer: int, overwrite: bool, no_watch: bool, watch_factor: float,
            watch_steps: int, watch_min_time: float, watch_mads: float, watch_stall: float, capture_steps: int, max_captures: int,
            watch_cooldown: float, watch_max_disk: float, watch_dump: bool, command: tuple[str, ...]) -> None:
    """Run COMMAND unchanged and collect per-rank traces, NCCL logs, Flight Recorder and hang dumps.

    Nothing in the training script changes: a sitecustomize on PYTHONPATH starts torch.profiler in
    each rank (driven by optimizer steps), records progress for the hang watchdog, and answers dump
    requests. The watch (on by default) records the next --capture-steps steps of every rank
    into RUN/captures/ when the job slows down (docs/watch.md).
    Exits with COMMAND's exit code, and ends with a summary: what was collected where,
    and the command to run next.

    \b
    Examples:
      traceread collect -o runs/exp1 -- torchrun --nproc-per-node 8 train.py --lr 3e-4
      traceread collect -o runs/exp1 --wait 20 --active 5 --ranks 0,7 -- python -m torch.distributed.run ...
      traceread collect -o runs/short --wait 0 --warmup 1 --active 3 -- torchrun ... train.py --steps 6
      traceread collect -o runs/hang --hang-timeout 120 --on-hang kill -- torchrun ... train.py
      traceread collect -o runs/long --every 1000 --max-cycles 6 -- torchrun ... train.py
      traceread collect -o runs/mem --memory-snapshot -- torchrun ... train.py   # memory events + snapshots
      srun -N4 traceread collect -o /shared/runs/exp2 -- torchrun --nnodes 4 ... train.py
      kill -USR1 <traceread pid>      # dump stacks + Flight Recorder of every rank now
      traceread collect -o runs/w --watch-factor 2 --watch-steps 10 --capture-steps 20 -- torchrun ... train.py
      traceread collect -o runs/quiet --no-watch -- torchrun ... train.py
      traceread snap runs/exp1 ; traceread watch runs/exp1   # from another terminal, while it runs
      traceread report runs/exp1 ; traceread hang runs/hang
    """
    from traceread.collect.launcher import CollectOptions, run_collect
    from traceread.collect.watch import WatchOptions

    cmd = list(command)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        raise click.UsageError("give the command to run after --, e.g. traceread collect -o RUN -- torchrun ...")
    if run_dir.exists() and not run_dir.is_dir():
        raise TraceReadError("exists and is not a folder", str(run_dir))
    if every and every < warmup + active:
        raise click.BadParameter(f"--every {every} is shorter than --warmup + --active ({warmup + active})",
                                 param_hint="--every")
    opts = CollectOptions(
        run_dir=run_dir, command=cmd, wait=wait, warmup=warmup, active=active, repeat=repeat, ranks=_ranks(ranks),
        every=every, max_cycles=max_cycles,
        record_shapes=record_shapes, with_stack=with_stack, profile_memory=profile_memory or memory_snapshot,
        memory_snapshot=memory_snapshot, profile=not no_profile,
        inject=not no_inject, hang_timeout_s=_timeout(hang_timeout), hang_floor_s=hang_floor,
        hang_factor=hang_factor, startup_timeout_s=startup_timeout, on_hang=on_hang, dump_grace_s=dump_grace,
        layout=layout, fr_buffer=fr_buffer, overwrite=overwrite,
        watch=WatchOptions(enabled=not no_watch, factor=watch_factor, steps=watch_steps, min_slow_s=watch_min_time,
                           mads=watch_mads,
                           stall_min_s=watch_stall, capture_steps=capture_steps, max_captures=max_captures,
                           cooldown_s=watch_cooldown, max_disk_mb=watch_max_disk, dump=watch_dump),
    )
    sys.exit(run_collect(opts))
