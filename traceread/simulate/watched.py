"""A watched run folder with exact truth: a baseline window, a step series, a capture of a slow stretch.

:func:`write_watched_run` lays out what ``traceread collect`` with its watch writes (docs/watch.md):
``traces/`` (the default window, a healthy simulated job), ``captures/capture1/`` (the same job
simulated with one rank slowed, at the captured step numbers) with its ``trigger.json``, and
``progress/rank{R}.steps`` for every step of the job. The series is written from the two
simulations' own step times (the healthy step before and after the stretch, the slow step inside
it, a small deterministic jitter), so the truth — which rank, which steps, how much per step and
in all — is what was written, never what an analysis found.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from statistics import fmean
from typing import Any

from traceread.simulate.kineto import BASE_TIME_NS


def _mean_step_us(truth: dict[str, Any]) -> float:
    return fmean(float(s["duration_us"]) for r in truth["ranks"].values() for s in r["steps"])


def write_watched_run(out: Path | str, *, ranks: int = 2, total_steps: int = 320, slow: tuple[int, int] = (200, 239),
                      slow_rank: int = 1, delay_us: float = 40_000.0, cause: str = "host", baseline_first: int = 8,
                      capture_steps: int = 10, detect_after: int = 4, jitter: float = 0.01, seed: int = 0,
                      **knobs: Any) -> dict[str, Any]:
    """Write the run folder; returns its truth (module docstring). ``knobs`` go to both simulations."""
    from traceread.simulate import simulate

    run = Path(out)
    small = {"layers": 2, "hidden": 1024, "heads": 16, "seq_len": 512, **knobs}
    base = simulate("ddp", run / "traces", ranks=ranks, steps=capture_steps, first_step=baseline_first, **small)
    first_cap = slow[0] + detect_after
    cap_dir = run / "captures" / "capture1"
    capt = simulate("ddp", cap_dir, ranks=ranks, steps=capture_steps, first_step=first_cap,
                    stragglers=[(slow_rank, delay_us, cause)], **small)
    base_us, slow_us = _mean_step_us(base), _mean_step_us(capt)
    rng = random.Random(seed)
    t = BASE_TIME_NS + 10**12
    ends: list[int] = []
    lost = 0.0
    for step in range(1, total_steps + 1):
        us = (slow_us if slow[0] <= step <= slow[1] else base_us) * (1.0 + rng.uniform(-jitter, jitter))
        if slow[0] <= step <= slow[1]:
            lost += us - base_us
        t += int(us * 1000)
        ends.append(t)
    (run / "progress").mkdir(parents=True, exist_ok=True)
    for r in range(ranks):
        lines = "".join(f"{s} {e - (ranks - 1 - r) * 3000}\n" for s, e in zip(range(1, total_steps + 1), ends))
        (run / "progress" / f"rank{r}.steps").write_text(lines, encoding="ascii")
    trigger = {"id": 1, "kind": "rank_late" if ranks > 1 else "job_slowdown", "detected_at_step": first_cap - 1,
               "since_step": slow[0], "ranks": [slow_rank], "baseline_step_ms": base_us / 1e3,
               "observed_step_ms": slow_us / 1e3, "factor": slow_us / base_us,
               "steps": [first_cap, first_cap + capture_steps - 1], "wall_time": None, "requested_by": "watch",
               "stacks": None, "fr": None, "note": "simulated"}
    (cap_dir / "trigger.json").write_text(json.dumps(trigger, indent=1), encoding="utf-8")
    truth = {"ranks": ranks, "total_steps": total_steps, "slow_steps": list(slow), "slow_rank": slow_rank,
             "cause": cause, "baseline_step_us": base_us, "slow_step_us": slow_us, "excess_us": slow_us - base_us,
             "lost_us": lost, "capture_steps": trigger["steps"], "baseline_steps": [baseline_first,
                                                                                   baseline_first + capture_steps - 1],
             "host_span": "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__" if cause == "host" else None}
    (run / "truth.json").write_text(json.dumps(truth, indent=1), encoding="utf-8")
    return truth
