"""Forward, backward and optimizer inside a host step, from the operators the profiler recorded.

torch marks the two phases it knows itself. The autograd engine records every backward node with
``Fwd thread id`` = the id (1, 2, ...) of the thread that ran its forward, while forward operators
carry 0 or nothing (torch 1.8 to 2.x alike); current versions also name the node
``autograd::engine::evaluate_function: <Node>``. ``torch.optim`` wraps each step in
``Optimizer.step#<Class>.step``. Per step window:

* backward = first backward node start .. last backward node end (on whichever thread ran it);
* optimizer = first ``Optimizer.step#`` start .. last one's end;
* forward = step start .. the first of backward start / optimizer start / step end.

What lies outside the three (data loading before the forward was already counted as forward: the
step opens with it; code between backward and the optimizer) is ``other``. A step with no backward
node (inference) is all forward up to an optimizer step, if any.
"""

from __future__ import annotations

import polars as pl

BACKWARD_PREFIX = "autograd::engine::evaluate_function"
OPTIMIZER_PREFIX = "Optimizer.step#"
PHASES = ("forward", "backward", "optimizer")


def step_phases(host: pl.DataFrame, start: float, end: float) -> list[dict[str, float | str]]:
    """``[{"name", "start_us", "end_us"}]`` of one step window [start, end), on the host clock, in
    time order; phases the step lacks are left out."""
    inside = host.filter((pl.col("ts") >= start) & (pl.col("ts") < end)).select("name", "ts", "end", "fwd_tid")
    names = inside["name"].fill_null("")
    bwd = inside.filter(names.str.starts_with(BACKWARD_PREFIX) | (inside["fwd_tid"].fill_null(0) > 0))
    opt = inside.filter(names.str.starts_with(OPTIMIZER_PREFIX))
    out: list[dict[str, float | str]] = []
    cut = end
    if bwd.height:
        b0, b1 = float(bwd["ts"].min()), min(float(bwd["end"].max()), end)  # type: ignore[arg-type]
        out.append({"name": "backward", "start_us": b0, "end_us": b1})
        cut = b0
    if opt.height:
        o0, o1 = float(opt["ts"].min()), min(float(opt["end"].max()), end)  # type: ignore[arg-type]
        out.append({"name": "optimizer", "start_us": o0, "end_us": o1})
        cut = min(cut, o0)
    if cut > start:
        out.append({"name": "forward", "start_us": start, "end_us": cut})
    out.sort(key=lambda p: float(p["start_us"]))
    return out


def phase_at(phases: list[dict[str, float | str]], t: float) -> str:
    """The phase holding host time ``t`` (the optimizer wins over backward where they overlap), else
    ``other``."""
    hit = [p["name"] for p in phases if float(p["start_us"]) <= t < float(p["end_us"])]
    for name in ("optimizer", "backward", "forward"):
        if name in hit:
            return name
    return "other"
