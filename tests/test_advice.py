"""Advice by role and cause (reports.explain.advice) with the savings the guide's cost models predict,
point-to-point never explained as a ring, and the "TP group spans N nodes" finding end to end."""

from __future__ import annotations

from pathlib import Path

import pytest

from traceread.assemble import explain
from traceread.assemble.findings.layout import tp_across_nodes
from traceread.assemble.report import ReportOptions, build_report
from traceread.simulate import simulate


def test_pipeline_bubble_at_2m_and_4m() -> None:
    share = 25_800.0
    text, saving = explain.advice("pp", "bubble", {"share_us": share, "stages": 4, "microbatches": 8})
    now, at2 = 3 / 11, 3 / 19
    assert saving == pytest.approx(share * (1 - at2 / now))
    assert "M = 16: 15.8%" in text and "M = 32: 8.6%" in text and "interleaved" in text and "zero-bubble" in text


def test_tp_across_nodes_saving_from_measured_busbw() -> None:
    text, saving = explain.advice("tp", "comm_transfer",
                                  {"share_us": 1000.0, "nodes": 2, "busbw_gbps": 45.0, "nvlink_gbps": 450.0})
    assert saving == pytest.approx(1000.0 * (1 - 45 / 450))
    assert "spans 2 nodes" in text and "NVLink" in text
    text, saving = explain.advice("tp", "comm_transfer", {"share_us": 1000.0, "nodes": 1})
    assert saving is None and "equence parallelism" in text and "async" in text.lower()


def test_dp_no_sync_and_hsdp() -> None:
    _t, s = explain.advice("dp", "comm_transfer", {"share_us": 800.0, "accumulation": 4})
    assert s == pytest.approx(600.0)  # 3 of 4 all-reduces skipped
    t, s = explain.advice("dp", "comm_transfer", {"share_us": 800.0, "nodes": 2, "gpus_per_node": 8})
    assert s == pytest.approx(700.0) and "HSDP" in t and "bucket_cap_mb" in t
    t, s = explain.advice("fsdp", "comm_transfer", {"share_us": 800.0})
    assert s is None and "prefetch" in t.lower() and "reshard_after_forward" in t


def test_ep_cp_straggler_host() -> None:
    t, s = explain.advice("ep", "comm_wait", {"share_us": 500.0})
    assert s == 500.0 and "capacity factor" in t
    t, s = explain.advice("cp", "comm_transfer", {"share_us": 500.0})
    assert s is None and "ring" in t
    t, s = explain.advice("dp", "comm_wait", {"share_us": 300.0, "rank": 5, "cause": "gpu"})
    assert s == 300.0 and "rank 5" in t and "GPU" in t
    t, s = explain.advice(None, "host_bound", {"share_us": 300.0})
    assert "CUDA graphs" in t and "torch.compile" in t and "workers" in t


#: The job's numbers for the table below: 8 stages, 2 micro-batches, a group over 4 nodes of 8 GPUs
#: measuring 1 GB/s against 900 GB/s NVLink, 16 accumulation micro-steps; a 100 µs share.
NUMBERS = {"share_us": 100.0, "stages": 8, "microbatches": 2, "nodes": 4, "gpus_per_node": 8, "busbw_gbps": 1.0,
           "nvlink_gbps": 900.0, "accumulation": 16}
#: Saving of each (role, category) worked out by hand from the guide's cost models (None: no model).
PP = 100.0 * (1 - (7 / (7 + 4)) / (7 / (7 + 2)))  # bubble (P-1)/(P-1+M) at M = 2 → at 2M = 4
SAVINGS: dict[tuple[str | None, str], float | None] = {
    **{(role, "bubble"): PP for role in ("dp", "fsdp", "tp", "cp", "pp", "ep", "other", None)},
    **{("pp", c): PP for c in ("comm_transfer", "comm_wait", "host_bound")},
    **{(role, "host_bound"): None for role in ("dp", "fsdp", "tp", "cp", "ep", "other", None)},
    **{("tp", c): 100.0 * (1 - 1.0 / 900.0) for c in ("comm_transfer", "comm_wait")},  # TP over 4 nodes: NVLink instead
    **{("dp", c): 100.0 * (1 - 1 / 16) for c in ("comm_transfer", "comm_wait")},  # no_sync: 15 of 16 all-reduces skipped
    **{("fsdp", c): 100.0 * (1 - 1 / 8) for c in ("comm_transfer", "comm_wait")},  # HSDP: 1/8 of the bytes cross nodes
    ("ep", "comm_wait"): 100.0, ("ep", "comm_transfer"): None,  # a balanced dispatch removes the whole wait
    **{(role, c): None for role in ("cp", "other", None) for c in ("comm_transfer", "comm_wait")},
}


@pytest.mark.parametrize("role", ["dp", "fsdp", "tp", "cp", "pp", "ep", "other", None])
@pytest.mark.parametrize("category", ["comm_transfer", "comm_wait", "bubble", "host_bound"])
def test_prediction_is_the_cost_models_number(role: str | None, category: str) -> None:
    """Every (role, category) pair's saving, exactly: the number the cost model gives for this job,
    never a share it does not model, never above the share."""
    text, saving = explain.advice(role, category, NUMBERS)
    assert text
    want = SAVINGS[(role, category)]
    assert saving == (None if want is None else pytest.approx(want)), (role, category)
    assert saving is None or 0.0 <= saving <= NUMBERS["share_us"]


def test_point_to_point_is_not_explained_as_a_ring() -> None:
    for name in ("send", "recv", "sendrecv"):
        text = explain.ring_allreduce({"name": name, "group_size": 4, "bytes": 8 << 20, "latency_us": 400.0,
                                       "link_peak_gbps": 450.0, "busbw_gbps": 21.0})
        assert "point-to-point" in text and "In a ring" not in text and "2(N−1)/N" not in text
    a2a = explain.ring_allreduce({"name": "alltoall", "group_size": 8, "bytes": 1 << 20})
    assert "pairwise" in a2a and "In a ring" not in a2a
    ar = explain.ring_allreduce({"name": "allreduce", "group_size": 8, "bytes": 1 << 20})
    assert "In a ring" in ar and "2(N−1)/N" in ar


def test_tp_group_across_nodes_finding(tmp_path: Path) -> None:
    """Simulated TP=4 × DP=2 on 4 hosts of 2 GPUs: every TP group crosses a node boundary."""
    simulate("tp", tmp_path / "sim", ranks=8, tp=4, hosts=4, steps=2, layers=2, hidden=1024, seq_len=512)
    report = build_report([tmp_path / "sim"], ReportOptions(cache_dir=tmp_path / "cache", workers=1))
    tp = [g for g in report["layout"]["groups"] if g["role"] == "tp"]  # type: ignore[index]
    assert len(tp) == 2 and all(len(g["nodes"]) == 2 for g in tp)
    (f,) = tp_across_nodes(report)
    w = report["ledger"]["window"]  # type: ignore[index]
    share = sum(p["us"] for p in w["parts"]  # the TP transfer on the critical path of every step
                if p["category"] == "comm_transfer" and p["role"] == "tp") / w["steps"]
    assert share > 0 and f["impact_us_per_step"] == pytest.approx(share)
    assert next(x for x in report["findings"] if x["id"] == "tp_across_nodes")["impact_us_per_step"] == pytest.approx(share)
    assert f["title"].startswith("Tensor-parallel group spans 2 nodes")
    busbw = min(c["busbw_gbps"] for c in report["collectives"] if "mesh_tp" in str(c["pg"]))
    assert f["predicted_saving_us"] == pytest.approx(share * (1 - busbw / 450.0))  # H100 NVLink4 per direction
    assert f["category"] == "comm_transfer" and f["role"] == "tp"


def test_no_tp_finding_inside_one_node(samples_dir: Path, tmp_path: Path) -> None:
    report = build_report([samples_dir / "tp_dp_h100"], ReportOptions(cache_dir=tmp_path, workers=1))
    assert tp_across_nodes(report) == []


def test_role_numbers_from_the_layout() -> None:
    from traceread.assemble.findings.layout import role_numbers

    report = {
        "source": {"devices": ["NVIDIA H100 80GB HBM3"]},
        "layout": {"degrees": {}, "groups": [
            {"pg": "1", "role": "tp", "size": 4, "ranks": [0, 1, 2, 3], "nodes": [0]},
            {"pg": "2", "role": "tp", "size": 4, "ranks": [4, 5, 6, 7], "nodes": [1]},
            {"pg": "3", "role": "dp", "size": 2, "ranks": [0, 4], "nodes": [0, 1]}]},
        "collectives": [{"pg": "3 (mesh_dp)", "name": "allreduce", "busbw_gbps": 40.0},
                        {"pg": "1 (mesh_tp)", "name": "allreduce", "busbw_gbps": 300.0}],
    }
    dp = role_numbers(report, "dp")  # type: ignore[arg-type]
    assert dp == {"nodes": 2, "group_size": 2, "gpus_per_node": 4, "busbw_gbps": 40.0, "nvlink_gbps": 450.0}
    _t, saving = explain.advice("dp", "comm_transfer", dict(dp, share_us=1000.0))
    assert saving == pytest.approx(750.0)  # HSDP over 4 GPUs per node
    assert role_numbers(report, "tp")["nodes"] == 1  # type: ignore[arg-type]
