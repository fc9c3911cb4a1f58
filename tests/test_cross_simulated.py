"""Cross-rank analyses against the simulator's exact truth (traceread.simulate, never analysis code).

Each scenario is simulated once per module into a temporary folder, read back with the real reader,
and analysed exactly as the report does: comm_events -> match_collectives -> clocks -> tables.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest

from traceread.analysis.comm.clocks import estimate_offsets
from traceread.analysis.comm.collectives import comm_events, match_collectives
from traceread.analysis.comm.perf import instance_timing
from traceread.analysis.comm.pipeline import detect_pipeline, stage_activity
from traceread.analysis.comm.stragglers import attribute
from traceread.analysis.time.breakdown import step_breakdowns
from traceread.analysis.time.slow_steps import find_slow_steps
from traceread.analysis.time.steps import device_steps
from traceread.engine.jobs import read_traces
from traceread.simulate import simulate

# slow-step causes the simulator injects -> the report's cause vocabulary
SIM_CAUSE = {"dataloader": "host", "gc": "host", "checkpoint": "host"}
SMALL = dict(layers=2, hidden=2048, heads=16, seq_len=1024)


def run(tmp: Path, scenario: str, **knobs: Any) -> dict[str, Any]:
    truth = simulate(scenario, tmp, **knobs)
    ts = read_traces([tmp], use_cache=False, workers=1)
    sw = {rt.rank: device_steps(rt) for rt in ts.ranks}
    m = match_collectives([comm_events(rt, sw[rt.rank].table) for rt in ts.ranks])
    clock = estimate_offsets(m)
    return dict(truth=truth, ts=ts, sw=sw, m=m, clock=clock, res=attribute(m, sw, clock))


@pytest.fixture(scope="module")
def ddp_gpu(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run(tmp_path_factory.mktemp("ddp_gpu"), "ddp", stragglers=[(5, 3000.0, "gpu")], steps=3, **SMALL)


@pytest.mark.slow
def test_ddp_gpu_straggler_matches_truth(ddp_gpu: dict[str, Any]) -> None:
    truth, res, m = ddp_gpu["truth"], ddp_gpu["res"], ddp_gpu["m"]
    assert m.mismatches == [] and set(m.events["method"]) == {"comms_id"}
    assert ddp_gpu["clock"].method == "single-clock"
    (t,) = truth["stragglers"]
    assert [e["rank"] for e in res.entries] == [t["rank"]]
    e = res.entries[0]
    assert e["blame_us_per_step"] == pytest.approx(t["blame_us_per_step"], rel=0.05)
    assert e["cause"] == t["cause"] == "gpu" and e["root"] is True


@pytest.mark.slow
def test_ddp_impact_is_the_step_time_saved(ddp_gpu: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> None:
    """Same job without the straggler: the job step time drops by about the rank's impact."""
    clean = simulate("ddp", tmp_path_factory.mktemp("clean"), steps=3, **SMALL)

    def job(truth: dict[str, Any]) -> float:
        return float(np.median([max(r["steps"][i]["duration_us"] for r in truth["ranks"].values())
                                for i in range(len(truth["steps"]))]))

    saved = job(ddp_gpu["truth"]) - job(clean)
    assert ddp_gpu["res"].entries[0]["impact_us_per_step"] == pytest.approx(saved, rel=0.05)


@pytest.mark.slow
def test_collective_waits_and_transfer_match_truth(ddp_gpu: dict[str, Any]) -> None:
    timing = instance_timing(ddp_gpu["m"], ddp_gpu["clock"])
    by_id = {cid: g for (cid,), g in timing.group_by(["comms_id"])}
    truth = ddp_gpu["truth"]["collectives"]
    assert len(by_id) == len(truth)
    for c in truth:
        g = by_id[c["comms_id"]]
        assert g["transfer_us"][0] == pytest.approx(c["transfer_us"], abs=0.01)
        waits = dict(zip(map(str, g["rank"].to_list()), g["wait"].to_list()))
        for r, w in c["waits_us"].items():
            assert waits[r] == pytest.approx(w, abs=0.01)


@pytest.mark.slow
def test_blame_unchanged_under_two_host_skew(tmp_path_factory: pytest.TempPathFactory) -> None:
    """--hosts 2 --skew-us 5000: host 1's clock is 5 ms off; offsets are recovered and the blame is
    the same as for the same 2-host job with synchronised clocks."""
    knobs = dict(stragglers=[(2, 2000.0, "host")], steps=3, hosts=2, **SMALL)
    flat = run(tmp_path_factory.mktemp("flat"), "ddp", skew_us=0.0, **knobs)
    skew = run(tmp_path_factory.mktemp("skew"), "ddp", skew_us=5000.0, **knobs)
    offs = skew["truth"]["clock_offsets_us"]
    assert any(v != 0 for v in offs.values())
    c = skew["clock"]
    for r, v in offs.items():
        assert c.offsets_us[int(r)] - c.offsets_us[0] == pytest.approx(v - offs["0"], abs=c.epsilon_us)
    for run_ in (flat, skew):
        (t,) = run_["truth"]["stragglers"]
        assert [e["rank"] for e in run_["res"].entries] == [2]
        e = run_["res"].entries[0]
        assert e["blame_us_per_step"] == pytest.approx(t["blame_us_per_step"], rel=0.05)
        assert e["cause"] == "host"
    assert skew["res"].entries[0]["blame_us_per_step"] == pytest.approx(
        flat["res"].entries[0]["blame_us_per_step"], abs=2 * skew["clock"].epsilon_us)
    assert flat["clock"].method == "single-clock"


@pytest.mark.slow
def test_tp_straggler_root_and_propagated(tmp_path_factory: pytest.TempPathFactory) -> None:
    r = run(tmp_path_factory.mktemp("tp"), "tp", stragglers=[(3, 2000.0, "gpu")], steps=3, **SMALL)
    (t,) = r["truth"]["stragglers"]
    entries = {e["rank"]: e for e in r["res"].entries}
    roots = [e["rank"] for e in r["res"].entries if e["root"]]
    assert roots == [3]
    assert entries[3]["blame_us_per_step"] == pytest.approx(t["blame_us_per_step"], rel=0.05)
    assert entries[3]["cause"] == "gpu"
    # the delay rank 3 carries from TP into the DP all-reduce is counted once in its impact
    assert entries[3]["impact_us_per_step"] < 0.5 * entries[3]["blame_us_per_step"]
    # its TP partner is late to the DP all-reduce only because it waited on rank 3 in TP
    tp_partner = 2
    truth_blame = r["truth"]["ranks"][str(tp_partner)]["blame_us_per_step"]
    assert entries[tp_partner]["root"] is False and "rank 3" in entries[tp_partner]["evidence"]
    assert entries[tp_partner]["blame_us_per_step"] == pytest.approx(truth_blame, rel=0.05)


@pytest.mark.slow
@pytest.mark.parametrize("schedule,factors", [("1f1b", None), ("gpipe", [1.0, 1.0, 1.3, 1.0])])
def test_pipeline_matches_truth(tmp_path_factory: pytest.TempPathFactory, schedule: str,
                                factors: list[float] | None) -> None:
    r = run(tmp_path_factory.mktemp(f"pp_{schedule}"), "pp", ranks=4, microbatches=8, batch=8, steps=2,
            schedule=schedule, stage_factors=factors, **SMALL)
    truth = r["truth"]["pipeline"]
    act = {rt.rank: stage_activity(rt, r["sw"][rt.rank]) for rt in r["ts"].ranks}
    pp = detect_pipeline(r["m"], act, r["clock"].offsets_us)
    assert pp is not None
    assert (pp["stages"], pp["microbatches"], pp["schedule"]) == (truth["stages"], truth["microbatches"], schedule)
    assert pp["theory_bubble_pct"] == pytest.approx(truth["theory_bubble_pct"])
    assert pp["bubble_pct"] == pytest.approx(truth["bubble_pct"], abs=1.0)
    for st in pp["per_stage"]:
        assert st["bubble_pct"] == pytest.approx(truth["bubble_pct_per_stage"][st["stage"]], abs=1.0)
    assert pp["unbalanced"] is (factors is not None)
    # the simulator launches backward from the autograd thread, as torch does: both phases charted
    assert {"fwd", "bwd", "p2p"} <= {b["kind"] for b in pp["timeline"]}
    assert r["res"].entries == [] and r["truth"]["stragglers"] == []  # a bubble is not a straggler


@pytest.mark.slow
def test_slow_steps_match_truth(tmp_path_factory: pytest.TempPathFactory) -> None:
    r = run(tmp_path_factory.mktemp("slow"), "slow_steps", steps=8, **SMALL,
            slow_steps=[(12, "dataloader", 20000.0), (14, "gc", 15000.0), (16, "checkpoint", 30000.0)])
    bd = pl.concat([step_breakdowns(rt, r["sw"][rt.rank]).with_columns(pl.lit(rt.rank).alias("rank"))
                    for rt in r["ts"].ranks])
    got = {e["step"]: e for e in find_slow_steps(bd)}
    truth = {t["step"]: t for t in r["truth"]["slow_steps"]}
    assert set(got) == set(truth)
    for s, t in truth.items():
        assert got[s]["cause"] == SIM_CAUSE[t["cause"]]
        assert got[s]["excess_us"] == pytest.approx(t["excess_us"], rel=0.05)
    assert r["res"].entries == []  # every rank stalls together: nobody is a straggler
