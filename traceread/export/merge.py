"""Stream a whole job into one Chrome-trace JSON file (plain or gzip), rank by rank.

Memory: only one rank's events are decoded at a time; each is encoded and written before the next
rank is read. What crosses ranks is small: the findings' extracts (communication events, step
windows) and a few hundred slices per finding. The clock offsets and the findings come from the
report document (:func:`traceread.assemble.report.build_report`), so the file shows what the report says.

File layout: ``{"traceEvents": [rank 0 ..., rank 1 ..., findings ...], "displayTimeUnit": "ms",
"otherData": {...}}``; ``otherData`` records the clock (method, offsets, uncertainty), the selection
and the findings that have no place on the timeline.
"""

from __future__ import annotations

import gzip
import io
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from traceread import __version__
from traceread.errors import TraceFileError
from traceread.export.marks import FindingMarks
from traceread.export.rank_events import RankEvents, metadata_events, rank_events, rank_pid
from traceread.export.selection import rank_window

if TYPE_CHECKING:
    from traceread.report_schema import RankEntry, Report


@dataclass
class ExportOptions:
    """The selection (``--ranks``, ``--steps``, ``--no-host``) and the reader's cache settings."""

    ranks: set[int] | None = None
    steps: tuple[int | None, int | None] | None = None
    gpu_only: bool = False
    use_cache: bool = True
    cache_dir: Path | None = None


@dataclass
class ExportResult:
    path: Path
    bytes_written: int
    events: int
    ranks: list[int]
    findings_slices: int
    warnings: list[str] = field(default_factory=list)


class _CountingWriter:
    """Bytes out (gzip when the name ends in .gz), counting what lands on disk."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._raw = open(path, "wb")  # closed in close()
        self._out: io.BufferedIOBase | gzip.GzipFile = (
            gzip.GzipFile(fileobj=self._raw, mode="wb", compresslevel=6) if path.name.endswith(".gz") else self._raw)
        self._first = True

    def raw(self, data: bytes) -> None:
        self._out.write(data)

    def events(self, items: Iterable[bytes]) -> int:
        n = 0
        for item in items:
            self._out.write(item if self._first else b",\n" + item)
            self._first = False
            n += 1
        return n

    def close(self) -> int:
        if self._out is not self._raw:
            self._out.close()
        self._raw.close()
        return self.path.stat().st_size


def process_name(entry: RankEntry) -> str:
    """``rank N (host, device)`` — the parts that are unknown are left out."""
    parts = [str(x) for x in (entry.get("host"), entry.get("device")) if x]
    return f"rank {entry['rank']}" + (f" ({', '.join(parts)})" if parts else "")


def export_trace(report: Report, out: str | Path, options: ExportOptions | None = None,
                 progress: Callable[[str], None] | None = None) -> ExportResult:
    """Write the merged trace of the ranks in ``report`` to ``out`` (see the module docstring)."""
    from traceread.engine.jobs import read_rank

    opts = options or ExportOptions()
    path = Path(out)
    clock = (report.get("source") or {}).get("clock") or {}
    offsets = {int(k): float(v) for k, v in (clock.get("offsets_us") or {}).items()}
    entries = sorted(report.get("ranks") or [], key=lambda e: e["rank"])
    chosen = [e for e in entries if opts.ranks is None or e["rank"] in opts.ranks]
    exported = {int(e["rank"]) for e in chosen}
    marks = FindingMarks(report, opts.steps)
    warnings: list[str] = []
    w = _CountingWriter(path)
    total = 0
    try:
        w.raw(b'{"traceEvents": [\n')
        for e in entries:
            rank = int(e["rank"])
            is_out = rank in exported
            if not is_out and not marks.wants_tables(rank, False):
                continue
            rt = None
            try:
                rt = read_rank(e["file"], use_cache=opts.use_cache, cache_dir=opts.cache_dir)
            except TraceFileError as exc:
                warnings.append(f"rank {rank}: {exc}")
                continue
            if marks.wants_tables(rank, is_out):
                try:
                    marks.observe(rt, rank, is_out)
                except Exception as exc:  # a finding's marks must not stop the export
                    warnings.append(f"rank {rank}: findings marks skipped: {type(exc).__name__}: {exc}")
            if not is_out:
                continue
            window = rank_window(e, rt.steps, opts.steps)
            del rt
            info = RankEvents()
            try:
                total += w.events(rank_events(e["file"], rank, offsets.get(rank, 0.0), window=window,
                                              gpu_only=opts.gpu_only, info=info))
            except TraceFileError as exc:
                warnings.append(f"rank {rank}: {exc}")
                continue
            total += w.events(metadata_events(rank_pid(rank), process_name(e), rank, info.threads))
            marks.note_end(rank, info.last_end)
            if progress:
                progress(f"rank {rank}")
        try:
            from traceread.export.watch_track import watch_events

            total += w.events(watch_events(report))  # a watched run: whole-job step time + captured windows
        except Exception as exc:
            warnings.append(f"watch track skipped: {type(exc).__name__}: {exc}")
        try:
            total += w.events(marks.events())
            n_marks = len(marks.slices)
        except Exception as exc:
            warnings.append(f"findings track incomplete: {type(exc).__name__}: {exc}")
            n_marks = 0
        other = {
            "generator": f"traceread {__version__}",
            "clock": {"method": clock.get("method", "none"), "reference": "rank clocks shifted by -offsets_us",
                      "epsilon_us": clock.get("epsilon_us"), "offsets_us": clock.get("offsets_us") or {},
                      "note": (f"times are on one clock; ranks on different hosts agree to ±{clock.get('epsilon_us', 0):.0f} µs"
                               if clock else "no clock alignment: each rank on its own clock")},
            "ranks": sorted(exported), "steps": list(opts.steps) if opts.steps else None, "gpu_only": opts.gpu_only,
            "findings_not_on_timeline": marks.unplaced(), "warnings": warnings,
        }
        w.raw(b'\n], "displayTimeUnit": "ms", "otherData": ' + msgspec.json.encode(other) + b"}\n")
    finally:
        size = w.close()
    return ExportResult(path, size, total, sorted(exported), n_marks, warnings)
