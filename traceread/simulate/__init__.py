"""Simulated multi-rank GPU training runs with exact ground truth.

``simulate("ddp", out_dir, ranks=8, stragglers=[(5, 3000.0, "gpu")])`` writes one
``rank{r}.pt.trace.json.gz`` per rank (shaped like a torch 2.x NCCL profile on the chosen GPU) and
``truth.json``, and returns the truth. The truth is computed from the schedule the simulator
generated (see :mod:`traceread.simulate.truth` for every definition), never from
``traceread.analysis``, so analyses can be tested against it.
"""

from __future__ import annotations

import json
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from traceread.simulate.scenarios import SCENARIOS, Knobs
from traceread.simulate.scenarios_layout import build_scenario as build

__all__ = ["SCENARIOS", "Knobs", "simulate", "knobs_from", "missing_truth"]


def knobs_from(**knobs: Any) -> Knobs:
    """Build :class:`Knobs` from keyword arguments, rejecting unknown names with one line."""
    names = {f.name for f in fields(Knobs)}
    unknown = sorted(set(knobs) - names)
    if unknown:
        raise ValueError(f"unknown simulate knob(s): {', '.join(unknown)}; known: {', '.join(sorted(names))}")
    return Knobs(**knobs)


def simulate(scenario: str, out_dir: Path | str, **knobs: Any) -> dict[str, Any]:
    """Run ``scenario`` with ``knobs`` (fields of :class:`Knobs`), write the traces and truth.json, return the truth."""
    from traceread.simulate.kineto import T0_NS, write_rank
    from traceread.simulate.memory import write_snapshot
    from traceread.simulate.scenarios import SCENARIO_DEFAULTS
    from traceread.simulate.truth import build_truth

    k = knobs_from(**{**SCENARIO_DEFAULTS.get(scenario, {}), **knobs})
    built = build(scenario, k)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stale = sorted(out.glob("rank*.pt.trace.json.gz"))
    if stale and not (out / "truth.json").is_file():
        raise ValueError(f"{out} already holds traces that simulate did not write (no truth.json); "
                         "choose an empty folder")
    for old in stale:  # a previous simulation: replace it whole
        old.unlink()
    per_host = k.per_node()
    offsets = [int(round(k.skew_us * 1000)) * (r // per_host) for r in range(k.ranks)]
    for old in sorted(out.glob("rank*.memory_snapshot.pickle")):
        old.unlink()
    for ctx in built.sim.ranks:
        write_rank(out / f"rank{ctx.rank}.pt.trace.json.gz", ctx, built.pgs[ctx.rank], k.ranks, per_host,
                   offsets[ctx.rank])
        if ctx.mem is not None:
            write_snapshot(out / f"rank{ctx.rank}.memory_snapshot.pickle", ctx.mem)
    baseline = None
    if k.stragglers:  # what-if: the same job without its stragglers, to price them in step time
        baseline = build(scenario, replace(k, stragglers=[]))
    truth = build_truth(built, T0_NS, offsets, baseline=baseline)
    (out / "truth.json").write_text(json.dumps(truth, indent=1) + "\n")
    return truth


def missing_truth(scenario: str, missing: list[int], **knobs: Any) -> dict[str, Any]:
    """The window ledger of ``scenario`` as the other ranks' traces show it when the traces of the
    ``missing`` ranks are gone (:func:`traceread.simulate.ledger_truth.missing_window_truth`): the same
    simulation as :func:`simulate` with these knobs, nothing written."""
    from traceread.simulate.ledger_truth import missing_window_truth
    from traceread.simulate.scenarios import SCENARIO_DEFAULTS
    from traceread.simulate.truth import step_windows

    k = knobs_from(**{**SCENARIO_DEFAULTS.get(scenario, {}), **knobs})
    built = build(scenario, k)
    windows = {c.rank: step_windows(c) for c in built.sim.ranks}
    return missing_window_truth(built, windows, frozenset(missing))
