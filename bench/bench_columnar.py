"""The two read paths, and the native decoders behind the columnar one, on the same files in one run.

For each file, one after the other in this one process (so every ratio compares like with like on
a loaded machine):

* ``floor``: ``bench/floor.py`` (gunzip + msgspec typed decode of every event, args raw);
* ``msgspec read``: ``parse_file`` with the default reader — the rank's whole tables (nesting and
  kernel/launch links included);
* ``columnar read``: the same tables by ``traceread/read/columnar.py`` (duckdb builds the columns,
  polars converts them; ``TRACEREAD_READER=columnar``), and its stages, each timed alone on the
  file's ``traceEvents`` as one batch: ``duckdb`` (duckdb's ``read_json`` to a polars frame of JSON
  texts), ``convert`` (the texts to typed columns), ``partition`` (the four tables' parts);
* decoders alone, for the choice of dependency: ``ndjson`` (the byte transform a newline-delimited
  reader needs), ``polars 5`` / ``polars full`` (``read_ndjson`` with five fields / the tables'
  schema), ``pyarrow full`` (``pyarrow.json.read_json``), ``duckdb typed`` (``read_json`` with
  typed columns instead of JSON texts).

The decoder rows build no table. Prints a JSON line per file and a markdown table of the totals.

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
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

import polars as pl  # noqa: E402
from floor import floor  # noqa: E402

from traceread.read import columnar, parse  # noqa: E402
from traceread.read.decode import Args  # noqa: E402
from traceread.read.json_columns import convert  # noqa: E402

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


def events_ndjson(array: bytes) -> bytes:
    """The ``traceEvents`` array's events, one per line (raw newlines cannot sit inside a JSON string)."""
    body = array[1:-1].replace(b"\n", b"").replace(b"\r", b"")
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


def duckdb_columns() -> dict[str, str]:
    kinds = {"int": "BIGINT", "float": "DOUBLE", "text": "VARCHAR", "raw": "VARCHAR", "list": "BIGINT[]"}
    seen: dict[str, str] = {}  # duckdb's struct keys ignore case: "External id" and "external id" collide
    for k, t in _arg_types().items():
        seen.setdefault(k.lower(), f'"{k}" {kinds[t]}')
    args = ", ".join(seen.values())
    return {"ph": "VARCHAR", "cat": "VARCHAR", "name": "VARCHAR", "ts": "DOUBLE", "dur": "DOUBLE",
            "pid": "VARCHAR", "tid": "VARCHAR", "id": "VARCHAR", "args": f"STRUCT({args})"}


def _array(data: bytes) -> bytes:
    """The ``traceEvents`` array's text (the bench files end with it: make_large.py writes them so)."""
    return data[data.index(b"[", data.index(b'"traceEvents"')): data.rindex(b"]") + 1]


def _msgspec_read(path: Path):  # type: ignore[no-untyped-def]
    os.environ["TRACEREAD_READER"] = "msgspec"
    try:
        return parse.parse_file(path)
    finally:
        del os.environ["TRACEREAD_READER"]


def measure(path: Path, decoders: bool) -> dict:
    row: dict = {"file": str(path)}
    row["floor"], _ = _timed(lambda: floor(path), "floor")
    row["msgspec read"], rt = _timed(lambda: _msgspec_read(path), "msgspec read")
    row["rows"] = rt.host.height + rt.gpu.height
    del rt
    row["columnar read"], rt = _timed(lambda: parse._parse_columnar(path, None), "columnar read")
    assert rt.host.height + rt.gpu.height == row["rows"]
    del rt
    row["gunzip"], data = _timed(lambda: inflate(path), "gunzip")
    row["bytes"] = len(data)
    doc = _array(data)
    del data
    with columnar.session() as con:
        row["duckdb"], raw = _timed(lambda: columnar.read_batch(con, doc), "duckdb")
        row["convert"], _ = _timed(lambda r=raw: convert(r, columnar._CONVS), "convert")
        row["tabulate"], _ = _timed(lambda: columnar.tabulate(con, doc, Counter()), "tabulate")
        del raw
        row["partition"] = max(0.0, row["tabulate"] - row["duckdb"] - row["convert"])
        _CPU["partition"] = max(0.0, _CPU["tabulate"] - _CPU["duckdb"] - _CPU["convert"])
        if decoders:
            row["duckdb typed"], _ = _timed(
                lambda: con.read_json(io.BytesIO(doc), format="array", columns=duckdb_columns()).pl(),
                "duckdb typed")
    if decoders:
        _decoders(row, doc)
    row["cpu"] = dict(_CPU)
    _CPU.clear()
    return row


def _decoders(row: dict, doc: bytes) -> None:
    row["ndjson"], nd = _timed(lambda: events_ndjson(doc), "ndjson")
    for full in (False, True):
        key = "polars full" if full else "polars 5"
        try:
            row[key], df = _timed(lambda f=full: pl.read_ndjson(io.BytesIO(nd), schema=polars_schema(f)), key)
            del df
        except Exception as exc:  # a refusal is a result
            row[key] = None
            row[key + " error"] = str(exc).splitlines()[0][:120]
    import pyarrow.json as pj

    opts = pj.ParseOptions(explicit_schema=pyarrow_schema(), unexpected_field_behavior="ignore")
    try:
        row["pyarrow full"], tb = _timed(lambda: pj.read_json(io.BytesIO(nd), parse_options=opts), "pyarrow full")
        del tb
    except Exception as exc:
        row["pyarrow full"] = None
        row["pyarrow full error"] = str(exc).splitlines()[0][:120]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--no-decoders", action="store_true", help="only the two read paths and the stages")
    args = ap.parse_args()
    rows = []
    for f in args.files:
        row = measure(f, not args.no_decoders)
        print(json.dumps(row), flush=True)
        rows.append(row)
    keys = ["floor", "msgspec read", "columnar read", "gunzip", "duckdb", "convert", "partition",
            "duckdb typed", "ndjson", "polars 5", "polars full", "pyarrow full"]
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
