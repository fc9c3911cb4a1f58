"""Every real trace in ../shared/traces reads, and its tables agree with an independent count.

The expectations are computed here from the raw JSON with orjson (not the reader's msgspec
path), never with reader code, so a reader bug cannot hide behind itself.
"""

from __future__ import annotations

import gzip
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import polars as pl
import pytest

from traceread.engine.jobs import read_rank
from traceread.model import FLOW_SCHEMA, GPU_SCHEMA, HOST_SCHEMA, STEP_SCHEMA

SHARED_TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
FILES = sorted(
    p for p in SHARED_TRACES.glob("**/*") if p.is_file() and ".json" in p.name
) if SHARED_TRACES.is_dir() else []


def _load_raw(path: Path) -> dict[str, Any]:
    """Raw JSON through orjson (independent of the reader's msgspec path, and fast)."""
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return orjson.loads(data)


def _facts(path: Path, raw: dict[str, Any]) -> dict[str, Any]:
    """What the tests check, counted from the raw events."""
    events = raw["traceEvents"]
    return {
        "complete": Counter(e.get("cat") for e in events if e.get("ph") == "X"),
        "rank": _expected_rank(path, raw),
        "device_name": _expected_device_name(raw),
        "steps": {
            int(e["name"].split("#")[1])
            for e in events
            if e.get("ph") == "X"
            and re.fullmatch(r"ProfilerStep#\d+", str(e.get("name")))
            and e.get("cat") != "gpu_user_annotation"
        },
    }


def _expected_rank(path: Path, raw: dict[str, Any]) -> int:
    dist = raw.get("distributedInfo") or {}
    if isinstance(dist.get("rank"), int):
        return dist["rank"]
    m = re.search(r"(?:rank|worker)[-_]?(\d+)", path.name)
    return int(m.group(1)) if m else 0


def _expected_device_name(raw: dict[str, Any]) -> str | None:
    kernels = [
        e["args"]["device"]
        for e in raw["traceEvents"]
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "Kernel")
    ]
    if not kernels:
        return None
    dev = Counter(kernels).most_common(1)[0][0]
    props = raw.get("deviceProperties") or []
    names = [d["name"] for d in props if d.get("id") == dev]
    if not names and len({d["name"] for d in props}) == 1:
        names = [props[0]["name"]]
    return (names[0] or None) if names else None


@pytest.fixture(scope="module")
def corpus(shared_traces: Path) -> dict[Path, tuple[Any, dict[str, Any]]]:
    """Every shared trace read once (no cache) beside facts counted from its raw JSON."""
    return {f: (read_rank(f, use_cache=False), _facts(f, _load_raw(f))) for f in FILES}


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SHARED_TRACES)))
def test_trace_reads_with_independent_counts(path: Path, corpus: dict) -> None:
    rt, facts = corpus[path]
    complete = facts["complete"]
    kinds = Counter(rt.gpu["kind"].to_list())
    assert kinds["kernel"] == complete["kernel"] + complete["Kernel"]
    assert kinds["memcpy"] == complete["gpu_memcpy"] + complete["Memcpy"]
    assert kinds["memset"] == complete["gpu_memset"] + complete["Memset"]
    host_cats = Counter(rt.host["cat"].to_list())
    assert host_cats["cpu_op"] == complete["cpu_op"] + complete["Operator"]
    assert rt.host.height == sum(complete.values()) - rt.gpu.height
    assert rt.rank == facts["rank"]
    assert rt.meta.device_name == facts["device_name"]
    # Contract: exact columns and dtypes.
    for frame, schema in (
        (rt.gpu, GPU_SCHEMA),
        (rt.host, HOST_SCHEMA),
        (rt.steps, STEP_SCHEMA),
        (rt.flows, FLOW_SCHEMA),
    ):
        assert dict(frame.schema) == schema
    assert rt.host["row"].to_list() == list(range(rt.host.height))
    assert rt.gpu["ts"].is_sorted() and rt.host["ts"].is_sorted()
    # Steps: one row per distinct ProfilerStep#N recorded on the host.
    assert sorted(rt.steps["step"].to_list()) == sorted(facts["steps"])


def test_times_keep_fractional_microseconds(corpus: dict) -> None:
    path = SHARED_TRACES / "hta_amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"
    rt, raw = corpus[path][0], _load_raw(path)
    assert raw["displayTimeUnit"] == "ms"  # display only: ts stays µs
    raw_ts = sorted(e["ts"] for e in raw["traceEvents"] if e.get("cat") == "kernel")
    assert sorted(rt.gpu.filter(pl.col("kind") == "kernel")["ts"].to_list()) == raw_ts
    assert any(t != int(t) for t in raw_ts)
    assert rt.meta.base_time_ns == raw["baseTimeNanoseconds"]


def test_string_pids_become_null(corpus: dict) -> None:
    rt, _ = corpus[SHARED_TRACES / "kineto_docs_traces/before_fix_trace.json"]
    spans = rt.host.filter(pl.col("cat") == "Trace")
    assert spans.height == 1 and spans["pid"].null_count() == 1


def test_legacy_categories_are_normalised(corpus: dict) -> None:
    rt, _ = corpus[SHARED_TRACES / "kineto_tb_resnet50_profiler_api_2021/worker0.pt.trace.json.gz"]
    cats = set(rt.host["cat"].unique().to_list())
    assert "cpu_op" in cats and "cuda_runtime" in cats
    assert not cats & {"Operator", "Runtime", "Kernel"}
    assert rt.meta.devices == [] and rt.meta.device_name is None
    # Legacy kernels link back through "external id"/correlation like current ones.
    assert rt.gpu["launch_row"].is_not_null().mean() > 0.9


def test_empty_device_name_is_none_but_sms_known(corpus: dict) -> None:
    rt, _ = corpus[SHARED_TRACES / "tracelens_inference_vllm_decode_full/graph_execution.json.gz"]
    assert rt.meta.device_name is None and rt.meta.num_sms == 304


def test_cuda_graph_launch_links_many_kernels(corpus: dict) -> None:
    rt, _ = corpus[SHARED_TRACES / "tracelens_inference_vllm_decode_full/graph_execution.json.gz"]
    per_launch = rt.gpu.group_by("launch_row").len().drop_nulls("launch_row")
    graph_rows = rt.host.filter(pl.col("name").str.contains("GraphLaunch"))["row"]
    counts = per_launch.filter(pl.col("launch_row").is_in(graph_rows.implode()))["len"]
    assert counts.len() >= 1 and counts.max() > 10


def test_comm_args_on_kernels(corpus: dict) -> None:
    path = SHARED_TRACES / "hta_nccl_parser_config/nccl_data.json.gz"
    rt, raw = corpus[path][0], _load_raw(path)
    raw_kernels = [
        e["args"] for e in raw["traceEvents"]
        if e.get("cat") == "kernel" and "Collective name" in e.get("args", {})
    ]
    comm = rt.gpu.filter(pl.col("coll_name").is_not_null())
    assert comm.height == len(raw_kernels) > 0
    assert sorted(comm["in_nelems"].to_list()) == sorted(a["In msg nelems"] for a in raw_kernels)
    ranks = sorted(a["Process Group Ranks"] for a in raw_kernels)
    assert sorted(comm["pg_ranks"].to_list()) == ranks
    assert comm["name"].str.contains("(?i)nccl").all()


def test_mtia_and_cpu_only_traces_have_no_gpu_rows(corpus: dict) -> None:
    rt, _ = corpus[SHARED_TRACES / "hta_mtia_inference_trace/mtia_inference_rank_0.json.gz"]
    assert rt.gpu.height == 0 and rt.meta.event_counts["mtia_runtime"] == 823
    assert rt.meta.rank == 0 and rt.meta.rank_source == "filename"
    rt, _ = corpus[SHARED_TRACES / "hta_rank_unavailable/rank_not_found.json.gz"]
    assert rt.meta.rank_source == "unknown" and rt.rank == 0 and rt.meta.backend == "nccl"


def test_input_dims_are_exact_json_text(corpus: dict) -> None:
    path = SHARED_TRACES / "param_dlrm_8rank/worker0_step_12.1694128201545.pt.trace.json"
    rt, raw = corpus[path][0], _load_raw(path)
    ops = rt.host.filter(pl.col("input_dims").is_not_null())
    raw_dims = [
        e["args"]["Input Dims"] for e in raw["traceEvents"]
        if e.get("ph") == "X" and "Input Dims" in e.get("args", {})
    ]
    assert ops.height == len(raw_dims)
    assert Counter(json.dumps(json.loads(d)) for d in ops["input_dims"]) == Counter(
        json.dumps(r) for r in raw_dims
    )
