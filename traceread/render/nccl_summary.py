"""The NCCL section of the terminal summary: what NCCL's logs and Inspector files say about the job.

Shown whenever NCCL records were found, and the whole report when they are all there is (a job that
crashed or hung before writing any trace, or one profiled with the NCCL Inspector only). The
diagnoses themselves are findings (``nccl_*``); ``info`` ones are listed here only.
"""

from __future__ import annotations

from typing import Any

from traceread.report_schema import Report


def _plugin(n: dict[str, Any]) -> str | None:
    p: dict[str, Any] = n.get("plugin") or {}
    if not p.get("kind") or p.get("kind") in ("socket",):
        return None
    bits = [str(p.get("version") or p.get("name") or p["kind"])]
    if p.get("provider"):
        bits.append(f"provider {p['provider']}" + (f", fabric {p['fabric']}" if p.get("fabric") else ""))
    if p.get("nics"):
        bits.append(f"{p['nics']} NIC(s)")
    if p.get("gdr") is False:
        bits.append("no GDR")
    if p.get("failed"):
        bits.append("FAILED to initialise")
    return "plugin " + ", ".join(bits)


def _init(n: dict[str, Any]) -> str | None:
    worst = n.get("init_slowest")
    if worst:
        comms = n.get("comms") or []
        where = f" (communicator {worst['comm_index'] + 1} of {len(comms)}, rank {worst['rank']})" if len(comms) > 1 else \
            f" (rank {worst['rank']})"
        return f"slowest communicator init {worst['total_s']:.2f} s{where}"
    if n.get("init_time_s") is not None:
        return f"slowest communicator init {n['init_time_s']:.2f} s"
    return None


def _inspector(n: dict[str, Any]) -> list[str]:
    ins: dict[str, Any] = n.get("inspector") or {}
    if not ins:
        return []
    comms = ins.get("comms") or []
    line = (f"NCCL Inspector ({len(ins.get('files') or [])} file(s)): {ins.get('records', 0)} collective record(s) "
            f"on {len(comms)} communicator(s)")
    if ins.get("slow_collectives_total"):
        line += f" · {ins['slow_collectives_total']} slow collective(s)"
    out = [line]
    for c in comms[:4]:
        big = max(c.get("collectives") or [{}], key=lambda k: k.get("msg_bytes") or 0)
        if not big.get("coll"):
            continue
        peak = f" = {big['pct_of_peak']:.0f}% of {c.get('peak_link')}" if big.get("pct_of_peak") is not None else ""
        bw = big.get("median_busbw_gbs")
        out.append(f"  {c.get('comm_id')} ({c.get('nranks')} ranks, {c.get('nnodes')} node(s)): {big['coll']} of "
                   f"{big['msg_bytes']} B, busbw {bw:.1f} GB/s{peak}" if bw is not None else
                   f"  {c.get('comm_id')} ({c.get('nranks')} ranks): {big['coll']} of {big['msg_bytes']} B")
    if ins.get("truncated"):
        out.append("  (stopped reading after the record limit; the rest of the files was not read)")
    return out


def _count(n: Any, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def nccl_lines(report: Report) -> list[str]:
    """A few plain lines: version, size, communicators, network and plugin, transports, init time,
    environment settings, WARN lines, timeouts, the Inspector's bandwidth, info remarks."""
    n: dict[str, Any] = report.get("nccl") or {}
    if not n:
        return []
    lines: list[str] = []
    if n.get("files"):
        parts = [f"NCCL {n.get('version') or '(version not logged)'}"]
        if n.get("nranks"):
            parts.append(_count(n["nranks"], "rank") + (f" on {_count(n['nodes'], 'node')}" if n.get("nodes") else ""))
        comms = n.get("comms") or []
        if len(comms) > 1:
            parts.append(f"{len(comms)} communicators")
        if n.get("network"):
            gdr = {True: ", GPUDirect RDMA", False: ", no GPUDirect RDMA"}.get(n.get("gdrdma"), "")  # type: ignore[arg-type]
            if str(n["network"]).lower() == "socket":
                gdr = ""  # sockets never use it: saying so adds nothing
            parts.append(f"network {n['network']}{gdr}")
        if (plugin := _plugin(n)):
            parts.append(plugin)
        transports = n.get("transports") or {}
        if transports:
            parts.append("transports " + ", ".join(f"{k}×{v}" for k, v in sorted(transports.items(), key=lambda kv: -kv[1])))
        if (init := _init(n)):
            parts.append(init)
        lines.append(f"NCCL logs ({_count(len(n.get('files') or []), 'file')}): " + " · ".join(parts))
        env = n.get("env") or {}
        if env:
            lines.append("  set by environment: " + ", ".join(f"{k}={v}" for k, v in list(env.items())[:8]))
        warns = n.get("warnings") or []
        if warns:
            lines.append(f"  {len(warns)} NCCL WARN line(s); first: {warns[0].get('message')}")
        problems = n.get("problems") or []
        if problems and len(problems) > len(warns):
            lines.append(f"  {_count(n.get('problems_total') or len(problems), 'problem line')} (WARN, error returns, "
                         f"failures, timeouts); first: {problems[0].get('quote')}")
        versions = n.get("versions_by_host") or {}
        if len(set(versions.values())) > 1:
            lines.append("  NCCL versions differ: " + ", ".join(f"{h} {v}" for h, v in list(versions.items())[:6]))
        unread = n.get("unread") or {}
        if unread.get("count"):
            lines.append(f"  {_count(unread['count'], 'line')} mention NCCL but could not be read (first: "
                         f"{unread.get('first')})")
        timeouts = n.get("timeouts") or []
        if timeouts:
            t = timeouts[0]
            lines.append(f"  {len(timeouts)} collective timeout(s); first: rank {t.get('rank')} {t.get('op')} #{t.get('seq')}")
    lines += _inspector(n)
    for d in n.get("diagnoses") or []:
        if d.get("severity") == "info":
            lines.append(f"  note: {d.get('message')}")
    if not report.get("ranks"):
        lines.append("  (no trace: the answer above comes from NCCL's own records alone)")
    return lines
