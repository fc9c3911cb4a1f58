"""Parallel layout (analysis.layout): each process group's role, the degrees and the nodes, against
what the simulator built (its scenario and knobs, or truth.json's ``layout`` where it writes one)
and against the real recorded and third-party jobs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from traceread.analysis.comm import layout
from traceread.assemble.report import ReportOptions, build_report
from traceread.simulate import simulate
from traceread.simulate.scenarios import SCENARIOS

ROLES = ("dp", "fsdp", "tp", "cp", "pp", "ep")


def degrees(**given: int) -> dict[str, int]:
    return {r: given.get(r, 1) for r in ROLES}


def expected_from_truth(truth: dict[str, Any]) -> tuple[dict[str, int], dict[str, str]]:
    """(degrees, role per pg name) the simulator built: its truth.json ``layout`` when it writes one,
    else the scenario's design (ddp/slow_steps: one data-parallel world group, or FSDP with
    ``comm=fsdp``; tp: TP groups of ``tp`` ranks + DP groups + an idle world group; pp: the world
    group carries the send/recv of ``ranks`` stages)."""
    if truth.get("layout"):
        lay = truth["layout"]
        return dict(lay["degrees"]), {str(g["pg"]): g["role"] for g in lay["groups"]}
    k, n = truth["knobs"], truth["knobs"]["ranks"]
    scenario = truth["scenario"]
    if scenario in ("ddp", "slow_steps"):
        role = "fsdp" if k.get("comm") == "fsdp" else "dp"
        return degrees(**{role: n}), {"0": role}
    if scenario == "tp":
        tp = k["tp"]
        roles = {"0": "other"}
        roles.update({str(1 + g): "tp" for g in range(n // tp)})
        roles.update({str(1 + n // tp + j): "dp" for j in range(tp)})
        return degrees(tp=tp, dp=n // tp), roles
    if scenario == "pp":
        return degrees(pp=n), {"0": "pp"}
    raise AssertionError(f"no expectation for scenario {scenario}")


def report_layout(path: Path, cache: Path) -> dict[str, Any]:
    report = build_report([path], ReportOptions(cache_dir=cache, workers=1))
    assert report["layout"] is not None, report["warnings"]
    return report["layout"]  # type: ignore[return-value]


def check(lay: dict[str, Any], want_degrees: dict[str, int], want_roles: dict[str, str]) -> None:
    assert lay["degrees"] == want_degrees
    got = {g["pg"]: g["role"] for g in lay["groups"]}
    assert got == want_roles
    for g in lay["groups"]:
        assert set(g) == {"pg", "desc", "role", "size", "ranks", "nodes", "evidence"}
        assert g["evidence"] and g["size"] == len(g["ranks"])


SIMULATED_SAMPLES = ["tp_dp_h100", "pp_1f1b_h100", "pp_gpipe_h100", "ddp_straggler_h100", "skewed_2host_h100",
                     "slow_steps_a100"]


@pytest.mark.parametrize("name", SIMULATED_SAMPLES)
def test_layout_of_simulated_samples(name: str, samples_dir: Path, tmp_path: Path) -> None:
    truth = json.loads((samples_dir / name / "truth.json").read_text())
    lay = report_layout(samples_dir / name, tmp_path)
    check(lay, *expected_from_truth(truth))
    hosts = truth.get("hosts") or 1
    world = {g["pg"]: g for g in lay["groups"]}["0"]
    assert world["nodes"] == list(range(hosts))  # device index restarts at 0 on each simulated host
    if hosts > 1:
        assert f"spans {hosts} nodes (nodes from device index)" in world["evidence"]


@pytest.mark.parametrize("name", ["cpu_ddp_gloo", "cpu_straggler_gloo", "cpu_hang_gloo", "h100_ddp_gloo_2proc_1gpu"])
def test_layout_of_recorded_gloo_ddp_jobs(name: str, samples_dir: Path, tmp_path: Path) -> None:
    """Real torchrun DDP jobs over gloo (tests/jobs/*_train.py, 2 ranks on one host, see run.json)."""
    run = json.loads((samples_dir / name / "run.json").read_text())
    assert "--nproc-per-node" in run["command"]
    lay = report_layout(samples_dir / name, tmp_path)
    check(lay, degrees(dp=2), {"0": "dp"})
    assert lay["groups"][0]["nodes"] == [0]  # both ranks on host "vm" (run.json), not two nodes


def test_generic_descriptions_fall_back_to_the_collectives(samples_dir: Path) -> None:
    """tp_dp_h100 with every description replaced by torch's generic "undefined": the roles come
    from what each group runs (per-layer all-reduces over the whole compute vs backward only)."""
    from traceread.assemble import job_reduce as crossrank
    from traceread.assemble.rank_map import slim_meta, summarise_rank
    from traceread.engine.jobs import read_rank
    from traceread.read.discover import find
    from traceread.read.ranks import identify

    summaries = []
    for f in find([samples_dir / "tp_dp_h100"]).files:
        rt = read_rank(f, use_cache=False)
        identify(rt, single=False)
        s = summarise_rank(rt)
        slim_meta(s.meta)  # what travels to the driver: the compact pg_config the layout reads
        summaries.append(s)
    crossrank.assign_ranks(summaries)
    for s in summaries:
        s.meta.pg_config = [dict(g, pg_desc="undefined") for g in s.meta.pg_config]
        s.comm = s.comm.with_columns(pl.lit("undefined").alias("pg_desc"))
    lay = layout.layout_from_summaries(summaries)
    truth = json.loads((samples_dir / "tp_dp_h100" / "truth.json").read_text())
    want_degrees, want_roles = expected_from_truth(truth)
    assert lay.degrees == want_degrees
    assert {g.pg: g.role for g in lay.groups} == want_roles
    assert "per-layer" in lay.group("1").evidence and "backward only" in lay.group("3").evidence  # type: ignore[union-attr]
    assert lay.role_of("2") == "tp" and lay.role_of("5") == "dp" and lay.role_of("99") == "other"


def test_fsdp_simulation(tmp_path: Path) -> None:
    """The simulator's FSDP variant (all-gather of parameters, reduce-scatter of gradients)."""
    truth = simulate("ddp", tmp_path / "sim", ranks=4, steps=2, layers=2, hidden=1024, seq_len=512, comm="fsdp")
    check(report_layout(tmp_path / "sim", tmp_path / "cache"), *expected_from_truth(truth))


NEW_SCENARIOS = sorted(set(SCENARIOS) - {"ddp", "tp", "pp", "slow_steps"})


@pytest.mark.parametrize("scenario", NEW_SCENARIOS)
def test_layout_of_scenarios_with_layout_truth(scenario: str, tmp_path: Path) -> None:
    """Every further scenario (3D with generic descriptions and a TP group across nodes, FSDP, MoE
    all-to-all, non-NCCL all-reduce...) writes its layout into truth.json: the inferred one matches."""
    truth = simulate(scenario, tmp_path / "sim", steps=2)
    assert truth.get("layout"), f"scenario {scenario} writes no layout truth"
    lay = report_layout(tmp_path / "sim", tmp_path / "cache")
    want = truth["layout"]
    assert lay["degrees"] == want["degrees"]
    assert {g["pg"]: g["role"] for g in lay["groups"]} == {str(g["pg"]): g["role"] for g in want["groups"]}
    assert {g["pg"]: g["nodes"] for g in lay["groups"]} == {str(g["pg"]): g["nodes"] for g in want["groups"]}


def test_dlrm_eight_ranks(shared_traces: Path, tmp_path: Path) -> None:
    """8 real V100 ranks of DLRM (2023 trace: no process-group names recorded): gradient all-reduce
    and embedding all-to-all on the world group, which is therefore data parallel of degree 8."""
    lay = report_layout(shared_traces / "param_dlrm_8rank", tmp_path)
    check(lay, degrees(dp=8), {"0": "dp"})
    ev = lay["groups"][0]["evidence"]
    # embeddings exchanged in forward (and their gradients in backward), gradients all-reduced in backward
    assert "forward: alltoall 4/step" in ev and "backward: allreduce 3/step, alltoall 1/step" in ev
    assert "does not name process groups" in ev


@pytest.mark.parametrize("desc,role", [
    ("mesh_tp", "tp"), ("mesh_dp", "dp"), ("mesh_dp_shard_cp", "fsdp"), ("mesh_pp", "pp"), ("mesh_ep", "ep"),
    ("mesh_cp", "cp"), ("TENSOR_MODEL_PARALLEL_GROUP", "tp"), ("PIPELINE_MODEL_PARALLEL_GROUP", "pp"),
    ("DATA_PARALLEL_GROUP_WITH_CP", "dp"), ("EXPERT_MODEL_PARALLEL_GROUP", "ep"), ("CONTEXT_PARALLEL_GROUP", "cp"),
    ("undefined", None), ("default_pg", None), ("", None), (None, None), ("EMBEDDING_GROUP", None),
])
def test_role_from_description(desc: str | None, role: str | None) -> None:
    assert layout.role_from_desc(desc) == role


@pytest.mark.parametrize("ranks,text", [
    ([0, 1, 2, 3], "0-3"), ([0, 4, 8, 12], "0-12:4"), ([3], "3"), ([0, 1, 5, 6, 9], "0-1,5-6,9"), ([], ""),
    ([2, 6], "2,6"),
])
def test_compact_ranks_round_trip(ranks: list[int], text: str) -> None:
    assert layout.compact_ranks(ranks) == text
    assert layout.expand_ranks(text) == ranks
    assert layout.expand_ranks(str(ranks)) == ranks  # torch's "[0, 1, 2]"


def test_compact_groups_keep_a_1024_rank_config_small() -> None:
    cfg = [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 1024, "ranks": list(range(1024))},
           {"pg_name": "7", "pg_desc": "mesh_dp", "pg_size": 128, "ranks": list(range(3, 1024, 8))}]
    small = layout.compact_groups(cfg)
    assert small == [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 1024, "ranks": "0-1023"},
                     {"pg_name": "7", "pg_desc": "mesh_dp", "pg_size": 128, "ranks": "3-1019:8"}]
    assert len(json.dumps(small)) < 200


def test_nodes_from_each_source() -> None:
    ranks = range(8)
    by_host, src = layout.node_map(ranks, hosts={r: "b" if r >= 4 else "a" for r in ranks})
    assert src == "run.json" and by_host == {r: r // 4 for r in ranks}
    by_log, src = layout.node_map(ranks, nccl={"nodes": 2, "local_ranks": 4}, world_size=8)
    assert src == "NCCL log" and by_log == by_host
    by_dev, src = layout.node_map(ranks, devices={r: r % 4 for r in ranks})
    assert src == "device index" and by_dev == by_host
    shared, _ = layout.node_map([0, 1], devices={0: 0, 1: 0})  # two processes on one GPU: one node
    assert shared == {0: 0, 1: 0}
    assert layout.node_map(ranks) == ({}, None)


@pytest.mark.parametrize("calls,spread,of,role", [
    ({"send": 12, "recv": 12}, 0.5, "compute", "pp"),
    ({"alltoall": 8}, 0.9, "compute", "ep"),
    ({"alltoall": 5, "allreduce": 3}, 0.7, "compute", "dp"),  # DLRM: embeddings + gradients on one group
    ({"allgather": 8, "reducescatter": 4}, 0.98, "compute", "fsdp"),
    ({"allreduce": 16}, 0.84, "compute", "tp"),
    ({"allreduce": 4}, 0.44, "compute", "dp"),
    ({"allreduce": 1}, None, "compute", "dp"),
    ({"allreduce": 2}, 0.82, "time", "dp"),  # gloo: wall time needs >= 90 % and >= 4 calls
    ({"allreduce": 8}, 0.95, "time", "tp"),
    ({"allgather": 1}, 0.0, "compute", "other"),
    ({"barrier": 1}, None, "compute", "other"),
    ({}, None, "compute", "other"),
])
def test_role_from_usage(calls: dict[str, float], spread: float | None, of: str, role: str) -> None:
    from collections import Counter

    u = layout._Usage(Counter(calls), spread, of, float(sum(calls.values())))
    got, evidence = layout.role_from_usage(u)
    assert got == role and evidence
