"""``traceread report --cycle all``: one report per profiling cycle, and the drift between them.

Above :mod:`traceread.assemble.report`: it runs the same analysis once per cycle the reader
found (:mod:`traceread.read.cycles`) and hands the documents to :func:`traceread.compare.drift.drift`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from traceread.options import ReportOptions
    from traceread.report_schema import Report


def build_all_cycles(paths: Sequence[str | Path], options: ReportOptions) -> Report:
    """``traceread report --cycle all``: one report per cycle of the latest run (the same analysis
    each time, files chosen by ``reader.cycles``), returned as the latest cycle's report with
    ``source.cycles`` and ``drift`` added. A single cycle gives a report without ``drift``."""
    from dataclasses import replace

    from traceread.assemble.report import build_report
    from traceread.compare.drift import drift
    from traceread.read import cycles as cyc
    from traceread.read.discover import find

    found = find(paths)
    sel = cyc.select(found.files, "all", [])
    per: list[tuple[dict[str, Any], Report]] = []
    for c in sel.chosen:
        rep = build_report(paths, replace(options, cycle=c.label))
        per.append(((rep.get("source") or {}).get("cycle") or c.to_json(), rep))
    if not per:
        return build_report(paths, options)
    main = per[-1][1]
    if len(per) > 1:
        main["drift"] = drift(per)
        main["warnings"] = [w for w in main.get("warnings") or [] if "profiling cycles found" not in w]
        main["warnings"].insert(0, f"--cycle all: {sel.why}; the sections above the drift table are the latest "
                                   f"cycle's ({per[-1][0].get('label')})")
    return main
