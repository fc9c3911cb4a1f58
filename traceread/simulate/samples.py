"""The simulated folders shipped in ``sample_traces/`` and how to regenerate them.

``python -m traceread.simulate.samples [ROOT]`` rewrites every folder below (default ROOT:
``sample_traces`` of the checkout) plus its README; output is byte-identical for the same code.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

from traceread.simulate import simulate

#: folder -> (scenario, knobs, one-line description for the README)
SAMPLES: dict[str, tuple[str, dict[str, Any], str]] = {
    "ddp_straggler_h100": (
        "ddp",
        {"ranks": 8, "steps": 3, "stragglers": [(5, 3000.0, "gpu")]},
        "8-rank DDP on H100, 4 gradient buckets overlapping backward; rank 5 is a GPU straggler "
        "(compute kernels +3 ms/step), so the other ranks wait in every all-reduce.",
    ),
    "tp_dp_h100": (
        "tp",
        {"ranks": 8, "steps": 3, "tp": 4},
        "8 ranks = 2 TP groups of 4 (mesh_tp all-reduce after attention and MLP, fwd and bwd) x DP 2 "
        "(mesh_dp gradient all-reduce overlapping backward).",
    ),
    "pp_1f1b_h100": (
        "pp",
        {"ranks": 4, "steps": 3, "microbatches": 8, "schedule": "1f1b"},
        "4-stage pipeline, 8 microbatches, 1F1B schedule, send/recv (ncclDevKernel_SendRecv) between "
        "adjacent stages; bubble theory 3/11 = 27.3%.",
    ),
    "pp_gpipe_h100": (
        "pp",
        {"ranks": 4, "steps": 3, "microbatches": 8, "schedule": "gpipe"},
        "Same pipeline with the GPipe schedule (all forwards, then all backwards).",
    ),
    "slow_steps_a100": (
        "slow_steps",
        {"ranks": 4, "steps": 10, "device": "A100", "layers": 2,
         "slow_steps": [(12, "dataloader", 30000.0), (15, "gc", 15000.0), (18, "checkpoint", 40000.0)]},
        "4-rank DDP on A100 (2 layers), 10 steps, 3 of them slow: step 12 data-loader stall (30 ms), "
        "step 15 GC pause (15 ms), step 18 checkpoint write (40 ms).",
    ),
    "skewed_2host_h100": (
        "ddp",
        {"ranks": 8, "steps": 3, "hosts": 2, "skew_us": 800.0},
        "8-rank DDP over 2 hosts (inter-node all-reduce); host 1's clock runs 800 us ahead, no real "
        "straggler: clock-unaware straggler detection wrongly blames ranks 4-7.",
    ),
    "3d_tp_crossnode_h100": (
        "3d",
        {},
        "16 ranks = DP 2 x TP 4 x PP 2 (1F1B, 4 microbatches) on nodes of 6 GPUs: TP group [4-7] spans nodes "
        "0 and 1, so its per-layer all-reduces run over InfiniBand; process groups carry torch's generic "
        "descriptions ('undefined'), roles must come from behaviour. truth.json: ledger and layout.",
    ),
    "moe_imbalance_h100": (
        "moe",
        {"steps": 2},
        "8-rank mixture of experts: all-to-all dispatch/combine around each MoE layer (expert parallel, "
        "ncclDevKernel_SendRecv, all_to_allv); rank 3's expert gets 3x the tokens, the others wait for it "
        "in the combine all-to-all.",
    ),
    "fsdp_exposed_h100": (
        "fsdp_exposed",
        {"ranks": 4, "steps": 2},
        "4-rank FSDP without prefetch: every layer's parameter all-gather waits for the previous layer's "
        "compute, so it is exposed (reduce-scatter of gradients overlaps backward).",
    ),
    "custom_allreduce_h100": (
        "custom_allreduce",
        {"ranks": 4, "tp": 4, "steps": 2},
        "4-rank tensor parallel whose per-layer all-reduce is torch symmetric memory's "
        "multimem_one_shot_all_reduce_kernel (not NCCL) under c10d::allreduce_ / record_param_comms.",
    ),
    "fsdp_memory_h100": (
        "ddp",
        {"ranks": 4, "steps": 3, "comm": "fsdp", "layers": 2, "hidden": 2048, "heads": 16, "seq_len": 1024,
         "memory": True, "leak_bytes": 16 << 20, "act_factors": [(2, 1.5)]},
        "4-rank FSDP (ZeRO-3) recorded with profile_memory: [memory] events and a memory snapshot per rank; "
        "rank 2's activations are 1.5x larger (the peak rank), every rank leaks 16 MiB per step. "
        "traceread report --params 100704256 puts the guide's model beside it.",
    ),
}

REGENERATE = "python -m traceread.simulate.samples sample_traces"


def _foreign_rows(root: Path) -> list[str]:
    """Rows of the existing README for folders other tools put in sample_traces/, kept as they are."""
    rows: dict[str, str] = {}
    old = root / "README.md"
    if old.is_file():
        for line in old.read_text().splitlines():
            m = re.match(r"^\| `([^`]+)/` \|", line)
            if m and m.group(1) not in SAMPLES:
                rows[m.group(1)] = line
    for d in sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
        if d not in SAMPLES and d not in rows:
            rows[d] = f"| `{d}/` | (not simulated: written by another traceread tool; see its docs) |"
    return [rows[k] for k in sorted(rows)]


def _foreign_sections(root: Path) -> list[str]:
    """Sections other tools appended to the README (from its first ``## `` heading on), kept verbatim."""
    old = root / "README.md"
    if not old.is_file():
        return []
    lines = old.read_text().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("## ")), None)
    if start is None:
        return []
    extra = lines[start:]
    return extra + ([""] if extra and extra[-1] != "" else [])


def readme(root: Path | None = None) -> str:
    """README of sample_traces/: one row per simulated folder, then rows kept for other folders."""
    lines = [
        "# Sample traces",
        "",
        "Simulated multi-rank torch 2.x NCCL profiles written by `traceread simulate`, each with a",
        "`truth.json` holding the exact numbers an analysis must find (see `docs/simulate.md`).",
        "They are synthetic: timings come from a schedule model, not from a GPU. Every truth.json also",
        "carries the step ledger (`ledger`, `ledger_by_step`, per rank `ledger` / `ledger_local`) and the",
        "parallel layout (`layout`) computed from the simulator's own schedule.",
        "",
        "| folder | what it shows |",
        "|---|---|",
    ]
    for name, (_, _, desc) in SAMPLES.items():
        lines.append(f"| `{name}/` | {desc} |")
    if root is not None:
        lines += _foreign_rows(root)
    lines += [
        "",
        f"Regenerate (deterministic, byte-identical): `{REGENERATE}`",
        "",
        "HTA note: `TraceAnalysis(trace_dir=...)` reads every `*.json` in a folder, and truth.json is",
        "not a trace; point HTA at a folder holding only the `rank*.pt.trace.json.gz` files.",
        "",
    ]
    if root is not None:
        lines += _foreign_sections(root)
    return "\n".join(lines)


def regenerate(root: Path | str, only: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Write the sample folders (all, or ``only`` these) under ``root``; return their truths."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    truths = {}
    for name, (scenario, knobs, _) in SAMPLES.items():
        if only is not None and name not in only:
            continue
        truths[name] = simulate(scenario, root / name, **knobs)
    if only is None:
        (root / "README.md").write_text(readme(root))
    return truths


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "sample_traces"
    regenerate(target)
    print(f"wrote {len(SAMPLES)} sample folders to {target}")
