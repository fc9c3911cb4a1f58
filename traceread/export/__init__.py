"""One Chrome-trace / Perfetto file for a whole job: every rank on the report's clock, plus findings.

Why: an engineer confirms a diagnosis by looking at the timeline, and Kineto writes one file per
rank on clocks that need not agree. :func:`export_trace` streams every rank's own events (its
threads and GPU streams kept, pids/tids remapped so ranks never collide) into one JSON file, each
rank shifted by the clock offset the report estimated (``report["source"]["clock"]``), and adds a
``traceread findings`` process whose slices show where and when each finding happens.

Modules: :mod:`.selection` (``--steps`` / ``--ranks`` parsing and the per-rank time window),
:mod:`.rank_events` (one rank's events remapped), :mod:`.marks` (the findings slices),
:mod:`.merge` (the streaming writer that puts them together).
"""

from traceread.export.merge import ExportOptions, ExportResult, export_trace

__all__ = ["ExportOptions", "ExportResult", "export_trace"]
