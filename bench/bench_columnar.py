"""Would a native columnar JSON reader beat the msgspec path? Measured on the same files in one run.

For each file, one after the other in this one process (so every ratio compares like with like on
a loaded machine):

* ``floor``: ``bench/floor.py`` (gunzip + msgspec typed decode of every event, args raw);
* ``traceread``: ``parse_file`` — the msgspec read path, the whole rank's tables (nesting and
  kernel/launch links included);
* ``ndjson``: the byte transform a native NDJSON reader needs — the ``traceEvents`` array with its
  newlines removed and one event per line (``}`` ``,`` ``{`` at the boundaries), in Python ``re``;
* ``polars 5``: ``polars.read_ndjson`` of that text with five top-level fields (ph cat name ts dur);
* ``polars full``: the same with the explicit schema of every field the tables keep (the args of
  :class:`traceread.read.decode.Args` as typed columns, shape args as text);
* ``pyarrow full``: ``pyarrow.json.read_json`` with the same schema (shape args left out: pyarrow
  cannot keep a list as its text).

The columnar rows decode only: they build no table, nest nothing, link nothing. A columnar path
costs at least ``ndjson`` + one of them, and is worth building only where that is well below
``traceread``. Prints a JSON line per file and a markdown table of the totals.

    python bench/make_large.py --set a100 --ranks 8 --mb 31
    python bench/bench_columnar.py bench/data/a100_8x31/rank*.pt.trace.json.gz
"""

from __future__ import annotations

import argparse
import gc
import gzip
import io
import json
import os
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

import polars as pl  # noqa: E402
from floor import floor  # noqa: E402

from traceread.read.decode import Args  # noqa: E402
from traceread.read.parse import parse_file  # noqa: E402

_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_FLOATS = {"blocks_per_sm", "warps_per_sm", "occupancy"}
_TEXTS = {"coll_name", "dtype", "pg_name", "pg_desc", "pg_ranks"}
_LISTS = {"grid", "block"}


def _arg_types() -> dict[str, str]:
    """JSON key -> one of int/float/text/list/raw for every arg the tables keep."""
    out = {}
    for field, key in zip(Args.__struct_fields__, Args.__struct_encode_fields__):
        ann = Args.__annotations__[field]
        if "Raw" in str(ann) or field == "comms_id":
            out[key] = "raw"
        elif field in _FLOATS:
            out[key] = "float"
        elif field in _TEXTS:
            out[key] = "text"
        elif field in _LISTS:
            out[key] = "list"
        else:
            out[key] = "int"
    return out


def polars_schema(full: bool) -> dict:
    top = {"ph": pl.Utf8, "cat": pl.Utf8, "name": pl.Utf8, "ts": pl.Float64, "dur": pl.Float64}
    if not full:
        return top
    kinds = {"int": pl.Int64, "float": pl.Float64, "text": pl.Utf8, "raw": pl.Utf8, "list": pl.List(pl.Int64)}
    args = pl.Struct({k: kinds[t] for k, t in _arg_types().items()})
    # pid/tid/id are ints or strings ("Spans", "stream 7"): text, converted later
    return top | {"pid": pl.Utf8, "tid": pl.Utf8, "id": pl.Utf8, "args": args}


def pyarrow_schema():  # type: ignore[no-untyped-def]
    import pyarrow as pa

    kinds = {"int": pa.int64(), "float": pa.float64(), "text": pa.string(), "list": pa.list_(pa.int64())}
    args = pa.struct([(k, kinds[t]) for k, t in _arg_types().items() if t != "raw"])
    return pa.schema([("ph", pa.string()), ("cat", pa.string()), ("name", pa.string()),
                      ("ts", pa.float64()), ("dur", pa.float64()), ("args", args)])


def inflate(path: Path) -> bytes:
    raw = path.read_bytes()
    return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw  # multi-member files too


def events_ndjson(data: bytes) -> bytes:
    """The ``traceEvents`` array, one event per line (raw newlines cannot sit inside a JSON string)."""
    start = data.index(b"[", data.index(b'"traceEvents"')) + 1
    end = data.rindex(b"]")  # the bench files end with the array (make_large.py writes them so)
    body = data[start:end].replace(b"\n", b"").replace(b"\r", b"")
    return _BOUNDARY.sub(b"}\n{", body)


_CPU: dict[str, float] = {}


def _timed(fn, key: str = ""):  # type: ignore[no-untyped-def]
    """Wall seconds and the result; the CPU seconds of this process (every thread: polars and
    pyarrow decode in parallel) go to ``_CPU[key]``, the steadier measure on a loaded machine."""
    gc.collect()
    c = time.process_time()
    t = time.perf_counter()
    out = fn()
    wall = time.perf_counter() - t
    _CPU[key] = time.process_time() - c
    return wall, out


def measure(path: Path, pyarrow: bool) -> dict:
    row: dict = {"file": str(path)}
    row["floor"], _ = _timed(lambda: floor(path), "floor")
    row["traceread"], rt = _timed(lambda: parse_file(path), "traceread")
    row["rows"] = rt.host.height + rt.gpu.height
    del rt
    row["gunzip"], data = _timed(lambda: inflate(path))
    row["bytes"] = len(data)
    row["ndjson"], nd = _timed(lambda d=data: events_ndjson(d), "ndjson")
    del data
    for full in (False, True):
        key = "polars full" if full else "polars 5"
        try:
            row[key], df = _timed(lambda f=full: pl.read_ndjson(io.BytesIO(nd), schema=polars_schema(f)), key)
            row[key + " rows"] = df.height
            del df
        except Exception as exc:  # a refusal is a result
            row[key] = None
            row[key + " error"] = str(exc).splitlines()[0][:120]
    if pyarrow:
        import pyarrow.json as pj

        opts = pj.ParseOptions(explicit_schema=pyarrow_schema(), unexpected_field_behavior="ignore")
        try:
            row["pyarrow full"], tb = _timed(lambda: pj.read_json(io.BytesIO(nd), parse_options=opts), "pyarrow full")
            del tb
        except Exception as exc:
            row["pyarrow full"] = None
            row["pyarrow full error"] = str(exc).splitlines()[0][:120]
    row["cpu"] = dict(_CPU)
    _CPU.clear()
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--no-pyarrow", action="store_true")
    args = ap.parse_args()
    rows = []
    for f in args.files:
        row = measure(f, not args.no_pyarrow)
        print(json.dumps(row), flush=True)
        rows.append(row)
    keys = ["floor", "traceread", "ndjson", "polars 5", "polars full", "pyarrow full"]
    total = {k: sum(r.get(k) or 0.0 for r in rows) for k in keys}
    cpu = {k: sum(r["cpu"].get(k, 0.0) for r in rows) for k in keys}
    load = os.getloadavg()[0]
    print(f"\n{len(rows)} files, {sum(r['bytes'] for r in rows) / 2**20:.0f} MiB of JSON, load average {load:.1f}")
    print("| stage | wall s | ÷ floor | CPU s | ÷ floor |\n|---|---:|---:|---:|---:|")
    for k in keys:
        if any(r.get(k) is not None for r in rows):
            print(f"| {k} | {total[k]:.2f} | {total[k] / total['floor']:.2f} "
                  f"| {cpu[k]:.2f} | {cpu[k] / cpu['floor']:.2f} |")


if __name__ == "__main__":
    main()
