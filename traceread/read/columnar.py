"""A batch of events (the text of a JSON array) -> the rank's table parts, with no Python object per
event: duckdb's JSON reader (yyjson, C++) builds the columns, polars converts them.

Why this path: the msgspec path decodes each event into a Python struct and builds every column
from those structs, which is most of a cold report's time (``docs/benchmarks.md``). Here the
fields the tables keep arrive as columns of their JSON text (see :mod:`traceread.read.json_columns`
for why text), and the partitions and columns are polars expressions. The result is the same parts
:mod:`traceread.read.events` builds, so everything after the read is shared; where this path could
differ (a value the msgspec path refuses, a duplicated key, text duckdb will not read) it raises
:class:`Refused` and the file is read the msgspec way.

duckdb's struct keys ignore case, so the few arg names that differ only in case from another
(``external id``, ``Input dims``, the allocator's ``Bytes``) are read by a second, narrow pass,
only when the batch holds one of them.
"""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.util import find_spec
from typing import Any

import polars as pl

from traceread.model import COMM_ARGS, GPU_SCHEMA, HOST_SCHEMA, MEMORY_SCHEMA
from traceread.read.columns import null_series
from traceread.read.events import (
    CATEGORY_ALIASES,
    FLOW_PHASES,
    GPU_KINDS,
    MEMORY_EVENT,
    POINT_SCHEMA,
    conform,
    flow_id_int,
)
from traceread.read.json_columns import (
    Conv,
    Refused,
    as_float,
    as_id,
    as_int,
    as_number,
    as_raw,
    as_string,
    as_text,
    as_triple,
    convert,
)

#: Arg keys read in the main pass -> their column name in the batch frame.
MAIN_ARGS: dict[str, str] = {
    "External id": "external_id",
    "correlation": "correlation",
    "device": "device",
    "stream": "stream",
    "grid": "grid",
    "block": "block",
    "registers per thread": "registers",
    "shared memory": "shared_memory",
    "blocks per SM": "blocks_per_sm",
    "warps per SM": "warps_per_sm",
    "est. achieved occupancy %": "occupancy",
    "bytes": "bytes",
    "Input Dims": "input_dims",
    "Input type": "input_types",
    "Input Strides": "input_strides",
    "Concrete Inputs": "concrete_inputs",
    "Sequence number": "seq_num",
    "Fwd thread id": "fwd_tid",
    **COMM_ARGS,
    "Total Allocated": "total_allocated",
    "Total Reserved": "total_reserved",
    "Device Type": "device_type",
    "Device Id": "device_id",
    "Addr": "addr",
}
#: Arg keys equal to a main one but for case: a second pass, only when the text holds one.
CASE_TWINS: dict[str, str] = {
    "external id": "external_id_legacy",
    "Input dims": "input_dims_legacy",
    "Bytes": "mem_bytes",
}
_TOP = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "id")
_COMM_TEXT = {"coll_name", "dtype", "pg_name", "pg_desc", "pg_ranks"}
_GPU_CATS = list(GPU_KINDS)


def _columns(args: dict[str, str]) -> dict[str, str]:
    fields = ", ".join('"' + k.replace('"', '""') + '" JSON' for k in args)
    return {**{k: "JSON" for k in _TOP}, "args": f"STRUCT({fields})"}


_MAIN_COLUMNS = _columns(MAIN_ARGS)
_TWIN_COLUMNS = {"args": _columns(CASE_TWINS)["args"]}


def available() -> bool:
    """Whether duckdb and pyarrow (the ``columnar`` extra) are installed here (found, not imported)."""
    return all(find_spec(name) is not None for name in ("duckdb", "pyarrow"))


@contextmanager
def session() -> Iterator[Any]:
    """A duckdb connection for one file, closed after it: never shared by threads, and never
    inherited by a forked worker (a connection's threads do not survive a fork). Opening one costs
    about 17 ms."""
    import duckdb

    con = duckdb.connect()
    try:
        yield con
    finally:
        con.close()


def _read(con: Any, doc: bytes | bytearray, columns: dict[str, str]) -> pl.DataFrame:
    try:
        rel = con.read_json(io.BytesIO(doc), format="array", columns=columns)
        table = rel.arrow().read_all()
    except Exception as exc:  # duckdb's own errors: the msgspec path words them
        raise Refused(str(exc).splitlines()[0][:200]) from None
    # duckdb's string buffers arrive fragmented: compacted once, every later pass is 3-5x faster
    return pl.from_arrow(table).rechunk()


def read_batch(con: Any, doc: bytes | bytearray) -> pl.DataFrame:
    """``doc`` (a JSON array of events) -> one row per event: the top-level fields and the args
    the tables keep, each as its JSON text."""
    df = _read(con, doc, _MAIN_COLUMNS)
    args = df.get_column("args").struct.unnest()
    args.columns = list(MAIN_ARGS.values())
    df = df.drop("args").hstack(args)
    memory = (df.get_column("name") == f'"{MEMORY_EVENT}"').any()
    if memory or any(f'"{k}"'.encode() in doc for k in CASE_TWINS if k != "Bytes"):
        twins = _read(con, doc, _TWIN_COLUMNS).get_column("args").struct.unnest()
        twins.columns = list(CASE_TWINS.values())
        if twins.height != df.height:  # pragma: no cover - both passes read the same text
            raise Refused("the two passes disagree")
        df = df.hstack(twins)
    else:
        df = df.hstack([null_series(c, pl.Utf8, df.height) for c in CASE_TWINS.values()])
    return df


class Parts:
    """One batch's table parts, as :func:`traceread.read.parse._tabulate` collects them."""

    __slots__ = ("gpu", "host", "flow", "memory", "count")

    def __init__(self, gpu: pl.DataFrame, host: pl.DataFrame, flow: pl.DataFrame,
                 memory: pl.DataFrame | None, count: int) -> None:
        self.gpu, self.host, self.flow, self.memory, self.count = gpu, host, flow, memory, count

    def __len__(self) -> int:
        return self.count


#: Every column the tables take from an event, as the msgspec path converts it.
_CONVS: list[Conv] = [
    as_string("ph", "ph"), as_string("cat", "cat"), as_string("name", "name"),
    as_number("ts", "ts"), as_number("dur", "dur"),
    as_id("pid", "pid"), as_id("tid", "tid"), as_id("id", "id", flow_id_int),
    as_int("external_id", "external_id"), as_int("external_id_legacy", "external_id_legacy"),
    as_int("correlation", "correlation"), as_int("device", "device"), as_int("stream", "stream"),
    *(as_triple(f"{g}_{xyz}", g, j) for g in ("grid", "block") for j, xyz in enumerate("xyz")),
    as_int("registers", "registers"), as_int("shared_memory", "shared_memory"),
    as_float("blocks_per_sm", "blocks_per_sm"), as_float("warps_per_sm", "warps_per_sm"),
    as_float("occupancy_pct", "occupancy"), as_int("bytes", "bytes"),
    as_raw("input_dims", "input_dims"), as_raw("input_dims_legacy", "input_dims_legacy"),
    as_raw("input_types", "input_types"), as_raw("input_strides", "input_strides"),
    as_raw("concrete_inputs", "concrete_inputs"),
    as_int("seq_num", "seq_num"), as_int("fwd_tid", "fwd_tid"),
    *(as_text(c, c) if c in _COMM_TEXT or c == "comms_id" else as_int(c, c) for c in COMM_ARGS.values()),
    as_int("mem_bytes", "mem_bytes"),
    *(as_int(c, c) for c in ("total_allocated", "total_reserved", "device_type", "device_id", "addr")),
]
_END = (pl.col("ts") + pl.col("dur")).alias("end")
_GPU_COLUMNS = [
    pl.col("cat").replace_strict(GPU_KINDS, return_dtype=pl.Utf8).alias("kind"),
    "name",
    pl.coalesce("device", "pid").alias("device"),
    pl.coalesce("stream", "tid").alias("stream"),
    "ts", "dur", _END, "correlation",
    pl.coalesce("external_id", "external_id_legacy").alias("external_id"),
    "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z",
    "registers", "shared_memory", "blocks_per_sm", "warps_per_sm", "occupancy_pct", "bytes",
    *COMM_ARGS.values(),
    pl.lit(None, pl.Int64).alias("launch_row"), pl.lit(None, pl.Int64).alias("op_row"),
]
_HOST_COLUMNS = [
    pl.lit(0, pl.Int64).alias("row"),
    pl.col("cat").replace(CATEGORY_ALIASES),
    "name", "pid", "tid", "ts", "dur", _END,
    pl.lit(None, pl.Int64).alias("depth"), pl.lit(None, pl.Int64).alias("parent"),
    pl.coalesce("external_id", "external_id_legacy").alias("external_id"),
    "correlation",
    pl.coalesce("input_dims", "input_dims_legacy").alias("input_dims"),
    "input_types", "input_strides", "concrete_inputs", "seq_num", "fwd_tid",
    *COMM_ARGS.values(),
]
_FLOW_COLUMNS = ["ph", pl.col("cat").replace(CATEGORY_ALIASES).alias("kind"), "id", "ts", "pid", "tid"]
_MEMORY_COLUMNS = ["ts", "pid", "tid", "device_type", "device_id", pl.col("mem_bytes").alias("bytes"),
                   "total_allocated", "total_reserved", "addr"]


def tabulate(con: Any, doc: bytes | bytearray, counts: Counter[str]) -> Parts:
    """The table parts of one batch (see :func:`read_batch`); adds its categories to ``counts``."""
    raw = read_batch(con, doc)
    if raw.get_column("ph").null_count():
        raise Refused("an event without ph")
    df = convert(raw, _CONVS)
    del raw
    per_cat = df.get_column("cat").drop_nulls().value_counts(sort=False)
    for c, n in zip(per_cat["cat"].to_list(), per_cat["count"].to_list()):
        counts[CATEGORY_ALIASES.get(c, c)] += n
    ph, cat = pl.col("ph"), pl.col("cat")
    is_x = ph == "X"
    is_gpu = cat.is_in(_GPU_CATS).fill_null(False)
    gpu = df.filter(is_x & is_gpu)
    host = df.filter(is_x & ~is_gpu)
    for part in (gpu, host):
        if part.get_column("ts").null_count() or part.get_column("dur").null_count():
            raise Refused("a complete event without ts or dur")  # the msgspec path names it
    mem = df.filter((ph == "i") & (pl.col("name") == MEMORY_EVENT).fill_null(False))
    return Parts(
        gpu=conform(gpu.select(_GPU_COLUMNS), GPU_SCHEMA),
        host=conform(host.select(_HOST_COLUMNS), HOST_SCHEMA),
        flow=conform(df.filter(ph.is_in(list(FLOW_PHASES))).select(_FLOW_COLUMNS), POINT_SCHEMA),
        memory=conform(mem.select(_MEMORY_COLUMNS), MEMORY_SCHEMA).filter(pl.col("ts").is_not_null())
        if mem.height else None,
        count=df.height,
    )
