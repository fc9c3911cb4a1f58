"""The job ledger rebuilt from each rank's summary, as the report builds it: the tests that compare it with
the simulator's truth share this one reconstruction."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from traceread.analysis.ledger import job as job_ledger


def rebuild_ledgers(folder: Path) -> dict[str, Any]:
    """The report (layout, job ledger, findings) and every rank's final and local segments."""
    from traceread.analysis.comm import clocks, collectives, layout
    from traceread.assemble.rank_map import summarise_rank
    from traceread.assemble.report import ReportOptions, build_report
    from traceread.engine.jobs import read_rank
    from traceread.read.ranks import identify

    report = build_report([folder], ReportOptions(use_cache=False, workers=1))
    summaries = []
    for f in sorted(folder.glob("rank*.pt.trace.json.gz")):
        rt = read_rank(f, use_cache=False)
        identify(rt, single=False)
        summaries.append(summarise_rank(rt))
    roles = {str(g["pg"]): g["role"] for g in (report.get("layout") or {}).get("groups") or []}
    # as the report does (assemble.job_reduce): traffic naming no group is the layout's unnamed row
    role_of = (lambda pg: roles.get(layout.group_key(pg, roles), "other")) if roles else None
    extracts = [s.comm for s in summaries if s.comm.height]
    matched = collectives.match_collectives(extracts) if extracts else None
    clock = clocks.estimate_offsets(matched) if matched is not None else None
    segs = {s.entry["rank"]: s.ledger_segments for s in summaries}
    final = job_ledger.build(segs, extracts, matched, clock, role_of)
    local = job_ledger.build(segs, extracts, None, None, role_of)
    return {"report": report, "final": final, "local": local}
