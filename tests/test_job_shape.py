"""The job's shape beyond the role table: one rank given of a TP group, two jobs in one folder,
the link each transfer used, serving iterations, roles reaching the step ledger, kernels that carry
no comm args, and the layout in the three outputs. Truth comes from the simulator's own schedule
(its process groups, its iterations, its hosts) or from the recorded samples' run.json."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from traceread.analysis.comm.layout import UNNAMED_PG
from traceread.assemble.report import ReportOptions, build_report
from traceread.read.warmup import judge
from traceread.simulate import simulate

SMALL = {"layers": 1, "hidden": 1024, "heads": 8, "seq_len": 512, "steps": 2}


def report(path: Path | list[Path], cache: Path) -> dict[str, Any]:
    paths = path if isinstance(path, list) else [path]
    return build_report(paths, ReportOptions(cache_dir=cache, workers=1))  # type: ignore[return-value]


def test_one_rank_of_a_tp_group(samples_dir: Path, tmp_path: Path) -> None:
    """Rank 0 alone of tp_dp_h100 (TP 4 x DP 2): its pg_config and its own collectives give the
    degrees; the peers' missing halves are named as not given, never as a desync or hang."""
    (tmp_path / "one").mkdir()
    shutil.copy(samples_dir / "tp_dp_h100" / "rank0.pt.trace.json.gz", tmp_path / "one")
    truth = json.loads((samples_dir / "tp_dp_h100" / "truth.json").read_text())["layout"]
    doc = report(tmp_path / "one", tmp_path / "cache")
    lay = doc["layout"]
    assert lay["degrees"] == truth["degrees"]
    roles = {g["pg"]: g["role"] for g in lay["groups"]}
    want = {str(g["pg"]): g["role"] for g in truth["groups"] if 0 in g["ranks"]}
    assert {pg: roles[pg] for pg in want} == want  # the groups rank 0 belongs to
    assert any("traces were not given" in w for w in doc["warnings"])
    assert not any("desync" in w for w in doc["warnings"])


def test_two_jobs_in_one_folder_are_refused(tmp_path: Path) -> None:
    """A 2-rank DDP job and a 4-rank MoE job written into one folder: two jobs, one line, exit 2."""
    simulate("ddp", tmp_path / "runs" / "a", ranks=2, **SMALL)
    simulate("moe", tmp_path / "runs" / "b", ranks=4, **SMALL)
    for sub in ("a", "b"):
        (tmp_path / "runs" / sub / "truth.json").unlink()
    res = subprocess.run([sys.executable, "-m", "traceread", "report", str(tmp_path / "runs"), "--format", "json",
                          "-o", str(tmp_path / "r.json"), "--no-cache"], capture_output=True, text=True, timeout=600)
    assert res.returncode == 2, res.stderr
    assert "2 different jobs" in res.stderr and res.stderr.count("\n") <= 1
    # one of them picked explicitly is reported
    res = subprocess.run([sys.executable, "-m", "traceread", "report", str(tmp_path / "runs"), "--cycle", "2:1",
                          "--format", "json", "-o", str(tmp_path / "r.json"), "--no-cache"],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    assert json.loads((tmp_path / "r.json").read_text())["source"]["ranks_read"] in (2, 4)


def _links(doc: dict[str, Any]) -> set[tuple[str | None, float | None]]:
    return {(c["link"], c["link_peak_gbps"]) for c in doc["collectives"]}


def test_link_each_transfer_used(samples_dir: Path, tmp_path: Path) -> None:
    """Inter-node all-reduce on the NIC, intra-node on NVLink, gloo on the host: each busbw against
    the peak of the link it crossed (the simulator's hosts; the recorded gloo job's backend)."""
    two = report(samples_dir / "skewed_2host_h100", tmp_path / "a")  # 8 ranks on 2 hosts: NIC
    assert _links(two) == {("network", 50.0)}
    assert all("usual NIC of NVIDIA H100" in c["link_source"] for c in two["collectives"])
    assert _links(report(samples_dir / "tp_dp_h100", tmp_path / "b")) == {("nvlink", 450.0)}
    gloo = report(samples_dir / "cpu_ddp_gloo", tmp_path / "c")
    assert _links(gloo) == {("host", None)} and "gloo" in gloo["collectives"][0]["link_name"]


@pytest.mark.slow
def test_link_of_every_cross_node_group(samples_dir: Path, tmp_path: Path) -> None:
    """3D job: the TP group over nodes 0 and 1 and every cross-node pipeline hop use the NIC."""
    three = report(samples_dir / "3d_tp_crossnode_h100", tmp_path / "d")
    by_pg = {c["pg"].split(" ")[0]: c["link"] for c in three["collectives"]}
    truth = json.loads((samples_dir / "3d_tp_crossnode_h100" / "truth.json").read_text())["layout"]
    for g in truth["groups"]:
        if str(g["pg"]) in by_pg:
            assert by_pg[str(g["pg"])] == ("network" if len(g["nodes"]) > 1 else "nvlink"), g


def test_nccl_log_names_the_nic(samples_dir: Path, tmp_path: Path) -> None:
    """With an NCCL log saying sockets, the inter-node peak is unknown (no meaningful line rate)."""
    folder = tmp_path / "run"
    shutil.copytree(samples_dir / "skewed_2host_h100", folder)
    (folder / "truth.json").unlink()
    (folder / "nccl.log").write_text(
        "host-a:100:100 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n"
        "host-a:100:100 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>\n"
        "host-a:100:100 [0] NCCL INFO Using network Socket\n")
    doc = report(folder, tmp_path / "cache")
    assert _links(doc) == {("network", None)}
    assert "Socket" in doc["collectives"][0]["link_name"]


def test_serving_iterations_are_steps(tmp_path: Path) -> None:
    """The vLLM-style serving scenario: iterations (not ProfilerStep) are the steps, prefill and decode
    apart; the engine's custom all-reduce, which names no group, is tensor parallel of the engine's
    TP size; no warm-up warning for a prefill longer than decodes; no training advice."""
    truth = simulate("serving", tmp_path / "sim", steps=5)
    doc = report(tmp_path / "sim", tmp_path / "cache")
    w = doc["workload"]
    assert (w["kind"], w["engine"], w["iterations"]) == ("serving", "vllm", {"prefill": 1, "decode": 4})
    steps = doc["ranks"][0]["steps"]
    assert [s["step"] for s in steps] == truth["steps"]
    assert [s["iteration"] for s in steps] == ["prefill"] + ["decode"] * 4
    for s, t in zip(steps, truth["ranks"]["0"]["steps"]):  # each iteration's own numbers, exactly
        for key in ("duration_us", "compute_us", "exposed_comm_us"):
            assert s[key] == pytest.approx(t[key], abs=2e-3), (s["step"], key)
    lay = doc["layout"]
    assert lay["degrees"]["tp"] == 2 and {g["pg"]: g["role"] for g in lay["groups"]}[UNNAMED_PG] == "tp"
    assert not any("warm-up" in x for x in doc["warnings"])
    text = " ".join(f["explanation"] + " ".join(f["suggestions"]) for f in doc["findings"])
    for word in ("data loader", "data-loader", "optimizer", "foreach", "DDP", "gradient"):
        assert word not in text
    assert not any(f["id"] == "slow_steps" for f in doc["findings"])  # the prefill is not a slow decode


def _comm_roles(led: dict[str, Any]) -> set[str | None]:
    return {p["role"] for p in led["parts"] if p["category"] in ("comm_wait", "comm_transfer") and p["us"] > 0}


@pytest.mark.parametrize("scenario", ["ep_renamed", "serving"])
def test_roles_reach_the_ledger(scenario: str, tmp_path: Path) -> None:
    """Traffic that names no group (an EP library's kernels, an engine's all-reduce) still carries its
    role into the step ledger: the same roles the simulator's ledger truth gives it."""
    truth = simulate(scenario, tmp_path / "sim", steps=2 if scenario == "ep_renamed" else 4)
    doc = report(tmp_path / "sim", tmp_path / "cache")
    assert None not in _comm_roles(doc["ledger"])
    assert _comm_roles(doc["ledger"]) == _comm_roles(truth["ledger"])


def _strip_kernel_comm_args(src: Path, dst: Path) -> None:
    """A copy of a simulated job as older torch writes it: comm args only on record_param_comms."""
    dst.mkdir(parents=True)
    for f in src.glob("rank*.pt.trace.json.gz"):
        doc = json.loads(gzip.decompress(f.read_bytes()))
        for e in doc["traceEvents"]:
            if e.get("cat") == "kernel":
                for k in ("Collective name", "Process Group Name", "Process Group Description", "Process Group Ranks",
                          "Group size", "Seq", "Comms Id", "In msg nelems", "Out msg nelems", "dtype"):
                    e.get("args", {}).pop(k, None)
        (dst / f.name).write_bytes(gzip.compress(json.dumps(doc).encode()))


def test_kernels_without_comm_args_take_them_from_the_launching_op(samples_dir: Path, tmp_path: Path) -> None:
    """Megatron-style traces whose kernels carry no process group: the layout finds tp from the
    descriptions, and the ledger's communication now has the tp and dp roles, not null."""
    _strip_kernel_comm_args(samples_dir / "tp_dp_h100", tmp_path / "old")
    truth = json.loads((samples_dir / "tp_dp_h100" / "truth.json").read_text())
    doc = report(tmp_path / "old", tmp_path / "cache")
    assert doc["layout"]["degrees"] == truth["layout"]["degrees"]
    assert _comm_roles(doc["ledger"]) == _comm_roles(truth["ledger"]) == {"tp", "dp"}


def test_layout_in_all_three_outputs(samples_dir: Path, tmp_path: Path) -> None:
    from traceread.render.html import render_html
    from traceread.render.terminal import render_text

    doc = report(samples_dir / "3d_tp_crossnode_h100", tmp_path)
    assert doc["layout"]["node_source"] == "device index"
    text = render_text(doc, width=160)
    assert "Parallel layout: dp 2 × tp 4 × pp 2 (nodes from device index)" in text
    assert "Workload: training" in text and "spans 2 nodes" in text
    page = render_html(doc)
    assert '<section id="layout">' in page and "per-layer activation all-reduces" in page
    assert json.loads(json.dumps(doc))["layout"]["groups"]


def test_layout_html_escapes_trace_strings() -> None:
    from traceread.render.layout_view import html_section

    doc = {"layout": {"degrees": {"tp": 2}, "node_source": None,
                      "groups": [{"pg": "<b>1</b>", "desc": "<script>x</script>", "role": "tp", "size": 2,
                                  "ranks": [0, 1], "nodes": [0], "evidence": "<img src=x onerror=1>"}]},
           "workload": {"kind": "training", "engine": None, "evidence": "<i>", "iterations": {}}}
    page = str(html_section(doc))
    assert "<script>" not in page and "<img" not in page and "<b>1" not in page
    assert "&lt;script&gt;" in page


def test_zero_length_startup_event_is_not_warmup() -> None:
    """A 0.0 ms ``_lazy_init`` (the check every CUDA call makes) is not evidence of warm-up."""
    assert not judge([10_000.0], {"torch/cuda/__init__.py(396): _lazy_init": 0.0}).is_warmup
    assert judge([10_000.0], {"torch/cuda/__init__.py(396): _lazy_init": 5_000.0}).is_warmup


def test_a_one_rank_pg_config_does_not_hide_the_traffic(samples_dir: Path, tmp_path: Path) -> None:
    """The A100 case: a rank whose pg_config lists its group with one member beside send/recv of the
    whole pipeline. The collectives' own Group size and members win: 4 pipeline stages."""
    dst = tmp_path / "pp"
    dst.mkdir()
    for f in sorted((samples_dir / "pp_1f1b_h100").glob("rank*.pt.trace.json.gz")):
        doc = json.loads(gzip.decompress(f.read_bytes()))
        r = doc["distributedInfo"]["rank"]
        doc["distributedInfo"]["pg_config"] = [dict(g, pg_size=1, ranks=[r]) for g in doc["distributedInfo"]["pg_config"]]
        (dst / f.name).write_bytes(gzip.compress(json.dumps(doc).encode()))
    truth = json.loads((samples_dir / "pp_1f1b_h100" / "truth.json").read_text())
    lay = report(dst, tmp_path / "cache")["layout"]
    assert lay["degrees"]["pp"] == truth["world_size"]
    g0 = {g["pg"]: g for g in lay["groups"]}["0"]
    assert g0["role"] == "pp" and g0["size"] == truth["world_size"] and "pg_config says 1" in g0["evidence"]


def test_symmetric_memory_all_reduce_without_a_group_is_tp() -> None:
    """B200 inference with torch symmetric-memory all-reduce (``symm_mem::one_shot_all_reduce``, no
    record_param_comms): the traffic names no group, runs per layer with no backward: tensor parallel
    over the world size the kernel is compiled for."""
    import polars as pl

    from traceread.analysis.comm.collectives import EXTRACT_SCHEMA
    from traceread.analysis.comm.layout import infer_layout

    kernel = "void c10d::symmetric_memory::one_shot_all_reduce_kernel<c10::BFloat16, 16, 4>(...)"
    rows = [{"rank": 0, "backend": "nccl", "stream": 20, "kernel": kernel, "op": "allreduce", "p2p": False,
             "ts": 10.0 * i + 100 * s, "end": 10.0 * i + 100 * s + 3, "step": s, "phase": "nobwd",
             "launcher": None} for s in range(3) for i in range(8)]
    ev = pl.DataFrame(rows, schema=EXTRACT_SCHEMA)
    groups = [{"pg_name": "0", "pg_desc": "default_pg", "pg_size": 4, "ranks": [0, 1, 2, 3]}]
    lay = infer_layout(ev, groups, world_size=4)
    assert lay.degrees["tp"] == 4
    assert lay.role_of(None) == "tp" and lay.group(None).size == 4  # type: ignore[union-attr]
    assert "compiled for (4)" in lay.group(None).evidence  # type: ignore[union-attr]
    assert "(unnamed) row" in lay.group("0").evidence  # type: ignore[union-attr]
