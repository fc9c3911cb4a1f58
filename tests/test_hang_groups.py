"""Every culprit, every stuck group: real 8-rank TP2 x PP2 x DP2 gloo jobs (tests/data/fr/groups_*, made by
tests/jobs/make_fr_fixtures.py) and simulated Megatron-like NCCL jobs (traceread.simulate.fr_hang), each
against its own truth."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from traceread.analysis.hang.diagnose import diagnose
from traceread.cli import cli
from traceread.simulate.fr_hang import HangKnobs, simulate_hang

DATA = Path(__file__).parent / "data" / "fr"
FAULTS = ("stop", "spin", "skip", "order")


def _truth(folder: Path) -> dict:
    return json.loads((folder / "truth.json").read_text())


def _named(entry: dict) -> set[tuple[int, str]]:
    return {(c["rank"], c["why"]) for c in entry.get("culprits") or []}


@pytest.mark.parametrize("fault", FAULTS)
def test_real_jobs_name_exactly_the_culprit(fault: str) -> None:
    folder = DATA / f"groups_{fault}"
    truth = _truth(folder)
    d = diagnose(folder, workers=1)
    e = d.entry
    assert _named(e) == {(c["rank"], c["why"]) for c in truth["culprits"]}
    culprit = truth["culprits"][0]["rank"]
    # every rank the job saw inside a collective is listed in that group's collective, and nowhere named
    listed = {(g["pg"], g["seq"]): g for g in e["groups"]}
    for s in truth["stuck"]:
        g = listed[(s["pg"], s["seq"])]
        assert g["waiting"] == s["waiting"], (s, g)
        assert g["culprits"] == [culprit]
    assert set(e["waiting_ranks"]) == {int(r) for r in truth["waiting"]} - {culprit}
    assert e["culprits"][0]["victims"] == 7
    assert d.lines[0].startswith(f"Rank {culprit} ")
    assert e["missing_ranks"] == [culprit]


def test_stopped_rank_without_dump_is_put_back_in_its_groups() -> None:
    e = diagnose(DATA / "groups_stop", workers=1).entry
    assert e["dumps"] == "Flight Recorder: 7 dumps of 7 ranks read (pickle 7); no dump from rank 5"
    [c] = e["culprits"]
    # the first collective it missed: its TP all-reduce of step 2 (rank 4 waits in it), not a later one
    assert (c["pg"], c["role"], c["op"], c["seq"], c["waiting"]) == ("3", "tp", "all_reduce", 17, [4])
    assert c["stack"] is None and any("no stack dump either" in x for x in c["evidence"])
    by_pg = {g["pg"]: g for g in e["groups"]}
    assert [b["rank"] for b in by_pg["3"]["behind"]] == [5] and by_pg["3"]["behind"][0]["why"] == "no_dump"
    assert by_pg["10"]["role"] == "pp" and by_pg["10"]["op"] == "broadcast"
    assert any("pg 3: rank 5 put back in it from the layout" in x for x in e["evidence"])


def test_spinning_rank_gets_its_stack_and_last_log_line() -> None:
    e = diagnose(DATA / "groups_spin", workers=1).entry
    [c] = e["culprits"]
    assert c["rank"] == 2 and c["why"] == "host_elsewhere"
    assert c["stack"].startswith("fr_groups_job.py:") and "in spin_holding_the_gil" in c["stack"]
    assert c["log"] == "rank 2: step 2 reducing gradients"
    assert (c["pg"], c["role"], c["seq"]) == ("5", "dp", 3)  # its DP all-reduce comes before the world one
    assert c["positions"]["0"] == [2, 2] and c["positions"]["5"] == [2, 2]


@pytest.mark.parametrize("fault,culprit,waiter", [("skip", 6, 4), ("order", 3, 1)])
def test_out_of_order_is_decided_by_the_other_ranks(fault: str, culprit: int, waiter: int) -> None:
    e = diagnose(DATA / f"groups_{fault}", workers=1).entry
    [c] = e["culprits"]
    assert c["summary"].startswith(f"Rank {culprit} called all_reduce #3 on pg 0 (world, default_pg) before all_reduce #3 "
                                   "on pg ")
    assert "which 6 of 6 other ranks call first" in c["summary"] and f"rank {waiter} waits in it" in c["summary"]
    assert c["role"] == "dp" and c["waiting"] == [waiter]


def test_cli_text_prints_one_line_per_culprit_first() -> None:
    res = CliRunner().invoke(cli, ["hang", str(DATA / "groups_stop")])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].startswith("Rank 5 never joined all_reduce #17 on pg 3 (tp, TENSOR_MODEL_PARALLEL_GROUP) and left no "
                               "Flight Recorder dump")
    assert "stuck groups (7):" in lines
    res = CliRunner().invoke(cli, ["hang", str(DATA / "groups_order" / "node1"), "--format", "json"])
    assert res.exit_code == 0  # half the job: what those dumps show, without inventing the rest
    doc = json.loads(res.output)
    assert {c["rank"] for c in doc["culprits"]} <= {0, 1, 2, 3}  # ranks without a dump; never one that dumped
    assert "no dump from ranks 0-3" in doc["dumps"]
    res = CliRunner().invoke(cli, ["hang", str(DATA / "groups_order" / "node1")])
    assert res.output.splitlines()[0] == ("Ranks 0-3 never joined all_reduce #3 on pg 0 (world, default_pg) and left "
                                          "no Flight Recorder dumps (stopped or dead); ranks 4-7 wait in it.")


def test_one_dump_file() -> None:
    res = CliRunner().invoke(cli, ["hang", str(DATA / "groups_skip" / "nccl_trace_rank_4"), "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["dumps"].startswith("Flight Recorder: 1 dump of 1 rank read (pickle 1)")
    assert doc["groups"][0]["waiting"] == [4]


# ----------------------------------------------------------------------------- simulated NCCL jobs


def _compare(folder: Path, truth: dict, timing: bool = True) -> dict:
    e = diagnose(folder, workers=1).entry
    want = {(c["rank"], c["why"]) for c in truth["culprits"]}
    got_groups = {(g["pg"], g["seq"]): g for g in e["groups"] if g["op"] not in ("send", "recv")}
    want_groups = {(s["pg"], s["seq"]): s["waiting"] for s in truth["stuck"]}
    assert set(got_groups) == set(want_groups)  # every stuck group, and only those
    faulted = {r for r, _ in want}
    for key, waiting in want_groups.items():
        got = set(got_groups[key]["waiting"])
        if timing:
            assert got == set(waiting), key
        else:  # without start events a stopped GPU looks like it is in its next collective
            assert set(waiting) <= got <= set(waiting) | faulted, key
    if timing:
        assert _named(e) == want
    else:
        assert not _named(e) - want  # never a healthy rank
    return e


@pytest.mark.parametrize("knobs", [
    HangKnobs(tp=2, pp=4, dp=2, faults=[(5, 0.4)]),
    HangKnobs(tp=2, pp=4, dp=2, microbatches=8, faults=[(5, 0.4), (10, 0.7)]),
    HangKnobs(tp=2, pp=2, dp=4, ep=2, faults=[(3, 0.3)]),
    HangKnobs(tp=4, pp=4, dp=2, faults=[(17, 0.1)], descs="undefined"),
    HangKnobs(tp=2, pp=4, dp=2, faults=[(0, 0.05), (15, 0.99)]),
    HangKnobs(tp=2, pp=4, dp=2, faults=[(4, 0.4), (5, 0.4)]),
], ids=["one", "two_stages", "moe", "no_descs", "first_and_last", "both_of_a_tp_pair"])
def test_simulated_gpu_stops(tmp_path: Path, knobs: HangKnobs) -> None:
    knobs.buffer = 400  # keeps the dumps small; the ring still wraps
    truth = simulate_hang(tmp_path, knobs)
    e = _compare(tmp_path, truth)
    assert e["culprits"][0]["why"] == "gpu_stopped"
    assert "never started it" in e["culprits"][0]["summary"]
    for c in e["culprits"]:
        assert c["victims"] >= 1 and not c["summary"].count("different order")


@pytest.mark.parametrize("knobs", [
    HangKnobs(tp=1, pp=1, dp=1, faults=[(0, 0.5)]),
    HangKnobs(tp=1, pp=1, dp=2, faults=[(0, 0.5), (1, 0.5)]),
], ids=["one_rank", "every_gpu"])
def test_simulated_gpu_stops_with_nobody_waiting(tmp_path: Path, knobs: HangKnobs) -> None:
    """No rank is in the stuck collective (a one-rank job, or every member's GPU stopped before it): the ranks
    whose GPU never started their queue are still the culprits (the real H100 dump of
    sample_traces/h100_nccl_timeout_1gpu has the same shape)."""
    knobs.buffer = 200
    truth = simulate_hang(tmp_path, knobs)
    assert sorted(c["rank"] for c in truth["culprits"]) == [f[0] for f in knobs.faults]
    e = _compare(tmp_path, truth)
    assert {c["why"] for c in e["culprits"]} == {"gpu_stopped"}
    assert diagnose(tmp_path, workers=1).headline.startswith("Rank 0's GPU stopped: its host enqueued ")


def test_simulated_victim_fault_is_not_a_culprit(tmp_path: Path) -> None:
    """A second fault on a rank that was already waiting for the first never happens: not named."""
    truth = simulate_hang(tmp_path, HangKnobs(tp=2, pp=2, dp=4, ep=4, buffer=300, faults=[(3, 0.3), (12, 0.9)]))
    assert [c["rank"] for c in truth["culprits"]] == [3] and truth["faults_not_reached"][0]["rank"] == 12
    _compare(tmp_path, truth)


def test_simulated_without_start_events_names_no_healthy_rank(tmp_path: Path) -> None:
    truth = simulate_hang(tmp_path, HangKnobs(tp=2, pp=4, dp=2, buffer=300, timing=False, faults=[(5, 0.4)]))
    e = _compare(tmp_path, truth, timing=False)
    assert e["culprits"] == []
    tp = next(g for g in e["groups"] if g["note"])
    assert tp["role"] == "tp" and set(tp["waiting"]) == {4, 5}
    assert any("set TORCH_NCCL_ENABLE_TIMING=1" in x for x in e["evidence"])
    headline = diagnose(tmp_path, workers=1).headline
    assert headline.startswith("Ranks 4-5 are all in all_reduce #") and "(set TORCH_NCCL_ENABLE_TIMING=1)" in headline


def test_simulated_p2p_waits_are_their_own_groups(tmp_path: Path) -> None:
    """Healthy pipeline stages wait in receives; p2p seqs never enter the collective seqs (pg_status of a PP
    group holds a p2p seq: torch writes the last work's seq there)."""
    import pickle

    truth = simulate_hang(tmp_path, HangKnobs(tp=2, pp=4, dp=2, buffer=300, faults=[(5, 0.4)]))
    raw = pickle.loads((tmp_path / "nccl_trace_rank_1").read_bytes())  # our own simulator's file
    pp_local = next(e["pg_id"] for e in raw["entries"] if e["is_p2p"])
    assert raw["pg_status"][str(pp_local)]["last_enqueued_collective"] > 0  # a p2p seq, in torch's key
    e = diagnose(tmp_path, workers=1).entry
    recv = {(g["waiting"][0], g["behind"][0]["rank"]) for g in e["groups"] if g["op"] == "recv"}
    want = {(int(r), b["from"]) for r, b in truth["blocked"].items() if b["op"] == "recv"}
    assert recv == want
    pp_groups = {g["pg"] for g in e["groups"] if g["role"] == "pp"}
    assert all(g["op"] in ("send", "recv") for g in e["groups"] if g["pg"] in pp_groups)


@pytest.mark.slow
def test_simulated_256_ranks(tmp_path: Path) -> None:
    truth = simulate_hang(tmp_path, HangKnobs(tp=4, pp=4, dp=16, ep=4, microbatches=8, buffer=600,
                                              faults=[(37, 0.45), (200, 0.2)]))
    _compare(tmp_path, truth)


def test_layout_rebuild_needs_a_unique_fit(tmp_path: Path) -> None:
    """Without pg_config, a rank with no dump is put back only where the layout leaves one place for it."""
    shutil.copytree(DATA / "groups_stop", tmp_path / "run")
    (tmp_path / "run" / "_dump_4").unlink()  # ranks 4 and 5 (a whole TP pair) have no dump now
    e = diagnose(tmp_path / "run", workers=1).entry
    assert {c["rank"] for c in e["culprits"]} <= {4, 5}
    assert 4 in {c["rank"] for c in e["culprits"]}


def test_two_ranks_without_dumps_are_each_put_back_once(tmp_path: Path) -> None:
    """Ranks 3 and 5 left no dump (rank 3's removed from the real run): rank 4's TP group could be {3, 4}
    or {4, 5} by its neighbours' pattern, but rank 3 is already in {2, 3}. Each goes back in its own
    groups only, and the answer is still the stopped rank 5 alone (rank 3 held no one up)."""
    shutil.copytree(DATA / "groups_stop", tmp_path / "run")
    (tmp_path / "run" / "_dump_3").unlink()
    e = diagnose(tmp_path / "run", workers=1).entry
    assert [(c["rank"], c["why"], c["pg"], c["seq"], c["waiting"]) for c in e["culprits"]] == [
        (5, "no_dump", "3", 17, [4])]
    put_back = sorted(x.split(": ", 1)[1].split(" from")[0] for x in e["evidence"] if "put back in it" in x)
    assert put_back == [f"pg {pg}: rank {r} put back in it" for pg, r in
                        (("10", 5), ("12", 3), ("2", 3), ("3", 5), ("6", 3), ("8", 5))]


def test_report_renderers_show_one_line_per_culprit_first() -> None:
    """``traceread report`` on a run with a hang: the terminal and the HTML page list every culprit first."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from report_fixture import full_report

    from traceread.assemble.findings import assemble
    from traceread.render import html, terminal

    doc = full_report()
    doc["hang"] = diagnose(DATA / "groups_stop", workers=1).entry
    doc["findings"] = assemble.build_findings(doc)
    text = terminal.render_text(doc, top=10, width=400)
    hang_lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("HANG:")]
    assert hang_lines[0].startswith("HANG: Rank 5 never joined all_reduce #17 on pg 3 (tp, TENSOR_MODEL_PARALLEL_GROUP)")
    assert "7 stuck group(s); Flight Recorder: 7 dumps of 7 ranks read" in text
    page = html.render_html(doc)
    section = page[page.index('<section id="hang">'):]
    assert section.index('data-culprit="5"') < section.index("stuck group")
    assert "reduce_scatter" not in section and "all_reduce #17" in section


def test_simulator_writes_torchs_format(tmp_path: Path) -> None:
    """The simulator's pickles have the keys, value types and pickle opcodes of a real torch 2.13 dump."""
    import pickle
    import pickletools

    real_bytes = (DATA / "groups_skip" / "nccl_trace_rank_4").read_bytes()  # written by torch (tests/jobs)
    simulate_hang(tmp_path, HangKnobs(tp=2, pp=2, dp=2, buffer=64, faults=[(1, 0.5)]))
    sim_bytes = (tmp_path / "nccl_trace_rank_4").read_bytes()
    real, sim = pickle.loads(real_bytes), pickle.loads(sim_bytes)  # our own files
    assert list(sim) == list(real)  # version, pg_config, comm_lib_version, pg_status, entries: torch's order
    assert sim["version"] == real["version"] == "2.10"
    r_entry, s_entry = real["entries"][-1], sim["entries"][-1]
    assert set(s_entry) - set(r_entry) <= {"duration_ms"}  # NCCL with timing adds it; gloo never does
    assert set(r_entry) <= set(s_entry)
    for key, value in r_entry.items():
        assert type(s_entry[key]) is type(value) or value is None or s_entry[key] is None, key
    for status in (real["pg_status"], sim["pg_status"]):
        assert all(set(v) == {"last_enqueued_collective", "last_started_collective", "last_completed_collective"}
                   for v in status.values())
    assert all(set(v) == {"name", "desc", "ranks"} for v in sim["pg_config"].values())
    ops = {op.name for op, _arg, _pos in pickletools.genops(real_bytes)}
    # the same protocol-2 opcodes; a float (duration_ms), a one-item list, a memo past 255 entries are the others
    assert {op.name for op, _arg, _pos in pickletools.genops(sim_bytes)} <= ops | {"BINFLOAT", "APPEND", "LONG_BINPUT",
                                                                                   "LONG_BINGET"}
    assert not {"GLOBAL", "STACK_GLOBAL", "REDUCE", "BUILD", "INST", "OBJ", "NEWOBJ"} & ops


@pytest.mark.parametrize("world", [10**30, 0, -3])
def test_an_impossible_world_size_is_not_believed(tmp_path: Path, world: int) -> None:
    """A world size no job has (from a damaged run folder) would only size the default group's member list: it is
    ignored, and the culprits are those the dumps show (fuzz case: bench/fuzz_cli.py --replay 2622 --seed 0
    --max-events 300 once raised OverflowError here)."""
    from traceread.analysis.hang.attribution import attribute
    from traceread.analysis.hang.dumps import collect

    truth = simulate_hang(tmp_path, HangKnobs(tp=2, pp=2, dp=2, buffer=200, faults=[(3, 0.4)]))
    dumps = collect([tmp_path], workers=1).dumps
    want = sorted(c["rank"] for c in truth["culprits"])
    told = attribute(dumps, world)
    assert sorted(c.rank for c in told.culprits) == want
    assert told.world == attribute(dumps, None).world == 8
