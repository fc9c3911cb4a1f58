"""Per-host clock offsets, so arrivals on different machines can be compared.

Ranks on one host share one clock (Kineto maps GPU times to the host's CLOCK_REALTIME); hosts differ
by their NTP error (0.1–10 ms), the same order as real waits. Uncorrected, a host whose clock runs
ahead looks late and gets blamed.

Sources, in order of trust:

1. offsets measured by ``traceread collect`` (``run.json`` ``clock``: same host 0 ± 0, other hosts
   a TCPStore ping-pong with rank 0), when every rank has one;
2. estimated from the traces: synchronising collectives (allreduce, allgather, reduce-scatter,
   all-to-all, barrier) end at nearly the same instant on every member, because nobody finishes
   before the last arrives. ``off(host) = median over instances of (median end on host − median end
   of the instance)``; instances whose residual exceeds 5 robust sigmas are dropped and the median
   taken again. The residual spread (1.4826·MAD, at least :data:`MIN_EPSILON_US`) is the
   uncertainty ``epsilon_us``: no wait smaller than it is blamed on anyone.

Host identity: ``run.json`` per-rank ``host`` when present. Without it, each rank's end offset is
estimated and ranks are grouped into one clock when their offsets differ by less than
``max(4·spread, 50 µs)`` (same-host ranks agree to a few µs; NTP skew between hosts is ≥ 100 µs).
When every rank falls into one group the offsets are exactly zero: a single host clock is never
"corrected" by noise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import polars as pl

from traceread.analysis.comm.collectives import SYNC_OPS, Matched

#: Floor of the clock uncertainty: end times of one collective on one host spread by a few µs.
MIN_EPSILON_US = 5.0
#: Minimum gap between offset clusters that makes two groups of ranks "different clocks".
MIN_CLUSTER_GAP_US = 50.0


@dataclass
class ClockModel:
    """Offsets to subtract from each rank's times (µs) and the remaining uncertainty."""

    offsets_us: dict[int, float] = field(default_factory=dict)
    epsilon_us: float = MIN_EPSILON_US
    hosts: dict[int, str] = field(default_factory=dict)
    method: str = "none"  # "recorded" | "estimated" | "single-clock" | "none"
    notes: list[str] = field(default_factory=list)

    def offset(self, rank: int) -> float:
        return self.offsets_us.get(rank, 0.0)

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "epsilon_us": self.epsilon_us,
            "offsets_us": {str(r): v for r, v in sorted(self.offsets_us.items())},
            "hosts": {str(r): h for r, h in sorted(self.hosts.items())},
            "notes": list(self.notes),
        }


def hosts_from_run_info(run_info: dict[str, Any] | None) -> tuple[dict[int, str], dict[int, float]]:
    """Per-rank host, and the clock offsets ``traceread collect`` measured, from ``run.json``.

    ``run.json`` stores ``clock.offsets_us[r]`` to *add* to rank r's times (rank 0's clock) with
    ``clock.uncertainty_us[r]`` (null when no measurement ran); returned offsets are in this
    module's convention (to *subtract*) and only for ranks whose uncertainty is known.
    """
    hosts: dict[int, str] = {}
    offsets: dict[int, float] = {}
    if not run_info:
        return hosts, offsets
    ranks = run_info.get("ranks") or {}
    items = ranks.items() if isinstance(ranks, dict) else ((r.get("rank"), r) for r in ranks if isinstance(r, dict))
    for r, info in items:
        rank = _as_int(r)
        if rank is not None and isinstance(info, dict) and info.get("host"):
            hosts[rank] = str(info["host"])
    clock = run_info.get("clock") or {}
    offs = clock.get("offsets_us") or {}
    unc = clock.get("uncertainty_us") or {}
    for r, v in offs.items():
        rank = _as_int(r)
        if rank is not None and isinstance(v, (int, float)) and isinstance(unc.get(r), (int, float)):
            offsets[rank] = 0.0 - float(v)
    return hosts, offsets


def recorded_uncertainty(run_info: dict[str, Any] | None) -> float:
    """Largest measured clock uncertainty in ``run.json`` (µs), 0 when none was recorded."""
    unc = ((run_info or {}).get("clock") or {}).get("uncertainty_us") or {}
    vals = [float(v) for v in unc.values() if isinstance(v, (int, float))]
    return max(vals, default=0.0)


def _as_int(x: Any) -> int | None:
    try:
        return int(x)
    except (TypeError, ValueError):
        return None


def _end_residuals(matched: Matched) -> pl.DataFrame:
    """Per (instance, rank): end minus the instance's median end, for complete synchronising ones."""
    ok = matched.instances.filter(
        pl.col("complete") & pl.col("op").is_in(list(SYNC_OPS)) & (pl.col("n_ranks") > 1)
    ).select("instance")
    ev = matched.events.join(ok, on="instance")
    return ev.select(
        "instance", "rank", (pl.col("end") - pl.col("end").median().over("instance")).alias("d")
    )


def _robust_median(d: np.ndarray) -> tuple[float, float]:
    """Median after dropping values further than 5 robust sigmas from a first median; and the sigma."""
    med = float(np.median(d))
    mad = float(np.median(np.abs(d - med))) * 1.4826
    keep = np.abs(d - med) <= max(5 * mad, MIN_EPSILON_US)
    d2 = d[keep] if keep.any() else d
    med2 = float(np.median(d2))
    sig = float(np.median(np.abs(d2 - med2))) * 1.4826
    return med2, sig


def estimate_offsets(
    matched: Matched,
    hosts: dict[int, str] | None = None,
    recorded: dict[int, float] | None = None,
    recorded_epsilon_us: float = 0.0,
) -> ClockModel:
    """Clock model for ``matched`` (see the module docstring for the method and heuristic).

    ``recorded``: offsets to subtract per rank (:func:`hosts_from_run_info`), used when every rank
    has one and the collectives' end times agree with them; ``recorded_epsilon_us``: their
    measured uncertainty (:func:`recorded_uncertainty`), a floor for ``epsilon_us``.
    """
    ranks = matched.ranks
    hosts = dict(hosts or {})
    if recorded and all(r in recorded for r in ranks):
        model = ClockModel({r: float(recorded[r]) for r in ranks}, method="recorded", hosts=hosts)
        model.epsilon_us = max(MIN_EPSILON_US, recorded_epsilon_us, _residual_spread(matched, model.offsets_us))
        # Trust, but verify: collectives must still end together on the recorded clocks.
        est = estimate_offsets(matched, hosts)
        ref = min(ranks)
        off = max(abs((model.offset(r) - model.offset(ref)) - (est.offset(r) - est.offset(ref))) for r in ranks)
        if off > max(3 * est.epsilon_us, 2 * recorded_epsilon_us, MIN_CLUSTER_GAP_US):
            est.notes.append(
                f"recorded clock offsets disagree with collective end times by up to {off:.0f} µs; "
                f"using offsets estimated from the traces instead (±{est.epsilon_us:.0f} µs)")
            return est
        return model
    res = _end_residuals(matched)
    if res.height == 0 or len(ranks) < 2:
        return ClockModel({r: 0.0 for r in ranks}, method="none", hosts=hosts,
                          notes=["no synchronising collective seen on several ranks; clocks not checked"])
    # Per-rank offset estimate (iterated once: the instance median itself is shifted by skewed hosts).
    per_rank = _per_rank_offsets(res, ranks)
    res2 = res.join(pl.DataFrame({"rank": list(per_rank), "o": list(per_rank.values())}), on="rank")
    res2 = res2.with_columns((pl.col("d") - pl.col("o")).alias("d"))
    res2 = res2.with_columns((pl.col("d") - pl.col("d").median().over("instance")).alias("d"))
    refined = _per_rank_offsets(res2, ranks)
    per_rank = {r: per_rank[r] + refined[r] for r in ranks}
    spread = float(np.median([_robust_median(g["d"].to_numpy())[1] for _, g in res2.group_by("rank")]))
    if hosts and all(r in hosts for r in ranks):
        groups: dict[str, list[int]] = {}
        for r in ranks:
            groups.setdefault(hosts[r], []).append(r)
        method = "estimated"
    else:
        groups = _cluster(per_rank, spread)
        method = "estimated" if len(groups) > 1 else "single-clock"
        hosts = hosts or {r: h for h, rs in groups.items() for r in rs}
    if len(groups) == 1:
        model = ClockModel({r: 0.0 for r in ranks}, method="single-clock", hosts=hosts)
        model.epsilon_us = max(MIN_EPSILON_US, 3.0 * spread)
        return model
    host_off = {h: float(np.median([per_rank[r] for r in rs])) for h, rs in groups.items()}
    ref_off = host_off[next(h for h, rs in groups.items() if min(ranks) in rs)]
    offsets = {r: host_off[h] - ref_off for h, rs in groups.items() for r in rs}
    model = ClockModel(offsets, method=method, hosts=hosts)
    model.epsilon_us = max(MIN_EPSILON_US, _residual_spread(matched, offsets))
    model.notes.append(
        f"{len(groups)} clocks; offsets estimated from collective end times, "
        f"uncertainty ±{model.epsilon_us:.0f} µs")
    return model


def _per_rank_offsets(res: pl.DataFrame, ranks: list[int]) -> dict[int, float]:
    out = {r: 0.0 for r in ranks}
    for (r,), g in res.group_by(["rank"]):
        out[int(r)] = _robust_median(g["d"].to_numpy())[0]
    return out


def _cluster(per_rank: dict[int, float], spread: float) -> dict[str, list[int]]:
    """Ranks whose end offsets lie within ``max(4·spread, 50 µs)`` of their neighbours share a clock."""
    gap = max(4 * spread, MIN_CLUSTER_GAP_US)
    items = sorted(per_rank.items(), key=lambda kv: kv[1])
    groups: list[list[int]] = [[items[0][0]]]
    for (_, prev), (r, v) in zip(items, items[1:]):
        if v - prev > gap:
            groups.append([])
        groups[-1].append(r)
    return {f"clock{i}": sorted(g) for i, g in enumerate(sorted(groups, key=min))}


def _residual_spread(matched: Matched, offsets: dict[int, float]) -> float:
    """Robust spread of corrected end times around their instance median (µs)."""
    res = _end_residuals(matched)
    if res.height == 0:
        return 0.0
    o = pl.DataFrame({"rank": list(offsets), "o": [float(v) for v in offsets.values()]})
    d = res.join(o, on="rank", how="left").with_columns(pl.col("o").fill_null(0.0))
    d = d.with_columns((pl.col("d") - pl.col("o")).alias("d"))
    v = d.with_columns((pl.col("d") - pl.col("d").median().over("instance")).alias("d"))["d"].to_numpy()
    return float(np.median(np.abs(v - np.median(v)))) * 1.4826 * 3.0


def aligned(events: pl.DataFrame, clock: ClockModel | None) -> pl.DataFrame:
    """``events`` with ``ts``, ``end`` and ``launch_ts`` moved onto the reference clock."""
    if clock is None or not any(clock.offsets_us.values()):
        return events
    o = pl.DataFrame({"rank": list(clock.offsets_us), "_off": list(clock.offsets_us.values())},
                     schema={"rank": pl.Int64, "_off": pl.Float64})
    ev = events.join(o, on="rank", how="left").with_columns(pl.col("_off").fill_null(0.0))
    return ev.with_columns(
        pl.col("ts") - pl.col("_off"), pl.col("end") - pl.col("_off"), pl.col("launch_ts") - pl.col("_off")
    ).drop("_off")
