"""The job's memory (the reduce side): ranks compared, the peak rank's timeline, the guide's model beside
what was measured, and the snapshots.

Each rank is represented by its primary device (:func:`.rank.rank_memory` puts the accelerator with
the highest peak first). Ranks compared: the rank with the highest peak allocated, the median peak,
and the imbalance = highest − median (what the other ranks leave unused when the batch must fit the
highest one). The model (:mod:`.estimate`) needs ``--params``: the ZeRO stage is ``--zero-stage``,
else 3 when the layout found an FSDP group, else 0; the shard degree is the FSDP group's size, else
the data-parallel one; model parallelism is TP × PP from the layout. At the peak rank, what the
model does not explain (peak allocated − training state) is activations and buffers.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from traceread.analysis.memory.estimate import ZERO_STAGES, at_stage, training_state

#: Fields of a rank's primary device copied into ``memory.ranks[]``.
RANK_FIELDS = (
    "device", "events", "totals_recorded", "baseline_known", "reserved_recorded", "window_start_allocated_bytes",
    "peak_allocated_bytes", "peak_us", "peak_step", "peak_offset_us", "peak_phase", "peak_operator",
    "peak_op_innermost", "peak_context", "floor_allocated_bytes", "reserved_at_peak_bytes", "fragmentation_bytes",
    "fragmentation_pct", "peak_reserved_bytes", "capacity_bytes", "capacity_source", "headroom_bytes",
    "headroom_pct", "growth_per_step_bytes", "leak", "steps", "live_at_peak", "live_in_window_bytes",
    "live_before_window_bytes",
)


def job_memory(per_rank: dict[int, dict[str, Any]], *, layout: Mapping[str, Any] | None = None,
               world_size: int | None = None, params: float | None = None, zero_stage: int | None = None,
               dtype: str = "bf16", optimizer: str = "adamw", master_weights: bool = False,
               snapshots: list[dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """``report["memory"]``, or None when no rank recorded memory events and no snapshot was read."""
    snapshots = snapshots or []
    rows = []
    for r in sorted(per_rank):
        devs = (per_rank[r] or {}).get("devices") or []
        if devs:
            d = devs[0]
            rows.append({"rank": r, **{k: d.get(k) for k in RANK_FIELDS},
                         "other_devices": [{"device": x["device"], "peak_allocated_bytes": x["peak_allocated_bytes"]}
                                           for x in devs[1:]]})
    if not rows and not snapshots:
        return None
    out: dict[str, Any] = {"ranks": rows, "peak_rank": None, "peak_allocated_bytes": None,
                           "median_peak_allocated_bytes": None, "min_peak_allocated_bytes": None,
                           "imbalance_bytes": None, "imbalance_pct": None, "leak_ranks": [], "timeline": None,
                           "model": None, "snapshots": snapshots}
    if rows:
        peaks = [int(x["peak_allocated_bytes"]) for x in rows]
        top = max(rows, key=lambda x: (x["peak_allocated_bytes"], -x["rank"]))
        med = float(statistics.median(peaks))
        out.update({"peak_rank": top["rank"], "peak_allocated_bytes": top["peak_allocated_bytes"],
                    "median_peak_allocated_bytes": med, "min_peak_allocated_bytes": min(peaks),
                    "imbalance_bytes": top["peak_allocated_bytes"] - med,
                    "imbalance_pct": (100.0 * (top["peak_allocated_bytes"] - med) / top["peak_allocated_bytes"]
                                      if top["peak_allocated_bytes"] else None),
                    "leak_ranks": [x["rank"] for x in rows if x["leak"]]})
        tl = per_rank[top["rank"]]["devices"][0].get("timeline")
        if tl:
            out["timeline"] = {"rank": top["rank"], "device": top["device"], **tl}
        if params:
            out["model"] = model_section(top, layout, world_size, params, zero_stage, dtype, optimizer, master_weights)
    return out


def _degrees(layout: Mapping[str, Any] | None) -> dict[str, int]:
    return {k: int(v) for k, v in ((layout or {}).get("degrees") or {}).items() if isinstance(v, int)}


def model_section(top: dict[str, Any], layout: Mapping[str, Any] | None, world_size: int | None, params: float,
                  zero_stage: int | None, dtype: str, optimizer: str, master_weights: bool) -> dict[str, Any]:
    """The guide's training state per GPU beside the peak rank's measurement (module docstring)."""
    deg = _degrees(layout)
    fsdp, dp = deg.get("fsdp", 1), deg.get("dp", 1)
    if zero_stage is None:
        stage = 3 if fsdp > 1 else 0
        stage_source = (f"inferred: the layout found an FSDP group of {fsdp} ranks" if fsdp > 1
                        else "inferred: no FSDP group in the layout (replicated training state)")
    else:
        stage, stage_source = int(zero_stage), "--zero-stage"
    if fsdp > 1:
        shard, shard_source = fsdp, "the FSDP group's size"
    elif dp > 1:
        shard, shard_source = dp, "the data-parallel degree"
    elif not deg and world_size:
        shard, shard_source = int(world_size), "the world size (no layout)"
    else:
        shard, shard_source = 1, "no data-parallel group"
    mp = deg.get("tp", 1) * deg.get("pp", 1)
    est = training_state(params, zero_stage=stage, shard_degree=shard, model_parallel=mp, dtype=dtype,
                         optimizer=optimizer, master_weights=master_weights)
    peak = float(top["peak_allocated_bytes"])
    rest = peak - est.total_bytes
    parts = {"weights": est.weights_bytes, "gradients": est.gradients_bytes, "optimizer_state": est.optimizer_bytes,
             "activations_and_buffers": max(rest, 0.0)}
    dominant = max(parts, key=lambda k: parts[k])
    what_if = [{"change": f"ZeRO-{s}" + (" (FSDP full shard)" if s == 3 else ""),
                "saving_bytes": est.total_bytes - at_stage(est, s).total_bytes}
               for s in ZERO_STAGES if s > stage and shard > 1]
    if rest > 0:
        what_if.append({"change": "activation recomputation (checkpointing)", "saving_bytes": rest,
                        "note": "at most: a checkpointed layer still keeps its input and recomputes the rest in backward"})
        what_if.append({"change": "half the micro-batch", "saving_bytes": rest / 2.0,
                        "note": "activations grow with the micro-batch; buffers do not, so this is an upper bound"})
    tp = deg.get("tp", 1)
    if rest > 0 and tp > 1:
        what_if.append({"change": "sequence parallelism", "saving_bytes": None,
                        "note": f"splits over the {tp} TP ranks the activations tensor parallelism keeps whole "
                                "(LayerNorm, dropout, residual); its share is not in the trace"})
    return {
        "rank": top["rank"], "estimate": est.to_json(), "zero_stage_source": stage_source,
        "shard_degree_source": shard_source, "model_parallel_source": "TP x PP from the layout",
        "measured_peak_allocated_bytes": peak, "measured_floor_allocated_bytes": top.get("floor_allocated_bytes"),
        "baseline_known": bool(top.get("baseline_known")),
        "activations_and_buffers_bytes": rest, "parts": parts, "dominant": dominant, "what_if": what_if,
    }
