"""Stragglers against the simulator's schedule (truth.json: every member's arrival at every
collective), on the cases no other test builds: several ranks late together.

The rule (traceread.analysis.comm.stragglers): the ranks arriving within ε of the last arrival are
late together; the gap from the latest on-time arrival is shared among them, and a gap within ε
blames nobody. Expected values below apply that rule to the simulator's arrivals, never to the
analysis' own numbers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from traceread.analysis.comm.clocks import estimate_offsets
from traceread.analysis.comm.collectives import comm_events, match_collectives
from traceread.analysis.comm.stragglers import attribute
from traceread.analysis.time.steps import device_steps
from traceread.assemble.report import ReportOptions, build_report
from traceread.engine.jobs import read_traces
from traceread.simulate import simulate

SMALL = dict(ranks=4, steps=3, layers=1, hidden=1024, heads=8, seq_len=512, jitter=0.0)


def analysed(folder: Path) -> Any:
    ts = read_traces([folder], use_cache=False, workers=1)
    sw = {rt.rank: device_steps(rt) for rt in ts.ranks}
    m = match_collectives([comm_events(rt, sw[rt.rank].table) for rt in ts.ranks])
    return attribute(m, sw, estimate_offsets(m))


def expected_blame(truth: dict[str, Any], eps: float) -> dict[int, float]:
    """Per rank, µs per step: for each collective, the ranks within ``eps`` of the last arrival share
    the gap to the latest on-time arrival (nothing when that gap is within ``eps``)."""
    out: dict[int, float] = {}
    for c in truth["collectives"]:
        arrivals = {int(r): t for r, t in c["arrivals_us"].items()}
        last = max(arrivals.values())
        late = [r for r, t in arrivals.items() if t >= last - eps]
        on_time = [t for t in arrivals.values() if t < last - eps]
        if not on_time or last - max(on_time) <= eps:
            continue
        for r in late:
            out[r] = out.get(r, 0.0) + (last - max(on_time)) / len(late) / len(truth["steps"])
    return out


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """Ranks 1 and 2 start every step 2 ms late (host), 3 µs apart: one late pair, within the clock's ε."""
    folder = tmp_path_factory.mktemp("pair")
    return folder, simulate("ddp", folder, stragglers=[(1, 2000.0, "host"), (2, 2003.0, "host")], **SMALL)


def test_two_ranks_late_together_share_the_gap(pair: tuple[Path, dict[str, Any]]) -> None:
    folder, truth = pair
    res = analysed(folder)
    assert res.epsilon_us == 5.0  # one host, no jitter: the floor
    want = expected_blame(truth, res.epsilon_us)
    # the host jitter of the simulated launches spreads the pair by a few µs: in most collectives
    # both are within ε of the last arrival and share its gap; where they are not, the last one alone
    # is late by the few µs between them
    both = [c for c in truth["collectives"]
            if min(c["arrivals_us"]["1"], c["arrivals_us"]["2"]) >= max(c["arrivals_us"].values()) - res.epsilon_us]
    assert len(both) >= 2 and set(want) == {1, 2} and all(v > 500.0 for v in want.values())
    got = {e["rank"]: e["blame_us_per_step"] for e in res.entries}
    assert got == {r: pytest.approx(v, abs=1e-3) for r, v in want.items()}
    assert {e["rank"]: e["cause"] for e in res.entries} == {1: "host", 2: "host"}


def test_the_report_lists_both_late_ranks(pair: tuple[Path, dict[str, Any]]) -> None:
    folder, _ = pair
    doc = build_report([folder], ReportOptions(workers=1, use_cache=False))
    assert sorted(s["rank"] for s in doc["stragglers"]) == [1, 2]


def test_late_arrivals_outside_the_analysed_steps_are_not_blamed(tmp_path: Path) -> None:
    """Rank 1 is 2 ms late (host) in every step; the analysed window is steps 11-12 only (step 10 left
    out, as a partial trailing step or one before the first complete ProfilerStep is). Its blame per
    analysed step counts those two steps' collectives, never step 10's, and says what it left out."""
    truth = simulate("ddp", tmp_path, stragglers=[(1, 2000.0, "host")], **SMALL)
    ts = read_traces([tmp_path], use_cache=False, workers=1)
    sw = {rt.rank: device_steps(rt) for rt in ts.ranks}
    m = match_collectives([comm_events(rt, sw[rt.rank].table) for rt in ts.ranks])
    kept = {r: w.table.filter(w.table["step"] != 10) for r, w in sw.items()}
    res = attribute(m, kept, estimate_offsets(m))
    analysed = {"steps": [11, 12], "collectives": [c for c in truth["collectives"] if c["step"] in (11, 12)]}
    want = expected_blame(analysed, res.epsilon_us)
    assert set(want) == {1} and len([c for c in truth["collectives"] if c["step"] == 10]) > 0
    (e,) = res.entries
    assert e["rank"] == 1 and e["blame_us_per_step"] == pytest.approx(want[1], abs=1e-3)
    assert any("outside the analysed steps not counted" in n for n in res.notes)
