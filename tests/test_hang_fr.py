"""Flight Recorder reading: real torch 2.13 gloo dumps (tests/data/fr, made by tests/data/hang_job.py)."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest

from traceread.analysis.hang.flight_recorder import (
    pg_descriptions,
    pg_members,
    rank_from_name,
    read_fr_dir,
    read_fr_dump,
    split_profiling_name,
)
from traceread.errors import TraceFileError

RUN = Path(__file__).parent / "data" / "fr" / "gloo_skip"


@pytest.mark.parametrize("ext", ["json", "pkl"])
def test_real_dump_both_formats(ext: str) -> None:
    d = read_fr_dump(RUN / "fr" / f"rank0.{ext}")
    assert d.rank == 0
    assert d.fmt == ("json" if ext == "json" else "pickle")
    assert d.version == "2.10"
    # pg_status is keyed by process-local pg id; resolved to the pg name through the entries
    assert d.pg_status["0"].last_enqueued == 12
    assert d.pg_status["0"].last_completed == 11
    assert d.pg_status["0"].last_started == -1  # gloo never records starts
    last = d.entries[-1]
    assert (last.pg_name, last.pg_desc, last.seq, last.op, last.backend) == ("0", "default_pg", 12, "all_reduce", "gloo")
    assert last.input_sizes == [[16]] and last.input_dtypes == ["Float"]
    ops = [e.op for e in d.entries]
    assert ops.count("all_reduce") == 11 and "broadcast" in ops and "all_gather" in ops


def test_json_and_pickle_agree() -> None:
    j = read_fr_dump(RUN / "fr" / "rank1.json")
    p = read_fr_dump(RUN / "fr" / "rank1.pkl")
    assert [(e.pg_name, e.seq, e.op, e.input_sizes) for e in j.entries] == \
           [(e.pg_name, e.seq, e.op, e.input_sizes) for e in p.entries]
    assert not j.entries[-1].frames
    # pickle keeps the Python frames of each enqueue, innermost first
    names = [f["name"] for f in p.entries[-1].frames]
    assert names[0] == "all_reduce" and "train_step" in names


def test_dir_prefers_pickle_and_falls_back_to_json(tmp_path: Path) -> None:
    dumps, problems = read_fr_dir(RUN / "fr")
    assert sorted(dumps) == [0, 1] and problems == []
    assert all(d.fmt == "pickle" for d in dumps.values())
    fr = tmp_path / "fr"
    shutil.copytree(RUN / "fr", fr)
    (fr / "rank1.pkl").write_bytes(b"\x80\x04garbage")
    dumps, problems = read_fr_dir(fr)
    assert dumps[1].fmt == "json"
    assert len(problems) == 1 and "rank1.pkl" in problems[0]


def test_broken_gloo_pg_config_is_rebuilt() -> None:
    dumps, _ = read_fr_dir(RUN / "fr")
    # the real gloo dump has a single empty pg_config key: useless for membership
    assert list(dumps[0].pg_config) == [""]
    members = pg_members(dumps)
    assert members["0"] == [0, 1]
    assert members["1"] == [0, 1]  # the new_group([0, 1]) subgroup, from the entries
    assert pg_members(dumps, world_size=4)["0"] == [0, 1, 2, 3]
    assert pg_descriptions(dumps)["0"] == "default_pg"


def test_nccl_style_pg_config_is_used(tmp_path: Path) -> None:
    raw = json.loads((RUN / "fr" / "rank0.json").read_text())
    raw["pg_config"] = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"}}
    (tmp_path / "rank0.json").write_text(json.dumps(raw))
    dumps, _ = read_fr_dir(tmp_path)
    assert pg_members(dumps)["0"] == [0, 1, 2]


def test_tolerates_missing_and_extra_fields(tmp_path: Path) -> None:
    raw = json.loads((RUN / "fr" / "rank0.json").read_text())
    raw["version"] = "2.99"
    raw["future_top_level"] = {"x": 1}
    for e in raw["entries"]:
        e.pop("thread_name", None)
        e.pop("output_dtypes", None)
        e.pop("timeout_ms", None)
        e["new_field_from_torch_3"] = [1, 2]
    del raw["pg_status"]
    f = tmp_path / "rank0.json"
    f.write_text(json.dumps(raw))
    d = read_fr_dump(f)
    assert d.version == "2.99" and d.pg_status == {}
    assert d.entries[-1].seq == 12 and d.entries[-1].timeout_ms is None


class _Boom:
    """A pickle payload that would run ``os.system`` when unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        import os

        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    bad = tmp_path / "rank0.pkl"
    bad.write_bytes(pickle.dumps({"version": "2.10", "entries": [_Boom(marker)]}))
    with pytest.raises(TraceFileError) as exc:
        read_fr_dump(bad)
    assert "rank0.pkl" in str(exc.value) and "\n" not in str(exc.value)
    assert "system" in str(exc.value)
    assert not marker.exists()


def test_pickle_needing_any_class_is_refused(tmp_path: Path) -> None:
    import collections

    f = tmp_path / "rank0.pkl"
    f.write_bytes(pickle.dumps({"version": "2.10", "entries": collections.OrderedDict()}))
    with pytest.raises(TraceFileError, match="refusing"):
        read_fr_dump(f)


@pytest.mark.parametrize("payload", [b"", b"{not json", b"\x80\x05\x95", json.dumps([1, 2]).encode()])
def test_garbage_is_one_line_error(tmp_path: Path, payload: bytes) -> None:
    f = tmp_path / "rank3.json"
    f.write_bytes(payload)
    with pytest.raises(TraceFileError) as exc:
        read_fr_dump(f)
    assert str(exc.value).startswith(str(f)) and "\n" not in str(exc.value)


def test_names() -> None:
    assert rank_from_name(Path("rank12.cpu.json")) == 12
    assert rank_from_name(Path("comm_lib_trace_rank_7")) == 7
    assert rank_from_name(Path("notes.txt")) is None
    assert split_profiling_name("nccl:send 0->1") == ("nccl", "send")
    assert split_profiling_name("gloo:all_reduce") == ("gloo", "all_reduce")


def test_two_recorders_of_one_rank_are_merged(tmp_path: Path) -> None:
    raw = json.loads((RUN / "fr" / "rank0.json").read_text())
    nccl = {"version": "2.10", "comm_lib_version": "2.27.5", "pg_config": {}, "pg_status": {"5": {
        "last_enqueued_collective": 3, "last_started_collective": 3, "last_completed_collective": 2}},
        "entries": [{"record_id": 0, "pg_id": 5, "process_group": ["5", "mesh_tp"], "collective_seq_id": 3,
                     "profiling_name": "nccl:all_gather", "state": "started", "is_p2p": False}]}
    (tmp_path / "rank0.json").write_text(json.dumps(nccl))
    (tmp_path / "rank0.cpu.json").write_text(json.dumps(raw))
    dumps, problems = read_fr_dir(tmp_path)
    assert problems == []
    d = dumps[0]
    assert d.comm_lib_version == "2.27.5"
    assert {"0", "5"} <= set(d.pg_status)
    assert {e.pg_name for e in d.entries} >= {"0", "5"}


def _torchfrtrace(folder: Path) -> str:
    """torch's own analyzer (``torchfrtrace``) on pickles named ``rank_<R>``."""
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(folder),
                          "-p", "rank_"], capture_output=True, text=True, timeout=120)
    return res.stdout + res.stderr


def _patched_pickles(out: Path, dumps: dict[int, dict]) -> None:
    """torchfrtrace needs a pg_config; gloo's is broken, so give it the true membership."""
    out.mkdir()
    world = "[" + ", ".join(map(str, sorted(dumps))) + "]"
    for r, d in dumps.items():
        d = dict(d)
        d["pg_config"] = {"0": {"name": "0", "desc": "default_pg", "ranks": world},
                          "1": {"name": "1", "desc": "undefined", "ranks": world}}
        (out / f"rank_{r}").write_bytes(pickle.dumps(d))


@pytest.mark.slow
def test_agrees_with_torchfrtrace_on_missing_rank(tmp_path: Path) -> None:
    from traceread.analysis.hang.diagnose import diagnose_hang

    dumps = {r: pickle.loads((RUN / "fr" / f"rank{r}.pkl").read_bytes()) for r in (0, 1)}  # our own dumps
    _patched_pickles(tmp_path / "frt", dumps)
    out = _torchfrtrace(tmp_path / "frt")
    assert "Not all ranks joining collective, sequence number: 12" in out
    assert "missing ranks: {1}" in out
    ours = diagnose_hang(RUN)
    assert ours["seq"] == 12 and ours["missing_ranks"] == [1]


@pytest.mark.slow
def test_agrees_with_torchfrtrace_on_dtype_mismatch(tmp_path: Path) -> None:
    from traceread.analysis.hang.diagnose import diagnose_hang

    r0 = pickle.loads((RUN / "fr" / "rank0.pkl").read_bytes())
    r1 = pickle.loads((RUN / "fr" / "rank1.pkl").read_bytes())
    extra = dict(r0["entries"][-1])
    extra["input_dtypes"] = extra["output_dtypes"] = ["Double"]
    extra["record_id"] = r1["entries"][-1]["record_id"] + 1
    r1["entries"] = r1["entries"] + [extra]
    r1["pg_status"] = {**r1["pg_status"], "0": {**r1["pg_status"]["0"], "last_enqueued_collective": 12}}
    dumps = {0: r0, 1: r1, 2: r0}
    _patched_pickles(tmp_path / "frt", dumps)
    out = _torchfrtrace(tmp_path / "frt")
    assert "Culprit rank 1" in out and "COLLECTIVE_DTYPE_MISMATCH" in out
    run = tmp_path / "run" / "fr"
    run.mkdir(parents=True)
    for r, d in dumps.items():
        (run / f"rank{r}.pkl").write_bytes(pickle.dumps(d))
    ours = diagnose_hang(tmp_path / "run")
    assert ours["seq"] == 12 and ours["missing_ranks"] == []
    assert "rank 1 has dtypes Double vs Float" in ours["mismatches"][0]
