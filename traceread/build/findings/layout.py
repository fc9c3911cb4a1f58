"""Findings that come from the parallel layout (``report["layout"]``, :mod:`traceread.analysis.comm.layout`).

* **tp_across_nodes** — a tensor-parallel group whose ranks sit on more than one node: its
  per-layer collectives cross the network (the NVLink → InfiniBand cliff). Its impact is the job
  ledger's share of tensor-parallel communication transfer (``comm_transfer``, role ``tp``): it is
  the *cause* of that share (computed here on the critical rank's own; the ledger findings then
  claim the TP transfer of the critical path, late peers' included, and scale the saving), so it
  replaces the generic exposed-TP-communication finding rather than adding to it; the predicted
  saving (:func:`traceread.build.explain.advice`) is the share times (1 − measured busbw ÷ NVLink peak).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from traceread.build import explain
from traceread.build.queries import pct_of_step
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


def _ledger_share(report: Report, category: str, role: str) -> float:
    """The critical rank's own share of (category, role) in the job ledger (the parts attributed to a
    late peer belong to the straggler finding)."""
    led = report.get("ledger") or {}
    crit = led.get("critical_rank")
    return sum(float(p["us"]) for p in led.get("parts") or []
               if p.get("category") == category and p.get("role") == role and (crit is None or p.get("rank") == crit))


def role_numbers(report: Report, role: str | None) -> dict[str, Any]:
    """The layout's numbers :func:`traceread.build.explain.advice` needs for a share of ``role``:
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


def tp_across_nodes(report: Report) -> list[Finding]:
    """One finding when any tensor-parallel group spans several nodes (see the module docstring)."""
    lay: Mapping[str, Any] = report.get("layout") or {}
    spread = [g for g in lay.get("groups") or [] if g.get("role") == "tp" and len(g.get("nodes") or []) > 1]
    if not spread:
        return []
    numbers = role_numbers(report, "tp")
    busbw, nv, nodes = numbers.get("busbw_gbps"), numbers.get("nvlink_gbps"), int(numbers["nodes"])
    share = _ledger_share(report, "comm_transfer", "tp")
    text, predicted = explain.advice("tp", "comm_transfer", dict(numbers, share_us=share))
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
    f: Finding = {
        "id": "tp_across_nodes", "title": title, "impact_us_per_step": share, "impact_pct": pct_of_step(share, report),
        "explanation": text, "evidence": evidence, "suggestions": sugg,
        "category": "comm_transfer", "role": "tp", "rank": None,
    }
    if predicted is not None:
        f["predicted_saving_us"] = predicted
    return [f]
