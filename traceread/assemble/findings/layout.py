"""Findings that come from the job's shape (``report["layout"]``, ``report["workload"]``).

* **tp_across_nodes** — a tensor-parallel group whose ranks sit on more than one node: its
  per-layer collectives cross the network (the NVLink → InfiniBand cliff). Its share is the window
  ledger's tensor-parallel communication transfer on the critical path (``comm_transfer``, role
  ``tp``, every rank's): it is the *cause* of that share, so it replaces the generic
  exposed-TP-communication finding rather than adding to it; the predicted saving
  (:func:`traceread.assemble.explain.advice`) is the share times (1 − measured busbw ÷ NVLink peak).
* :func:`fit_to_workload` — a serving or inference job's findings told in its terms (serving advice,
  no training-only advice, a prefill among decodes is not a slow step).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from traceread.assemble import explain
from traceread.assemble.findings.base import Budget, make_finding
from traceread.assemble.findings.window import Window, window_of
from traceread.report_schema import Finding, Report


def _nvlink_gbps(report: Report) -> float | None:
    """Per-direction peak of the devices' intra-node link (the bandwidth TP would get inside a node)."""
    from traceread.analysis import hardware as dev

    for name in (report.get("source") or {}).get("devices") or []:
        spec = dev.resolve_device(name, None)
        key = getattr(spec, "link", None) if spec else None
        if key and key in dev.LINKS:
            return dev.LINKS[key].per_direction_bytes_per_s / 1e9
    return None


def role_numbers(report: Report, role: str | None) -> dict[str, Any]:
    """The layout's numbers :func:`traceread.assemble.explain.advice` needs for a share of ``role``:
    ``nodes`` (most nodes one group of that role spans), ``group_size``, ``gpus_per_node`` (most
    ranks of the job on one node), ``busbw_gbps`` (slowest measured bus bandwidth of those groups'
    collectives) and ``nvlink_gbps`` (the devices' intra-node link peak). Missing ones are left out."""
    lay: Mapping[str, Any] = report.get("layout") or {}
    groups = [g for g in lay.get("groups") or [] if g.get("role") == role]
    out: dict[str, Any] = {}
    if groups:
        out["nodes"] = max(len(g.get("nodes") or []) for g in groups) or None
        out["group_size"] = max(int(g.get("size") or 0) for g in groups)
    per_node: dict[int, set[int]] = {}
    for g in lay.get("groups") or []:
        if len(g.get("nodes") or []) == 1:
            per_node.setdefault(g["nodes"][0], set()).update(g.get("ranks") or [])
    if per_node:
        out["gpus_per_node"] = max(len(r) for r in per_node.values())
    pgs = {str(g["pg"]) for g in groups}
    colls = [c for c in report.get("collectives") or []  # the table labels groups "name (desc)"
             if str(c.get("pg")).split(" ")[0] in pgs and c.get("busbw_gbps")]
    if colls:
        out["busbw_gbps"] = min(float(c.get("busbw_gbps") or 0.0) for c in colls)  # all known (above)
    nv = _nvlink_gbps(report)
    if nv:
        out["nvlink_gbps"] = nv
    return {k: v for k, v in out.items() if v is not None}


def tp_across_nodes(report: Report, budget: Budget | None = None, win: Window | None = None) -> list[Finding]:
    """One finding when any tensor-parallel group spans several nodes (see the module docstring),
    claiming its share from ``budget`` (a fresh one of the document's window when not given)."""
    lay: Mapping[str, Any] = report.get("layout") or {}
    spread = [g for g in lay.get("groups") or [] if g.get("role") == "tp" and len(g.get("nodes") or []) > 1]
    if not spread:
        return []
    win = win or window_of(report)
    if win is None:
        return []
    budget = budget or Budget(win.parts)
    keys = budget.keys("comm_transfer", "tp")
    share = budget.claim(keys)
    numbers = role_numbers(report, "tp")
    busbw, nv, nodes = numbers.get("busbw_gbps"), numbers.get("nvlink_gbps"), int(numbers["nodes"])
    text, predicted = explain.advice("tp", "comm_transfer", dict(numbers, share_us=share / win.n))
    worst = max(spread, key=lambda g: len(g["nodes"]))
    title = (f"Tensor-parallel group spans {nodes} nodes: per-layer collectives at network speed "
             f"({len(spread)} of {sum(1 for g in lay.get('groups') or [] if g.get('role') == 'tp')} TP groups)")
    evidence = [f"process group {worst['pg']} ({worst.get('desc') or 'no description'}): ranks "
                f"{worst['ranks'][:16]} on nodes {worst['nodes']} — {worst.get('evidence')}"]
    if busbw is not None:
        evidence.append(f"measured bus bandwidth of its collectives: {busbw:.1f} GB/s"
                        + (f" vs {nv:.0f} GB/s NVLink peak per direction" if nv else ""))
    degrees = lay.get("degrees") or {}
    sugg = [f"Reorder the device mesh so TP (degree {degrees.get('tp')}) is the innermost, node-local dimension "
            "(torchrun places consecutive ranks on one node; Megatron orders tp-cp-ep-dp-pp with tp fastest).",
            "If TP must be larger than a node, use pipeline parallelism across nodes instead."]
    rank = keys[0][2] if keys else None
    return [make_finding("tp_across_nodes", title, share, win, "comm_transfer", "tp", rank, text, evidence, sugg,
                         predicted_us=(predicted * win.n if predicted is not None else None))]


# ------------------------------------------------------------------------------------------------
# findings that fit the workload (training, serving, inference)

#: Words of advice that only make sense while training.
_TRAINING_ONLY = re.compile(r"data[- ]?loader|optimi[sz]er|foreach|fused=True|gradient|backward|\bDDP\b|bucket|"
                            r"no_sync|accumulation|FSDP|checkpoint|pin_memory", re.IGNORECASE)

_SERVING_ADVICE: dict[tuple[str, str | None], str] = {
    ("host_bound", None): (
        "The GPU waited for the engine's CPU side between kernels: scheduling, input preparation, sampling and "
        "Python overhead of each iteration. Run decode under CUDA graphs (vLLM and SGLang capture graphs for a set "
        "of batch sizes: check this batch size is among them and that eager mode is off), enable asynchronous / "
        "overlapped scheduling, and keep logging and detokenisation out of the iteration."),
    ("compute_other", None): (
        "Small kernels leave the GPU under-used at this batch size: serve more requests at once (max-num-seqs / "
        "max-running-requests), or capture decode iterations in CUDA graphs so their launches cost nothing."),
    ("comm_transfer", "tp"): (
        "Tensor-parallel all-reduce after every layer of every iteration is on the critical path: keep TP inside "
        "one NVLink domain, use the engine's custom or fused all-reduce (all-reduce + RMSNorm fusion, symmetric "
        "memory), or serve with fewer TP ranks and more replicas when the model fits."),
    ("comm_wait", "tp"): (
        "Tensor-parallel ranks wait for each other inside the per-layer all-reduce: one rank's GPU or CPU is "
        "slower each iteration; compare the ranks (traceread diff) and check the slow rank's host for other load."),
}


def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.;])\s+", text) if s]


def fit_to_workload(findings: list[Finding], report: Report) -> list[Finding]:
    """Findings of a serving or inference job told in its terms: advice that fits an engine replaces
    training advice (data loaders, optimizers, gradient buckets), and a prefill iteration among
    decode iterations is not a "slow step" (it processes whole prompts). Training jobs are untouched."""
    work: dict[str, Any] = dict(report.get("workload") or {})
    kind = work.get("kind")
    if kind not in ("serving", "inference"):
        return findings
    kinds = _iteration_kinds(report)
    common = max(sorted(set(kinds.values())), key=list(kinds.values()).count) if kinds else None
    out: list[Finding] = []
    for f in findings:
        if f.get("id") == "slow_steps" and kinds:
            steps = [int(s) for s in re.findall(r"step (\d+):", " ".join(f.get("evidence") or []))]
            if steps and all(kinds.get(s) not in (None, common) for s in steps):
                continue  # prefill among decodes (or the reverse): their own kind of iteration, not slow
        g: dict[str, Any] = dict(f)
        key = (str(f.get("category")), f.get("role") if f.get("category", "").startswith("comm") else None)
        if kind == "serving" and key in _SERVING_ADVICE:
            g["explanation"] = _SERVING_ADVICE[key]
        else:
            kept = [s for s in _sentences(str(f.get("explanation") or "")) if not _TRAINING_ONLY.search(s)]
            g["explanation"] = " ".join(kept)
        g["suggestions"] = [s for s in f.get("suggestions") or [] if not _TRAINING_ONLY.search(s)]
        out.append(g)  # type: ignore[arg-type]
    return out


def _iteration_kinds(report: Report) -> dict[int, str]:
    """Step -> prefill / decode / mixed of the engine iterations (from the ranks' step entries)."""
    out: dict[int, str] = {}
    for e in report.get("ranks") or []:
        for s in e.get("steps") or []:
            if s.get("iteration"):
                out.setdefault(int(s["step"]), str(s["iteration"]))
    return out
