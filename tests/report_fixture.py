"""A hand-built report document that fills every section, for renderer tests.

Numbers are made consistent with each other (per-step breakdowns add up to the step, collectives
and stragglers agree) so that findings computed from it can be checked by hand:

* 4 ranks, 6 steps of ~100 ms; rank 3 is a GPU straggler costing the others 8 ms/step;
* exposed communication 12 ms/step on rank 0 (the all-reduce on pg "0");
* a 4-stage pipeline with 8 micro-batches and a measured bubble of 30 %;
* step 4 is slow by 40 ms on every rank;
* a kernel whose name is an HTML/script injection attempt.
"""

from __future__ import annotations

import copy
from typing import Any

from traceread.report_schema import SCHEMA_ID

EVIL = "<script>alert(1)</script>"
N_RANKS = 4
N_STEPS = 6
STEP_US = 100_000.0


def _steps(rank: int) -> list[dict[str, Any]]:
    out = []
    t = 1_000.0 + rank * 3.0
    for s in range(N_STEPS):
        dur = STEP_US + (40_000.0 if s == 4 else 0.0)
        exposed = 12_000.0 if rank != 3 else 4_000.0
        idle = 10_000.0 + (40_000.0 if s == 4 else 0.0)
        compute = dur - exposed - idle - 1_000.0
        out.append({
            "step": 10 + s, "start_us": t, "duration_us": dur, "compute_us": compute,
            "comm_us": exposed + 20_000.0, "exposed_comm_us": exposed, "exposed_memcpy_us": 1_000.0,
            "idle_us": idle, "host_bound_us": 0.6 * idle,
        })
        t += dur
    return out


def _rank(rank: int) -> dict[str, Any]:
    steps = _steps(rank)
    window = sum(s["duration_us"] for s in steps)
    compute = sum(s["compute_us"] for s in steps)
    exposed = sum(s["exposed_comm_us"] for s in steps)
    comm = sum(s["comm_us"] for s in steps)
    idle = sum(s["idle_us"] for s in steps)
    return {
        "rank": rank, "file": f"traces/rank{rank}.pt.trace.json.gz", "device": "NVIDIA H100 80GB HBM3",
        "num_sms": 132, "window_us": window, "gpu_busy_us": window - idle, "compute_us": compute,
        "comm_us": comm, "exposed_comm_us": exposed, "memcpy_us": 9_000.0, "exposed_memcpy_us": 6_000.0,
        "idle_us": idle, "comm_overlap_pct": 100.0 * (comm - exposed) / comm, "gpu_util_pct": 100.0 * (window - idle) / window,
        "sm_efficiency_pct": 71.5 - rank, "achieved_occupancy_pct": 38.0, "mfu_pct": 31.2 if rank != 3 else 29.0,
        "steps": steps, "host": f"node{rank // 2}",
        "idle_breakdown": {"host_bound_us": idle * 0.6, "kernel_gap_us": idle * 0.3, "other_us": idle * 0.1},
        "hfu_pct": 35.0, "cpu": None, "dropped_partial_step": 16,
    }


def step_timeline() -> dict[str, Any]:
    """The ``step_timeline`` extra for two steps of the four ranks; the pg name is markup (must stay text)."""
    rows: dict[str, list[Any]] = {k: [] for k in ("step", "rank", "stream", "start", "end", "kind", "pg", "category")}
    for step in (11, 12):
        for rank in range(N_RANKS):
            for stream, kind, pg, a, b in ((7, "compute", None, 0.0, 900.0), (13, "comm", EVIL, 900.0 + 50 * rank, 1400.0),
                                           (-1, "host_bound", None, 1400.0, 1500.0)):
                cat = {"comm": f"comm pg {EVIL}", "host_bound": "host-bound idle"}.get(kind, kind)
                for k, v in zip(rows, (step, rank, stream, a, b, kind, pg, cat)):
                    rows[k].append(v)
    crit = [{"rank": N_RANKS - 1, "stream": 13, "t": 900.0 + 50 * (N_RANKS - 1), "pg": EVIL}]
    return {"steps": [{"label": "median step", "step": 11, "duration_us": 1500.0, "step_us": 1500.0, "critical": crit},
                      {"label": "slowest step", "step": 12, "duration_us": 1500.0, "step_us": 1500.0, "critical": crit}],
            "ranks": list(range(N_RANKS)), "note": None, "clock": "single-clock", "rows": rows}


def full_report() -> dict[str, Any]:
    """The document ``build_report`` would produce for the scenario above (findings left empty)."""
    ranks = [_rank(r) for r in range(N_RANKS)]
    steps = [10 + s for s in range(N_STEPS)]
    return copy.deepcopy({
        "schema": SCHEMA_ID,
        "source": {"paths": ["runs/fixture"], "world_size": N_RANKS, "backend": "nccl",
                   "devices": ["NVIDIA H100 80GB HBM3"]},
        "warnings": [f"rank 2: 3 kernels named {EVIL} had no launch"],
        "ranks": ranks,
        "collectives": [
            {"pg": "0", "name": "allreduce", "count": 60, "bytes": 100_000_000, "latency_us": 2_000.0,
             "wait_us": 1_300.0, "algbw_gbps": 50.0, "busbw_gbps": 75.0, "group_size": 4,
             "link": "nvlink", "link_peak_gbps": 450.0},
            {"pg": "1", "name": "allgather", "count": 24, "bytes": 8_000_000, "latency_us": 400.0,
             "wait_us": 50.0, "algbw_gbps": 20.0, "busbw_gbps": 15.0, "group_size": 2,
             "link": "network", "link_peak_gbps": 50.0},
            {"pg": "2", "name": EVIL, "count": 6, "bytes": 1024, "latency_us": 20.0, "wait_us": 0.0,
             "algbw_gbps": None, "busbw_gbps": None, "group_size": 4, "link": None, "link_peak_gbps": None},
        ],
        "stragglers": [
            {"rank": 3, "blame_us_per_step": 8_000.0, "arrived_last": 58, "cause": "gpu", "root": True,
             "evidence": "rank 3 arrived last at 58 of 60 all-reduces on pg 0"},
            {"rank": 1, "blame_us_per_step": 300.0, "arrived_last": 2, "cause": "unknown", "root": False},
        ],
        "pipeline": {
            "stages": 4, "microbatches": 8, "schedule": "1f1b", "bubble_pct": 30.0,
            "theory_bubble_pct": 100.0 * 3 / 11, "unbalanced": False,
            "per_stage": [{"rank": r, "stage": r, "bubble_pct": 28.0 + r, "idle_us": 30_000.0,
                           "p2p_wait_us": 2_000.0, "compute_us": 68_000.0} for r in range(4)],
            "timeline": [
                {"stage": st, "start_us": 1_000.0 + st * 5_000.0 + m * 6_000.0,
                 "end_us": 1_000.0 + st * 5_000.0 + m * 6_000.0 + 5_000.0, "kind": "fwd"}
                for st in range(4) for m in range(8)
            ] + [
                {"stage": st, "start_us": 60_000.0 + (3 - st) * 5_000.0 + m * 6_000.0,
                 "end_us": 60_000.0 + (3 - st) * 5_000.0 + m * 6_000.0 + 5_500.0, "kind": "bwd"}
                for st in range(4) for m in range(8)
            ],
        },
        "slow_steps": [
            {"step": 14, "duration_us": 140_000.0, "median_us": 100_000.0, "excess_us": 40_000.0,
             "cause": "host", "rank": None, "detail": "idle grew by 40 ms on every rank (host-side stall)"},
        ],
        "hang": {
            "pg": "0", "seq": 1234, "op": "allreduce", "missing_ranks": [3], "waiting_ranks": [0, 1, 2],
            "stacks": {"3": "train.py:88 in save_checkpoint", "0": "torch/distributed/c10d.py:10 in all_reduce"},
            "mismatches": [], "evidence": ["Flight Recorder: ranks 0-2 entered allreduce seq 1234; rank 3 last completed 1233"],
        },
        "findings": [], "ledger": None, "coverage": None,
        "layout": {"degrees": {"dp": 4, "fsdp": 1, "tp": 1, "pp": 1, "cp": 1, "ep": 1},
                   "groups": [{"pg": "0", "desc": "default_pg", "role": "dp", "size": 4, "ranks": [0, 1, 2, 3],
                               "nodes": [0], "evidence": "allreduce 10/step: gradient all-reduce during backward only"}]},
        "kernels": [
            {"name": "sm90_xmma_gemm_bf16bf16_bf16f32", "calls": 600, "total_us": 240_000.0, "mean_us": 400.0,
             "blocks_per_sm": 3.9, "occupancy_pct": 12.0, "wave_efficiency_pct": 97.0, "sm_time_lost_us": 7_200.0, "ranks": 4},
            {"name": EVIL, "calls": 1200, "total_us": 60_000.0, "mean_us": 50.0, "blocks_per_sm": 0.25,
             "occupancy_pct": 6.0, "wave_efficiency_pct": 25.0, "sm_time_lost_us": 45_000.0, "ranks": 4},
            {"name": "vectorized_elementwise_kernel<add>", "calls": 2400, "total_us": 48_000.0, "mean_us": 20.0,
             "blocks_per_sm": None, "occupancy_pct": None, "wave_efficiency_pct": None, "sm_time_lost_us": None, "ranks": 4},
        ],
        "roofline": {
            "device": "NVIDIA H100 80GB HBM3", "precision": "bf16", "peak_tflops": 989.4, "peak_gbps": 3350.0,
            "ridge_flop_per_byte": 989.4e12 / 3350e9, "ceiling": "datasheet dense peak",
            "ops": [
                {"name": "aten::mm", "calls": 600, "flops": 4.0e14, "bytes": 2.0e11, "time_us": 600_000.0,
                 "intensity": 2000.0, "achieved_tflops": 666.7, "bound": "compute", "roofline_pct": 67.4,
                 "roofline_time_us": 404_285.0},
                {"name": "aten::add_", "calls": 2400, "flops": 1.0e10, "bytes": 1.2e11, "time_us": 48_000.0,
                 "intensity": 0.083, "achieved_tflops": 0.21, "bound": "memory", "roofline_pct": 74.6,
                 "roofline_time_us": 35_820.0},
                {"name": EVIL, "calls": 60, "flops": 1.0e9, "bytes": 4.0e9, "time_us": 6_000.0,
                 "intensity": 0.25, "achieved_tflops": 0.17, "bound": "memory", "roofline_pct": 19.9,
                 "roofline_time_us": 1_194.0},
            ],
        },
        "straggler_heatmap": {
            "ranks": list(range(N_RANKS)), "steps": steps,
            "wait_us": [[(0.0 if r == 3 else 8_000.0 + 100.0 * s) for s in range(N_STEPS)] for r in range(N_RANKS)],
        },
        "step_timeline": step_timeline(),
        "nccl": {
            "version": "2.21.5", "nodes": 2, "ranks": 4,
            "transports": {"P2P/NVLink": 4, "NET/Socket": 2},
            "diagnoses": [{"id": "transport_fallback", "severity": "warning",
                           "message": "inter-node traffic uses NET/Socket, not IB: InfiniBand was not found",
                           "suggestion": "check NCCL_IB_HCA / that the IB driver is loaded; NCCL_SOCKET_IFNAME"}],
        },
    })


def with_ledger(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with a step ledger matching the scenario: rank 0 is critical (100 ms median step 12),
    waiting 8 ms for straggler rank 3 (whose compute fills that time on the critical path)."""
    parts = [("compute_bound", None, 0, 40_000.0), ("memory_bound", None, 0, 9_000.0),
             ("compute_other", None, 0, 2_000.0), ("bubble", "pp", 0, 24_000.0),
             ("comm_transfer", "dp", 0, 4_000.0), ("compute_bound", None, 3, 8_000.0),
             ("host_bound", None, 0, 6_000.0), ("dependency", None, 0, 4_000.0),
             ("exposed_memcpy", None, 0, 1_000.0), ("idle_other", None, 0, 2_000.0)]
    doc = copy.deepcopy(doc)
    doc["ledger"] = {"step": 12, "step_us": STEP_US, "critical_rank": 0,
                     "parts": [{"category": c, "role": ro, "rank": rk, "us": us} for c, ro, rk, us in parts],
                     "waited_on": [{"rank": 3, "role": "dp", "us": 8_000.0}]}
    for r in doc["ranks"]:
        own = [{"category": c, "role": ro, "rank": r["rank"], "us": us} for c, ro, rk, us in parts if rk == 0]
        own.append({"category": "comm_wait", "role": "dp", "rank": r["rank"], "us": 8_000.0})
        r["ledger"] = {"step": 12, "step_us": STEP_US, "parts": own}
    return doc
