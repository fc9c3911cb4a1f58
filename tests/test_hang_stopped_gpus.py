"""Every stopped GPU named (issue 37): simulated TP x PP x EP x DP Megatron MoE jobs where one, two or three
GPUs stop in different groups, each against the simulator's own truth (traceread.simulate.fr_hang).

The shape of the real case: every entry ``scheduled`` (no start, no completion recorded), the stopped rank's
own record shows a tensor-parallel collective that never completes while its TP peer is several collectives
further in the same group, and the rest of the job waits in an expert-parallel all-to-all the stopped ranks
never joined. ``blind`` is how many completions the stopped rank's record missed; ``states="scheduled"``
writes no per-entry state at all (completion only in ``pg_status``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from traceread.analysis.hang.diagnose import diagnose
from traceread.assemble.findings.hang import hang as hang_finding
from traceread.cli import cli
from traceread.simulate.fr_hang import HangKnobs, simulate_hang

CASES = {
    "one_scheduled_only": HangKnobs(tp=2, pp=2, dp=4, ep=4, faults=[(2, 0.5)], blind=3, timing=False,
                                    states="scheduled"),
    "two_tp_groups_scheduled_only": HangKnobs(tp=2, pp=2, dp=4, ep=4, faults=[(2, 0.5), (9, 0.5)], blind=3,
                                              timing=False, states="scheduled"),
    "three_faults_one_reached": HangKnobs(tp=2, pp=2, dp=4, ep=4, faults=[(2, 0.5), (9, 0.5), (13, 0.3)], blind=3,
                                          timing=False, states="scheduled"),
    "three_with_start_events": HangKnobs(tp=2, pp=2, dp=4, ep=2, faults=[(2, 0.5), (9, 0.6), (13, 0.3)], blind=2),
    "three_never_started": HangKnobs(tp=2, pp=2, dp=4, ep=2, faults=[(2, 0.5), (9, 0.6), (13, 0.3)], blind=0),
    "three_completed_states_no_timing": HangKnobs(tp=2, pp=2, dp=4, ep=2, faults=[(2, 0.5), (9, 0.6), (13, 0.3)],
                                                  blind=4, timing=False),
    "three_scheduled_only": HangKnobs(tp=2, pp=2, dp=4, ep=2, faults=[(2, 0.5), (9, 0.6), (13, 0.3)], blind=3,
                                      timing=False, states="scheduled"),
    "pp4_peers_five_ahead": HangKnobs(tp=2, pp=4, dp=2, ep=2, faults=[(5, 0.4), (10, 0.7)], blind=5, timing=False,
                                      states="scheduled"),
}


def _check(folder: Path, truth: dict) -> dict:
    d = diagnose(folder, workers=1)
    e = d.entry
    want = {(c["rank"], c["pg"], c["seq"]) for c in truth["culprits"]}
    got = {(c["rank"], c["pg"], c["seq"]) for c in e["culprits"]}
    assert got == want  # every stopped GPU, each at the collective its own record never completes, nobody else
    assert {c["why"] for c in e["culprits"]} == {"gpu_stopped"}
    # one source: the answer names exactly the ranks of culprits[], one line each
    assert len(d.lines) == len(e["culprits"])
    for c, line in zip(e["culprits"], d.lines):
        assert line == c["summary"] and line.startswith(f"Rank {c['rank']}'s GPU stopped")
    assert sorted(e["missing_ranks"]) == sorted(r for r, _pg, _seq in want)
    for g in e["groups"]:  # never "every member is in it" when a member is past it or missing from it
        if (g.get("note") or "").startswith("every member"):
            assert not g["behind"] and not g.get("done"), g
        if g.get("done") and (g["waiting"] or g["behind"]):
            assert "went past it" in (g.get("note") or "")
    return e


@pytest.mark.parametrize("name", list(CASES))
def test_every_stopped_gpu_is_named(tmp_path: Path, name: str) -> None:
    knobs = CASES[name]
    knobs.buffer = 300
    truth = simulate_hang(tmp_path, knobs)
    assert truth["culprits"]  # the simulator stopped at least one GPU that others wait for
    e = _check(tmp_path, truth)
    if knobs.blind:  # the record lags the peers: it says so, with the peer and how far it went
        for c in e["culprits"]:
            assert "never completing while rank" in c["summary"] and "completed it" in c["summary"]
    if knobs.states == "scheduled":
        assert all(any("no state beyond 'scheduled'" in x for x in c["evidence"]) for c in e["culprits"])


def test_the_real_case_two_tp_groups_and_an_ep_all_to_all(tmp_path: Path) -> None:
    """16-rank MoE, every entry ``scheduled``: both stopped GPUs are named, the EP all-to-all waits on both,
    and the report's finding, ``culprits[]`` and the answer name the same two ranks."""
    truth = simulate_hang(tmp_path, HangKnobs(tp=2, pp=2, dp=4, ep=4, buffer=300, faults=[(2, 0.5), (9, 0.5)],
                                              blind=3, timing=False, states="scheduled"))
    e = _check(tmp_path, truth)
    assert {c["role"] for c in e["culprits"]} == {"tp"}
    assert len({c["pg"] for c in e["culprits"]}) == 2  # two different TP groups
    a2a = [g for g in e["groups"] if g["op"] == "all_to_all" and g["waiting"]]
    assert {b["rank"] for g in a2a for b in g["behind"]} == {2, 9}
    assert all(set(g["culprits"]) <= {2, 9} and g["culprits"] for g in a2a)
    tp = [g for g in e["groups"] if g["role"] == "tp" and g["done"] and g["waiting"]]
    assert tp and all("every member" not in (g["note"] or "") for g in tp)
    f = hang_finding({"hang": e, "source": {"backend": "nccl"}})[0]  # type: ignore[typeddict-item]
    assert f["title"].endswith("and 1 more collective: the GPUs of ranks 2, 9 stopped")
    res = CliRunner().invoke(cli, ["hang", str(tmp_path), "--format", "json"])
    assert res.exit_code in (0, 3), res.output
    doc = json.loads(res.output)
    assert sorted(c["rank"] for c in doc["culprits"]) == [2, 9]


def _recorder(rank: int, ops: list[tuple[str, int, bool]]) -> object:
    """One rank's NCCL recorder (no start events): ``(group, seq, completed)`` in enqueue order."""
    from traceread.simulate.flight_recorder import Entry, RankRecorder

    groups = {"1": ("TENSOR_MODEL_PARALLEL_GROUP", [0, 1]), "2": ("EXPERT_MODEL_PARALLEL_GROUP", [1, 2])}
    mine = [(name, desc, members) for name, (desc, members) in groups.items() if rank in members]
    local = {name: i for i, (name, _d, _m) in enumerate(mine)}
    t = 1_795_000_000_000_000_000
    entries = [Entry(pg=pg, local_id=local[pg], desc=groups[pg][0], op="all_reduce" if pg == "1" else "all_to_all",
                     coll_seq=seq, p2p_seq=0, op_id=seq, is_p2p=False, peer=None, sizes=[[8, 8]], dtype="BFloat16",
                     created_ns=t + i * 1000, started_ns=None, completed_ns=t + i * 1000 + 500 if done else None)
               for i, (pg, seq, done) in enumerate(ops)]
    return RankRecorder(rank=rank, groups=mine, entries=entries)


def test_everyone_in_it_and_only_one_also_missing_elsewhere(tmp_path: Path) -> None:
    """Ranks 0 and 1 are both in TP all_reduce #5 and none completes (no start events: it cannot say whose GPU);
    rank 2 waits in EP all_to_all #3 for rank 1 only. Rank 1 is named, as "most likely", and rank 0 is not."""
    from traceread.simulate.flight_recorder import write_dump

    tp = [("1", s, s < 5) for s in range(1, 6)]
    recs = {0: _recorder(0, tp), 1: _recorder(1, tp + [("2", 1, True), ("2", 2, True), ("2", 3, False)]),
            2: _recorder(2, [("2", 1, True), ("2", 2, True), ("2", 3, False)])}
    for r, rec in recs.items():
        write_dump(tmp_path / f"nccl_trace_rank_{r}", rec, timing=False, stateless=True)  # type: ignore[arg-type]
    d = diagnose(tmp_path, workers=1)
    (c,) = d.entry["culprits"]
    assert (c["rank"], c["why"], c["pg"], c["seq"]) == (1, "gpu_stopped", "1", 5)
    assert d.lines[0].startswith("Rank 1's GPU most likely stopped: every member of all_reduce #5 on pg 1")
    assert "only rank 1 is also missing from all_to_all #3 on pg 2" in d.lines[0]
    assert d.entry["missing_ranks"] == [1]
