"""How much shorter a step would be if a straggler were not late: its delays counted once.

``blame_us_per_step`` (:mod:`stragglers`) charges a late rank the full gap at every collective it was
last to join. That is the time the others spent waiting for it, not what the step would gain: when
the rank's GPU keeps computing while a collective runs (DDP gradient buckets overlapping backward),
its lateness is not reset by that collective, and the same delay makes it late again at the next
bucket. Summing the gaps counts the first delay once per bucket (8.7 ms/step of blame for a
3 ms/step slowdown on an 8-rank, 4-bucket DDP job).

Definition (µs). Per instance ``c`` the *reference* rank is the latest on-time arrival (the one the
gap is measured from). ``c⁻`` is the reference rank's previous synchronising collective in the same
step. The reference arrival **carries** the delay of ``c⁻`` when it could not have started before
``c⁻`` ended: it started within ``ε`` of ``c⁻``'s end (same stream, queued behind it), or its GPU did
not compute for at least :data:`OVERLAP_FRACTION` of ``c⁻`` (its work waited for the result, as
after a tensor-parallel all-reduce). For each *direct* late arrival of rank r (:mod:`stragglers`:
not propagated from another rank) the job's accumulated delay due to r is

    Δ_r(c) = blame_r(c) + (Δ_r(c⁻) if the reference carries c⁻ else 0)

(when r was not late at ``c⁻`` — e.g. ``c⁻`` is another group's collective — r's most recent Δ in
the step stands in for Δ_r(c⁻))
— an overlapped rank's gap already contains its earlier lateness, so nothing is added; a blocking
or queued collective passed the earlier delay on to everyone, so it is added. The step would end
earlier by the largest Δ_r in it; ``impact_us_per_step`` = Σ over steps of max Δ_r ÷ steps analysed.
In DDP it is the lateness at the last bucket, in tensor parallelism the sum of fresh per-collective
delays. Like blame, it assumes nobody else would then be last; the report keeps the smaller of this
and :mod:`stragglers`' direct sum (both are upper bounds on the saving).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import polars as pl

OVERLAP_FRACTION = 0.5


def _reference(timing: pl.DataFrame, eps: float) -> dict[int, tuple[bool, int | None]]:
    """instance -> (reference arrival carries the previous collective's delay, that instance)."""
    t = timing.select("instance", "rank", "step", "ts", "end", "busy_at_start", "busy_at_end").sort(["rank", "ts"])
    dur = (pl.col("end") - pl.col("ts")).clip(lower_bound=0.0)
    t = t.with_columns(
        ((pl.col("busy_at_end") - pl.col("busy_at_start")) >= OVERLAP_FRACTION * dur).alias("_ovl"),
    ).with_columns(
        pl.col("instance").shift(1).over("rank").alias("prev_instance"),
        pl.col("step").shift(1).over("rank").alias("prev_step"),
        pl.col("end").shift(1).over("rank").alias("prev_end"),
        pl.col("_ovl").shift(1).over("rank").alias("prev_ovl"),
        pl.col("ts").max().over("instance").alias("_last"),
    )
    ref = (t.filter(pl.col("ts") < pl.col("_last") - eps)
           .sort("ts").group_by("instance").agg(pl.all().last()))
    out: dict[int, tuple[bool, int | None]] = {}
    for row in ref.iter_rows(named=True):
        same_step = row["prev_instance"] is not None and row["prev_step"] == row["step"]
        queued = row["prev_end"] is not None and row["ts"] - row["prev_end"] <= eps
        waited = row["prev_ovl"] is False  # null (no busy data) is not evidence of waiting
        out[int(row["instance"])] = (bool(same_step and (queued or waited)),
                                     int(row["prev_instance"]) if same_step else None)
    return out


def step_impact_per_step(records: pl.DataFrame, timing: pl.DataFrame, n_steps: int, eps: float) -> dict[int, float]:
    """Per late rank: Σ over steps of the largest Δ_r (module docstring) ÷ ``n_steps``.

    ``records``: :attr:`stragglers.StragglerResult.records`; ``timing``: :func:`comm_perf.instance_timing`
    over the same synchronising collectives; ``eps``: the clock uncertainty used for the records.
    """
    if records.height == 0 or timing.height == 0:
        return {}
    ref = _reference(timing, eps)
    last = timing.group_by("instance").agg(pl.col("ts").max().alias("_last"))
    rec = records.filter(pl.col("direct")).join(last, on="instance", how="left").sort("_last")
    delta: dict[tuple[int, int], float] = {}
    latest: dict[tuple[int, int], float] = {}  # (rank, step) -> most recent Δ
    worst: dict[tuple[int, int], float] = defaultdict(float)  # (rank, step) -> max Δ
    for inst, step, rank, blame in rec.select("instance", "step", "rank", "blame_us").iter_rows():
        r, s = int(rank), int(step)
        carry, prev = ref.get(int(inst), (False, None))
        carried = delta.get((r, prev), latest.get((r, s), 0.0)) if carry and prev is not None else 0.0
        d = float(blame) + carried
        delta[(r, int(inst))] = latest[(r, s)] = d
        worst[(r, s)] = max(worst[(r, s)], d)
    out: dict[int, float] = {int(r): 0.0 for r in records["rank"].unique().to_list()}
    for (r, _s), d in worst.items():
        out[r] += d / max(int(n_steps), 1)
    return {r: v for r, v in out.items() if np.isfinite(v)}
