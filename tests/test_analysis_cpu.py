"""CPU-only breakdown (gloo runs) against hand-computed truth, HTA's CPU-only sample and a real
2-rank gloo run recorded here with torch.profiler."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import needs
import polars as pl
import pytest
from ports import free_port as _free_port
from rank_factory import make_rank

from traceread.analysis.time.cpu_breakdown import cpu_breakdown
from traceread.model import RankTrace


def op(cat: str, name: str, ts: float, dur: float, tid: int = 1) -> dict[str, Any]:
    return {"cat": cat, "name": name, "ts": ts, "dur": dur, "tid": tid}


def check_identity(out: dict[str, Any]) -> None:
    assert out["compute_us"] + out["comm_us"] + out["idle_us"] == pytest.approx(out["window_us"], abs=1e-6)


def test_hand_example() -> None:
    host = [
        op("user_annotation", "ProfilerStep#3", 0, 100),
        op("cpu_op", "aten::mm", 5, 20),
        op("cpu_op", "aten::addmm", 8, 5),  # nested: counted once
        op("cpu_op", "c10d::allreduce_", 30, 10),  # comm issued by the training thread
        op("cpu_op", "record_param_comms", 31, 2),
        op("user_annotation", "gloo:all_reduce", 32, 30, tid=2),  # gloo worker thread
        op("cpu_op", "aten::add", 50, 20),  # overlaps comm [50,62): compute only [62,70)
        op("cuda_runtime", "cudaLaunchKernel", 80, 5),  # not an op
    ]
    out = cpu_breakdown(make_rank(host=host))
    assert out is not None
    assert out["window_us"] == 100.0
    assert out["comm_us"] == 32.0  # [30,62)
    assert out["compute_us"] == 20.0 + 8.0  # [5,25) + [62,70)
    assert out["idle_us"] == 100.0 - 60.0
    check_identity(out)
    # Thread 1 computes [50,62) while thread 2's gloo all_reduce runs: only [30,50) is exposed.
    assert out["exposed_comm_us"] == 20.0
    assert out["comm_overlap_pct"] == pytest.approx(12 / 32 * 100)
    threads = {t["tid"]: t for t in out["threads"]}
    assert threads[1] == {"tid": 1, "busy_us": 20.0 + 10.0 + 20.0, "comm_us": 10.0}
    assert threads[2] == {"tid": 2, "busy_us": 30.0, "comm_us": 30.0}
    assert [t["tid"] for t in out["threads"]] == [1, 2]


def test_not_for_gpu_traces_or_empty() -> None:
    assert cpu_breakdown(make_rank([{"name": "k", "ts": 1.0, "dur": 1.0}], [op("cpu_op", "aten::mm", 0, 5)])) is None
    assert cpu_breakdown(make_rank()) is None


def _read(path: Path) -> RankTrace:
    from traceread.engine import jobs as reader
    return reader.read_rank(path, use_cache=False)


def test_hta_cpu_only_sample(shared_traces: Path) -> None:
    """HTA's gloo rank 34/300: five gloo:all_reduce on two worker threads, a few aten::empty."""
    rt = _read(shared_traces / "hta_cpu_only" / "rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz")
    out = cpu_breakdown(rt)
    assert out is not None
    check_identity(out)
    # Independent truth from the raw events (see the trace): comm is the union of the ten
    # gloo:all_reduce spans on threads 3553/3554; compute is the four aten::empty on thread 1074.
    gloo = rt.host.filter(pl.col("name") == "gloo:all_reduce").sort("ts")
    assert gloo.height == 10
    spans: list[list[float]] = []
    for s, e in zip(gloo["ts"].to_list(), gloo["end"].to_list()):
        if spans and s <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], e)
        else:
            spans.append([s, e])
    assert out["comm_us"] == pytest.approx(sum(e - s for s, e in spans), abs=1e-6)
    empties = rt.host.filter(pl.col("name") == "aten::empty")
    assert out["compute_us"] == pytest.approx(float((empties["end"] - empties["ts"]).sum()), abs=1e-6)
    tids = {t["tid"] for t in out["threads"]}
    assert {3553, 3554, 1074} <= tids


def python_union(spans: list[tuple[float, float]]) -> float:
    """Plain-Python union length (independent of traceread.intervals)."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(spans):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s  # type: ignore[operator]
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + ((cur_e - cur_s) if cur_e is not None else 0.0)  # type: ignore[operator]


def test_ddp_gloo_sample(samples_dir: Path) -> None:
    """The project's own 2-rank DDP gloo sample (recorded by `traceread collect`)."""
    folder = samples_dir / "cpu_ddp_gloo" / "traces"
    for path in sorted(folder.glob("rank*.pt.trace.json.gz")):
        rt = _read(path)
        out = cpu_breakdown(rt)
        assert out is not None
        check_identity(out)
        comm_rows = rt.host.filter(
            ((pl.col("cat") == "user_annotation") & pl.col("name").str.starts_with("gloo:"))
            | ((pl.col("cat") == "cpu_op") & pl.col("name").str.starts_with("c10d::"))
            | (pl.col("name") == "record_param_comms")
        )
        assert comm_rows.height > 0
        spans = list(zip(comm_rows["ts"].to_list(), comm_rows["end"].to_list()))
        assert out["comm_us"] == pytest.approx(python_union(spans), abs=1e-6)
        assert 0 <= out["exposed_comm_us"] <= out["comm_us"]
        assert sum(t["comm_us"] for t in out["threads"]) >= out["comm_us"] - 1e-6


def _gloo_worker(rank: int, world: int, port: int, out_dir: str) -> None:  # runs in a child process
    import torch
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    x = torch.randn(256, 256)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            y = x @ x
            t = torch.ones(1 << 16) * rank
            dist.all_reduce(t)
            y = y + t[:256]
            prof.step()
    prof.export_chrome_trace(os.path.join(out_dir, f"rank{rank}.pt.trace.json"))
    dist.destroy_process_group()


@pytest.mark.slow
def test_real_gloo_run(tmp_path: Path) -> None:
    """Two gloo ranks profiled on CPU; the breakdown must see their all_reduces and matmuls."""
    torch = needs.module("torch")
    torch.multiprocessing.spawn(_gloo_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    for rank in (0, 1):
        rt = _read(tmp_path / f"rank{rank}.pt.trace.json")
        out = cpu_breakdown(rt)
        assert out is not None
        check_identity(out)
        comm_rows = rt.host.filter(
            pl.col("name").str.starts_with("gloo:") | pl.col("name").str.starts_with("c10d::")
            | (pl.col("name") == "record_param_comms")
        )
        assert comm_rows.height >= 3  # one collective per profiled step at least
        assert out["comm_us"] > 0 and out["compute_us"] > 0
        mm = rt.host.filter(pl.col("name") == "aten::mm")
        assert mm.height >= 2
        # Every matmul is compute and runs outside collectives: compute covers them.
        assert out["compute_us"] >= float((mm["end"] - mm["ts"]).sum()) - 1e-6
