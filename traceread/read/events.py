"""Typed events -> the GPU, host, flow and memory columns of :mod:`traceread.model`.

Events arrive in batches; each batch is partitioned by phase and category and every column is
built with one list comprehension over its partition (much faster than appending row by row).
The batches are concatenated and sorted at the end. Categories are normalised so that 2021 traces
(``Operator``/``Runtime``/``Kernel``) look like current ones.
"""

from __future__ import annotations

from collections import Counter
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from traceread.errors import TraceFileError
from traceread.model import COMM_ARGS, FLOW_SCHEMA, GPU_SCHEMA, HOST_SCHEMA, MEMORY_SCHEMA, empty_frame
from traceread.read.columns import (
    float_col,
    id_int,
    int_col,
    null_series,
    raw_id_text,
    raw_text_col,
    str_col,
    triples,
)
from traceread.read.decode import Args, Event

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

#: Legacy (torch 1.8-1.9, 2021) category names -> current ones; flow categories -> ``ac2g``.
CATEGORY_ALIASES: dict[str, str] = {
    "Operator": "cpu_op",
    "Runtime": "cuda_runtime",
    "Kernel": "kernel",
    "Memcpy": "gpu_memcpy",
    "Memset": "gpu_memset",
    "async": "ac2g",  # 2021 "launch" flows
    "async_gpu": "ac2g",
    "async_cpu_to_gpu": "ac2g",
}

#: Device-side activity that becomes a GPU row, by raw category.
GPU_KINDS: dict[str, str] = {
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "gpu_memset": "memset",
    "Kernel": "kernel",
    "Memcpy": "memcpy",
    "Memset": "memset",
}

FLOW_PHASES = frozenset({"s", "f", "t"})
#: Name of the allocator's instant events (``ph: i``) when ``profile_memory=True``.
MEMORY_EVENT = "[memory]"
_GPU_CATS = frozenset(GPU_KINDS)
_EMPTY_ARGS = Args()
# Comm columns whose type is text (the rest are ints).
_COMM_TEXT = {"coll_name", "dtype", "pg_name", "pg_desc", "pg_ranks"}


def normalise_category(cat: str | None) -> str | None:
    return CATEGORY_ALIASES.get(cat, cat) if cat is not None else None


def partition(
    events: list[Event], counts: Counter[str] | None = None
) -> tuple[list[Event], list[Event], list[Event]]:
    """Split into (gpu, host, flow) events; ``ph: X`` with a device category is GPU work.

    Also adds the raw number of events per normalised category to ``counts`` (uncategorised
    metadata events are not counted).
    """
    parts = partition_with_cats(events, counts)
    return parts[0][0], parts[1][0], parts[2][0]


def memory_events(events: list[Event], ph: pl.Series) -> list[Event]:
    """The ``[memory]`` instant events of a batch: the name is read only on the (few) ``ph: i``
    events, so traces without memory profiling pay one vectorised comparison."""
    idx = np.flatnonzero((ph == "i").to_numpy())
    if idx.size == 0:
        return []
    return [e for e in _take(events, idx) if e.name == MEMORY_EVENT]


Part = tuple[list[Event], pl.Series | None]


def partition_with_cats(
    events: list[Event], counts: Counter[str] | None = None
) -> tuple[Part, Part, Part, list[Event]]:
    """:func:`partition`, each part with its raw ``cat`` column (built here anyway, so the
    frames need not build it again), plus the ``[memory]`` events. The masks are computed by
    polars on two string columns and the events gathered by index (C loops), not by a Python
    test per event."""
    if not events:
        return ([], None), ([], None), ([], None), []
    ph = pl.Series("ph", [e.ph for e in events], dtype=pl.Utf8)
    cat = pl.Series("cat", [e.cat for e in events], dtype=pl.Utf8)
    if counts is not None:
        per_cat = cat.to_frame().group_by("cat", maintain_order=True).len()
        for c, n in zip(per_cat["cat"].to_list(), per_cat["len"].to_list()):
            if c is not None:
                counts[CATEGORY_ALIASES.get(c, c)] += n
    is_x = (ph == "X").to_numpy()
    is_gpu = cat.is_in(list(_GPU_CATS)).fill_null(False).to_numpy()
    is_flow = ph.is_in(list(FLOW_PHASES)).to_numpy()
    out = []
    for mask in (is_x & is_gpu, is_x & ~is_gpu, is_flow):
        idx = np.flatnonzero(mask)
        out.append((_take(events, idx), cat.gather(idx)))
    return out[0], out[1], out[2], memory_events(events, ph)


def _take(items: list, idx: np.ndarray) -> list:
    """``[items[i] for i in idx]`` in C."""
    if idx.size == 0:
        return []
    if idx.size == 1:
        return [items[int(idx[0])]]
    return list(itemgetter(*idx.tolist())(items))


def _column_getter(field: str):
    """``lambda items: [x.<field> for x in items]`` compiled for one field: a comprehension with a
    literal attribute name runs ~2x faster than ``map(operator.attrgetter(field), items)``."""
    if not field.isidentifier():  # pragma: no cover - struct field names are identifiers
        raise ValueError(field)
    return eval(f"lambda items: [x.{field} for x in items]")  # fixed identifiers


_GETTERS = {
    f: _column_getter(f) for f in (*Event.__struct_fields__, *Args.__struct_fields__)
}


#: Args that most traces never carry (legacy spellings, optional shape args, comm args): one
#: probe over all of them replaces a column pass per field when none is present.
_SPARSE_ARGS = (
    "external_id_legacy",
    "input_dims_legacy",
    "input_strides",
    "concrete_inputs",
    *COMM_ARGS.values(),
)


class _Columns:
    """Fields of a list of structs as column lists, built on first use.

    Fields listed in ``absent`` are known to hold their default on every item: their column is
    ``[None] * n`` without touching the items (every consumer treats None and the empty default
    alike).
    """

    __slots__ = ("_items", "_cache", "_absent")

    def __init__(self, items: list, absent: frozenset[str] = frozenset()) -> None:
        self._items = items
        self._cache: dict[str, list] = {}
        self._absent = absent

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, field: str) -> list:
        col = self._cache.get(field)
        if col is None:
            if field in self._absent:
                col = [None] * len(self._items)
            else:
                col = _GETTERS[field](self._items)
            self._cache[field] = col
        return col


_SPARSE_GETTER = attrgetter(*_SPARSE_ARGS)
_SPARSE_DEFAULT = _SPARSE_GETTER(_EMPTY_ARGS)


def _absent_args(args: list[Args]) -> frozenset[str]:
    """The sparse args that hold their default on every item: one C-level pass for all of them
    (a tuple per item compared with the all-default tuple), then a look at the odd items only."""
    odd = list(filter(_SPARSE_DEFAULT.__ne__, map(_SPARSE_GETTER, args)))
    if not odd:
        return frozenset(_SPARSE_ARGS)
    if len(odd) * 8 > len(args):
        return frozenset()  # not sparse in this trace: plain column passes are cheaper
    absent = []
    for j, field in enumerate(_SPARSE_ARGS):
        d = _SPARSE_DEFAULT[j]
        if all(t[j] is d for t in odd):
            absent.append(field)
    return frozenset(absent)


def _transpose(evs: list[Event]) -> tuple[_Columns, _Columns]:
    """Event fields and arg fields of a batch as lazily built columns."""
    ev = _Columns(evs)
    args = ev["args"]
    if None in args:
        args = [a if a is not None else _EMPTY_ARGS for a in args]
    return ev, _Columns(args, _absent_args(args))


def _times(ev: _Columns, path: Path, what: str) -> tuple[pl.Series, pl.Series]:
    for key in ("ts", "dur"):
        col = ev[key]
        if None in col:
            name = ev["name"][col.index(None)]
            raise TraceFileError(
                f"malformed event: {what} event {name!r} has no {key}", str(path)
            )
    return (
        pl.Series("ts", ev["ts"], dtype=pl.Float64),
        pl.Series("dur", ev["dur"], dtype=pl.Float64),
    )


def _comm_columns(a: _Columns) -> list[pl.Series]:
    cols = []
    for col in COMM_ARGS.values():
        if col == "comms_id":
            ids = [raw_id_text(r) if r else None for r in a["comms_id"]]
            cols.append(str_col(col, ids))
        elif col in _COMM_TEXT:
            cols.append(str_col(col, a[col]))
        else:
            cols.append(int_col(col, a[col]))
    return cols


def _external_ids(a: _Columns) -> pl.Series:
    new, old = a["external_id"], a["external_id_legacy"]
    if old.count(None) == len(old):
        return int_col("external_id", new)
    return int_col("external_id", [x if x is not None else y for x, y in zip(new, old)])


def _fallback(primary: pl.Series, secondary: pl.Series) -> pl.Series:
    """``primary`` where it is known, else ``secondary`` (e.g. args.device, else the pid)."""
    if primary.null_count() == 0:
        return primary
    return primary.zip_with(primary.is_not_null(), secondary)


def gpu_frame(evs: list[Event], path: Path, cat: pl.Series | None = None) -> pl.DataFrame:
    """GPU rows of one batch; ``launch_row``/``op_row`` are filled in later by links."""
    if not evs:
        return empty_frame(GPU_SCHEMA)
    ev, a = _transpose(evs)
    ts, dur = _times(ev, path, "GPU")
    n = len(evs)
    cols = [
        _raw_cat(ev, cat).replace_strict(GPU_KINDS).alias("kind"),
        str_col("name", ev["name"]),
        _fallback(int_col("device", a["device"]), int_col("device", ev["pid"], id_int)),
        _fallback(int_col("stream", a["stream"]), int_col("stream", ev["tid"], id_int)),
        ts,
        dur,
        (ts + dur).alias("end"),
        int_col("correlation", a["correlation"]),
        _external_ids(a),
        *triples("grid", a["grid"]),
        *triples("block", a["block"]),
        int_col("registers", a["registers"]),
        int_col("shared_memory", a["shared_memory"]),
        float_col("blocks_per_sm", a["blocks_per_sm"]),
        float_col("warps_per_sm", a["warps_per_sm"]),
        float_col("occupancy_pct", a["occupancy"]),
        int_col("bytes", a["bytes"]),
        *_comm_columns(a),
        null_series("launch_row", pl.Int64, n),
        null_series("op_row", pl.Int64, n),
    ]
    return conform(pl.DataFrame(cols), GPU_SCHEMA)


def _raw_cat(ev: _Columns, cat: pl.Series | None) -> pl.Series:
    """The raw ``cat`` column: the one partition built, else from the events."""
    if cat is not None and cat.len() == len(ev):
        return cat
    return pl.Series("cat", ev["cat"], dtype=pl.Utf8)


def conform(df: pl.DataFrame, schema: dict[str, PolarsDataType]) -> pl.DataFrame:
    """``df`` with the columns and dtypes of ``schema``; casts only the columns that differ."""
    have = df.schema
    casts = [pl.col(c).cast(t) for c, t in schema.items() if have.get(c) != t]
    if casts:
        df = df.with_columns(casts)
    return df if df.columns == list(schema) else df.select(list(schema))


def finish_gpu(parts: list[pl.DataFrame]) -> pl.DataFrame:
    """Batches -> one GPU table sorted by ``ts`` (file order on ties)."""
    kept = [p for p in parts if p.height]
    parts.clear()
    if not kept:
        return empty_frame(GPU_SCHEMA)
    return _sorted_by_ts(kept)


def _sorted_by_ts(parts: list[pl.DataFrame]) -> pl.DataFrame:
    """The batches concatenated and stably sorted by ``ts`` (file order on ties), one column at
    a time, each source column dropped once moved: the peak is the table plus one column (a
    frame sort holds two tables). All-null columns stay unmaterialised (see null_series)."""
    df = pl.concat(parts, rechunk=False)
    parts.clear()
    n = df.height
    ts = df["ts"].to_numpy()
    order = None if bool((ts[1:] >= ts[:-1]).all()) else pl.Series(np.argsort(ts, kind="stable"))
    del ts
    cols = []
    for name in df.columns:
        col = df.get_column(name)
        if col.null_count() == n:
            cols.append(null_series(name, col.dtype, n))
        else:
            cols.append(col.rechunk() if order is None else col.gather(order))
        df = df.drop(name)
        del col
    return pl.DataFrame(cols)


def host_frame(evs: list[Event], path: Path, cat: pl.Series | None = None) -> pl.DataFrame:
    """Host rows of one batch, without nesting columns filled yet."""
    if not evs:
        return empty_frame(HOST_SCHEMA)
    ev, a = _transpose(evs)
    ts, dur = _times(ev, path, "host")
    n = len(evs)
    dims = a["input_dims"]
    if any(a["input_dims_legacy"]):
        dims = [x if x else y for x, y in zip(dims, a["input_dims_legacy"])]
    cols = [
        pl.Series("row", np.zeros(n, dtype=np.int64)),
        _raw_cat(ev, cat).replace(CATEGORY_ALIASES).alias("cat"),
        str_col("name", ev["name"]),
        int_col("pid", ev["pid"], id_int),
        int_col("tid", ev["tid"], id_int),
        ts,
        dur,
        (ts + dur).alias("end"),
        null_series("depth", pl.Int64, n),
        null_series("parent", pl.Int64, n),
        _external_ids(a),
        int_col("correlation", a["correlation"]),
        raw_text_col("input_dims", dims),
        raw_text_col("input_types", a["input_types"]),
        raw_text_col("input_strides", a["input_strides"]),
        raw_text_col("concrete_inputs", a["concrete_inputs"]),
        int_col("seq_num", a["seq_num"]),
        int_col("fwd_tid", a["fwd_tid"]),
        *_comm_columns(a),
    ]
    return conform(pl.DataFrame(cols), HOST_SCHEMA)


def finish_host(parts: list[pl.DataFrame]) -> pl.DataFrame:
    """Batches -> one host table sorted by ``ts`` (file order on ties), ``row`` = position."""
    kept = [p for p in parts if p.height]
    parts.clear()
    if not kept:
        return empty_frame(HOST_SCHEMA)
    df = _sorted_by_ts(kept)
    return df.with_columns(pl.int_range(0, df.height, dtype=pl.Int64).alias("row"))


def memory_frame(evs: list[Event]) -> pl.DataFrame:
    """``[memory]`` rows of one batch (see :data:`traceread.model.MEMORY_SCHEMA`)."""
    if not evs:
        return empty_frame(MEMORY_SCHEMA)
    a = _Columns([e.args if e.args is not None else _EMPTY_ARGS for e in evs])
    cols = [
        float_col("ts", [e.ts for e in evs]),
        int_col("pid", [e.pid for e in evs], id_int),
        int_col("tid", [e.tid for e in evs], id_int),
        int_col("device_type", a["device_type"]),
        int_col("device_id", a["device_id"]),
        int_col("bytes", a["mem_bytes"]),
        int_col("total_allocated", a["total_allocated"]),
        int_col("total_reserved", a["total_reserved"]),
        int_col("addr", a["addr"]),
    ]
    df = conform(pl.DataFrame(cols), MEMORY_SCHEMA)
    return df.filter(pl.col("ts").is_not_null())  # an instant without a time cannot be placed


def finish_memory(parts: list[pl.DataFrame]) -> pl.DataFrame:
    """Batches -> one memory table sorted by ``ts`` (file order on ties)."""
    kept = [p for p in parts if p.height]
    parts.clear()
    if not kept:
        return empty_frame(MEMORY_SCHEMA)
    return _sorted_by_ts(kept)


#: Flow endpoints of one batch, before :func:`pair_flows` joins them into arrows.
POINT_SCHEMA: dict[str, PolarsDataType] = {
    "ph": pl.Utf8,
    "kind": pl.Utf8,
    "id": pl.Int64,
    "ts": pl.Float64,
    "pid": pl.Int64,
    "tid": pl.Int64,
}


def flow_points(evs: list[Event], cat: pl.Series | None = None) -> pl.DataFrame:
    """Flow endpoints (``s``/``f``/``t`` events) of one batch, not yet paired."""
    if not evs:
        return empty_frame(POINT_SCHEMA)
    return pl.DataFrame(
        [
            pl.Series("ph", [e.ph for e in evs], dtype=pl.Utf8),
            _raw_cat(_Columns(evs), cat).replace(CATEGORY_ALIASES).alias("kind"),
            int_col("id", [e.id for e in evs], flow_id_int),
            pl.Series("ts", [e.ts for e in evs], dtype=pl.Float64),
            int_col("pid", [e.pid for e in evs], id_int),
            int_col("tid", [e.tid for e in evs], id_int),
        ]
    )


def flow_id_int(v: int | str | None) -> int | None:
    """A flow's ``id`` as int: an int, a numeric string, else a hex string (masked to 63 bits)."""
    return _flow_id(v) if isinstance(v, str) else id_int(v)


def pair_flows(parts: list[pl.DataFrame]) -> pl.DataFrame:
    """One row per flow arrow: the start (``s``) joined to each finish/step (``f``/``t``) by id.

    An arrow whose other end is missing (profiling window cut it off) keeps its known end and
    nulls for the other.
    """
    parts = [p for p in parts if p.height]
    if not parts:
        return empty_frame(FLOW_SCHEMA)
    df = pl.concat(parts)
    src = (
        df.filter(pl.col("ph") == "s")
        .unique(["kind", "id"], keep="first", maintain_order=True)
        .select("kind", "id", src_ts="ts", src_pid="pid", src_tid="tid")
    )
    dst = df.filter(pl.col("ph") != "s").select(
        "kind", "id", dst_ts="ts", dst_pid="pid", dst_tid="tid"
    )
    out = src.join(dst, on=["kind", "id"], how="full", coalesce=True, nulls_equal=False)
    return out.sort(["src_ts", "dst_ts"], nulls_last=True).select(
        [pl.col(c).cast(t) for c, t in FLOW_SCHEMA.items()]
    )


def _flow_id(v: str) -> int | None:
    i = id_int(v)
    if i is not None:
        return i
    try:
        return int(v, 16) & 0x7FFFFFFFFFFFFFFF
    except ValueError:
        return None


__all__ = [
    "CATEGORY_ALIASES",
    "FLOW_PHASES",
    "GPU_KINDS",
    "MEMORY_EVENT",
    "POINT_SCHEMA",
    "conform",
    "finish_gpu",
    "finish_host",
    "finish_memory",
    "flow_id_int",
    "flow_points",
    "gpu_frame",
    "host_frame",
    "memory_frame",
    "normalise_category",
    "pair_flows",
    "partition",
    "partition_with_cats",
]
