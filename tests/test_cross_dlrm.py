"""Cross-rank analyses on the real 8-rank DLRM trace (8x V100, one ProfilerStep#10, one host clock).

Raw facts (checked by reading the JSON, reproduced independently below with the json module):
* the NCCL kernels carry no comm args (no Seq, no Comms Id, no Collective name): matching must be
  ordinal; each rank runs 8 comm kernels on stream 84 — 4 SendRecv (all_to_all, forward), 1
  AllReduce, 1 SendRecv (backward all_to_all), 2 AllReduce — inside ``nccl:all_to_all`` /
  ``nccl:all_reduce`` annotations.
* the ends of each instance agree across ranks within ~10 µs: one clock (same host), no offsets.
* rank 7's ProfilerStep starts last (8718 µs after the reference vs 1205 on rank 1); its first
  all_to_all kernel starts 505 µs after the next-latest rank (rank 6) and its cudaLaunchKernel is
  only 12 µs before that kernel: the host launched late (host cause).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from traceread.analysis.comm.clocks import estimate_offsets
from traceread.analysis.comm.collectives import comm_events, match_collectives
from traceread.analysis.comm.perf import collective_table
from traceread.analysis.comm.stragglers import attribute
from traceread.analysis.time.steps import device_steps
from traceread.engine.jobs import read_traces


def _raw_nccl_kernels(folder: Path) -> dict[int, list[tuple[float, float]]]:
    out = {}
    for f in sorted(folder.glob("*.json")):
        d = json.loads(f.read_text())
        ks = sorted((e for e in d["traceEvents"] if e.get("cat") == "kernel" and "nccl" in e["name"].lower()),
                    key=lambda e: e["ts"])
        out[d["distributedInfo"]["rank"]] = [(float(e["ts"]), float(e["ts"] + e["dur"])) for e in ks]
    return out


@pytest.fixture(scope="module")
def dlrm(shared_traces: Path):
    folder = shared_traces / "param_dlrm_8rank"
    ts = read_traces([folder], use_cache=False)
    sw = {rt.rank: device_steps(rt) for rt in ts.ranks}
    m = match_collectives([comm_events(rt, sw[rt.rank].table) for rt in ts.ranks])
    return folder, ts, sw, m


def test_ordinal_matching_complete(dlrm) -> None:
    _, ts, _, m = dlrm
    assert len(ts.ranks) == 8
    assert m.mismatches == []
    assert set(m.events["method"]) == {"ordinal"}
    assert m.instances.height == 8 and m.instances["complete"].all()
    ops = m.instances.sort("instance")["op"].to_list()
    assert ops == ["alltoall"] * 4 + ["allreduce", "alltoall"] + ["allreduce"] * 2
    assert m.steps == [10]


def test_single_clock_detected(dlrm) -> None:
    _, _, _, m = dlrm
    c = estimate_offsets(m)
    assert c.method == "single-clock" and set(c.offsets_us.values()) == {0.0}
    assert c.epsilon_us < 20.0


def test_rank7_is_the_host_late_straggler(dlrm) -> None:
    folder, _, sw, m = dlrm
    raw = _raw_nccl_kernels(folder)
    # independent computation of the definition: per ordinal, last arrival - next-latest arrival
    expected = 0.0
    for k in range(8):
        starts = sorted((raw[r][k][0], r) for r in raw)
        if starts[-1][1] == 7 and starts[-1][0] - starts[-2][0] > 5.0:
            expected += starts[-1][0] - starts[-2][0]
    assert expected == pytest.approx(1309.0)  # 505 + 509 + 162 + 124 + 9 µs
    res = attribute(m, sw, estimate_offsets(m))
    assert [e["rank"] for e in res.entries] == [7]
    e = res.entries[0]
    assert e["blame_us_per_step"] == pytest.approx(expected, rel=0.05)
    assert e["cause"] == "host" and e["root"] is True and e["arrived_last"] == 5
    # ranks 4 and 5 are last on the backward collectives by 14-52 µs: below 1 % of the ~18.7 ms step
    assert {r["rank"] for r in res.records.to_dicts()} == {4, 5, 7}
    hm = res.heatmap
    assert hm is not None and hm["steps"] == [10] and len(hm["wait_us"]) == 8
    assert hm["wait_us"][7][0] == min(row[0] for row in hm["wait_us"])  # the straggler waits least


def test_collective_table_sizes_from_annotations(dlrm) -> None:
    _, ts, _, m = dlrm
    rows = collective_table(m, estimate_offsets(m), device_names={rt.rank: rt.meta.device_name for rt in ts.ranks})
    assert sum(r["count"] for r in rows) == 8
    assert all(r["link"] == "nvlink" and r["link_peak_gbps"] == 150.0 for r in rows)  # V100-SXM2
    # the forward/backward embedding all_to_all moves 6144 floats (nccl:all_to_all Input Dims)
    a2a = [r for r in rows if r["name"] == "alltoall" and r["bytes"] == 6144 * 4]
    assert a2a and a2a[0]["count"] == 2
    # transfer = shortest kernel of the instance: rank 7's 10 µs (fwd) and rank 5's 10 µs (bwd)
    assert a2a[0]["latency_us"] == pytest.approx(10.0)
    assert all(r["busbw_gbps"] is None or r["busbw_gbps"] < 150.0 for r in rows)
