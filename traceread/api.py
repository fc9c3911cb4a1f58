"""The Python API: ``traceread.analyze(paths, **options) -> Report``, for notebooks and scripts.

The same engine, caches and analyses as ``traceread report`` (a report built here is a cache hit for
the CLI and the other way round); the answer as text and every table of the report as a polars
DataFrame (:mod:`traceread.render.tables`), the document itself as a dict (schema
``traceread.report/1``), and the same JSON, HTML, CSV and text outputs as the command::

    import traceread

    rep = traceread.analyze("sample_traces/ddp_straggler_h100")
    print(rep.answer)                      # the first line of `traceread report`
    rep.findings.select("title", "impact_us_per_step")
    rep.ranks.sort("step_us", descending=True).head()
    rep.to_html("report.html")

See docs/api.md.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traceread.assemble.report import NothingUsableError, ReportOptions
from traceread.errors import TraceReadError

if TYPE_CHECKING:
    import polars as pl

__all__ = ["Report", "analyze", "NothingUsableError", "TraceReadError"]

PathLike = str | os.PathLike[str]
_OPTION_NAMES = tuple(f.name for f in dataclasses.fields(ReportOptions))


class Report:
    """One analysed run: the answer, every table as a DataFrame, and the report's outputs.

    ``document`` is the report document (a dict, schema ``traceread.report/1``, as ``traceread
    report --format json`` prints it). Table properties are built on first use and kept.
    """

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self._tables: dict[str, pl.DataFrame] = {}

    # -------------------------------------------------------------------------------- the answer

    @property
    def answer(self) -> str:
        """The biggest loss in one sentence (the ANSWER line of the terminal report)."""
        from traceread.render.terminal import answer

        return answer(self.document)[0]  # type: ignore[arg-type]

    @property
    def change(self) -> str | None:
        """What to change first (the CHANGE line), or None."""
        from traceread.render.terminal import answer

        return answer(self.document)[1]  # type: ignore[arg-type]

    @property
    def headline(self) -> str:
        """What the job is: ranks, backend, device, steps, median step time."""
        from traceread.render.terminal import headline

        return headline(self.document)  # type: ignore[arg-type]

    @property
    def step_us(self) -> float | None:
        """The job's step time: median over ranks of each rank's mean step (µs)."""
        from traceread.assemble.queries import median_step_us

        return median_step_us(self.document)  # type: ignore[arg-type]

    @property
    def warnings(self) -> list[str]:
        return list(self.document.get("warnings") or [])

    # -------------------------------------------------------------------------------- the tables

    def table(self, name: str) -> pl.DataFrame:
        """One table by name (:attr:`table_names`); an empty DataFrame when the run has none."""
        from traceread.render.tables import TABLES, table

        if name not in TABLES:
            raise KeyError(f"no table {name!r}; tables: {', '.join(TABLES)}")
        if name not in self._tables:
            self._tables[name] = table(self.document, name)  # type: ignore[arg-type]
        return self._tables[name]

    @property
    def table_names(self) -> list[str]:
        from traceread.render.tables import TABLES

        return list(TABLES)

    def tables(self) -> dict[str, pl.DataFrame]:
        """Every table by name (empty ones included)."""
        return {n: self.table(n) for n in self.table_names}

    @property
    def findings(self) -> pl.DataFrame:
        """Biggest share of the step first: id, title, impact_us_per_step, impact_pct, category, role, rank…"""
        return self.table("findings")

    @property
    def ledger(self) -> pl.DataFrame:
        """The job's step ledger: category, role, rank, us (sums to the ledger's step)."""
        return self.table("ledger")

    @property
    def rank_ledgers(self) -> pl.DataFrame:
        return self.table("rank_ledgers")

    @property
    def ranks(self) -> pl.DataFrame:
        """One row per rank: step_us and the per-step split (means over its steps), efficiency numbers."""
        return self.table("ranks")

    @property
    def steps(self) -> pl.DataFrame:
        """One row per rank and step: start, duration and that step's own split."""
        return self.table("steps")

    @property
    def kernels(self) -> pl.DataFrame:
        return self.table("kernels")

    @property
    def collectives(self) -> pl.DataFrame:
        return self.table("collectives")

    @property
    def stragglers(self) -> pl.DataFrame:
        return self.table("stragglers")

    @property
    def slow_steps(self) -> pl.DataFrame:
        return self.table("slow_steps")

    @property
    def layout(self) -> pl.DataFrame:
        """Process groups and their roles (dp, tp, pp, …), members and nodes."""
        return self.table("layout")

    @property
    def operators(self) -> pl.DataFrame:
        """Roofline operators: FLOP/byte, TFLOP/s, bound (the detailed rank)."""
        return self.table("operators")

    # -------------------------------------------------------------------------------- outputs

    def to_dict(self) -> dict[str, Any]:
        return self.document

    def to_json(self, path: PathLike | None = None, *, indent: bool = True) -> str:
        """The JSON document (``traceread report --format json``); also written to ``path`` if given."""
        from traceread.render.json_report import to_json

        text = to_json(self.document, indent=indent)  # type: ignore[arg-type]
        if path is not None:
            Path(path).write_text(text + "\n", encoding="utf-8")
        return text

    def to_html(self, path: PathLike, *, title: str | None = None) -> Path:
        """The offline HTML page, written to ``path``."""
        from traceread.render.html import write_html

        return write_html(self.document, path, title=title)  # type: ignore[arg-type]

    def to_csv(self, folder: PathLike) -> list[Path]:
        """One CSV per non-empty table in ``folder`` (``traceread report --format csv``)."""
        from traceread.render.tables import write_csv

        return write_csv(self.document, folder)  # type: ignore[arg-type]

    def to_text(self, *, top: int = 10, width: int = 100) -> str:
        """The terminal summary as plain text."""
        from traceread.render.terminal import render_text

        return render_text(self.document, top=top, width=width)  # type: ignore[arg-type]

    def __repr__(self) -> str:
        return f"<traceread.Report {self.headline}\n  ANSWER: {self.answer}>"

    def _repr_html_(self) -> str:
        """What a notebook cell shows: the answer, the step ledger as a bar, the findings (the page's
        own templates; nothing loaded from outside)."""
        from traceread.render.notebook import notebook_html

        return notebook_html(self.document)  # type: ignore[arg-type]

    @property
    def figures(self) -> dict[str, Any]:
        """The page's charts that have data, as plotly Figures by name (``rep.figures["ledger"]``)."""
        from traceread.render.notebook import figures

        return figures(self.document)  # type: ignore[arg-type]

    def finding(self, which: int | str) -> dict[str, Any]:
        """One finding: by its place in :attr:`findings` (0 = the answer) or by id (the first of that id)."""
        found = list(self.document.get("findings") or [])
        if isinstance(which, int):
            if not -len(found) <= which < len(found):
                raise IndexError(f"finding {which}: the report has {len(found)} finding(s)")
            return found[which]
        for f in found:
            if f.get("id") == which:
                return f
        raise KeyError(f"no finding {which!r}; findings: {', '.join(str(f.get('id')) for f in found) or 'none'}")

    def explain(self, which: int | str | dict[str, Any] = 0) -> str:
        """A finding in words: what it costs, why (explanation), the evidence, what to change."""
        f = which if isinstance(which, dict) else self.finding(which)
        lines = [str(f.get("title") or f.get("id"))]
        if f.get("impact_us_per_step"):
            from traceread.fmt import ms

            pct = f.get("impact_pct")
            lines.append(f"Costs {ms(f['impact_us_per_step'])} per step" + (f" ({pct:.1f}% of the step)" if pct else "")
                         + (f"; predicted saving {ms(f['predicted_saving_us'])}" if f.get("predicted_saving_us") else ""))
        if f.get("explanation"):
            lines += ["", str(f["explanation"])]
        if f.get("evidence"):
            lines += ["", "Evidence:"] + [f"  - {e}" for e in f["evidence"]]
        if f.get("suggestions"):
            lines += ["", "What to change:"] + [f"  - {e}" for e in f["suggestions"]]
        return "\n".join(lines)


def options(**kw: Any) -> ReportOptions:
    """:class:`ReportOptions` from keyword arguments (``device_spec``/``cache_dir`` as paths);
    an unknown name is a TypeError that lists the known ones."""
    unknown = sorted(set(kw) - set(_OPTION_NAMES))
    if unknown:
        raise TypeError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(_OPTION_NAMES)}")
    for name in ("device_spec", "cache_dir"):
        if kw.get(name) is not None:
            kw[name] = Path(kw[name])
    return ReportOptions(**kw)


def analyze(paths: PathLike | Sequence[PathLike], *, max_rank_bytes: int | str | None = None, **kw: Any) -> Report:
    """Analyse the traces under ``paths`` (run folders, trace files, globs, object URLs) as
    ``traceread report`` does, and return the :class:`Report`.

    Options are the :class:`traceread.options.ReportOptions` fields, e.g. ``workers=4``,
    ``use_cache=False``, ``params=7e9, tokens_per_step=4_194_304``, ``cycle="all"``,
    ``executor="ray"``, ``device_spec="h20.toml"``; ``max_rank_bytes`` (bytes or "64GiB") is the
    reader's size guard. Raises :class:`NothingUsableError` (a :class:`TraceReadError`) when no
    trace could be analysed, and :class:`TraceReadError` for inconsistent input.
    """
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not items:
        raise TraceReadError("no paths given")
    opts = options(**kw)
    from traceread.compare.captures import build_watched
    from traceread.read.inflate import parse_size, rank_bytes_limit

    limit = parse_size(str(max_rank_bytes)) if max_rank_bytes is not None else None
    given = [str(p) if isinstance(p, os.PathLike) else p for p in items]
    with rank_bytes_limit(limit):  # this call's limit only: the next call without one gets the default
        return Report(build_watched(given, opts))  # type: ignore[arg-type]  # --cycle all and watched runs too
