"""One trace file -> one :class:`RankTrace` (no cache, no processes: the unit the others reuse)."""

from __future__ import annotations

import gc
import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import polars as pl

from traceread.errors import TraceFileError
from traceread.model import STEP_SCHEMA, RankTrace, empty_frame
from traceread.read.decode import Event, decode_all, decode_top, fix_lone_surrogates
from traceread.read.events import (
    finish_gpu,
    finish_host,
    finish_memory,
    flow_points,
    gpu_frame,
    host_frame,
    memory_frame,
    pair_flows,
    partition_with_cats,
)
from traceread.read.foreign import foreign_format, is_foreign_name
from traceread.read.inflate import uncompressed_chunks
from traceread.read.links import link
from traceread.read.meta import build_meta, top_values
from traceread.read.nesting import nest
from traceread.read.ranks import identify
from traceread.read.stream import EventStream

_STEP_RE = r"^ProfilerStep#(\d+)$"


def parse_file(path: str | Path, *, max_rank_bytes: int | None = None) -> RankTrace:
    """Decode and tabulate one file; raises only :class:`TraceFileError`.

    ``max_rank_bytes``: the most uncompressed bytes accepted (default: ``--max-rank-bytes``, see
    :func:`traceread.read.inflate.max_rank_bytes`).
    """
    p = Path(path)
    if is_foreign_name(p.name) and (other := foreign_format(p)) is not None:
        raise TraceFileError(other.reason(), str(p))  # without reading a 2 GB Nsight report
    # The parse allocates millions of short-lived objects and no reference cycles: the cyclic
    # collector would only rescan them (measured 10-30% of the parse time).
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _parse(p, max_rank_bytes)
    except TraceFileError as exc:
        raise _named(p, exc) from None
    except (MemoryError, KeyboardInterrupt):
        raise
    except Exception as exc:  # any surprise becomes the one-line file error
        msg = str(exc).splitlines()[0] if str(exc) else ""
        raise TraceFileError(
            f"cannot read trace: {type(exc).__name__}{': ' + msg if msg else ''}", str(p)
        ) from None
    finally:
        if gc_was_enabled:
            gc.enable()


def _named(p: Path, exc: TraceFileError) -> TraceFileError:
    """The reader's failure, or the file named as the other tool's format it is (traceread.read.foreign)."""
    if exc.message.startswith(("cannot open", "empty file")):
        return exc
    other = foreign_format(p)
    return TraceFileError(other.reason(), exc.path) if other is not None else exc


def parse_named(local: Path, name: str, *, max_rank_bytes: int | None = None) -> RankTrace:
    """Parse ``local`` as the trace the user knows as ``name`` (an object URL downloaded to a
    temporary file, a file on another node's disk): errors and the rank's ``file`` say ``name``."""
    from traceread.read.ranks import identify

    try:
        rt = parse_file(local, max_rank_bytes=max_rank_bytes)
    except TraceFileError as exc:
        raise TraceFileError(exc.message, name) from None
    rt.file = name
    identify(rt, single=True)
    return rt


#: Events tabulated per batch on the whole-document path: the batch's Python objects (~13 MB)
#: stay in the CPU cache across the column passes over them; each batch is freed once tabulated.
BATCH = 20_000
#: Files whose text is at most this long are decoded as one document (one decoder call, the
#: fastest for small files); longer ones are streamed (:mod:`traceread.read.stream`).
WHOLE_LIMIT = 16 << 20


def _parse(p: Path, max_rank_bytes: int | None) -> RankTrace:
    if reader() == "columnar":
        try:
            return _parse_columnar(p, max_rank_bytes)
        except (MemoryError, KeyboardInterrupt):
            raise
        except Exception:  # Refused, or bad input: the msgspec path reads it or words it
            pass
    chunks = uncompressed_chunks(p, max_rank_bytes)
    head = bytearray()
    for chunk in chunks:
        head += chunk
        if len(head) > WHOLE_LIMIT:
            return _parse_streamed(p, EventStream(p, chunks, head))
    if not head:
        raise TraceFileError("empty file", str(p))
    return _parse_whole(p, head)


def _parse_whole(p: Path, data: bytearray) -> RankTrace:
    top = decode_top(fix_lone_surrogates(data), p)
    keys = list(top)
    values = top_values(top)
    # One decoder call for the whole array (no per-event slices to cut first).
    events = decode_all(top["traceEvents"], p)
    del top, data

    def batches() -> Iterator[list[Event]]:
        while events:
            batch = events[:BATCH]
            del events[:BATCH]
            yield batch

    counts: Counter[str] = Counter()
    return _tabulate(p, _event_parts(p, batches(), counts), counts, lambda: (values, keys))


def _parse_streamed(p: Path, stream: EventStream) -> RankTrace:
    counts: Counter[str] = Counter()
    return _tabulate(p, _event_parts(p, iter(stream), counts), counts, _top_of(stream))


def _top_of(stream: EventStream) -> Callable[[], tuple[dict, list[str]]]:
    """The stream's top-level values and keys, asked for once its events are consumed."""
    return lambda: (top_values(stream.top), list(stream.top))


#: Text per columnar batch: duckdb's per-call cost is noise at this size, and one batch's columns
#: stay small next to the rank's tables.
COLUMNAR_BATCH_BYTES = 32 << 20


def reader() -> str:
    """``msgspec`` unless ``$TRACEREAD_READER`` is ``columnar`` and duckdb is installed (the
    ``columnar`` extra). Both give the same tables (tests/test_read_paths.py); the columnar one is
    not the default because it is not faster here (docs/benchmarks.md, "A columnar reader")."""
    if os.environ.get("TRACEREAD_READER", "").strip().lower() != "columnar":
        return "msgspec"  # without importing the columnar modules (their expressions cost ~50 ms)
    from traceread.read import columnar

    return "columnar" if columnar.available() else "msgspec"


def _parse_columnar(p: Path, max_rank_bytes: int | None) -> RankTrace:
    """The rank read by :mod:`traceread.read.columnar`; raises :class:`columnar.Refused` (or the
    stream's error) where the msgspec path must read the file instead."""
    from traceread.read import columnar

    chunks = uncompressed_chunks(p, max_rank_bytes)
    head = bytearray(next(chunks, b""))
    if not head:
        raise columnar.Refused("empty file")
    counts: Counter[str] = Counter()
    with columnar.session() as con:
        stream = EventStream(p, chunks, head, lambda doc: columnar.tabulate(con, doc, counts),
                             COLUMNAR_BATCH_BYTES)
        return _tabulate(p, ((b.gpu, b.host, b.flow, b.memory) for b in stream), counts, _top_of(stream))


Frames = tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, "pl.DataFrame | None"]


def _event_parts(p: Path, batches: Iterator[list[Event]], counts: Counter[str]) -> Iterator[Frames]:
    """Batches of msgspec events -> their GPU, host, flow and memory frames."""
    for batch in batches:
        (gpu_evs, gpu_cat), (host_evs, host_cat), (flow_evs, flow_cat), mem_evs = partition_with_cats(
            batch, counts
        )
        del batch
        yield (gpu_frame(gpu_evs, p, gpu_cat), host_frame(host_evs, p, host_cat),
               flow_points(flow_evs, flow_cat), memory_frame(mem_evs) if mem_evs else None)
        del gpu_evs, host_evs, flow_evs, mem_evs


def _tabulate(
    p: Path, parts: Iterator[Frames], counts: Counter[str], top: Callable[[], tuple[dict, list[str]]]
) -> RankTrace:
    """Batches' frames -> the rank's tables; ``top`` gives the top-level values and keys once
    the events are consumed (a streamed file's trailing keys are known only then)."""
    gpu_parts, host_parts, flow_parts, mem_parts = [], [], [], []
    for gpu_df, host_df, flow_df, mem_df in parts:
        gpu_parts.append(gpu_df)
        host_parts.append(host_df)
        flow_parts.append(flow_df)
        if mem_df is not None:
            mem_parts.append(mem_df)
    values, keys = top()
    refuse_export(values, p)
    gpu = finish_gpu(gpu_parts)
    host = finish_host(host_parts)
    flows = pair_flows(flow_parts)
    memory = finish_memory(mem_parts)
    del gpu_parts, host_parts, flow_parts, mem_parts
    host, op_anc = nest(host)
    gpu = link(gpu, host, op_anc)
    meta = build_meta(values, keys, gpu, dict(counts))
    rt = RankTrace(
        rank=0,
        file=str(p),
        meta=meta,
        gpu=gpu,
        host=host,
        steps=steps_frame(host),
        flows=flows,
        memory=memory,
    )
    identify(rt, single=True)
    return rt


def refuse_export(top: dict[str, Any], p: Path) -> None:
    """A timeline written by ``traceread export`` (every rank merged, ``otherData.generator`` says so)
    is not one rank's trace: counted as one, an export saved into the run folder became an extra rank
    of the next report (and of the next export, which doubled in size)."""
    other = top.get("otherData")
    generator = other.get("generator") if isinstance(other, dict) else None
    if isinstance(generator, str) and generator.startswith("traceread"):
        raise TraceFileError("not a Kineto trace: a timeline written by traceread export (every rank merged), "
                             "not one rank's trace", str(p))


def steps_frame(host: pl.DataFrame) -> pl.DataFrame:
    """``ProfilerStep#N`` host windows, one per step (the GPU-annotation copies are dropped)."""
    if host.height == 0:
        return empty_frame(STEP_SCHEMA)
    steps = (
        host.filter(
            pl.col("name").str.contains(_STEP_RE).fill_null(False)
            & (pl.col("cat") != "gpu_user_annotation").fill_null(True)
        )
        .with_columns(step=pl.col("name").str.extract(_STEP_RE, 1).cast(pl.Int64, strict=False))
        .filter(pl.col("step").is_not_null())
        # One row per step: the longest copy (a nested duplicate is never longer).
        .sort(["step", "dur"], descending=[False, True])
        .unique("step", keep="first", maintain_order=True)
        .sort("ts")
    )
    return steps.select([pl.col(c).cast(t) for c, t in STEP_SCHEMA.items()])
