"""The two read paths give the same tables: msgspec (the default) and the columnar one
(``TRACEREAD_READER=columnar``, duckdb; traceread/read/columnar.py).

On every sample and shared trace, on real traces damaged at random (deleted keys, values of another
JSON type: each path must give the same tables or the same one-line error), on hand-written events
that carry each value the msgspec path converts in its own way, on a file read in many batches with
event boundaries inside strings, and on the report documents. The shape arguments (``Input Dims`` and
the like) are compared as the JSON they hold: the columnar reader re-serialises them compactly.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from tests.damage import JSON_VALUES, SOURCES, damage_events
from traceread.errors import TraceFileError
from traceread.model import RankTrace
from traceread.read import columnar, parse
from traceread.read.parse import parse_file

pytestmark = pytest.mark.skipif(not columnar.available(), reason="duckdb and pyarrow (the columnar extra) are not installed")

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "traces"
RAW_JSON = ("input_dims", "input_types", "input_strides", "concrete_inputs")
TABLES = ("gpu", "host", "flows", "memory", "steps")


def _as_json(df: pl.DataFrame) -> pl.DataFrame:
    cols = [c for c in RAW_JSON if c in df.columns]
    return df.with_columns(
        pl.Series(c, [None if v is None else msgspec.json.encode(msgspec.json.decode(v)).decode()
                      for v in df[c].to_list()], dtype=pl.Utf8)
        for c in cols
    )


def _read(path: Path, reader: str, monkeypatch: pytest.MonkeyPatch) -> RankTrace | str:
    monkeypatch.setenv("TRACEREAD_READER", reader)
    try:
        return parse_file(path)
    except TraceFileError as exc:
        return str(exc)


def _columnar_only(path: Path) -> RankTrace | str:
    """The columnar path without its fallback: a refusal is named, not hidden."""
    try:
        return parse._parse_columnar(path, None)
    except Exception as exc:  # the test reports which
        return f"refused: {type(exc).__name__}: {exc}"


def _assert_same(a: RankTrace | str, b: RankTrace | str) -> None:
    if isinstance(a, str) or isinstance(b, str):
        assert a == b
        return
    for table in TABLES:
        try:
            assert_frame_equal(_as_json(getattr(a, table)), _as_json(getattr(b, table)))
        except AssertionError as exc:
            raise AssertionError(f"{table}: {exc}") from None
    assert a.meta == b.meta


def _traces() -> list[Path]:
    found = glob.glob(str(REPO / "sample_traces" / "**" / "*.pt.trace.json*"), recursive=True)
    found += glob.glob(str(SHARED / "**" / "*.json*"), recursive=True)
    return sorted(Path(f) for f in found)


@pytest.mark.parametrize("path", _traces(), ids=lambda p: str(p.relative_to(SHARED.parent if SHARED in p.parents else REPO)))
def test_every_real_trace_reads_the_same_both_ways(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    want = _read(path, "msgspec", monkeypatch)
    got = _columnar_only(path)
    if isinstance(want, str):  # not a trace (a manifest, a Flight Recorder dump): both refuse
        assert isinstance(got, str)
        assert _read(path, "columnar", monkeypatch) == want
        return
    assert not isinstance(got, str), got
    _assert_same(want, got)


# ---- damaged real traces ------------------------------------------------------------------------

#: Besides any JSON value, the ones the two paths convert by different means: floats in lists, and
#: the texts real traces write for numbers and ids.
VALUES = st.one_of(
    JSON_VALUES,
    st.lists(st.floats(allow_nan=False, allow_infinity=False), max_size=3),
    st.sampled_from(["2560", " 12 ", "0x1F", "stream 7", "[1, 2, 3]", "1e3", "-0"]),
)


@pytest.fixture(scope="module")
def sources() -> dict[str, dict]:
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} is absent")
    out = {}
    for name in SOURCES:
        data = (SHARED / name).read_bytes()
        out[name] = json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
    return out


# CI runs a fixed set of examples (derandomized: a landing is never blocked by a new draw);
# TRACEREAD_FUZZ_EXAMPLES=2000 explores new ones.
_DEEP = os.environ.get("TRACEREAD_FUZZ_EXAMPLES")


@settings(max_examples=int(_DEEP or 30), derandomize=_DEEP is None, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_damaged_traces_read_the_same_both_ways(
    sources: dict[str, dict], data: st.DataObject, tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    doc = json.loads(json.dumps(sources[data.draw(st.sampled_from(SOURCES))]))
    damage_events(doc, data, VALUES, most=8)
    path = tmp_path_factory.mktemp("damaged") / "rank0.pt.trace.json"
    path.write_text(json.dumps(doc))
    _assert_same(_read(path, "msgspec", monkeypatch), _read(path, "columnar", monkeypatch))


# ---- each conversion, by hand -------------------------------------------------------------------

def _kernel(**args: object) -> dict:
    return {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10, "dur": 2, "args": args}


def _op(name: str = "aten::mm", **args: object) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": 9, "dur": 5, "args": args}


ODD_EVENTS = {
    "ints as strings, hex, floats": [_kernel(correlation="2560", device=" 1 ", stream="0x1F", bytes=3.0,
                                             registers=2.5, **{"shared memory": True})],
    "64-bit and larger ints": [_kernel(correlation=2**63, device=2**70, **{"External id": -(2**63)})],
    "grid and block": [_kernel(grid=[1, 2, 3], block="[4, 5, 6]"), _kernel(grid=[1, 2]),
                       _kernel(grid=[1.0, 2, 3], block={"x": 1})],
    "floats": [_kernel(**{"blocks per SM": "1.5", "warps per SM": 3, "est. achieved occupancy %": [1]})],
    "legacy spellings": [_op(**{"external id": 5, "Input dims": [[2, 3]]}), _op(**{"External id": 6})],
    "shape args": [_op(**{"Input Dims": [[2, 3], []], "Input type": ["float", ""],
                          "Concrete Inputs": ["", "1.50", "\u00e9\\n"], "Input Strides": [[3, 1]]})],
    "comm args": [_op("record_param_comms", **{"Collective name": "allreduce", "dtype": 5, "Group size": "8",
                                               "Process Group Ranks": [0, 1], "Comms Id": "0xdeadbeef",
                                               "Seq": 1.0, "In msg nelems": 1.5, "Process Group Name": 1e-05})],
    "ids": [dict(_op(), pid="Spans", tid="stream 7"), dict(_kernel(), pid="3", tid=-1)],
    "escaped names": [_op(name='a "quoted" \\ name \u00e9'), _op(name="line\nbreak")],
    "memory": [{"ph": "i", "cat": "cpu_instant_event", "name": "[memory]", "pid": 1, "tid": 1, "ts": 3,
                "args": {"Bytes": 512, "Total Allocated": "1024", "Total Reserved": 2048, "Device Type": 1,
                         "Device Id": 0, "Addr": 2**64}},
               {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "pid": 0, "tid": 7, "ts": 4, "dur": 1,
                "args": {"bytes": 64}}],
    "flows": [{"ph": "s", "cat": "ac2g", "name": "f", "id": "0x1f", "pid": 1, "tid": 1, "ts": 9},
              {"ph": "f", "cat": "ac2g", "name": "f", "id": 31, "pid": 0, "tid": 7, "ts": 10, "bp": "e"},
              {"ph": "s", "cat": "async", "name": "f", "id": 2**70, "pid": 1, "tid": 1, "ts": 9}],
    "legacy categories": [dict(_op(), cat="Operator"), dict(_kernel(), cat="Kernel"),
                          {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                           "ts": 9.5, "dur": 1, "args": {"correlation": 3}}],
    "no args, null args, nulls": [dict(_op(), args=None), {k: v for k, v in _op().items() if k != "args"},
                                  dict(_kernel(), cat=None), _kernel(correlation=None)],
}
REFUSED_EVENTS = {
    "a number as name": [dict(_op(), name=5)],
    "a string as ts": [dict(_op(), ts="9")],
    "a float pid": [dict(_op(), pid=1.5)],
    "a boolean tid": [dict(_op(), tid=True)],
    "a list as args": [dict(_op(), args=[1])],
    "no ts on a complete event": [{k: v for k, v in _op().items() if k != "ts"}],
    "no ph": [{k: v for k, v in _op().items() if k != "ph"}],  # msgspec reads it as ph ""
    "a float flow id": [{"ph": "s", "cat": "ac2g", "name": "f", "id": 1.5, "pid": 1, "tid": 1, "ts": 9}],
}


@pytest.mark.parametrize("case", sorted({**ODD_EVENTS, **REFUSED_EVENTS}))
def test_each_odd_value_reads_the_same_both_ways(case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events = {**ODD_EVENTS, **REFUSED_EVENTS}[case]
    path = tmp_path / "rank0.pt.trace.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": [*events, _op("ProfilerStep#1")]}))
    want = _read(path, "msgspec", monkeypatch)
    got = _columnar_only(path)
    if case in REFUSED_EVENTS:  # the columnar path refuses; the fallback gives msgspec's own line
        assert isinstance(got, str) and got.startswith("refused")
        _assert_same(want, _read(path, "columnar", monkeypatch))
    else:
        assert not isinstance(want, str), want
        _assert_same(want, got)


def test_many_batches_with_boundaries_inside_strings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches of a few kB: the byte pattern that ends an event also sits inside names and args, so
    the stream must move those cuts back; the tables are the one-batch tables."""
    tricky = 'x"}, {"ph": "X'
    events = [_op(name=f"op{i} {tricky}" if i % 3 else f"op{i}", **{"Input Dims": [[i, 2]]}) for i in range(400)]
    for i, ev in enumerate(events):
        ev["ts"] = float(i * 10)
    events += [dict(_kernel(correlation=i), ts=i * 10 + 1.0) for i in range(400)]
    path = tmp_path / "rank0.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}, indent=1))
    one = _columnar_only(path)
    monkeypatch.setattr(parse, "COLUMNAR_BATCH_BYTES", 3000)
    many = _columnar_only(path)
    assert not isinstance(one, str) and not isinstance(many, str), (one, many)
    _assert_same(one, many)
    _assert_same(_read(path, "msgspec", monkeypatch), many)
    assert one.host.height == 400 and one.meta == many.meta


@pytest.mark.parametrize("run", ["tp_dp_h100", "fsdp_memory_h100", "cpu_ddp_gloo", "h100_nccl_timeout_1gpu"])
def test_report_documents_are_identical(run: str, tmp_path: Path) -> None:
    docs = []
    for reader in ("msgspec", "columnar"):
        out = tmp_path / f"{reader}.json"
        subprocess.run(
            [sys.executable, "-m", "traceread.cli", "report", str(REPO / "sample_traces" / run),
             "--format", "json", "-o", str(out), "--no-cache"],
            check=True, capture_output=True, env={**os.environ, "TRACEREAD_READER": reader},
        )
        docs.append(out.read_bytes())
    assert docs[0] == docs[1]
