"""Bad input becomes one TraceFileError line naming the file; read_traces keeps going."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
import zstandard

from traceread.engine.jobs import read_rank, read_traces
from traceread.errors import TraceFileError
from traceread.read import discover

DLRM = "param_dlrm_8rank"


@pytest.fixture()
def small_trace(shared_traces: Path) -> bytes:
    """A real, complete trace (uncompressed JSON bytes) to break in many ways."""
    return (shared_traces / "kineto_docs_traces" / "before_fix_trace.json").read_bytes()


def _error(path: Path) -> str:
    with pytest.raises(TraceFileError) as info:
        read_rank(path, use_cache=False)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(str(path))
    return msg


def test_truncated_gzip(tmp_path: Path, small_trace: bytes) -> None:
    gz = gzip.compress(small_trace)
    p = tmp_path / "rank0.json.gz"
    p.write_bytes(gz[: len(gz) // 2])
    assert "truncated gzip stream" in _error(p)
    assert f"byte {len(gz) // 2}" in _error(p)


def test_corrupt_gzip_reports_offset(tmp_path: Path, small_trace: bytes) -> None:
    gz = bytearray(gzip.compress(small_trace))
    for i in range(20, 60):
        gz[i] ^= 0xFF
    p = tmp_path / "rank0.json.gz"
    p.write_bytes(bytes(gz))
    msg = _error(p)
    assert "gzip" in msg and "byte" in msg


def test_truncated_json(tmp_path: Path, small_trace: bytes) -> None:
    p = tmp_path / "rank0.json"
    p.write_bytes(small_trace[: len(small_trace) // 3])
    assert "truncated JSON" in _error(p)


def test_syntax_error_reports_byte(tmp_path: Path, small_trace: bytes) -> None:
    at = small_trace.index(b'"ph"', 2000)
    p = tmp_path / "rank0.json"
    p.write_bytes(small_trace[:at] + b"}}" + small_trace[at:])
    msg = _error(p)
    assert "invalid JSON" in msg and "(byte " in msg


def test_empty_file(tmp_path: Path) -> None:
    p = tmp_path / "rank0.json"
    p.write_bytes(b"")
    assert _error(p).endswith("empty file")


@pytest.mark.parametrize(
    ("doc", "expect"),
    [
        ([1, 2, 3], "not a Kineto trace: the JSON document is a list"),
        ({"schemaVersion": 1}, "no traceEvents"),
        ({"traceEvents": {"a": 1}}, "traceEvents is not a list"),
        ({"traceEvents": [{"ph": "X", "cat": "kernel", "ts": "soon", "dur": 1}]}, "event #0"),
        ({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "dur": 1}]}, "no ts"),
        ({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1.0}]}, "no dur"),
        ({"traceEvents": [{"ph": 7}]}, "event #0"),
        ({"traceEvents": ["not an event"]}, "event #0"),
    ],
)
def test_not_a_trace_or_garbled_event(tmp_path: Path, doc: object, expect: str) -> None:
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps(doc))
    assert expect in _error(p)


def test_missing_file(tmp_path: Path) -> None:
    assert "no such file" in _error(tmp_path / "nope.json")


def test_zstd_trace_reads_and_corrupt_zstd_fails(tmp_path: Path, small_trace: bytes) -> None:
    z = zstandard.ZstdCompressor().compress(small_trace)
    good = tmp_path / "rank0.json.zst"
    good.write_bytes(z)
    assert read_rank(good, use_cache=False).gpu.height == 1
    bad = tmp_path / "rank1.json.zst"
    bad.write_bytes(z[: len(z) // 2])
    assert "zstd" in _error(bad)


def test_odd_arg_types_do_not_fail(tmp_path: Path) -> None:
    events = [
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": "stream 7", "ts": 10.5,
         "dur": 2, "args": {"device": 0, "stream": "7", "correlation": 2**70, "grid": "[1, 2, 3]",
                            "block": [4, "5", 6.0], "bytes": "2560", "Comms Id": 2**64 - 1,
                            "registers per thread": [1], "blocks per SM": "1.5"}},
        {"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": 9, "dur": 5,
         "args": {"External id": "12", "Input Dims": "[[1, 2]]", "Sequence number": True,
                  "Process Group Ranks": [0, 1]}},
    ]
    p = tmp_path / "odd.json"
    p.write_text(json.dumps({"traceEvents": events}))
    rt = read_rank(p, use_cache=False)
    k = rt.gpu.row(0, named=True)
    assert (k["stream"], k["correlation"], k["bytes"]) == (7, None, 2560)
    assert k["comms_id"] == str(2**64 - 1)
    assert (k["grid_x"], k["grid_y"], k["grid_z"]) == (1, 2, 3)
    assert (k["block_x"], k["block_y"], k["block_z"]) == (4, 5, 6)
    assert k["registers"] is None and k["blocks_per_sm"] == 1.5 and k["ts"] == 10.5
    h = rt.host.row(0, named=True)
    assert h["external_id"] == 12 and h["input_dims"] == '"[[1, 2]]"'
    assert h["pg_ranks"] == "[0,1]"


# ---- read_traces: one broken rank never stops the others --------------------------------------


def _dlrm_copy(shared: Path, dest: Path, n: int = 3) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    files = sorted((shared / DLRM).iterdir())[:n]
    for f in files:
        shutil.copy(f, dest / f.name)
    return sorted(dest.iterdir())


def test_folder_with_one_broken_rank(tmp_path: Path, shared_traces: Path) -> None:
    files = _dlrm_copy(shared_traces, tmp_path / "run" / "traces")
    broken = files[1]
    broken.write_bytes(broken.read_bytes()[:5000])
    ts = read_traces(tmp_path / "run", use_cache=False, workers=1)
    assert [r.rank for r in ts.ranks] == [0, 2]
    assert len(ts.failures) == 1 and ts.failures[0].file == str(broken)
    assert ts.failures[0].rank == 1 and "truncated JSON" in ts.failures[0].reason
    assert any(w.startswith(f"rank 1 missing: {broken}: truncated JSON") for w in ts.warnings)


def test_run_folder_extras_are_skipped_and_run_json_loaded(
    tmp_path: Path, shared_traces: Path
) -> None:
    run = tmp_path / "run"
    _dlrm_copy(shared_traces, run / "traces", n=2)
    (run / "run.json").write_text(json.dumps({"command": ["python", "train.py"], "exit_code": 0}))
    for name in ("truth.json", "hang.json", "report.json"):
        (run / name).write_text("{}")
    (run / "fr").mkdir()
    (run / "fr" / "rank0.json").write_text('{"entries": []}')
    (run / "errors").mkdir()
    (run / "errors" / "rank1.json").write_text('{"message": "boom"}')
    (run / "notes.json").write_text('{"hello": 1}')  # unknown JSON: a warning, not a failure
    assert len(discover([run])) == 3
    ts = read_traces(run, use_cache=False, workers=1)
    assert [r.rank for r in ts.ranks] == [0, 1]
    assert ts.failures == []
    assert ts.run_info == {"command": ["python", "train.py"], "exit_code": 0}
    assert len(ts.warnings) == 1 and "notes.json" in ts.warnings[0]


def test_explicit_bad_file_is_a_failure(tmp_path: Path, shared_traces: Path) -> None:
    files = _dlrm_copy(shared_traces, tmp_path, n=1)
    other = tmp_path / "notes.json"
    other.write_text('{"hello": 1}')
    ts = read_traces([files[0], other, tmp_path / "missing.json"], use_cache=False)
    assert [r.rank for r in ts.ranks] == [0]
    assert {f.file for f in ts.failures} == {str(other), str(tmp_path / "missing.json")}


def test_parallel_read_with_broken_rank(tmp_path: Path, shared_traces: Path) -> None:
    files = _dlrm_copy(shared_traces, tmp_path / "t", n=3)
    files[2].write_bytes(gzip.compress(files[2].read_bytes())[:-100])
    ts = read_traces(tmp_path / "t", use_cache=False, workers=2, progress=True)
    assert [r.rank for r in ts.ranks] == [0, 1]
    assert len(ts.failures) == 1 and ts.failures[0].rank == 2
    assert "truncated gzip" in ts.failures[0].reason


def test_display_unit_ns_keeps_microseconds(tmp_path: Path) -> None:
    doc = {
        "displayTimeUnit": "ns",
        "baseTimeNanoseconds": 1700000000000000000,
        "traceEvents": [
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
             "ts": 100.125, "dur": 2.5, "args": {"External id": 3}},
        ],
    }
    p = tmp_path / "rank0.json"
    p.write_text(json.dumps(doc))
    rt = read_rank(p, use_cache=False)
    assert rt.host.row(0, named=True)["ts"] == 100.125
    assert rt.host.row(0, named=True)["end"] == 102.625
    assert rt.meta.display_time_unit == "ns" and rt.meta.base_time_ns == 1700000000000000000
    assert rt.gpu.height == 0 and rt.steps.height == 0 and rt.flows.height == 0


def test_broken_worker_pool_falls_back_to_reading_here(
    tmp_path: Path, shared_traces: Path
) -> None:
    """A pool that cannot start (e.g. a script without a __main__ guard) must not fail ranks."""
    from traceread.engine import executors

    files = _dlrm_copy(shared_traces, tmp_path / "t", n=2)
    real = executors.ProcessPoolExecutor

    class Broken(real):  # type: ignore[misc, valid-type]
        def submit(self, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
            from concurrent.futures import Future
            from concurrent.futures.process import BrokenProcessPool

            fut: Future = Future()
            fut.set_exception(BrokenProcessPool("child failed to start"))
            return fut

    executors.ProcessPoolExecutor = Broken  # type: ignore[misc]
    try:
        ts = read_traces(files, use_cache=False, workers=2)
    finally:
        executors.ProcessPoolExecutor = real  # type: ignore[misc]
    assert not ts.failures and [r.rank for r in ts.ranks] == [0, 1] and ts.ranks[0].gpu.height > 0


def test_discover_globs_nested_folders_and_hidden(tmp_path: Path, shared_traces: Path) -> None:
    run = tmp_path / "run"
    _dlrm_copy(shared_traces, run / "node0" / "traces", n=2)
    _dlrm_copy(shared_traces, run / ".cache", n=1)  # hidden folders are not searched
    (run / "node0" / "traces" / "notes.txt").write_text("not json")
    found = discover([run])
    assert [f.parent.name for f in found] == ["traces", "traces"]
    globbed = discover([str(run / "node0" / "traces" / "worker1*")])
    assert [f.name for f in globbed] == [found[1].name]
    ts = read_traces([str(run / "*" / "traces" / "*.json")], use_cache=False, workers=1)
    assert [r.rank for r in ts.ranks] == [0, 1] and ts.sources == [
        str(run / "*" / "traces" / "*.json")
    ]
    missing = read_traces([str(tmp_path / "nothing*.json")], use_cache=False)
    assert missing.ranks == [] and missing.failures[0].reason == "no such file or folder"
