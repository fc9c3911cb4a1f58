"""Every real trace in ../shared/traces with its job shape written down from its own evidence
(MANIFEST.md says what each is): the parallel layout, the workload (training, serving, inference)
and, for folders that hold several jobs, the one-line refusal naming them.

The expectations come from each file's own metadata and events, read by hand: ``distributedInfo``
(rank / world size / process groups), the collectives its kernels or gloo spans carry, the engine
annotations. They are not produced by traceread.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from traceread.assemble.report import ReportOptions, build_report

pytestmark = pytest.mark.shared

NO_GROUPS: dict[str, Any] = {"degrees": {}, "roles": {}}

#: folder -> (nontrivial degrees, pg -> role (only the groups listed are checked), workload kind,
#: engine, iteration counts). Evidence for each, from the trace itself, in the comment.
EXPECTED: dict[str, tuple[dict[str, int], dict[str, str], str, str | None, dict[str, int]]] = {
    # 8 ranks of DLRM, no pg names: embeddings all-to-all in forward, gradients all-reduced in backward (DDP)
    "param_dlrm_8rank": ({"dp": 8}, {"0": "dp"}, "training", None, {}),
    # ranks 0 and 1 of 128, no pg names: the world group (torch's "0") runs DDP's backward all-reduce
    "hta_trace_filter": ({"dp": 128}, {"0": "dp"}, "training", None, {}),
    # rank 0 of 2, pg_config lists one group of 2 (default_pg): gradient all-reduces in backward
    "hta_nccl_parser_config": ({"dp": 2}, {"0": "dp"}, "training", None, {}),
    # rank 1 of 2, no pg names: 404 all-reduces per step, all launched in backward
    "hta_df_index_resolver": ({"dp": 2}, {"0": "dp"}, "training", None, {}),
    # rank 1 of 2, no pg names: DLRM-like (all-to-all in forward, all-reduce in backward)
    "hta_trace_diff_test": ({"dp": 2}, {"0": "dp"}, "training", None, {}),
    # rank 34 of 300 on gloo: 10 groups of 300 in pg_config, all-reduce spans that name none of them
    "hta_cpu_only": ({"dp": 300}, {"0": "other", "(unnamed)": "dp"}, "unknown", None, {}),
    # vLLM / SGLang on one MI300X (world size 1): every group of one rank; one engine iteration each
    "tracelens_inference_vllm_decode_full": ({}, {"0": "other", "1": "other"}, "serving", "vllm", {"decode": 1}),
    "tracelens_inference_vllm_prefilldecode_piecewise": ({}, {"0": "other"}, "serving", "vllm", {"mixed": 1}),
    "tracelens_inference_sglang_decode": ({}, {"0": "other"}, "serving", "sglang", {"decode": 1}),
    "tracelens_inference_sglang_prefilldecode": ({}, {"0": "other"}, "serving", "sglang", {"prefill": 1}),
    # CUDA-graph capture runs of the same engines: engine operators, no iteration annotation
    "tracelens_inference_sglang_decode_capture_traces": ({}, {"0": "other"}, "serving", "sglang", {}),
    "tracelens_inference_vllm_decode_full_capture_traces": ({}, {"0": "other"}, "serving", "vllm", {}),
    # one process without torch.distributed (no distributedInfo, no collective): no group at all
    "tracelens_mi300_ddp_resnet18_no_pool": ({}, {}, "training", None, {}),
    "kineto_tb_resnet50_num_workers_0": ({}, {}, "training", None, {}),
    "hta_critical_path_alexnet": ({}, {}, "inference", None, {}),
    "tracelens_torch_compile_triton": ({}, {}, "inference", None, {}),
}
#: Folders that hold several jobs: refused in one line naming each (exit 2).
SEVERAL_JOBS = {"tracelens_mi300": 5, "param_et_replay": 2}
#: The fast subset run without -m slow (one per kind of evidence).
FAST = ("hta_nccl_parser_config", "hta_trace_filter", "tracelens_inference_vllm_decode_full",
        "tracelens_inference_sglang_decode")


def _report(folder: Path, cache: Path) -> dict[str, Any]:
    return build_report([folder], ReportOptions(cache_dir=cache, workers=1))  # type: ignore[return-value]


def _check(name: str, doc: dict[str, Any]) -> None:
    degrees, roles, kind, engine, iterations = EXPECTED[name]
    lay = doc["layout"] or {"degrees": {}, "groups": []}
    assert {r: n for r, n in lay["degrees"].items() if n > 1} == degrees
    got = {g["pg"]: g["role"] for g in lay["groups"]}
    assert {pg: got.get(pg) for pg in roles} == roles
    if not roles:
        assert lay["groups"] == []
    for g in lay["groups"]:
        assert g["evidence"] and g["size"] == len(g["ranks"])
    w = doc["workload"]
    assert (w["kind"], w["engine"], w["iterations"]) == (kind, engine, iterations), w
    assert not any("desync" in x for x in doc["warnings"])  # a rank not given is not a hang


@pytest.mark.parametrize("name", FAST)
def test_real_trace_shapes(name: str, shared_traces: Path, tmp_path: Path) -> None:
    _check(name, _report(shared_traces / name, tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(EXPECTED) - set(FAST)))
def test_real_trace_shapes_all(name: str, shared_traces: Path, tmp_path: Path) -> None:
    _check(name, _report(shared_traces / name, tmp_path))


def test_ranks_not_given_are_named_not_a_desync(shared_traces: Path, tmp_path: Path) -> None:
    """Rank 0 of a 2-rank job: its collectives lack rank 1 because rank 1's file was not given."""
    doc = _report(shared_traces / "hta_nccl_parser_config", tmp_path)
    assert any("ranks whose traces were not given (1)" in w for w in doc["warnings"])


@pytest.mark.parametrize("name", sorted(SEVERAL_JOBS))
def test_folders_of_several_jobs_are_refused_in_one_line(name: str, shared_traces: Path, tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "traceread", "report", str(shared_traces / name), "--format", "json",
                          "-o", str(tmp_path / "r.json"), "--no-cache"], capture_output=True, text=True, timeout=600)
    assert res.returncode == 2
    line = res.stderr.strip()
    assert "\n" not in line and f"{SEVERAL_JOBS[name]} different jobs" in line
    for f in (shared_traces / name).iterdir():
        if f.name.endswith(".json.gz"):
            assert f.name in line
    assert not (tmp_path / "r.json").exists()


def test_two_folders_of_different_jobs(shared_traces: Path, tmp_path: Path) -> None:
    """A V100 rank of a 2-rank job beside five single-GPU MI300X traces: six jobs, not "6 rank(s) of 2"."""
    res = subprocess.run([sys.executable, "-m", "traceread", "report", str(shared_traces / "hta_trace_diff_test"),
                          str(shared_traces / "tracelens_mi300"), "--format", "json", "-o", str(tmp_path / "r.json"),
                          "--no-cache"], capture_output=True, text=True, timeout=600)
    assert res.returncode == 2 and "6 different jobs" in res.stderr and "V100" in res.stderr


def test_manifest_names_every_folder_checked(shared_traces: Path) -> None:
    """The expectations above cover the manifest's multi-rank and serving material."""
    manifest = (shared_traces / "MANIFEST.md").read_text()
    for name in list(EXPECTED) + list(SEVERAL_JOBS):
        assert f"`{name}/`" in manifest, name
