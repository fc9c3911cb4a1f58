"""The simulated files: real Kineto shape, read back by traceread.read, deterministic, skew applied."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from traceread.simulate import SCENARIOS, simulate
from traceread.simulate.samples import SAMPLES, readme, regenerate

SMALL = {"layers": 1, "hidden": 1024, "heads": 8, "seq_len": 512, "steps": 2}


def _load(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


@pytest.fixture(scope="module")
def tp_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("tp")
    return out, simulate("tp", out, ranks=4, tp=2, **SMALL)


@pytest.fixture(scope="module")
def pp_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("pp")
    return out, simulate("pp", out, ranks=3, microbatches=3, batch=1, **SMALL)


def test_every_scenario_writes_one_trace_per_rank(tmp_path: Path) -> None:
    for name in SCENARIOS:
        out = tmp_path / name
        kn = dict(SMALL)
        if name == "slow_steps":
            kn["slow_steps"] = [(11, "gc", 5000.0)]
        if name == "3d":
            kn.update(tp=1, pp=2, layers=2)
        if name in ("custom_allreduce", "tp_sp"):
            kn["tp"] = 2
        if name == "cp":
            kn["cp"] = 2
        truth = simulate(name, out, ranks=2, **kn)
        files = sorted(p.name for p in out.glob("rank*.pt.trace.json.gz"))
        assert files == ["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"]
        assert truth["scenario"] == name and truth["world_size"] == 2
        assert json.loads((out / "truth.json").read_text()) == json.loads(json.dumps(truth))
        for r in range(2):
            ev = _load(out / f"rank{r}.pt.trace.json.gz")["traceEvents"]
            t = truth["ranks"][str(r)]
            assert sum(1 for e in ev if e.get("cat") == "kernel") == t["kernels"]
            assert sum(1 for e in ev if e.get("cat") == "kernel" and e["name"].startswith("nccl")) == t["nccl_kernels"]
            assert sum(1 for e in ev if e.get("cat") == "kernel" and "Collective name" in e["args"]) == t["comm_kernels"]
            assert sum(1 for e in ev if e.get("cat") == "gpu_memcpy") == t["memcpys"]
        from traceread.engine.jobs import read_traces

        ts = read_traces([out], use_cache=False, workers=1)
        assert not ts.failures and [rt.rank for rt in ts.ranks] == [0, 1]
        for rt in ts.ranks:
            assert rt.gpu.height == truth["ranks"][str(rt.rank)]["kernels"] + truth["ranks"][str(rt.rank)]["memcpys"]


def test_trace_has_torch_2x_top_level_and_event_fields(tp_run: tuple[Path, dict]) -> None:
    out, truth = tp_run
    doc = _load(out / "rank1.pt.trace.json.gz")
    assert list(doc)[:3] == ["schemaVersion", "deviceProperties", "distributedInfo"]
    assert doc["baseTimeNanoseconds"] > 0 and doc["displayTimeUnit"] == "ms"
    props = doc["deviceProperties"][0]
    assert props["name"] == "NVIDIA H100 80GB HBM3" and props["numSms"] == 132
    di = doc["distributedInfo"]
    assert (di["backend"], di["rank"], di["world_size"], di["pg_count"]) == ("nccl", 1, 4, 3)
    descs = {pg["pg_desc"]: pg for pg in di["pg_config"]}
    assert descs["mesh_tp"]["ranks"] == [0, 1] and descs["mesh_dp"]["ranks"] == [1, 3]
    ev = doc["traceEvents"]
    cats = {e.get("cat") for e in ev}
    assert {"cpu_op", "user_annotation", "cuda_runtime", "kernel", "gpu_memcpy", "ac2g", "fwdbwd"} <= cats
    steps = [e["name"] for e in ev if e.get("name", "").startswith("ProfilerStep#")]
    assert steps == ["ProfilerStep#10", "ProfilerStep#11"]
    kernels = [e for e in ev if e.get("cat") == "kernel"]
    for k in kernels:
        a = k["args"]
        for key in ("device", "stream", "correlation", "External id", "grid", "block", "registers per thread",
                    "shared memory", "blocks per SM", "warps per SM", "est. achieved occupancy %"):
            assert key in a, key
        assert (k["pid"], k["tid"]) == (a["device"], a["stream"])
        blocks = a["grid"][0] * a["grid"][1] * a["grid"][2]
        assert a["blocks per SM"] == round(blocks / 132, 6)
    nccl = [k for k in kernels if k["name"].startswith("ncclDevKernel_AllReduce_Sum_bf16_RING_")]
    assert nccl
    for k in nccl:
        a = k["args"]
        assert a["Collective name"] == "allreduce" and a["dtype"] == "BFloat16"
        assert a["In msg nelems"] == a["Out msg nelems"] and a["Group size"] == 2
        assert a["Process Group Description"] in ("mesh_tp", "mesh_dp")
    rpc = [e for e in ev if e.get("name") == "record_param_comms"]
    assert len(rpc) == len(nccl) and all("Seq" in e["args"] and "Comms Id" in e["args"] for e in rpc)
    mm = [e for e in ev if e.get("name") == "aten::mm"]
    assert mm and all(e["args"]["Input type"][0] == "c10::BFloat16" and len(e["args"]["Input Dims"]) == 2
                      for e in mm)
    bwd = [e for e in ev if e.get("name", "").startswith("autograd::engine::evaluate_function")]
    assert bwd and all("Fwd thread id" in e["args"] and "Sequence number" in e["args"] for e in bwd)
    launches = {e["args"]["correlation"] for e in ev if e.get("name") == "cudaLaunchKernel"}
    assert {k["args"]["correlation"] for k in kernels} <= launches
    flows = [e for e in ev if e.get("cat") == "ac2g"]
    assert len(flows) == 2 * (len(kernels) + sum(1 for e in ev if e.get("cat") == "gpu_memcpy"))


def test_comms_id_and_seq_agree_across_ranks(tp_run: tuple[Path, dict]) -> None:
    out, truth = tp_run
    seen: dict[str, set] = {}
    for r in range(4):
        for e in _load(out / f"rank{r}.pt.trace.json.gz")["traceEvents"]:
            if e.get("cat") == "kernel" and "Comms Id" in e.get("args", {}):
                a = e["args"]
                seen.setdefault(str(a["Comms Id"]), set()).add((a["Process Group Name"], a["Seq"], r))
    assert len(seen) == len(truth["collectives"])
    for c in truth["collectives"]:
        members = seen[c["comms_id"]]
        assert {m[2] for m in members} == set(c["ranks"])
        assert {(m[0], m[1]) for m in members} == {(c["pg"], c["seq"])}


def test_p2p_kernels_carry_src_and_dst(pp_run: tuple[Path, dict]) -> None:
    out, truth = pp_run
    doc = _load(out / "rank1.pt.trace.json.gz")
    sr = [e for e in doc["traceEvents"] if e.get("cat") == "kernel" and e["name"].startswith("ncclDevKernel_SendRecv")]
    kinds = {(e["args"]["Collective name"], e["args"]["Src Rank"], e["args"]["Dst Rank"]) for e in sr}
    assert kinds == {("recv", 0, 1), ("send", 1, 2), ("recv", 2, 1), ("send", 1, 0)}
    pairs = [c for c in truth["collectives"] if c["name"] == "sendrecv"]
    assert len(pairs) == 2 * 2 * 3 * 2  # 2 links x (act + grad) x 3 microbatches x 2 steps


def test_reader_reads_back_ranks_kernels_and_steps(tp_run: tuple[Path, dict]) -> None:
    from traceread.engine import jobs as reader
    out, truth = tp_run
    ts = reader.read_traces([out], use_cache=False, workers=1)
    assert not ts.failures
    assert [rt.rank for rt in ts.ranks] == [0, 1, 2, 3]
    for rt in ts.ranks:
        t = truth["ranks"][str(rt.rank)]
        assert rt.meta.num_sms == 132 and rt.meta.world_size == 4 and rt.meta.backend == "nccl"
        assert (rt.gpu["kind"] == "kernel").sum() == t["kernels"]
        assert (rt.gpu["kind"] == "memcpy").sum() == t["memcpys"]
        assert rt.gpu["coll_name"].is_not_null().sum() == t["nccl_kernels"]
        assert rt.steps["step"].to_list() == truth["steps"]
        starts = rt.steps["ts"].to_list()
        assert starts == pytest.approx([s["start_us"] for s in t["steps"]], abs=1e-3)
        assert rt.gpu["launch_row"].null_count() == 0
        first, last = rt.gpu["ts"].min(), rt.gpu["end"].max()
        assert last - first == pytest.approx(t["window_us"], abs=2e-3)


def test_skew_shifts_every_timestamp_of_the_host(tmp_path: Path) -> None:
    truth = simulate("ddp", tmp_path, ranks=4, hosts=2, skew_us=500.0, **SMALL)
    for c in truth["collectives"]:
        for r in c["ranks"]:
            doc_r = _load(tmp_path / f"rank{r}.pt.trace.json.gz")
            (k,) = [e for e in doc_r["traceEvents"] if e.get("cat") == "kernel"
                    and str(e["args"].get("Comms Id")) == c["comms_id"]]
            off = truth["clock_offsets_us"][str(r)]
            assert k["ts"] - off == pytest.approx(c["arrivals_us"][str(r)], abs=2e-3)
        break


def test_generation_is_deterministic(tmp_path: Path) -> None:
    a = simulate("ddp", tmp_path / "a", ranks=2, stragglers=[(1, 500.0, "gpu")], **SMALL)
    b = simulate("ddp", tmp_path / "b", ranks=2, stragglers=[(1, 500.0, "gpu")], **SMALL)
    assert a == b
    for f in ("rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz", "truth.json"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    c = simulate("ddp", tmp_path / "c", ranks=2, seed=1, **SMALL)
    assert c["ranks"]["0"]["window_us"] != a["ranks"]["0"]["window_us"]


def test_committed_samples_are_current(tmp_path: Path, samples_dir: Path) -> None:
    """The shipped sample folders are exactly what the simulator writes today (regenerate otherwise)."""
    name = "ddp_straggler_h100"
    regenerate(tmp_path, only=[name])
    written = sorted((samples_dir / name).glob("rank*.pt.trace.json.gz")) + [samples_dir / name / "truth.json"]
    assert len(written) == 9
    for f in written:
        assert (tmp_path / name / f.name).read_bytes() == f.read_bytes(), f"{f} is stale: regenerate the samples"
    text = (samples_dir / "README.md").read_text()
    assert text == readme(samples_dir)
    for folder in SAMPLES:
        assert f"| `{folder}/` |" in text
    assert {p.name for p in samples_dir.iterdir() if p.is_dir()} >= set(SAMPLES)


def test_unknown_knob_and_bad_values_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown simulate knob"):
        simulate("ddp", tmp_path, rnks=4)
    with pytest.raises(ValueError, match="unknown scenario"):
        simulate("zero_bubble", tmp_path)
    with pytest.raises(ValueError, match="straggler rank 9"):
        simulate("ddp", tmp_path, ranks=4, stragglers=[(9, 1.0, "gpu")])


def test_refuses_to_overwrite_foreign_traces(tmp_path: Path) -> None:
    (tmp_path / "rank0.pt.trace.json.gz").write_bytes(b"not ours")
    with pytest.raises(ValueError, match="choose an empty folder"):
        simulate("ddp", tmp_path, ranks=2, **SMALL)
    assert (tmp_path / "rank0.pt.trace.json.gz").read_bytes() == b"not ours"
    simulate("ddp", tmp_path / "sim", ranks=4, **SMALL)
    simulate("ddp", tmp_path / "sim", ranks=2, **SMALL)  # a previous simulation is replaced whole
    assert sorted(p.name for p in (tmp_path / "sim").glob("rank*")) == ["rank0.pt.trace.json.gz",
                                                                        "rank1.pt.trace.json.gz"]


def test_machines_have_at_most_eight_gpus(tmp_path: Path) -> None:
    simulate("ddp", tmp_path, ranks=16, hosts=1, **SMALL)
    doc = _load(tmp_path / "rank9.pt.trace.json.gz")
    assert len(doc["deviceProperties"]) == 8
    assert {e["pid"] for e in doc["traceEvents"] if e.get("cat") == "kernel"} == {1}


def test_new_scenarios_look_like_torch_traces(tmp_path: Path) -> None:
    """3d: generic pg descriptions, TP group across nodes by device index; moe: all_to_allv on SendRecv
    kernels with split sizes; custom_allreduce: a non-NCCL kernel carrying the record_param_comms metadata."""
    simulate("3d", tmp_path / "3d", ranks=8, tp=2, pp=2, gpus_per_node=3, layers=2, microbatches=2, **{
        k: v for k, v in SMALL.items() if k != "layers"})
    docs = {r: _load(tmp_path / "3d" / f"rank{r}.pt.trace.json.gz") for r in range(8)}
    for r, doc in docs.items():
        cfg = doc["distributedInfo"]["pg_config"]
        assert [c["pg_desc"] for c in cfg] == ["default_pg", "undefined", "undefined", "undefined"]
        assert {e["args"]["device"] for e in doc["traceEvents"] if e.get("cat") == "kernel"} == {r % 3}
        assert len(doc["deviceProperties"]) == 3
    simulate("moe", tmp_path / "moe", ranks=4, hot_rank=2, **SMALL)
    ev = _load(tmp_path / "moe" / "rank0.pt.trace.json.gz")["traceEvents"]
    a2a = [e for e in ev if e.get("cat") == "kernel" and e["args"].get("Collective name") == "all_to_allv"]
    assert a2a and all(e["name"].startswith("ncclDevKernel_SendRecv") for e in a2a)
    assert all(e["args"]["In split size"] == "[" + ", ".join([str(e["args"]["In msg nelems"] // 4)] * 4) + "]"
               for e in a2a)
    assert any(e.get("name") == "c10d::alltoall_base_" for e in ev)
    for impl, marker in (("multimem", "multimem_one_shot_all_reduce_kernel"), ("vllm", "cross_device_reduce_1stage")):
        out = tmp_path / impl
        simulate("custom_allreduce", out, ranks=2, tp=2, allreduce_kernel=impl, **SMALL)
        ev = _load(out / "rank0.pt.trace.json.gz")["traceEvents"]
        custom = [e for e in ev if e.get("cat") == "kernel" and marker in e["name"]]
        assert custom and all(e["args"]["Collective name"] == "allreduce" and e["args"]["Group size"] == 2
                              for e in custom)
        corr = {e["args"]["correlation"] for e in custom}
        launches = [e for e in ev if e.get("cat") == "cuda_runtime" and e["args"].get("correlation") in corr]
        ext = {e["args"]["External id"] for e in launches}
        parents = {e["name"] for e in ev if e.get("cat") == "cpu_op" and e["args"].get("External id") in ext}
        assert parents == {"record_param_comms"}


def test_new_scenarios_are_deterministic(tmp_path: Path) -> None:
    for name, kn in (("moe", {"ranks": 2}), ("3d", {"ranks": 4, "tp": 1, "pp": 2})):
        a = simulate(name, tmp_path / f"{name}a", **kn, **SMALL)
        b = simulate(name, tmp_path / f"{name}b", **kn, **SMALL)
        assert a == b
        for f in ("rank0.pt.trace.json.gz", "truth.json"):
            assert (tmp_path / f"{name}a" / f).read_bytes() == (tmp_path / f"{name}b" / f).read_bytes()
