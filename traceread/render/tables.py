"""The report document as flat tables: one polars DataFrame per table, for CSV and the Python API.

Each table is a function of the document alone (:data:`TABLES`, name → builder), so a new part of
the document gets a new entry here and appears in ``--format csv`` and in ``traceread.analyze(...)``
alike. Columns are the document's own field names (units in the name: ``_us`` microseconds,
``_pct`` percent, ``_gbps`` GB/s); per-step values are means over the rank's analysed steps, as in
every view (:mod:`traceread.assemble.queries`). Nested values become JSON text in a CSV file.

polars is imported inside the functions: a cached report rendered as text or HTML never loads it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from traceread.assemble.queries import host_bound_per_step, per_step, step_us
from traceread.report_schema import Report

if TYPE_CHECKING:
    import polars as pl

Rows = list[dict[str, Any]]

#: Per-step means shown for each rank (the GPU split; the CPU split on CPU-only ranks).
STEP_FIELDS = ("compute_us", "comm_us", "exposed_comm_us", "exposed_memcpy_us", "idle_us",
               "cpu_compute_us", "cpu_comm_us", "cpu_exposed_comm_us", "cpu_idle_us")


def findings_rows(report: Report) -> Rows:
    return [{"order": i, "id": f.get("id"), "title": f.get("title"), "impact_us_per_step": f.get("impact_us_per_step"),
             "impact_pct": f.get("impact_pct"), "predicted_saving_us": f.get("predicted_saving_us"),
             "category": f.get("category"), "role": f.get("role"), "rank": f.get("rank"),
             "explanation": f.get("explanation"), "suggestion": next(iter(f.get("suggestions") or []), None),
             "evidence": f.get("evidence") or []}
            for i, f in enumerate(report.get("findings") or [], 1)]


def ledger_rows(report: Report) -> Rows:
    """The job ledger (the critical rank's median step, parts summing to ``step_us``)."""
    led = report.get("ledger") or {}
    return [{"step": led.get("step"), "critical_rank": led.get("critical_rank"), "category": p["category"],
             "role": p.get("role"), "rank": p.get("rank"), "us": p["us"]} for p in led.get("parts") or []]


def rank_ledger_rows(report: Report) -> Rows:
    return [{"rank": r["rank"], "step": r["ledger"].get("step"), "step_us": r["ledger"].get("step_us"),
             "category": p["category"], "role": p.get("role"), "us": p["us"]}
            for r in report.get("ranks") or [] if r.get("ledger") for p in r["ledger"].get("parts") or []]


def rank_rows(report: Report) -> Rows:
    """One row per rank: identity, mean step, the per-step split, the efficiency numbers."""
    out = []
    for r in report.get("ranks") or []:
        row: dict[str, Any] = {"rank": r.get("rank"), "host": r.get("host"), "device": r.get("device"),
                               "file": r.get("file"), "steps": len(r.get("steps") or []), "step_us": step_us(r)}
        for f in STEP_FIELDS:
            row[f] = per_step(r, f)
        row["host_bound_us"] = host_bound_per_step(r)
        for f in ("comm_overlap_pct", "gpu_util_pct", "sm_efficiency_pct", "achieved_occupancy_pct", "mfu_pct", "hfu_pct"):
            row[f] = r.get(f)
        out.append(row)
    return out


def step_rows(report: Report) -> Rows:
    return [{"rank": r.get("rank"), **s} for r in report.get("ranks") or [] for s in r.get("steps") or []]


def _plain(key: str) -> Callable[[Report], Rows]:
    def rows(report: Report) -> Rows:
        return [dict(x) for x in report.get(key) or []]  # type: ignore[attr-defined]

    rows.__name__ = f"{key}_rows"
    return rows


def layout_rows(report: Report) -> Rows:
    layout: dict[str, Any] = dict(report.get("layout") or {})
    return [dict(g) for g in layout.get("groups") or []]


def operator_rows(report: Report) -> Rows:
    return [dict(o) for o in (report.get("roofline") or {}).get("ops") or []]


def warning_rows(report: Report) -> Rows:
    return [{"warning": w} for w in report.get("warnings") or []]


def capture_rows(report: Report) -> Rows:
    """A watched run's captures against the baseline (compare.captures): one row each, flat."""
    rows = []
    for c in (report.get("watch") or {}).get("captures") or []:
        steps, slow = c.get("steps") or [None, None], c.get("slow_steps") or [None, None]
        span, kernel, what = c.get("host_span") or {}, c.get("kernel") or {}, c.get("what") or {}
        rows.append({"capture": c.get("name"), "kind": c.get("kind"), "requested_by": c.get("requested_by"),
                     "first_step": steps[0], "last_step": steps[1], "step_us": c.get("step_us"),
                     "baseline_step_us": c.get("baseline_step_us"), "excess_us": c.get("excess_us"),
                     "changed": c.get("changed"), "rank": c.get("rank"), "what": what.get("category"),
                     "host_span": (span.get("caller") or {}).get("name") or span.get("name"),
                     "kernel": kernel.get("name"), "slow_first_step": slow[0], "slow_last_step": slow[1],
                     "slow_steps": c.get("n_slow_steps"), "lost_us": c.get("lost_us"), "sentence": c.get("sentence")})
    return rows


def series_rows(report: Report) -> Rows:
    """A watched run's job step-time series as the document keeps it (at most 1,000 points)."""
    s = (report.get("watch") or {}).get("series") or {}
    keys = ("step_first", "step_last", "job_median_us", "job_max_us", "wall_end_ns")
    return [dict(zip(keys, vals)) for vals in zip(*(s.get(k) or [] for k in keys))] if s else []


#: name → rows builder; ``--format csv`` writes ``<name>.csv`` for each non-empty one.
TABLES: dict[str, Callable[[Report], Rows]] = {
    "findings": findings_rows,
    "ledger": ledger_rows,
    "rank_ledgers": rank_ledger_rows,
    "ranks": rank_rows,
    "steps": step_rows,
    "kernels": _plain("kernels"),
    "collectives": _plain("collectives"),
    "stragglers": _plain("stragglers"),
    "slow_steps": _plain("slow_steps"),
    "layout": layout_rows,
    "operators": operator_rows,
    "warnings": warning_rows,
    "captures": capture_rows,
    "step_series": series_rows,
}


def frame(rows: Rows) -> pl.DataFrame:
    """Rows as a DataFrame (columns in first-seen order; ints and floats in one column become floats)."""
    import polars as pl

    if not rows:
        return pl.DataFrame()
    cols: dict[str, None] = {}
    for r in rows:
        cols.update(dict.fromkeys(r))
    data = [{c: r.get(c) for c in cols} for r in rows]
    return pl.DataFrame(data, infer_schema_length=None, strict=False)


def table(report: Report, name: str) -> pl.DataFrame:
    """One table of :data:`TABLES` as a DataFrame (empty, without columns, when the document has none)."""
    return frame(TABLES[name](report))


def _csv_ready(df: pl.DataFrame) -> pl.DataFrame:
    """Nested columns (lists, structs) as JSON text: CSV holds flat values only."""
    import polars as pl

    nested = [c for c, t in df.schema.items() if isinstance(t, (pl.List, pl.Struct, pl.Array, pl.Object))]
    if not nested:
        return df
    import orjson

    return df.with_columns(pl.Series(c, [None if v is None else orjson.dumps(v, option=orjson.OPT_NON_STR_KEYS).decode()
                                          for v in df[c].to_list()], dtype=pl.String) for c in nested)


def write_csv(report: Report, folder: str | Path) -> list[Path]:
    """One ``<table>.csv`` per non-empty table in ``folder`` (created); the paths written."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in TABLES:
        df = table(report, name)
        if df.height == 0:
            continue
        path = out / f"{name}.csv"
        _csv_ready(df).write_csv(path)
        written.append(path)
    return written
