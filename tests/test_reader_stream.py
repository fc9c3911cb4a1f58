"""The streaming reader (ranks over 16 MiB) gives the same tables as the whole-document reader.

Forced onto small files with tiny batches and chunks, so that candidate cuts land inside strings,
inside nested args lists and between events, on real traces and on documents written to trip it.
"""

from __future__ import annotations

import contextlib
import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from traceread.model import RankTrace
from traceread.read import inflate, parse, stream

REAL = [
    "kineto_docs_traces/before_fix_trace.json",
    "hta_amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "hta_nccl_parser_config/nccl_data.json.gz",
    "param_dlrm_8rank/worker0_step_8.1697513281431.pt.trace.json",
]


@contextlib.contextmanager
def _streamed(batch: int, chunk: int) -> Iterator[None]:
    saved = parse.WHOLE_LIMIT, stream.BATCH_BYTES, inflate.OUT_CHUNK
    parse.WHOLE_LIMIT, stream.BATCH_BYTES, inflate.OUT_CHUNK = 0, batch, chunk
    try:
        yield
    finally:
        parse.WHOLE_LIMIT, stream.BATCH_BYTES, inflate.OUT_CHUNK = saved


def _both(path: Path, batch: int = 2000, chunk: int = 999) -> tuple[RankTrace, RankTrace]:
    whole = parse.parse_file(path)
    with _streamed(batch, chunk):
        streamed = parse.parse_file(path)
    return whole, streamed


def _assert_same(a: RankTrace, b: RankTrace) -> None:
    for table in ("gpu", "host", "steps", "flows"):
        assert getattr(a, table).equals(getattr(b, table)), table
    assert (a.rank, a.meta) == (b.rank, b.meta)


@pytest.mark.parametrize("name", REAL)
def test_real_traces_identical(shared_traces: Path, name: str) -> None:
    path = shared_traces / name
    if not path.exists():  # the DLRM file name carries a timestamp
        path = next((shared_traces / Path(name).parent).glob("worker0*.json"))
    a, b = _both(path, batch=100_000, chunk=7777)
    assert a.host.height > 0
    _assert_same(a, b)


def _tricky_doc() -> dict:
    """Keys before and after the events, boundary-like text in strings and nested args."""
    events = []
    for i in range(300):
        events.append({"ph": "X", "cat": "cpu_op", "name": f"op}},{{ {i}", "pid": 1, "tid": 2,
                       "ts": i * 10.0, "dur": 5.0,
                       "args": {"External id": i, "Input Dims": [[1, i]], "odd": [{"a": 1}, {"b": 2}],
                                "Input type": ["}, {"]}})
        events.append({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": i * 10.0 + 1,
                       "dur": 2.0, "args": {"device": 0, "stream": 7, "correlation": i,
                                            "grid": [1, 1, 1], "block": [32, 1, 1]}})
        events.append({"ph": "s", "cat": "ac2g", "id": i, "pid": 1, "tid": 2, "ts": i * 10.0})
        events.append({"ph": "f", "cat": "ac2g", "id": i, "pid": 0, "tid": 7, "ts": i * 10.0 + 1,
                       "bp": "e"})
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA A100", "numSms": 108}],
            "traceEvents": events, "traceName": "x", "displayTimeUnit": "ms",
            "baseTimeNanoseconds": 1700000000000000000}


@pytest.mark.parametrize("indent", [None, 1])
@pytest.mark.parametrize("gz", [False, True])
def test_tricky_layouts_identical(tmp_path: Path, indent: int | None, gz: bool) -> None:
    text = json.dumps(_tricky_doc(), indent=indent, separators=(",", ":") if indent is None else None)
    p = tmp_path / ("rank0.json.gz" if gz else "rank0.json")
    p.write_bytes(gzip.compress(text.encode()) if gz else text.encode())
    for batch in (50, 700, 5000):
        a, b = _both(p, batch=batch, chunk=333)
        _assert_same(a, b)
    assert a.meta.base_time_ns == 1700000000000000000 and a.meta.device_name == "NVIDIA A100"
    assert a.host.height == 300 and a.gpu.height == 300 and a.flows.height == 300


def test_events_after_metadata_keys_at_the_end(tmp_path: Path) -> None:
    doc = _tricky_doc()
    reordered = {"traceEvents": doc.pop("traceEvents"), **doc}
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps(reordered))
    a, b = _both(p, batch=100)
    _assert_same(a, b)
    assert b.meta.device_name == "NVIDIA A100"


def test_streamed_errors_name_the_event_and_the_byte(tmp_path: Path) -> None:
    doc = _tricky_doc()
    doc["traceEvents"][500]["ts"] = "soon"
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps(doc))
    with _streamed(4000, 999), pytest.raises(Exception) as info:
        parse.parse_file(p)
    assert "malformed event: event #500:" in str(info.value) and "$.ts" in str(info.value)
    text = json.dumps(_tricky_doc()).encode()
    at = text.index(b'"ph"', len(text) // 2)
    p.write_bytes(text[:at] + b"}}" + text[at:])
    with _streamed(4000, 999), pytest.raises(Exception) as info:
        parse.parse_file(p)
    assert "invalid JSON" in str(info.value)
    assert abs(int(str(info.value).split("(byte ")[1].rstrip(")")) - at) < 4


def test_lone_surrogate_in_one_name_keeps_the_rank_readable(tmp_path: Path) -> None:
    """Python's own json writes (and reads) a lone surrogate escape; msgspec refused the whole file.
    The name reads with U+FFFD in its place, a real pair keeps its character, an escaped backslash
    before ``ud800`` stays text; whole and streamed reads agree."""
    src = Path(__file__).resolve().parents[1] / "sample_traces" / "cpu_ddp_gloo" / "traces" / "rank0.pt.trace.json.gz"
    doc = json.loads(gzip.decompress(src.read_bytes()))
    ops = [e for e in doc["traceEvents"] if e.get("cat") == "cpu_op"]
    ops[0]["name"] = "aten::odd\ud800name"
    ops[1]["name"] = "aten::emoji\U0001f600"
    ops[2]["name"] = "aten::text\\ud800"
    path = tmp_path / "rank0.pt.trace.json"
    path.write_text(json.dumps(doc))  # ensure_ascii: \ud800, \ud83d\ude00 and \\ud800 in the file
    assert "\\ud800name" in path.read_text()
    whole, streamed = _both(path, batch=3000, chunk=1001)
    _assert_same(whole, streamed)
    names = set(whole.host["name"].to_list())
    assert {"aten::odd\ufffdname", "aten::emoji\U0001f600", "aten::text\\ud800"} <= names
