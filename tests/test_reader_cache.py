"""The parquet cache returns identical tables and is invalidated by any change of its key."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import pytest
from polars.testing import assert_frame_equal

from traceread import model
from traceread.engine import caches as cache
from traceread.engine.jobs import read_rank, read_traces
from traceread.model import RankTrace
from traceread.read import parse as parse_mod

TRACE = "hta_nccl_parser_config/nccl_data.json.gz"


def _same(a: RankTrace, b: RankTrace) -> None:
    assert (a.rank, a.file) == (b.rank, b.file)
    assert dataclasses.asdict(a.meta) == dataclasses.asdict(b.meta)
    for name in ("gpu", "host", "steps", "flows"):
        assert_frame_equal(getattr(a, name), getattr(b, name))


@pytest.fixture()
def trace_copy(tmp_path: Path, shared_traces: Path) -> Path:
    dest = tmp_path / "data" / "rank0.json.gz"
    dest.parent.mkdir()
    shutil.copy(shared_traces / TRACE, dest)
    return dest


def _count_parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    real = parse_mod._parse

    def spy(p: Path, *args: object) -> RankTrace:
        calls.append(str(p))
        return real(p, *args)

    monkeypatch.setattr(parse_mod, "_parse", spy)
    return calls


def test_cache_hit_is_identical(tmp_path: Path, trace_copy: Path, monkeypatch) -> None:
    calls = _count_parses(monkeypatch)
    root = tmp_path / "cache"
    first = read_rank(trace_copy, cache_dir=root)
    second = read_rank(trace_copy, cache_dir=root)
    assert len(calls) == 1
    _same(first, second)
    assert second.gpu.height == 3774 and second.meta.nccl_version == "2.17.1"


def test_change_of_file_or_version_is_a_miss(
    tmp_path: Path, trace_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _count_parses(monkeypatch)
    root = tmp_path / "cache"
    read_rank(trace_copy, cache_dir=root)
    st = trace_copy.stat()
    os.utime(trace_copy, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    read_rank(trace_copy, cache_dir=root)
    assert len(calls) == 2
    monkeypatch.setattr(model, "READER_VERSION", "test-next")
    read_rank(trace_copy, cache_dir=root)
    assert len(calls) == 3
    read_rank(trace_copy, cache_dir=root)
    assert len(calls) == 3


def test_corrupt_entry_is_reparsed(tmp_path: Path, trace_copy: Path, monkeypatch) -> None:
    calls = _count_parses(monkeypatch)
    root = tmp_path / "cache"
    first = read_rank(trace_copy, cache_dir=root)
    entry = cache.entry_dir(root, trace_copy)
    (entry / "host.parquet").write_bytes(b"garbage")
    again = read_rank(trace_copy, cache_dir=root)
    assert len(calls) == 2
    _same(first, again)


def test_no_cache_writes_nothing(tmp_path: Path, trace_copy: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRACEREAD_CACHE_DIR", str(tmp_path / "envcache"))
    read_rank(trace_copy, use_cache=False)
    read_traces(trace_copy.parent, use_cache=False)
    assert not (tmp_path / "envcache").exists()
    read_rank(trace_copy)
    assert any((tmp_path / "envcache").iterdir())


def test_read_traces_uses_cache_written_by_workers(
    tmp_path: Path, shared_traces: Path
) -> None:
    root = tmp_path / "cache"
    cold = read_traces(shared_traces / "param_dlrm_8rank", cache_dir=root, workers=2)
    assert len(list(root.iterdir())) == 8
    warm = read_traces(shared_traces / "param_dlrm_8rank", cache_dir=root)
    assert [r.rank for r in warm.ranks] == list(range(8))
    for a, b in zip(cold.ranks, warm.ranks):
        _same(a, b)
