"""``traceread simulate``: write simulated multi-rank traces with exact ground truth."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import click

from traceread.errors import TraceReadError
from traceread.textsafe import clean

T = TypeVar("T")

SCENARIO_NAMES = ("ddp", "tp", "pp", "slow_steps", "3d", "fsdp_exposed", "moe", "custom_allreduce", "host_bound",
                  "gloo_host")


def _straggler(value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a rank number") from None


def _slow_step(value: str) -> tuple[int, str, float]:
    parts = value.split(":")
    if len(parts) != 3:
        raise click.BadParameter(f"{value!r}: expected STEP:CAUSE:US, e.g. 11:dataloader:30000")
    try:
        return int(parts[0]), parts[1], float(parts[2])
    except ValueError:
        raise click.BadParameter(f"{value!r}: STEP and US must be numbers") from None


@click.command("simulate", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("scenario", type=click.Choice(SCENARIO_NAMES))
@click.option("-o", "--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Folder to write rank{r}.pt.trace.json.gz and truth.json into.")
@click.option("--ranks", default=8, show_default=True, help="World size (pp: number of stages).")
@click.option("--steps", default=3, show_default=True, help="Profiled steps (ProfilerStep#10, #11, ...).")
@click.option("--device", default="H100", show_default=True, type=click.Choice(["H100", "A100", "B200"],
              case_sensitive=False), help="GPU model written into deviceProperties and used for timings.")
@click.option("--seed", default=0, show_default=True, help="Seed of all jitter (same seed, same bytes).")
@click.option("--jitter", default=0.01, show_default=True, help="Relative s.d. of compute-kernel durations.")
@click.option("--layers", default=4, show_default=True, help="Decoder blocks in the model.")
@click.option("--hidden", default=4096, show_default=True, help="Hidden size.")
@click.option("--heads", default=32, show_default=True, help="Attention heads.")
@click.option("--seq-len", default=2048, show_default=True, help="Sequence length.")
@click.option("--batch", default=2, show_default=True, help="Sequences per rank and step (pp: per microbatch).")
@click.option("--buckets", default=4, show_default=True, help="ddp: gradient buckets (all-reduces) per step.")
@click.option("--comm", default="allreduce", show_default=True, type=click.Choice(["allreduce", "fsdp"]),
              help="ddp: bucketed all-reduce, or FSDP-style all-gather + reduce-scatter per layer.")
@click.option("--straggler", "straggler_ranks", multiple=True, callback=lambda c, p, v: [_straggler(x) for x in v],
              help="Rank that straggles (repeatable).")
@click.option("--straggler-delay-us", "straggler_delays", multiple=True, type=float,
              help="Delay per step of each --straggler (one value, or one per straggler). Default 3000.")
@click.option("--straggler-cause", "straggler_causes", multiple=True, type=click.Choice(["gpu", "host"]),
              help="gpu: slower compute kernels; host: late launches (one value, or one per straggler). Default gpu.")
@click.option("--tp", default=2, show_default=True, help="tp: tensor-parallel group size.")
@click.option("--microbatches", default=4, show_default=True, help="pp: microbatches per step.")
@click.option("--schedule", default="1f1b", show_default=True, type=click.Choice(["gpipe", "1f1b", "interleaved"]),
              help="pp: pipeline schedule (interleaved = Megatron interleaved 1F1B).")
@click.option("--chunks", default=2, show_default=True, help="pp interleaved: model chunks per stage.")
@click.option("--p2p-us", default=None, type=float, help="pp: fixed send/recv transfer time (0 = free transfers).")
@click.option("--stage-factors", default=None, help="pp: comma-separated compute-time factor per stage, e.g. 1,1,1.4,1.")
@click.option("--no-optimizer", is_flag=True, help="Leave out the optimizer step.")
@click.option("--slow-step", "slow_steps", multiple=True, callback=lambda c, p, v: [_slow_step(x) for x in v],
              help="STEP:CAUSE:US with CAUSE dataloader|gc|checkpoint (repeatable).")
@click.option("--hosts", default=1, show_default=True, help="Hosts the ranks are spread over (consecutive blocks).")
@click.option("--skew-us", default=0.0, show_default=True, help="Clock offset of host h = h x SKEW µs.")
@click.option("--gpus-per-node", default=None, type=int,
              help="Ranks per node (consecutive); 3d default 6, so one TP group spans two nodes.")
@click.option("--pp", default=2, show_default=True, help="3d: pipeline stages (dp = ranks / (tp x pp)).")
@click.option("--no-prefetch", "prefetch", flag_value=False, default=True,
              help="ddp --comm fsdp: no all-gather prefetch (fsdp_exposed sets it).")
@click.option("--hot-rank", default=None, type=int, help="moe: the overloaded expert rank (default 3).")
@click.option("--hot-factor", default=3.0, show_default=True, help="moe: tokens of the hot expert x fair share.")
@click.option("--allreduce-kernel", default="nccl", show_default=True, type=click.Choice(["nccl", "multimem", "vllm"]),
              help="tp: TP all-reduce kernel (custom_allreduce default: multimem).")
@click.option("--loader-us", default=0.0, show_default=True,
              help="Extra data-loader time on the host every step (host_bound default 6000).")
@click.option("--memory", is_flag=True, default=False,
              help="ddp family: record [memory] events (profile_memory=True) with the training state allocated "
                   "before the window, and write rank{r}.memory_snapshot.pickle (torch's snapshot format).")
@click.option("--leak-bytes", default=0, show_default=True, type=click.IntRange(0),
              help="With --memory: bytes every step keeps alive for good (like losses.append(loss)).")
@click.option("--activation-factor", "act_factors", multiple=True,
              callback=lambda c, p, v: [_act_factor(x) for x in v],
              help="With --memory: RANK:FACTOR, that rank's activations are FACTOR x larger (repeatable).")
@click.option("--host-jitter-us", default=0.0, show_default=True,
              help="Every rank and step: a random host delay up to this (noise, no straggler).")
@click.pass_context
def simulate(ctx: click.Context, scenario: str, out_dir: Path, straggler_ranks: list[int], straggler_delays: tuple[float, ...],
             straggler_causes: tuple[str, ...], stage_factors: str | None, no_optimizer: bool,
             slow_steps: list[tuple[int, str, float]], device: str, **knobs: Any) -> None:
    """Write a simulated multi-rank GPU training run with exact ground truth.

    Writes one torch-2.x-shaped Kineto trace per rank (rank{r}.pt.trace.json.gz: NCCL kernels with
    record_param_comms metadata, cpu_ops with shapes, occupancy fields, deviceProperties of the GPU)
    and truth.json with the numbers an analysis must find (time breakdown, SM efficiency, MFU,
    per-collective waits, straggler blame, pipeline bubble, slow steps, clock offsets).

    \b
    Scenarios: ddp, tp, pp, slow_steps, 3d, fsdp_exposed, moe, custom_allreduce, host_bound,
    gloo_host (each has its own defaults; options you give override them).
    \b
    Examples:
      traceread simulate ddp -o /tmp/ddp --straggler 5 --straggler-delay-us 3000
      traceread simulate ddp -o /tmp/host --straggler 2 --straggler-cause host --device A100
      traceread simulate ddp -o /tmp/fsdp --comm fsdp --ranks 4
      traceread simulate tp -o /tmp/tp --ranks 8 --tp 4
      traceread simulate pp -o /tmp/pp --ranks 4 --microbatches 8 --schedule gpipe --p2p-us 0
      traceread simulate pp -o /tmp/ppi --ranks 4 --microbatches 8 --schedule interleaved --chunks 2
      traceread simulate slow_steps -o /tmp/slow --steps 5 --slow-step 11:dataloader:30000
      traceread simulate ddp -o /tmp/skew --hosts 2 --skew-us 800
      traceread simulate 3d -o /tmp/3d                 # DP2 x TP4 x PP2, a TP group across 2 nodes
      traceread simulate moe -o /tmp/moe --hot-rank 5 --hot-factor 4
      traceread simulate custom_allreduce -o /tmp/car --allreduce-kernel vllm
      traceread simulate host_bound -o /tmp/hb --loader-us 8000
      traceread simulate ddp -o /tmp/mem --ranks 4 --memory --leak-bytes 67108864 --activation-factor 2:1.5
      traceread simulate ddp -o /tmp/zero3 --ranks 4 --comm fsdp --memory   # ZeRO-3 memory
      traceread simulate gloo_host -o /tmp/gloo --straggler 1 --straggler-cause host
      traceread simulate ddp -o /tmp/noise --steps 8 --host-jitter-us 3000   # no straggler
      traceread report /tmp/ddp
    """
    from traceread.simulate import simulate as run

    # only the options the user gave: a scenario's own defaults fill the rest
    knobs = {n: v for n, v in knobs.items()
             if ctx.get_parameter_source(n) is not click.core.ParameterSource.DEFAULT}

    stragglers = []
    for i, r in enumerate(straggler_ranks):
        delay = _pick(straggler_delays, i, 3000.0, "--straggler-delay-us")
        cause = _pick(straggler_causes, i, "gpu", "--straggler-cause")
        stragglers.append((r, float(delay), str(cause)))
    factors = None
    if stage_factors:
        try:
            factors = [float(x) for x in stage_factors.split(",")]
        except ValueError:
            raise click.BadParameter(f"{stage_factors!r}: expected numbers separated by commas",
                                     param_hint="--stage-factors") from None
    if scenario == "slow_steps" and not slow_steps:
        steps = int(knobs.get("steps", 3))
        slow_steps = [(10 + (1 if steps > 1 else 0), "dataloader", 30000.0)]  # steps are numbered from 10
    try:
        truth = run(scenario, out_dir, device=device.upper(), stragglers=stragglers, stage_factors=factors,
                    optimizer=not no_optimizer, slow_steps=slow_steps, **knobs)
    except ValueError as exc:
        raise TraceReadError(str(exc)) from None
    from statistics import fmean

    from traceread.fmt import ms

    r0 = truth["ranks"]["0"]
    click.echo(f"wrote {truth['world_size']} ranks x {len(truth['steps'])} steps of '{scenario}' on "
               f"{truth['device']} to {clean(str(out_dir))}/ (truth.json)")

    def mean(key: str) -> float:
        return fmean(float(s.get(key) or 0.0) for s in r0["steps"])

    # every number per step (means over the steps of rank 0), so they add up to the step beside them
    click.echo(f"rank 0, mean per step: step {ms(mean('duration_us'), 2)} = compute {ms(mean('compute_us'), 2)} + "
               f"exposed comm {ms(mean('exposed_comm_us'), 2)} + exposed memcpy {ms(mean('exposed_memcpy_us'), 2)} + "
               f"idle {ms(mean('idle_us'), 2)}; MFU {r0['mfu_pct']:.1f}%")
    for st in truth["stragglers"]:
        click.echo(f"straggler rank {st['rank']} ({st['cause']}): others wait {ms(st['blame_us_per_step'], 2)} per step")
    if truth["pipeline"]:
        p = truth["pipeline"]
        click.echo(f"pipeline bubble {p['bubble_pct']:.2f}% (theory {p['theory_bubble_pct']:.2f}%)")
    mt = truth.get("memory")
    if mt:
        click.echo(f"memory: peak {mt['peak_allocated_bytes'] / 1e9:.2f} GB allocated on rank {mt['peak_rank']} "
                   f"(median {mt['median_peak_allocated_bytes'] / 1e9:.2f} GB)"
                   + (f", leaking on ranks {mt['leak_ranks']}" if mt["leak_ranks"] else ""))
    led = truth["ledger"]
    top = sorted(led["parts"], key=lambda x: -x["us"])[:3]
    parts = ", ".join(f"{x['category']}{':' + x['role'] if x['role'] else ''} rank {x['rank']} "
                      f"{ms(x['us'], 2)}" for x in top)
    click.echo(f"job ledger of step {led['step']} ({ms(led['step_us'], 2)}, critical rank {led['critical_rank']}): {parts}")


def _act_factor(value: str) -> tuple[int, float]:
    rank, sep, factor = value.partition(":")
    try:
        if not sep:
            raise ValueError
        return int(rank), float(factor)
    except ValueError:
        raise click.BadParameter(f"{value!r}: expected RANK:FACTOR, e.g. 3:1.5") from None


def _pick(values: tuple[T, ...], i: int, default: T, flag: str) -> T:
    if not values:
        return default
    if len(values) == 1:
        return values[0]
    if i >= len(values):
        raise click.BadParameter("give one value, or one per --straggler", param_hint=flag)
    return values[i]
