"""Hand-built :class:`RankTrace` objects for analysis tests.

Tests state only the columns they care about; every other column of the model.py schemas is null,
exactly as the reader leaves columns a trace does not carry. One builder for every analysis test so
that a schema change in ``traceread/model.py`` is absorbed in one place.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import polars as pl

from traceread.model import FLOW_SCHEMA, GPU_SCHEMA, HOST_SCHEMA, STEP_SCHEMA, RankMeta, RankTrace, empty_frame

#: Host columns holding JSON text in the trace; tests may give them as Python lists.
JSON_TEXT_COLUMNS = ("input_dims", "input_types", "input_strides", "concrete_inputs")


def frame(rows: Iterable[Mapping[str, Any]], schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """A table with exactly ``schema``'s columns: keys outside it are dropped, missing ones null."""
    rows = list(rows)
    if not rows:
        return empty_frame(schema)
    return pl.DataFrame([{c: r.get(c) for c in schema} for r in rows], schema=schema)


def host_rows(host: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Host rows numbered in order (``row`` = position), on thread 1 at depth 0 unless given;
    ``end = ts + dur``; list-valued shape columns dumped to JSON text as the reader stores them."""
    out = []
    for i, h in enumerate(host):
        row = {"row": i, "tid": 1, "depth": 0, **h, "end": h["ts"] + h["dur"]}
        for k in JSON_TEXT_COLUMNS:
            if isinstance(row.get(k), list):
                row[k] = json.dumps(row[k])
        out.append(row)
    return out


def gpu_rows(gpu: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Kernels on device 0, stream 7 unless given; ``end = ts + dur``."""
    return [{"kind": "kernel", "device": 0, "stream": 7, **g, "end": g["ts"] + g["dur"]} for g in gpu]


def make_rank(
    gpu: Iterable[Mapping[str, Any]] = (),
    host: Iterable[Mapping[str, Any]] = (),
    steps: Iterable[tuple[int, float, float]] = (),
    *,
    meta: RankMeta | None = None,
) -> RankTrace:
    """Rank 0 from short row dicts; ``steps`` are ``(step, start, end)`` host ``ProfilerStep`` windows
    on thread 1. ``meta`` defaults to rank 0 on device 0."""
    step_rows = [{"step": n, "ts": s, "dur": e - s, "end": e, "tid": 1} for n, s, e in steps]
    return RankTrace(
        rank=0,
        file="hand-built",
        meta=meta if meta is not None else RankMeta(rank=0, device_id=0),
        gpu=frame(gpu_rows(gpu), GPU_SCHEMA),
        host=frame(host_rows(host), HOST_SCHEMA),
        steps=frame(step_rows, STEP_SCHEMA),
        flows=empty_frame(FLOW_SCHEMA),
    )


def make_op_rank(
    host: Iterable[Mapping[str, Any]],
    gpu: Iterable[Mapping[str, Any]] = (),
    steps: Iterable[tuple[int, float, float]] = (),
) -> RankTrace:
    """Like :func:`make_rank`, host rows first and defaulting to ``cat="cpu_op"``, ``pid=1``: the
    operator-level analyses (roofline, MFU) read cpu_ops and the kernels they caused (``op_row``)."""
    return make_rank(gpu, [{"cat": "cpu_op", "pid": 1, **h} for h in host], steps)
