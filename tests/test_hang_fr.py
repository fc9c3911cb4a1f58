"""Flight Recorder reading: real torch 2.13 gloo dumps (tests/data/fr, made by tests/data/hang_job.py and
tests/jobs/make_fr_fixtures.py), discovery by content, two recorders, torchfrtrace agreement."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import pytest

from traceread.analysis.hang.dumps import collect, find_dumps
from traceread.analysis.hang.flight_recorder import (
    normalize_op,
    rank_from_name,
    read_dump,
    sniff,
    split_profiling_name,
)
from traceread.analysis.hang.groups import build_groups
from traceread.errors import TraceFileError

DATA = Path(__file__).parent / "data" / "fr"
RUN = DATA / "gloo_skip"


@pytest.mark.parametrize("ext", ["json", "pkl"])
def test_real_dump_both_formats(ext: str) -> None:
    d = read_dump(RUN / "fr" / f"rank0.{ext}")
    assert d.rank == 0 and d.recorder == "cpu" and not d.timing
    assert d.fmt == ("json" if ext == "json" else "pickle")
    assert d.version == "2.10"
    g = d.groups["0"]  # pg_status is keyed by process-local pg id; resolved to the pg name through the entries
    assert (g.pg, g.desc, g.backend) == ("0", "default_pg", "gloo")
    assert (g.enqueued, g.completed) == (12, 11)
    assert [o.seq for o in g.pending] == [12]
    last = g.pending[0]
    assert (last.op, last.sizes, last.dtypes, last.is_p2p) == ("all_reduce", "[[16]]", "Float", False)
    assert g.ops == {"all_gather": 1, "all_reduce": 11}
    assert d.groups["1"].desc == "undefined" and d.groups["1"].pending == []


def test_gloo_pg_status_lag_is_corrected_by_retired_entries() -> None:
    """Measured on torch 2.13: rank 1's pg_status says completed #8 while entries 9-11 are retired."""
    raw = pickle.loads((RUN / "fr" / "rank1.pkl").read_bytes())  # our own fixture
    assert raw["pg_status"]["0"]["last_completed_collective"] == 8
    d = read_dump(RUN / "fr" / "rank1.pkl")
    assert (d.groups["0"].enqueued, d.groups["0"].completed, d.groups["0"].pending) == (11, 11, [])


def test_json_and_pickle_agree() -> None:
    j = read_dump(RUN / "fr" / "rank0.json")
    p = read_dump(RUN / "fr" / "rank0.pkl")
    assert {k: (v.enqueued, v.completed) for k, v in j.groups.items()} == \
           {k: (v.enqueued, v.completed) for k, v in p.groups.items()}
    assert j.groups["0"].pending[0].where is None  # JSON dumps carry no Python frames
    assert p.groups["0"].pending[0].where.startswith("hang_job.py:")  # the pickle says where it was enqueued


def test_pickle_preferred_and_json_fallback(tmp_path: Path) -> None:
    ds = collect([RUN / "fr"], workers=1)
    assert sorted(ds.dumps) == [0, 1] and ds.problems == []
    assert all(d.fmt == "pickle" for d in ds.dumps.values())
    fr = tmp_path / "fr"
    shutil.copytree(RUN / "fr", fr)
    (fr / "rank1.pkl").write_bytes(b"\x80\x02}q\x00(X\x07\x00\x00\x00versionq\x01garbage")
    ds = collect([fr], workers=1)
    assert ds.dumps[1].fmt == "json"
    assert len(ds.problems) == 1 and "rank1.pkl" in ds.problems[0] and "\n" not in ds.problems[0]


def test_broken_gloo_pg_config_is_rebuilt() -> None:
    ds = collect([RUN / "fr"], workers=1)
    assert ds.dumps[0].pg_config == {}  # the real gloo dump's single empty key is useless
    groups, _ = build_groups(ds.dumps, None)
    assert groups["0"].members == [0, 1] and groups["0"].role == "world"
    assert groups["1"].members == [0, 1] and groups["1"].rebuilt  # the new_group([0, 1]) subgroup, from the entries
    assert build_groups(ds.dumps, 4)[0]["0"].members == [0, 1, 2, 3]


def test_nccl_style_pg_config_is_used(tmp_path: Path) -> None:
    raw = json.loads((RUN / "fr" / "rank0.json").read_text())
    raw["pg_config"] = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"}}
    (tmp_path / "rank0.json").write_text(json.dumps(raw))
    ds = collect([tmp_path], workers=1)
    assert build_groups(ds.dumps, None)[0]["0"].members == [0, 1, 2]


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
    d = read_dump(f)
    assert d.version == "2.99"
    assert d.groups["0"].enqueued == 12 and d.groups["0"].pending[0].timeout_ms is None


def test_no_entries_uses_pg_status(tmp_path: Path) -> None:
    """A dump with no entries still says where the rank stopped (torch omits "entries" when empty)."""
    raw = json.loads((RUN / "fr" / "rank0.json").read_text())
    raw.pop("entries")
    f = tmp_path / "rank0.json"
    f.write_text(json.dumps(raw))
    d = read_dump(f, rank=0)
    assert d.entries == 0 and d.unmapped == 2  # pg ids cannot be named without entries or a pg_config
    raw["pg_config"] = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"},
                        "1": {"name": "1", "desc": "undefined", "ranks": "[0, 1]"}}
    f.write_text(json.dumps(raw))
    d = read_dump(f, rank=0)  # named by creation order now: local ids and names grow together
    assert (d.groups["0"].enqueued, d.groups["0"].completed) == (12, 11) and d.groups["0"].from_status


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
    bad.write_bytes(pickle.dumps({"version": "2.10", "pg_config": {}, "entries": [_Boom(marker)]}, protocol=2))
    with pytest.raises(TraceFileError) as exc:
        read_dump(bad)
    assert "rank0.pkl" in str(exc.value) and "\n" not in str(exc.value)
    assert "system" in str(exc.value)
    assert not marker.exists()


def test_pickle_needing_any_class_is_refused(tmp_path: Path) -> None:
    import collections

    f = tmp_path / "rank0.pkl"
    f.write_bytes(pickle.dumps({"version": "2.10", "pg_config": {}, "entries": collections.OrderedDict()}, protocol=2))
    with pytest.raises(TraceFileError, match="refusing"):
        read_dump(f)


@pytest.mark.parametrize("payload", [b"", b"{not json", b"\x80\x05\x95", json.dumps([1, 2]).encode()])
def test_garbage_is_one_line_error(tmp_path: Path, payload: bytes) -> None:
    f = tmp_path / "rank3.json"
    f.write_bytes(payload)
    with pytest.raises(TraceFileError) as exc:
        read_dump(f)
    assert str(exc.value).startswith(str(f)) and "\n" not in str(exc.value)


def test_names_and_ops() -> None:
    assert rank_from_name("rank12.cpu.json") == 12
    assert rank_from_name("comm_lib_trace_rank_7") == 7
    assert rank_from_name("nccl_trace_rank_3.pkl") == 3
    assert rank_from_name("_dump_15") == 15
    assert rank_from_name("node1/dumps/host1_rank5.pkl") == 5
    assert rank_from_name("run/rank3/fr_dump.pkl") == 3
    assert rank_from_name("notes.txt") is None
    assert split_profiling_name("nccl:send 0->1") == ("nccl", "send", "0->1")
    assert split_profiling_name("gloo:all_reduce") == ("gloo", "all_reduce", "")
    assert normalize_op("ALLREDUCE") == "all_reduce" and normalize_op("_REDUCE_SCATTER_BASE") == "reduce_scatter"
    assert normalize_op("_allgather_base") == "all_gather" and normalize_op(None) == "unknown"


def test_sniff_by_content() -> None:
    assert sniff((RUN / "fr" / "rank0.pkl").read_bytes()[:4096]) == "pickle"
    assert sniff((RUN / "fr" / "rank0.json").read_bytes()[:4096]) == "json"
    assert sniff(b'{"traceEvents": [], "schemaVersion": 1}') is None  # a Kineto trace
    assert sniff(pickle.dumps({"segments": [], "device_traces": []}, protocol=2)) is None  # a memory snapshot
    assert sniff(b"Thread 0x00007f (most recent call first):") is None


def test_discovery_finds_every_layout() -> None:
    """Flat torch prefixes, RUN/fr, nested per-host folders, one file: by content, any name."""
    stop = find_dumps([DATA / "groups_stop"])
    assert sorted(p.name for p in stop) == [f"_dump_{r}" for r in (0, 1, 2, 3, 4, 6, 7)]
    assert len(find_dumps([DATA / "groups_skip"])) == 8
    order = find_dumps([DATA / "groups_order"])
    assert sorted(p.suffix for p in order) == [".json"] * 4 + [".pkl"] * 4
    assert find_dumps([DATA / "groups_skip" / "nccl_trace_rank_3"]) == [DATA / "groups_skip" / "nccl_trace_rank_3"]
    assert find_dumps([DATA / "groups_spin" / "stacks"]) == []  # stack dumps are not dumps


def test_summary_line_says_what_was_read() -> None:
    ds = collect([DATA / "groups_stop"], workers=1)
    assert ds.summary(8) == "Flight Recorder: 7 dumps of 7 ranks read (pickle 7); no dump from rank 5"
    ds = collect([DATA / "groups_spin"], workers=1)
    assert ds.summary(8) == "Flight Recorder: 8 dumps of 8 ranks read (JSON 1, pickle 7); all 8 ranks have one"


def test_parallel_read_through_the_engine_matches(tmp_path: Path) -> None:
    """Many dumps go through the engine's local processes; the result is the same as in-process."""
    for r in range(48):
        shutil.copy(DATA / "groups_skip" / f"nccl_trace_rank_{r % 8}", tmp_path / f"_dump_{r}")
    a, b = collect([tmp_path], workers=1), collect([tmp_path], workers=2)
    assert sorted(a.dumps) == sorted(b.dumps) == list(range(48))
    assert all(a.dumps[r].groups.keys() == b.dumps[r].groups.keys() for r in a.dumps)


def test_two_recorders_of_one_rank_are_merged(tmp_path: Path) -> None:
    raw = json.loads((RUN / "fr" / "rank0.json").read_text())
    nccl = {"version": "2.10", "comm_lib_version": "2.27.5", "pg_config": {}, "pg_status": {"5": {
        "last_enqueued_collective": 3, "last_started_collective": 3, "last_completed_collective": 2}},
        "entries": [{"record_id": 0, "pg_id": 5, "process_group": ["5", "mesh_tp"], "collective_seq_id": 3,
                     "profiling_name": "nccl:all_gather", "state": "started", "is_p2p": False}]}
    (tmp_path / "rank0.json").write_text(json.dumps(nccl))
    (tmp_path / "rank0.cpu.json").write_text(json.dumps(raw))
    ds = collect([tmp_path], workers=1)
    assert ds.problems == []
    d = ds.dumps[0]
    assert d.comm_lib_version == "2.27.5"
    assert {"0", "5"} <= set(d.groups)
    assert d.groups["5"].timing and not d.groups["0"].timing  # start events: NCCL's, not gloo's


def test_same_pg_name_in_both_recorders_stays_apart(tmp_path: Path) -> None:
    """A default group with a gloo and an NCCL backend counts its collectives twice, separately."""
    raw = json.loads((RUN / "fr" / "rank0.json").read_text())
    nccl = {"version": "2.10", "comm_lib_version": "2.27.5", "pg_config": {}, "pg_status": {"0": {
        "last_enqueued_collective": 40, "last_started_collective": -1, "last_completed_collective": 40}},
        "entries": [{"record_id": 0, "pg_id": 0, "process_group": ["0", "default_pg"], "collective_seq_id": 40,
                     "profiling_name": "nccl:all_reduce", "state": "completed", "is_p2p": False}]}
    (tmp_path / "rank0.json").write_text(json.dumps(nccl))
    (tmp_path / "rank0.cpu.json").write_text(json.dumps(raw))
    d = collect([tmp_path], workers=1).dumps[0]
    assert (d.groups["0"].enqueued, d.groups["0:cpu"].enqueued) == (40, 12)


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
    assert [c["rank"] for c in ours["culprits"]] == [1] and ours["culprits"][0]["why"] == "mismatch"
    assert "rank 1 has dtypes Double vs Float" in ours["mismatches"][0]
