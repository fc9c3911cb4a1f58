"""Rank identity (distributedInfo > file name > position) and refusal of mixed jobs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from traceread.engine.jobs import read_rank, read_traces
from traceread.errors import RankConflictError
from traceread.read.ranks import rank_from_name


@pytest.mark.parametrize(
    ("name", "rank"),
    [
        ("rank-3.json", 3),
        ("rank3.pt.trace.json.gz", 3),
        ("rank_3.json", 3),
        ("worker3.json", 3),
        ("worker_12.1694.pt.trace.json", 12),
        ("host1_RANK-7.json", 7),
        ("traces/rank5/trace.json", 5),
        ("graph_capture_rank_0.1773709742341309550.pt.trace.json.gz", 0),
        ("frank9.json", None),
        ("trace.json", None),
    ],
)
def test_rank_from_name(name: str, rank: int | None) -> None:
    assert rank_from_name(name) == rank


def test_param_dlrm_is_one_job(shared_traces: Path) -> None:
    ts = read_traces(shared_traces / "param_dlrm_8rank", use_cache=False, workers=1)
    assert [r.rank for r in ts.ranks] == list(range(8)) and ts.warnings == []


def test_same_rank_twice_names_both_files(shared_traces: Path) -> None:
    with pytest.raises(RankConflictError) as info:
        read_traces(shared_traces / "kineto_tb_resnet50_num_workers_0", use_cache=False)
    msg = str(info.value)
    assert "rank 0 appears in 2 files" in msg
    assert "worker0.1623143089861" in msg and "worker0.1623143566756" in msg


def _rewrite_dist(src: Path, dest: Path, **dist: object) -> Path:
    doc = json.loads(src.read_text())
    doc["distributedInfo"].update(dist)
    dest.write_text(json.dumps(doc))
    return dest


def test_different_world_sizes_are_different_jobs(tmp_path: Path, shared_traces: Path) -> None:
    src = sorted((shared_traces / "param_dlrm_8rank").iterdir())
    shutil.copy(src[0], tmp_path / src[0].name)
    _rewrite_dist(src[1], tmp_path / "other_job.json", world_size=16)
    with pytest.raises(RankConflictError) as info:
        read_traces(tmp_path, use_cache=False, workers=1)
    assert "world size 8" in str(info.value) and "world size 16" in str(info.value)
    assert "other_job.json" in str(info.value)


def test_different_backends_are_different_jobs(tmp_path: Path, shared_traces: Path) -> None:
    src = sorted((shared_traces / "param_dlrm_8rank").iterdir())
    shutil.copy(src[0], tmp_path / src[0].name)
    _rewrite_dist(src[1], tmp_path / "gloo.json", backend="gloo")
    with pytest.raises(RankConflictError, match="backend"):
        read_traces(tmp_path, use_cache=False, workers=1)


def test_rank_by_position_with_warning(tmp_path: Path, shared_traces: Path) -> None:
    src = shared_traces / "hta_distributed_info_unavailable" / "distributed_info_not_found.json.gz"
    for name in ("b.json.gz", "a.json.gz"):
        shutil.copy(src, tmp_path / name)
    ts = read_traces(tmp_path, use_cache=False, workers=1)
    assert [(r.rank, Path(r.file).name) for r in ts.ranks] == [(0, "a.json.gz"), (1, "b.json.gz")]
    assert all(r.meta.rank_source == "unknown" for r in ts.ranks)
    assert len(ts.warnings) == 2 and all("assumed" in w for w in ts.warnings)


def test_filename_rank_fills_gaps(tmp_path: Path, shared_traces: Path) -> None:
    src = shared_traces / "hta_distributed_info_unavailable" / "distributed_info_not_found.json.gz"
    shutil.copy(src, tmp_path / "rank_1.json.gz")
    shutil.copy(src, tmp_path / "worker-0.json.gz")
    ts = read_traces(tmp_path, use_cache=False, workers=1)
    assert [(r.rank, r.meta.rank_source) for r in ts.ranks] == [(0, "filename"), (1, "filename")]
    assert ts.warnings == []


def test_single_file_without_rank_is_rank_zero(shared_traces: Path) -> None:
    path = shared_traces / "hta_rank_unavailable" / "rank_not_found.json.gz"
    rt = read_rank(path, use_cache=False)
    assert (rt.rank, rt.meta.rank, rt.meta.rank_source) == (0, 0, "unknown")
