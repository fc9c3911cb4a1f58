"""Property-based: however a real trace is damaged, only TraceFileError ever leaves the reader.

Mutations of real traces: truncation, byte flips (in the JSON and in the gzip stream), deleted
keys, and values replaced by values of another JSON type, at random events.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from traceread.errors import TraceFileError
from traceread.model import GPU_SCHEMA, HOST_SCHEMA, RankTrace
from traceread.reader import read_rank, read_traces

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
SOURCES = [
    "kineto_docs_traces/before_fix_trace.json",
    "hta_trace_compare_base/base.json.gz",
    "hta_amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "hta_trace_file_list/inference_rank_1.json.gz",
]
# TRACEREAD_FUZZ_EXAMPLES=2000 for a deep run; CI keeps it short.
EXAMPLES = int(os.environ.get("TRACEREAD_FUZZ_EXAMPLES", "40"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _raw(name: str) -> bytes:
    data = (SHARED / name).read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


@pytest.fixture(scope="module")
def sources(shared_traces: Path) -> dict[str, bytes]:
    return {name: _raw(name) for name in SOURCES}


def _check(data: bytes, suffix: str = ".json") -> None:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / f"rank0{suffix}"
        p.write_bytes(data)
        try:
            rt = read_rank(p, use_cache=False)
        except TraceFileError as exc:
            assert "\n" not in str(exc) and str(p) in str(exc)
            return
        assert isinstance(rt, RankTrace)
        assert dict(rt.gpu.schema) == GPU_SCHEMA and dict(rt.host.schema) == HOST_SCHEMA


JSON_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


@FUZZ
@given(data=st.data())
def test_truncation(sources: dict[str, bytes], data: st.DataObject) -> None:
    raw = sources[data.draw(st.sampled_from(SOURCES))]
    cut = data.draw(st.integers(0, len(raw) - 1))
    _check(raw[:cut])


@FUZZ
@given(data=st.data())
def test_byte_flips(sources: dict[str, bytes], data: st.DataObject) -> None:
    raw = bytearray(sources[data.draw(st.sampled_from(SOURCES))])
    for _ in range(data.draw(st.integers(1, 5))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    _check(bytes(raw))


@FUZZ
@given(data=st.data())
def test_gzip_damage(sources: dict[str, bytes], data: st.DataObject) -> None:
    gz = bytearray(gzip.compress(sources[data.draw(st.sampled_from(SOURCES))]))
    if data.draw(st.booleans()):
        gz = gz[: data.draw(st.integers(0, len(gz) - 1))]
    else:
        for _ in range(data.draw(st.integers(1, 4))):
            gz[data.draw(st.integers(0, len(gz) - 1))] ^= data.draw(st.integers(1, 255))
    _check(bytes(gz), ".json.gz")


@FUZZ
@given(data=st.data())
def test_deleted_keys_and_changed_types(sources: dict[str, bytes], data: st.DataObject) -> None:
    doc = json.loads(sources[data.draw(st.sampled_from(SOURCES))])
    events = doc["traceEvents"]
    for _ in range(data.draw(st.integers(1, 6))):
        ev = events[data.draw(st.integers(0, len(events) - 1))]
        target = ev
        if isinstance(ev.get("args"), dict) and ev["args"] and data.draw(st.booleans()):
            target = ev["args"]
        if not target:
            continue
        key = data.draw(st.sampled_from(sorted(target)))
        if data.draw(st.booleans()):
            del target[key]
        else:
            target[key] = data.draw(JSON_VALUES)
    if data.draw(st.integers(0, 9)) == 0:  # sometimes damage the top level too
        key = data.draw(st.sampled_from(sorted(doc)))
        doc[key] = data.draw(JSON_VALUES)
    _check(json.dumps(doc).encode())


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(cut=st.floats(0.0, 0.99), victim=st.integers(0, 2))
def test_read_traces_never_raises_with_one_broken_rank(
    shared_traces: Path, cut: float, victim: int
) -> None:
    src = sorted((shared_traces / "param_dlrm_8rank").iterdir())[:3]
    with tempfile.TemporaryDirectory() as d:
        for f in src:
            shutil.copy(f, Path(d) / f.name)
        bad = Path(d) / src[victim].name
        raw = bad.read_bytes()
        bad.write_bytes(raw[: int(len(raw) * cut)])
        ts = read_traces(d, use_cache=False, workers=1)
        assert len(ts.ranks) == 2 and len(ts.failures) == 1
        assert ts.failures[0].rank == victim
        assert [r.rank for r in ts.ranks] == [r for r in range(3) if r != victim]
