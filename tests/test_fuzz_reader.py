"""Property-based: however a real trace is damaged, only TraceFileError ever leaves the reader.

Mutations of real traces: truncation, byte flips (in the JSON and in the gzip stream), deleted
keys, and values replaced by values of another JSON type, at random events; the same through the
streaming path; and hostile files (decompression bombs of whitespace, garbage or tiny events),
which must fail in one line, fast and in bounded memory.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.damage import JSON_VALUES, SOURCES, damage_events
from traceread.engine.jobs import read_rank, read_traces
from traceread.errors import TraceFileError, TraceReadError
from traceread.model import GPU_SCHEMA, HOST_SCHEMA, RankTrace
from traceread.read import inflate, parse, stream

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
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
    damage_events(doc, data, JSON_VALUES, most=6)
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


# ---- the streamed path (ranks over 16 MiB) under the same damage --------------------------------


@contextlib.contextmanager
def _streamed() -> Iterator[None]:
    """Force the streaming reader on small files, with tiny batches and chunks so that cuts land
    everywhere (inside strings, nested args, whitespace)."""
    saved = parse.WHOLE_LIMIT, stream.BATCH_BYTES, inflate.OUT_CHUNK
    parse.WHOLE_LIMIT, stream.BATCH_BYTES, inflate.OUT_CHUNK = 0, 1500, 777
    try:
        yield
    finally:
        parse.WHOLE_LIMIT, stream.BATCH_BYTES, inflate.OUT_CHUNK = saved


@FUZZ
@given(data=st.data())
def test_streamed_truncation_and_flips(sources: dict[str, bytes], data: st.DataObject) -> None:
    raw = bytearray(sources[data.draw(st.sampled_from(SOURCES))])
    if data.draw(st.booleans()):
        raw = raw[: data.draw(st.integers(0, len(raw) - 1))]
    else:
        for _ in range(data.draw(st.integers(1, 5))):
            raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    gz = data.draw(st.booleans())
    with _streamed():
        _check(gzip.compress(bytes(raw), 1) if gz else bytes(raw), ".json.gz" if gz else ".json")


# ---- hostile files: bombs, whitespace, garbage (generated here, small on disk) ------------------


TRACEREAD = [sys.executable, "-c", "from traceread.cli import main; main()"]


def _gz_member(text: bytes) -> bytes:
    return gzip.compress(text, 9)


def _bomb(tmp: Path, name: str, head: bytes, filler: bytes, gib: float, tail: bytes) -> Path:
    """``head`` + ``gib`` GiB of ``filler`` + ``tail`` as a multi-member .json.gz of a few MB:
    one 1 MiB member of filler repeated (each member is ~1 KiB compressed)."""
    mib = filler * ((1 << 20) // len(filler))
    member = _gz_member(mib)
    p = tmp / name
    with open(p, "wb") as fh:
        fh.write(_gz_member(head))
        fh.write(member * int(gib * 1024))
        fh.write(_gz_member(tail))
    return p


def _error_of(p: Path, **kw: object) -> str:
    with pytest.raises(TraceFileError) as info:
        parse.parse_file(p, **kw)
    msg = str(info.value)
    assert "\n" not in msg and msg.startswith(str(p))
    return msg


def test_whitespace_bomb_fails_fast_in_one_line(tmp_path: Path) -> None:
    p = _bomb(tmp_path, "rank0.json.gz", b'{"traceEvents": [', b" ", 3.0, b"]}")
    assert p.stat().st_size < 4 << 20  # 3 GiB of text in ~3 MB
    assert "of whitespace at byte 17: not a trace" in _error_of(p)


def test_whitespace_only_and_between_events(tmp_path: Path) -> None:
    only = _bomb(tmp_path, "a.json.gz", b"", b"\n\t ", 1.0, b"")
    assert "of whitespace at byte 0: not a trace" in _error_of(only)
    ev = b'{"ph": "X", "cat": "cpu_op", "name": "op", "pid": 1, "tid": 1, "ts": 1, "dur": 1}'
    between = _bomb(tmp_path, "b.json.gz", b'{"traceEvents": [' + ev + b",", b" ", 1.0, ev + b"]}")
    assert "of whitespace at byte" in _error_of(between)


def test_garbage_fails_in_one_line(tmp_path: Path) -> None:
    rng = random.Random(7)
    p = tmp_path / "rank0.json"
    p.write_bytes(b"x" + rng.randbytes(20 << 20))
    assert "invalid JSON" in _error_of(p)
    g = _bomb(tmp_path, "g.json.gz", b'{"traceEvents": [', b"garbage\x00", 1.0, b"]}")
    assert "not a Kineto trace" in _error_of(g)


def test_event_bomb_is_refused_by_the_ratio_and_the_size_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Valid tiny events repeated: JSON no profiler writes, compressed ~1000x. (The ratio is
    checked from 32 MiB here instead of 256 MiB, to keep the test short.)"""
    monkeypatch.setattr(inflate, "RATIO_FLOOR", 32 << 20)
    ev = b'{"ph": "i", "name": "x", "ts": 1},'
    p = _bomb(tmp_path, "rank0.json.gz", b'{"traceEvents": [', ev, 0.4, b'{"ph": "i"}]}')
    assert "decompression bomb" in _error_of(p)
    assert "(--max-rank-bytes)" in _error_of(p, max_rank_bytes=24 << 20)


def test_max_rank_bytes_on_a_real_trace(tmp_path: Path, sources: dict[str, bytes]) -> None:
    raw = sources["hta_trace_compare_base/base.json.gz"]
    p = tmp_path / "rank0.json.gz"
    p.write_bytes(gzip.compress(raw, 1))
    assert "(--max-rank-bytes)" in _error_of(p, max_rank_bytes=len(raw) // 2)
    assert parse.parse_file(p, max_rank_bytes=len(raw)).gpu.height > 0


def test_report_on_a_bomb_exits_2_in_one_line_with_bounded_memory(tmp_path: Path) -> None:
    bomb = _bomb(tmp_path, "rank0.json.gz", b'{"traceEvents": [', b" ", 3.0, b"]}")
    code = (
        "import resource, subprocess, sys\n"
        "p = subprocess.run([sys.executable, '-c', 'from traceread.cli import main; main()', 'report',"
        " '--no-cache', '--format', 'json', sys.argv[1]], capture_output=True, text=True)\n"
        "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
        "sys.stderr.write(p.stderr)\n"
    )
    out = subprocess.run([sys.executable, "-c", code, str(bomb)], capture_output=True, text=True)
    rc, rss_kib = map(int, out.stdout.split())
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert rc == 2, out.stderr
    assert any(str(bomb) in line and "whitespace" in line for line in lines), out.stderr
    assert "Traceback" not in out.stderr
    assert rss_kib < 1 << 20  # well under 1 GiB for 3 GiB of text


def test_max_rank_bytes_option(tmp_path: Path, sources: dict[str, bytes]) -> None:
    p = tmp_path / "rank0.json.gz"
    raw = sources["hta_trace_compare_base/base.json.gz"]
    p.write_bytes(gzip.compress(raw, 1))
    out = subprocess.run(
        [*TRACEREAD, "report", "--no-cache", "--format", "json",
         "--max-rank-bytes", str(len(raw) // 2), str(p)], capture_output=True, text=True,
    )
    assert out.returncode == 2 and "--max-rank-bytes" in out.stderr and str(p) in out.stderr
    bad = subprocess.run(
        [*TRACEREAD, "report", "--max-rank-bytes", "lots", str(p)],
        capture_output=True, text=True,
    )
    assert bad.returncode == 2 and "not a size" in bad.stderr


def test_a_limit_given_in_process_does_not_outlive_its_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`report --max-rank-bytes` run in-process (CliRunner, a notebook) and ``traceread.analyze(max_rank_bytes=)``
    set the limit for their own read only: the next call in the same process reads at the default again (the
    limit once stayed in the environment and refused every later trace over 8 MiB)."""
    from click.testing import CliRunner

    import traceread
    from traceread.cli import cli

    monkeypatch.delenv(inflate.MAX_RANK_BYTES_ENV, raising=False)
    run = tmp_path / "run"
    assert CliRunner().invoke(cli, ["simulate", "ddp", "-o", str(run), "--ranks", "2", "--steps", "2"]).exit_code == 0
    res = CliRunner().invoke(cli, ["report", str(run), "--no-cache", "--format", "json", "--max-rank-bytes", "1KiB"])
    assert res.exit_code == 2 and "--max-rank-bytes" in res.output, res.output
    assert inflate.MAX_RANK_BYTES_ENV not in os.environ
    with pytest.raises(TraceReadError):
        traceread.analyze(run, use_cache=False, max_rank_bytes="1KiB")
    assert inflate.MAX_RANK_BYTES_ENV not in os.environ
    assert traceread.analyze(run, use_cache=False).document["ranks"]  # read at the default
    monkeypatch.setenv(inflate.MAX_RANK_BYTES_ENV, "123456789")  # a limit the user set stays theirs
    CliRunner().invoke(cli, ["report", str(run), "--no-cache", "--format", "json", "--max-rank-bytes", "1KiB"])
    assert os.environ[inflate.MAX_RANK_BYTES_ENV] == "123456789"
