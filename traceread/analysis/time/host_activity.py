"""Which host-side activity grew in a slow step: the data loader, a checkpoint, or time no operator covers.

A slow step whose extra time is GPU idle (``slow_steps`` cause ``host``) only says the host was late.
The host trace says with what. Definitions (µs):

* **self time** of a host event (operator, annotation, runtime call) = its duration − the durations of
  the events nested directly in it. Time inside ``enumerate(DataLoader)...`` waiting for a worker,
  inside ``checkpoint.save`` writing a file, or inside ``DistributedDataParallel.forward`` while the
  garbage collector runs is self time: no operator covers it.
* per (step, name): the summed self time of the events named ``name`` that start inside the rank's
  device step window (``ProfilerStep#N`` markers excluded); only the :data:`KEEP_NAMES` names with the
  largest self time in any step are kept, so the extract stays small.
* **growth** of a name in a slow step = median over ranks of (its self time in that step − its median
  over the normal steps). The names whose growth is at least :data:`MIN_SHARE` of the step's excess
  are what the host was doing instead of launching work.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from traceread.model import RankTrace

KEEP_NAMES = 40
MIN_SHARE = 0.25

SCHEMA = {"step": pl.Int64, "name": pl.Utf8, "self_us": pl.Float64}


def host_self_time(rt: RankTrace, windows: pl.DataFrame) -> pl.DataFrame:
    """(step, name, self_us) of this rank's host events, per device step window (module docstring)."""
    h = rt.host
    if h.height == 0 or windows.height == 0 or "parent" not in h.columns:
        return pl.DataFrame(schema=SCHEMA)
    # Per-row arrays instead of joins on the host table: a join or sort of it would copy every
    # name (hundreds of MB on a 1 GB rank); only the rows kept at the end carry their name.
    kids = h.select("parent", "dur").filter(pl.col("parent").is_not_null()).group_by("parent").agg(pl.col("dur").sum())
    kids_us = np.zeros(h.height)
    kids_us[kids["parent"].to_numpy()] = kids["dur"].to_numpy()
    self_us = np.maximum(h["dur"].to_numpy() - kids_us, 0.0)
    del kids, kids_us
    w = windows.select("step", "start", "end").sort("start")
    ts = h["ts"].to_numpy()
    at = np.searchsorted(w["start"].to_numpy(), ts, side="right") - 1  # last window starting <= ts
    inside = at >= 0
    at[~inside] = 0
    inside &= ts < w["end"].to_numpy()[at]
    keep = inside & (self_us > 0)
    keep &= ~h["name"].str.starts_with("ProfilerStep#").fill_null(True).to_numpy()  # unnamed: dropped
    ev = h.select("name").with_columns(
        pl.Series("step", w["step"].to_numpy()[at], dtype=pl.Int64), pl.Series("self_us", self_us)
    ).filter(pl.Series(keep))
    per = ev.group_by("step", "name").agg(pl.col("self_us").sum())
    # Ties broken by name: group_by order is arbitrary, and the extract must not change run to run.
    top = (per.group_by("name").agg(pl.col("self_us").max())
           .sort(["self_us", "name"], descending=[True, False]).head(KEEP_NAMES))
    return per.filter(pl.col("name").is_in(top["name"].implode())).select(
        [pl.col(c).cast(t) for c, t in SCHEMA.items()]).sort("step", "name")


def grown(per_rank: dict[int, pl.DataFrame], step: int, normal_steps: list[int], excess_us: float) -> list[tuple[str, float]]:
    """(name, growth µs) of the host activities that explain ≥ MIN_SHARE of ``excess_us``, largest first."""
    rows = []
    for r, f in per_rank.items():
        if f.height:
            rows.append(f.with_columns(pl.lit(r, pl.Int64).alias("rank")))
    if not rows or not normal_steps:
        return []
    df = pl.concat(rows)
    names = df["name"].unique().to_list()
    ranks = list(per_rank)
    full = (pl.DataFrame({"rank": ranks}).join(pl.DataFrame({"name": names}), how="cross")
            .join(pl.DataFrame({"step": [step, *normal_steps]}), how="cross")
            .join(df, on=["rank", "name", "step"], how="left").with_columns(pl.col("self_us").fill_null(0.0)))
    base = full.filter(pl.col("step") != step).group_by("rank", "name").agg(pl.col("self_us").median().alias("b"))
    g = (full.filter(pl.col("step") == step).join(base, on=["rank", "name"])
         .with_columns((pl.col("self_us") - pl.col("b")).alias("d"))
         .group_by("name").agg(pl.col("d").median()).sort("d", descending=True))
    out = [(str(n), float(d)) for n, d in g.iter_rows() if np.isfinite(d) and d >= MIN_SHARE * excess_us]
    return out[:3]
