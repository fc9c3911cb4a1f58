"""Do the recorded steps look like warm-up rather than the job's steady state?

Start-up steps are slow for reasons that vanish later: graph compilation (TorchDynamo, AOTAutograd,
Inductor), Triton autotuning, cuDNN benchmark mode, lazy CUDA/NCCL initialisation, allocator growth.
A report of those steps diagnoses start-up, not training. Definition (docs/cycles.md, "Warm-up"):

* **start-up events**: host events whose name marks compilation, autotuning or one-time
  initialisation (:data:`WARMUP_PATTERNS`; steady-state names such as ``TorchDynamo Cache Lookup``,
  ``Torch-Compiled Region`` or ``CompiledFunction``, which run every step of a compiled model, are
  not among them). Any such event in the window is evidence.
* **slow first step**: the first recorded step takes at least :data:`FIRST_STEP_RATIO` times the
  median of the later steps (needs two steps or more).

Either one makes the window warm-up. The verdict lists its reasons in words with the numbers.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any

#: First step / median of the others at or above which the first step counts as warm-up.
FIRST_STEP_RATIO = 1.5
#: Start-up events shorter than this in total are not evidence: a 0.0 ms ``_lazy_init`` is the
#: "already initialised" check every CUDA call makes, not initialisation.
MIN_STARTUP_US = 1000.0

#: Names of one-time start-up work (compilation, autotuning, lazy initialisation).
WARMUP_PATTERNS = (
    r"\(dynamo_timed\)",  # every dynamo_timed span: compile_inner, backend compile, inductor, autotune
    r"^_compile\.compile_inner", r"^entire_frame_compile", r"^entire_backward_compile", r"^compile_attempt_",
    r"^backend_compile", r"^create_aot_dispatcher_function", r"^aot_trace_joint_graph",
    r"compile_fx", r"inductor_compile", r"^async_compile", r"[Aa]utotun", r"benchmark_all_configs",
    r"^cudnnFind", r"cudnn.*[Bb]enchmark", r"^ncclCommInit", r"^init_process_group", r"lazy_init",
)
_WARMUP_RE = re.compile("|".join(f"(?:{p})" for p in WARMUP_PATTERNS))


@functools.lru_cache(maxsize=65536)  # a trace repeats a few thousand names tens of thousands of times
def warmup_event(name: str) -> bool:
    """Whether a host event name marks one-time start-up work."""
    return bool(_WARMUP_RE.search(name))


#: Categories that are never start-up *host* work: device-side events, launches and their mirrors
#: (the peek of a raw trace and the summary of a parsed one skip the same ones).
NOT_STARTUP_CATS = frozenset({"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset",
                              "gpu_user_annotation", "cuda_runtime", "Runtime", "cuda_driver", "cuda_sync",
                              "ac2g", "async"})


def warm_names_of(host: Any) -> dict[str, float]:
    """Start-up event name -> total µs in one rank's host table (complete events only): the same
    evidence the cycle peek gathers, computed in the map so the driver never reads a rank again."""
    import polars as pl

    if host is None or not host.height:
        return {}
    spans = host.select("cat", "name", "dur").filter(pl.col("dur").is_not_null() & ~pl.col("cat").is_in(list(NOT_STARTUP_CATS)))
    names = [n for n in spans["name"].drop_nulls().unique().to_list() if warmup_event(n)]
    if not names:
        return {}
    totals = spans.filter(pl.col("name").is_in(names)).group_by("name").agg(pl.col("dur").sum())
    return {str(n): float(d) for n, d in totals.iter_rows()}


@dataclass
class Verdict:
    """``is_warmup`` and why; ``first_step_ratio`` and ``startup_us`` (the longest start-up span) are
    the numbers behind it."""

    is_warmup: bool
    reasons: list[str] = field(default_factory=list)
    first_step_ratio: float | None = None
    startup_us: float = 0.0
    startup_events: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {"warmup": self.is_warmup, "reasons": self.reasons, "first_step_ratio": self.first_step_ratio,
                "startup_us": self.startup_us, "startup_events": self.startup_events}


def judge(step_us: Sequence[float], startup: Mapping[str, float]) -> Verdict:
    """Verdict for one window: ``step_us`` its step durations in step order, ``startup`` the
    start-up events found in it (name -> total µs)."""
    reasons: list[str] = []
    ratio = None
    steps = [float(s) for s in step_us if s and s > 0]
    if len(steps) >= 2:
        rest = median(steps[1:])
        ratio = steps[0] / rest if rest > 0 else None
        if ratio is not None and ratio >= FIRST_STEP_RATIO:
            reasons.append(f"first recorded step takes {ratio:.1f}x the median of the others "
                           f"({steps[0] / 1e3:.1f} ms vs {rest / 1e3:.1f} ms)")
    startup = {n: d for n, d in startup.items() if d >= MIN_STARTUP_US}
    names = sorted(startup, key=lambda n: -startup[n])
    longest = float(max(startup.values(), default=0.0))  # spans nest (compile_inner holds the rest): no sum
    if names:
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        reasons.append(f"compilation/autotuning/initialisation in the window (longest span {longest / 1e3:.1f} ms): "
                       f"{shown}")
    return Verdict(bool(reasons), reasons, ratio, longest, names[:10])


def report_step_us(ranks: Sequence[Mapping[str, Any]]) -> list[float]:
    """The job's step durations in step order: per step number, the median over ranks. Serving
    iterations are compared only with iterations of the first one's kind (a prefill is longer than
    a decode by nature, not because it warms up)."""
    by_step: dict[int, list[float]] = {}
    kind: dict[int, object] = {}
    for r in ranks:
        for s in r.get("steps") or []:
            d = s.get("duration_us")
            if d is not None and s.get("step") is not None:
                by_step.setdefault(int(s["step"]), []).append(float(d))
                kind.setdefault(int(s["step"]), s.get("iteration"))
    first = kind[min(kind)] if kind else None
    return [median(v) for k, v in sorted(by_step.items()) if kind.get(k) == first]
