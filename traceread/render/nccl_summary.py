"""The NCCL section of the terminal summary: what the NCCL logs say about the job's communication.

Shown whenever NCCL logs were found, and the whole report when they are all there is (a job that
crashed or hung before writing any trace). The diagnoses themselves are findings (``nccl_*``).
"""

from __future__ import annotations

from typing import Any

from traceread.report_schema import Report


def nccl_lines(report: Report) -> list[str]:
    """A few plain lines: version, size, network and transports, init time, WARN lines, timeouts."""
    n: dict[str, Any] = report.get("nccl") or {}
    if not n:
        return []
    parts = [f"NCCL {n.get('version') or '(version not logged)'}"]
    if n.get("nranks"):
        parts.append(f"{n['nranks']} ranks" + (f" on {n['nodes']} node(s)" if n.get("nodes") else ""))
    if n.get("network"):
        gdrdma = n.get("gdrdma")
        gdr = {True: ", GPUDirect RDMA", False: ", no GPUDirect RDMA"}.get(gdrdma, "") if gdrdma is not None else ""
        parts.append(f"network {n['network']}{gdr}")
    transports = n.get("transports") or {}
    if transports:
        parts.append("transports " + ", ".join(f"{k}×{v}" for k, v in sorted(transports.items(), key=lambda kv: -kv[1])))
    if n.get("init_time_s") is not None:
        parts.append(f"slowest communicator init {n['init_time_s']:.2f} s")
    lines = ["NCCL logs (" + f"{len(n.get('files') or [])} file(s)): " + " · ".join(parts)]
    warns = n.get("warnings") or []
    if warns:
        lines.append(f"  {len(warns)} NCCL WARN line(s); first: {warns[0].get('message')}")
    timeouts = n.get("timeouts") or []
    if timeouts:
        t = timeouts[0]
        lines.append(f"  {len(timeouts)} collective timeout(s); first: rank {t.get('rank')} {t.get('op')} #{t.get('seq')}")
    if not report.get("ranks"):
        lines.append("  (no trace: the answer above comes from the NCCL logs alone)")
    return lines
