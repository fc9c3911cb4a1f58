"""Hang diagnosis from each source alone and all together (real dumps from tests/data/hang_job.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from traceread.analysis.hang.diagnose import diagnose, diagnose_hang, normalize_op
from traceread.cli import cli
from traceread.errors import TraceReadError

DATA = Path(__file__).parent / "data"
RUN = DATA / "fr" / "gloo_skip"
JOB = DATA / "hang_job.py"


def _line_of(needle: str) -> int:
    return next(i for i, text in enumerate(JOB.read_text().splitlines(), 1) if needle in text)


def _copy(tmp_path: Path, *parts: str) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    for p in parts:
        src = RUN / p
        if src.is_dir():
            shutil.copytree(src, run / p)
        else:
            shutil.copy(src, run / p)
    return run


def test_all_sources_name_the_culprit() -> None:
    d = diagnose(RUN)
    e = d.entry
    assert e["missing_ranks"] == [1] and e["waiting_ranks"] == [0]
    assert (e["pg"], e["seq"], e["op"]) == ("0 (world, default_pg)", 12, "all_reduce")
    assert e["stacks"]["1"] == f"hang_job.py:{_line_of('time.sleep(')} in train_step"
    assert e["stacks"]["0"] == f"hang_job.py:{_line_of('dist.all_reduce(x)')} in train_step"
    assert e["mismatches"] == []
    assert d.headline.startswith("Rank 1 never joined all_reduce #12 on pg 0 (world, default_pg); rank 0 waits in it; "
                                 f"it is at hang_job.py:{_line_of('time.sleep(')} in train_step")
    [c] = e["culprits"]
    assert (c["rank"], c["why"], c["pg"], c["seq"], c["waiting"], c["victims"]) == (1, "host_elsewhere", "0", 12, [0], 1)
    assert c["stack"].startswith(f"hang_job.py:{_line_of('time.sleep(')} in train_step")
    assert c["positions"] == {"0": [11, 11], "1": [1, 1]}
    ev = "\n".join(e["evidence"])
    assert "Root Cause" in ev and "rank 0" in ev and "victim" in ev  # torchrun would blame the victim
    assert "Timed out waiting" in ev


def test_only_flight_recorder(tmp_path: Path) -> None:
    e = diagnose_hang(_copy(tmp_path, "fr"))
    assert e is not None
    assert (e["missing_ranks"], e["waiting_ranks"], e["seq"], e["op"]) == ([1], [0], 12, "all_reduce")
    assert e["stacks"] == {}
    # the pickle's frames still say where the waiting rank enqueued the collective
    [g] = e["groups"]
    assert g["enqueued_at"] == f"hang_job.py:{_line_of('dist.all_reduce(x)')} in train_step"
    assert (g["pg"], g["role"], g["op"], g["seq"], g["sizes"], g["dtype"], g["waiting"], g["culprits"]) == \
        ("0", "world", "all_reduce", 12, "[[16]]", "Float", [0], [1])
    assert g["behind"] == [{"rank": 1, "why": "never_enqueued", "enqueued": 11, "completed": 11}]


def test_only_json_flight_recorder(tmp_path: Path) -> None:
    run = _copy(tmp_path, "fr")
    for f in (run / "fr").glob("*.pkl"):
        f.unlink()
    e = diagnose_hang(run)
    assert (e["missing_ranks"], e["waiting_ranks"], e["seq"]) == ([1], [0], 12)


def test_only_stacks(tmp_path: Path) -> None:
    e = diagnose_hang(_copy(tmp_path, "stacks"))
    assert e is not None
    assert (e["missing_ranks"], e["waiting_ranks"], e["op"], e["seq"]) == ([1], [0], "all_reduce", None)
    assert e["stacks"]["1"].endswith("in train_step")


def test_only_pyspy_stacks() -> None:
    d = diagnose(DATA / "stacks" / "pyspy_gloo")
    assert d.entry["missing_ranks"] == [1] and d.entry["waiting_ranks"] == [0]
    assert "Rank 1 is at train_gloo.py:8 in train_step" in d.headline


def _watchdog_run(tmp_path: Path, shared_dir: Path, world: int) -> Path:
    run = tmp_path / "run"
    (run / "nccl").mkdir(parents=True)
    # source B of the shared log: a 2.6-era DDP job whose ranks 0 and 1 timed out in ALLREDUCE #808
    lines = [ln for ln in (shared_dir / "nccl_logs" / "torch_c10d_watchdog.log").read_text().splitlines()
             if "E626 06:24" in ln]
    assert len(lines) == 4
    (run / "launcher.log").write_text("\n".join(lines) + "\n")
    (run / "run.json").write_text(json.dumps({"world": {"world_size": world}}))
    return run


def test_only_watchdog_log(tmp_path: Path, shared_dir: Path) -> None:
    e = diagnose_hang(_watchdog_run(tmp_path, shared_dir, world=3))
    assert (e["pg"], e["seq"], e["op"]) == ("0 (default_pg)", 808, "all_reduce")
    assert e["waiting_ranks"] == [0, 1]
    assert e["missing_ranks"] == [2]  # the member that reported no timeout
    assert any("last enqueued #811" in x for x in e["evidence"])


def test_torchrun_root_cause_is_called_a_victim(tmp_path: Path) -> None:
    run = _copy(tmp_path, "fr", "stacks")
    (run / "launcher.log").write_text(
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
        "============================================================\n"
        "train.py FAILED\n------------------------------------------------------------\n"
        "Root Cause (first observed failure):\n[0]:\n  time      : 2026-11-21_11:06:37\n"
        "  host      : node0\n  rank      : 0 (local_rank: 0)\n  exitcode  : 1 (pid: 123)\n")
    e = diagnose_hang(run)
    assert any("'Root Cause (first observed failure)' names rank 0" in x and "victim" in x for x in e["evidence"])


def _mismatch_run(tmp_path: Path) -> Path:
    """Rank 1 did join #12, but with float64 where rank 0 used float32 (derived from the real dumps)."""
    run = _copy(tmp_path, "fr")
    for f in (run / "fr").glob("*.pkl"):
        f.unlink()
    r0 = json.loads((run / "fr" / "rank0.json").read_text())
    r1 = json.loads((run / "fr" / "rank1.json").read_text())
    extra = dict(r0["entries"][-1])
    extra["input_dtypes"] = extra["output_dtypes"] = ["Double"]
    extra["record_id"] = r1["entries"][-1]["record_id"] + 1
    r1["entries"].append(extra)
    r1["pg_status"]["0"]["last_enqueued_collective"] = "12"
    (run / "fr" / "rank1.json").write_text(json.dumps(r1))
    return run


def test_dtype_mismatch_names_the_odd_rank(tmp_path: Path) -> None:
    # add a third rank so there is a majority: rank 2 is a copy of rank 0
    run = _mismatch_run(tmp_path)
    shutil.copy(run / "fr" / "rank0.json", run / "fr" / "rank2.json")
    d = diagnose(run)
    e = d.entry
    assert e["missing_ranks"] == []  # rank 1 joined, with the wrong dtype
    assert e["waiting_ranks"] == [0, 2]
    assert [(c["rank"], c["why"]) for c in e["culprits"]] == [(1, "mismatch")]
    assert len(e["mismatches"]) == 1
    assert "rank 1 has dtypes Double vs Float (ranks 0, 2)" in e["mismatches"][0]
    assert d.headline.startswith("Rank 1: collective mismatch: collective #12 on pg 0 (world, default_pg): rank 1")


def test_no_evidence_is_none(tmp_path: Path) -> None:
    (tmp_path / "traces").mkdir()
    (tmp_path / "run.json").write_text("{}")
    assert diagnose_hang(tmp_path) is None


def test_unreadable_evidence_is_bad_input(tmp_path: Path) -> None:
    (tmp_path / "fr").mkdir()
    (tmp_path / "fr" / "rank0.pkl").write_bytes(b"garbage")
    with pytest.raises(TraceReadError, match="rank0.pkl"):
        diagnose_hang(tmp_path)


def test_per_host_layout(tmp_path: Path) -> None:
    shutil.copytree(RUN, tmp_path / "node0")
    e = diagnose_hang(tmp_path)
    assert e["missing_ranks"] == [1] and e["seq"] == 12


def test_normalize_op() -> None:
    assert normalize_op("ALLREDUCE") == "all_reduce"
    assert normalize_op("_REDUCE_SCATTER_BASE") == "reduce_scatter"
    assert normalize_op("all_gather") == "all_gather"
    assert normalize_op(None) == "unknown"


# ----------------------------------------------------------------------------- CLI


def test_cli_text_json_and_exit_codes(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(cli, ["hang", str(RUN)])
    assert res.exit_code == 0, res.output
    first = res.output.splitlines()[0]
    assert first.startswith("Rank 1 never joined all_reduce #12")
    res = runner.invoke(cli, ["hang", str(RUN), "--format", "json"])
    assert res.exit_code == 0
    doc = json.loads(res.output)
    assert doc["missing_ranks"] == [1] and doc["seq"] == 12
    (tmp_path / "empty").mkdir()
    assert runner.invoke(cli, ["hang", str(tmp_path / "empty")]).exit_code == 3
    assert runner.invoke(cli, ["hang", str(tmp_path / "missing")]).exit_code == 2
    res = runner.invoke(cli, ["hang", "--help"])
    assert res.exit_code == 0 and "traceread hang runs/exp1" in res.output


def test_healthy_flight_recorder_is_no_hang(tmp_path: Path) -> None:
    """Dumps in which every enqueued collective completed on every rank are not hang evidence."""
    run = _copy(tmp_path, "fr")
    for f in (run / "fr").glob("*.pkl"):
        f.unlink()
    r0 = json.loads((run / "fr" / "rank0.json").read_text())
    r0["entries"] = [e for e in r0["entries"] if not (e["process_group"][0] == "0" and e["collective_seq_id"] == 12)]
    r0["pg_status"]["0"]["last_enqueued_collective"] = "11"
    (run / "fr" / "rank0.json").write_text(json.dumps(r0))
    assert diagnose_hang(run) is None
    # ... but with the collector's hang record it is a hang outside collectives
    shutil.copy(RUN / "hang.json", run / "hang.json")
    e = diagnose_hang(run)
    assert e is not None and e["op"] == "unknown" and e["missing_ranks"] == []
    assert any("outside collectives" in x for x in e["evidence"])


def test_debug_mode_messages(tmp_path: Path) -> None:
    """Messages measured with TORCH_DISTRIBUTED_DEBUG=DETAIL / monitored_barrier on torch 2.13 gloo."""
    (tmp_path / "launcher.log").write_text(
        "[rank0]: RuntimeError: [Rank 0]: Ranks 1 failed to pass monitoredBarrier in 5000 ms\n"
        "[rank0]: RuntimeError: Detected mismatch between collectives on ranks. Rank 0 is running collective: "
        "CollectiveFingerPrint(SequenceNumber=1, OpType=ALLREDUCE, TensorShape=[16], TensorDtypes=Float), but Rank 1 "
        "is running collective: CollectiveFingerPrint(SequenceNumber=1, OpType=ALLREDUCE, TensorShape=[32], "
        "TensorDtypes=Float).Collectives differ in the following aspects: \tTensor Tensor shapes: 16vs 32\n")
    e = diagnose_hang(tmp_path)
    assert e is not None
    assert e["missing_ranks"] == [1] and e["waiting_ranks"] == [0]
    assert len(e["mismatches"]) == 1 and "TensorShape=[32]" in e["mismatches"][0]


def test_uneven_all_to_all_is_not_a_mismatch(tmp_path: Path) -> None:
    """all_to_all with uneven splits has different input sizes per rank by design."""
    run = _mismatch_run(tmp_path)
    for r in (0, 1):
        f = run / "fr" / f"rank{r}.json"
        doc = json.loads(f.read_text())
        last = doc["entries"][-1]
        last["profiling_name"] = "gloo:all_to_all"
        last["input_dtypes"] = last["output_dtypes"] = ["Float"]
        last["input_sizes"] = [[16 + 8 * r]]
        f.write_text(json.dumps(doc))
    e = diagnose_hang(run)
    assert e["mismatches"] == [] and e["op"] == "all_to_all" and e["waiting_ranks"] == [0, 1]
    assert e["culprits"] == [] and e["groups"][0]["note"] == "every member is in it and none completes"


def test_nccl_style_dump_all_joined_not_completed(tmp_path: Path) -> None:
    """NCCL dumps carry real pg_config and states: all ranks joined #12, one never started it."""
    run = _mismatch_run(tmp_path)
    for r in (0, 1):
        f = run / "fr" / f"rank{r}.json"
        doc = json.loads(f.read_text())
        doc["pg_config"] = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}}
        doc["comm_lib_version"] = "2.27.5"
        for e in doc["entries"]:
            e["profiling_name"] = e["profiling_name"].replace("gloo:", "nccl:")
            e["input_dtypes"] = e["output_dtypes"] = ["Float"]
            e["state"] = "completed" if e["collective_seq_id"] < 12 else ("started" if r == 0 else "scheduled")
        f.write_text(json.dumps(doc))
    e = diagnose_hang(run)
    # start events say rank 0's GPU is in #12 and rank 1's never started it: rank 1's GPU stopped
    assert e["missing_ranks"] == [1] and e["waiting_ranks"] == [0] and e["mismatches"] == []
    [c] = e["culprits"]
    assert (c["rank"], c["why"], c["seq"]) == (1, "gpu_stopped", 12)
    assert c["summary"].startswith("Rank 1's GPU stopped: its host enqueued all_reduce #12 on pg 0 (world, default_pg) "
                                   "but its GPU never started it; rank 0 waits in it")
    assert e["groups"][0]["behind"][0]["why"] == "not_started"
