"""Matching collectives across ranks, clock offsets and the collectives table (hand-built inputs).

The inputs are built with known arrivals/ends so every expected number below follows from the
construction, not from running the code.
"""

from __future__ import annotations

import polars as pl
import pytest

from traceread.analysis.comm.clocks import ClockModel, estimate_offsets, hosts_from_run_info, recorded_uncertainty
from traceread.analysis.comm.collectives import EXTRACT_SCHEMA, comm_events, match_collectives, normalize_op
from traceread.analysis.comm.perf import busbw_factor, collective_table, intra_node_link
from traceread.model import FLOW_SCHEMA, GPU_SCHEMA, HOST_SCHEMA, STEP_SCHEMA, RankMeta, RankTrace, empty_frame


def ev(rank: int, ts: float, end: float, **kw: object) -> dict[str, object]:
    base: dict[str, object] = dict(
        rank=rank, backend="nccl", stream=7, kernel="ncclDevKernel_AllReduce_Sum_f32_RING_LL", op="allreduce",
        p2p=False, pg="0", pg_desc="default_pg", pg_ranks=None, group_size=None, dtype="Float",
        in_nelems=1 << 20, out_nelems=1 << 20, seq=None, comms_id=None, src_rank=None, dst_rank=None,
        ts=ts, end=end, launch_ts=ts - 20.0, step=0,
    )
    base.update(kw)
    return base


def frame(rows: list[dict[str, object]]) -> pl.DataFrame:
    return pl.DataFrame(rows, schema=EXTRACT_SCHEMA)


def ddp_rows(n: int, steps: int, late_rank: int, delay: float, skew: dict[int, float] | None = None,
             use_seq: bool = True) -> list[dict[str, object]]:
    """n ranks, 2 allreduces per step; ``late_rank`` reaches the first one ``delay`` µs late.
    Transfer = 100 µs; all members end at last arrival + 100 (the NCCL ring rule)."""
    rows = []
    for s in range(steps):
        t0 = 10_000.0 * s + 1_000.0
        for r in range(n):
            off = (skew or {}).get(r, 0.0)
            a1 = t0 + (delay if r == late_rank else 0.0)
            e1 = t0 + delay + 100.0
            a2 = e1 + 50.0
            e2 = a2 + 100.0
            for k, (a, e) in enumerate(((a1, e1), (a2, e2))):
                seq = 2 * s + k + 1 if use_seq else None
                rows.append(ev(r, a + off, e + off, seq=seq, step=s, group_size=n,
                               pg_ranks=str(list(range(n)))))
    return rows


def test_normalize_op_names() -> None:
    assert normalize_op("ncclDevKernel_AllGather_RING_LL(ncclDevComm*)") == "allgather"
    assert normalize_op("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t") == "sendrecv"
    assert normalize_op("_reduce_scatter_base") == "reducescatter"
    assert normalize_op("nccl:all_to_all") == "alltoall"
    assert normalize_op("c10d::allreduce_") == "allreduce"
    assert normalize_op("gloo:all_reduce") == "allreduce"
    assert normalize_op("aten::mm") is None


def test_seq_matching_complete_and_waits() -> None:
    m = match_collectives([frame([r for r in ddp_rows(4, 3, 2, 300.0) if r["rank"] == k]) for k in range(4)])
    assert m.mismatches == []
    assert m.instances.height == 6 and m.instances["complete"].all()
    assert set(m.events["method"]) == {"seq"}
    assert m.instances["bytes"][0] == 4 << 20  # 2^20 floats
    table = collective_table(m)
    assert len(table) == 1
    row = table[0]
    assert row["count"] == 6 and row["latency_us"] == pytest.approx(100.0)
    # per first allreduce: 3 ranks wait 300, rank 2 waits 0 -> mean 225; second allreduce: 0.
    assert row["wait_us"] == pytest.approx(225.0 / 2)
    assert row["algbw_gbps"] == pytest.approx((4 << 20) / 100e-6 / 1e9)
    assert row["busbw_gbps"] == pytest.approx(row["algbw_gbps"] * 2 * 3 / 4)


def test_ordinal_matching_aligns_by_step_when_windows_differ() -> None:
    rows = ddp_rows(2, 3, 1, 0.0, use_seq=False)
    # rank 1's profile starts one step later: its step-0 events are absent.
    rows = [r for r in rows if not (r["rank"] == 1 and r["step"] == 0)]
    m = match_collectives(frame(rows))
    assert set(m.events["method"]) == {"ordinal"}
    complete = m.instances.filter(pl.col("complete"))
    assert complete.height == 4  # steps 1 and 2, two allreduces each
    # step-1 instance 0 pairs rank 0's and rank 1's first allreduce of step 1 (same end time)
    e = m.events.filter(pl.col("step") == 1).group_by("instance").agg(pl.col("end").n_unique())
    assert (e["end"] == 1).all()
    assert any("lack ranks" in s for s in m.mismatches)
    assert any("most ranks ran" in s or "rank 1" in s for s in m.mismatches)


def test_size_and_count_mismatch_reported_not_raised() -> None:
    rows = ddp_rows(3, 1, 0, 0.0)
    rows[0]["in_nelems"] = 12  # rank 0's first allreduce has a different size
    rows.append(ev(2, 9_000.0, 9_100.0, seq=99, group_size=3, pg_ranks="[0, 1, 2]"))  # extra on rank 2
    m = match_collectives(frame(rows))
    text = " | ".join(m.mismatches)
    assert "input size differs" in text
    assert "rank 2: 3" in text
    assert "lack ranks (missing: 0-1)" in text


def test_p2p_matched_by_pair_and_order() -> None:
    rows = []
    for k in range(3):
        t = 1_000.0 * k
        kn = "ncclDevKernel_SendRecv"
        rows.append(ev(0, t, t + 50, op="send", p2p=True, kernel=kn, dst_rank=1, src_rank=0))
        rows.append(ev(1, t + 10, t + 50, op="recv", p2p=True, kernel=kn, src_rank=0, dst_rank=1))
        rows.append(ev(1, t + 500, t + 560, op="send", p2p=True, kernel=kn, dst_rank=0, src_rank=1))
        rows.append(ev(0, t + 520, t + 560, op="recv", p2p=True, kernel=kn, src_rank=1, dst_rank=0))
    m = match_collectives(frame(rows))
    assert m.mismatches == []
    assert m.instances.height == 6 and m.instances["complete"].all()
    assert set(m.events["method"]) == {"p2p"}
    for _, g in m.events.group_by("instance"):
        assert g["end"].n_unique() == 1  # a matched pair ends together by construction


def test_p2p_pairs_ignore_colliding_comms_id_and_follow_launch_order() -> None:
    """Real torch hashes a p2p Comms Id from (group, the side's own p2p Seq): pair 0->1 and pair
    2->3 get the same id for their first transfer. Rank 0 launches transfer A (big) then B (small) on
    two streams; B's kernel starts first on the GPU. Matching must pair by launch order per pair."""
    kn = "ncclDevKernel_SendRecv"
    rows = []
    for src, dst in ((0, 1), (2, 3)):
        # A: launched first, starts later; B: launched second, starts first
        rows.append(ev(src, 500.0, 900.0, op="send", p2p=True, kernel=kn, src_rank=src, dst_rank=dst,
                       launch_ts=10.0, comms_id="77", seq=1))
        rows.append(ev(src, 100.0, 200.0, op="send", p2p=True, kernel=kn, src_rank=src, dst_rank=dst,
                       launch_ts=20.0, comms_id="78", seq=2))
        rows.append(ev(dst, 480.0, 900.0, op="recv", p2p=True, kernel=kn, src_rank=src, dst_rank=dst,
                       launch_ts=15.0, comms_id="77", seq=1))
        rows.append(ev(dst, 90.0, 200.0, op="recv", p2p=True, kernel=kn, src_rank=src, dst_rank=dst,
                       launch_ts=25.0, comms_id="78", seq=2))
    m = match_collectives(frame(rows))
    assert m.mismatches == []
    assert m.instances.height == 4 and (m.instances["n_ranks"] == 2).all()
    for _, g in m.events.group_by("instance"):
        assert g["end"].n_unique() == 1  # A with A, B with B


def test_clock_offsets_estimated_per_host_and_single_clock_untouched() -> None:
    rows = ddp_rows(4, 4, 1, 200.0, skew={2: 5_000.0, 3: 5_000.0})
    m = match_collectives(frame(rows))
    c = estimate_offsets(m)
    assert c.method == "estimated"
    assert c.offsets_us[0] == 0.0 and c.offsets_us[1] == 0.0
    assert c.offsets_us[2] == pytest.approx(5_000.0) and c.offsets_us[3] == pytest.approx(5_000.0)
    # with explicit hosts the same answer
    c2 = estimate_offsets(m, hosts={0: "a", 1: "a", 2: "b", 3: "b"})
    assert c2.offsets_us[3] == pytest.approx(5_000.0)
    # recorded offsets win when the traces agree with them (within their 10 µs error) ...
    c3 = estimate_offsets(m, recorded={0: 0.0, 1: 0.0, 2: 4_990.0, 3: 4_990.0}, recorded_epsilon_us=10.0)
    assert c3.method == "recorded" and c3.offsets_us[2] == 4_990.0 and c3.epsilon_us >= 10.0
    # ... and lose when they do not (a host whose measurement went wrong)
    c4 = estimate_offsets(m, recorded={0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0})
    assert c4.method == "estimated" and c4.offsets_us[2] == pytest.approx(5_000.0)
    assert any("recorded clock offsets disagree" in n for n in c4.notes)
    # one clock: exactly zero, no noise "correction"
    m1 = match_collectives(frame(ddp_rows(4, 4, 1, 200.0)))
    c1 = estimate_offsets(m1)
    assert c1.method == "single-clock" and set(c1.offsets_us.values()) == {0.0}


def test_one_host_with_microsecond_noise_is_one_clock() -> None:
    """Ranks of one host see a collective end a few µs apart (0, 3, 6, 9 µs here): that is noise, far
    below the 50 µs any two NTP-synchronised hosts differ by. One clock, offsets exactly zero."""
    rows = ddp_rows(4, 4, 1, 200.0)
    for row in rows:
        row["end"] = float(row["end"]) + 3.0 * int(row["rank"])  # type: ignore[arg-type]
    c = estimate_offsets(match_collectives(frame(rows)))
    assert c.method == "single-clock" and c.offsets_us == {0: 0.0, 1: 0.0, 2: 0.0, 3: 0.0}
    assert len(set(c.hosts.values())) == 1


def test_every_rank_its_own_clock() -> None:
    """Offsets clearly apart (0, 1, 2, 3 ms) and no host names: each rank gets its own clock and the
    corrected arrivals put the 200 µs-late rank 1 back as the only late one."""
    m = match_collectives(frame(ddp_rows(4, 4, 1, 200.0, skew={r: 1_000.0 * r for r in range(4)})))
    c = estimate_offsets(m)
    assert c.method == "estimated" and len(set(c.hosts.values())) == 4
    for r in range(4):
        assert c.offsets_us[r] == pytest.approx(1_000.0 * r)


def test_hosts_from_run_info() -> None:
    """run.json as ``traceread collect`` writes it: offsets to ADD to a rank's times, null
    uncertainty when no measurement ran (then the offset is not trusted)."""
    info = {"ranks": {"0": {"host": "n1"}, "1": {"host": "n2"}, "2": {"host": "n3"}},
            "clock": {"offsets_us": {"0": 0.0, "1": -12.5, "2": 0.0},
                      "uncertainty_us": {"0": 0.0, "1": 3.0, "2": None}}}
    hosts, offs = hosts_from_run_info(info)
    assert hosts == {0: "n1", 1: "n2", 2: "n3"} and offs == {0: 0.0, 1: 12.5}
    assert recorded_uncertainty(info) == 3.0
    assert hosts_from_run_info(None) == ({}, {})


def test_link_and_busbw_factors() -> None:
    assert busbw_factor("allreduce", 8) == pytest.approx(1.75)
    assert busbw_factor("allgather", 8) == pytest.approx(0.875)
    assert busbw_factor("send", 2) == 1.0
    assert intra_node_link("Tesla V100-SXM2-32GB") == ("nvlink", 150.0)
    assert intra_node_link("NVIDIA H100 80GB HBM3") == ("nvlink", 450.0)
    assert intra_node_link("NVIDIA H100 PCIe") == ("pcie", 63.0)
    assert intra_node_link("Some Future GPU") == (None, None)
    m = match_collectives(frame(ddp_rows(4, 1, 0, 0.0)))
    row = collective_table(m, hosts={0: "a", 1: "a", 2: "b", 3: "b"}, network_gbps=50.0)[0]
    assert row["link"] == "network" and row["link_peak_gbps"] == 50.0
    row = collective_table(m, device_names={r: "NVIDIA H100 80GB HBM3" for r in range(4)})[0]
    assert row["link"] == "nvlink"


def _rank_trace(rank: int) -> RankTrace:
    """A tiny real-shaped RankTrace: one step, an allreduce kernel launched inside
    ``nccl:all_reduce`` without comm args (older torch), and one compute kernel."""
    host = pl.DataFrame([
        dict(row=0, cat="user_annotation", name="ProfilerStep#5", tid=1, ts=0.0, dur=1000.0, end=1000.0, depth=0),
        dict(row=1, cat="cpu_op", name="nccl:all_reduce", tid=1, ts=100.0, dur=30.0, end=130.0, depth=1, parent=0),
        dict(row=2, cat="cuda_runtime", name="cudaLaunchKernel", tid=1, ts=110.0, dur=5.0, end=115.0, depth=2,
             parent=1, correlation=7),
    ], schema=HOST_SCHEMA)
    gpu = pl.DataFrame([
        dict(kind="kernel", name="ncclKernel_AllReduce_RING_LL_Sum_float", stream=20, ts=120.0 + rank,
             dur=50.0, end=170.0 + rank, correlation=7, launch_row=2),
        dict(kind="kernel", name="volta_sgemm", stream=7, ts=10.0, dur=50.0, end=60.0, correlation=3),
    ], schema=GPU_SCHEMA)
    steps = pl.DataFrame([dict(step=5, ts=0.0, dur=1000.0, end=1000.0, tid=1)], schema=STEP_SCHEMA)
    return RankTrace(rank, f"r{rank}.json", RankMeta(rank=rank), gpu, host, steps, empty_frame(FLOW_SCHEMA))


def test_comm_events_extract_from_rank_trace() -> None:
    ex = comm_events(_rank_trace(3))
    assert ex.columns == list(EXTRACT_SCHEMA)
    assert ex.height == 1
    row = ex.row(0, named=True)
    assert row["op"] == "allreduce"  # from the nccl:all_reduce ancestor of the launch
    assert row["launch_ts"] == 110.0 and row["step"] == 5 and row["rank"] == 3
    m = match_collectives([comm_events(_rank_trace(r)) for r in range(2)])
    assert m.instances.height == 1 and m.instances["complete"][0]
    assert m.events["method"][0] == "ordinal"


def test_clockmodel_json() -> None:
    c = ClockModel({0: 0.0, 1: 3.0}, 5.0, {0: "a", 1: "b"}, "recorded")
    assert c.to_json()["offsets_us"] == {"0": 0.0, "1": 3.0}


def _gloo_rank(rank: int, late: float, pg_config: list[dict] | None = None) -> RankTrace:
    """A gloo CPU trace as ProcessGroupGloo writes it: the main thread (tid 1) issues six
    ``c10d::allreduce_`` ops (alternately small and large, as DDP's loss and gradient all-reduces),
    the pool of two worker threads (different tids per rank) runs them as ``gloo:all_reduce`` spans.
    Which worker picks up which collective is a race: here rank r's k-th runs on worker (k·(r+1)) % 3 % 2,
    so the thread <-> collective pairing differs between ranks. ``late`` delays the rank's issues."""
    rows = [dict(row=0, cat="user_annotation", name="ProfilerStep#3", tid=1, ts=0.0, dur=5000.0, end=5000.0, depth=0)]
    tids = (100 + rank, 200 + rank)
    for k in range(6):
        issue = 800.0 * k + 100.0 + late
        dims = "[[[1]], [], [], [], [], []]" if k % 2 == 0 else "[[[2632]], [], [], [], [], []]"
        rows.append(dict(row=len(rows), cat="cpu_op", name="c10d::allreduce_", tid=1, ts=issue, dur=20.0,
                         end=issue + 20.0, depth=1, parent=0, input_dims=dims))
        ts, end = issue + 30.0, 800.0 * k + 600.0  # everyone leaves together once the last arrived
        rows.append(dict(row=len(rows), cat="user_annotation", name="gloo:all_reduce", tid=tids[k * (rank + 1) % 3 % 2],
                         ts=ts, dur=end - ts, end=end, depth=0))
    host = pl.DataFrame(rows, schema=HOST_SCHEMA)
    steps = pl.DataFrame([dict(step=3, ts=0.0, dur=5000.0, end=5000.0, tid=1)], schema=STEP_SCHEMA)
    meta = RankMeta(rank=rank, backend="gloo", pg_config=pg_config or [])
    return RankTrace(rank, f"g{rank}.json", meta, empty_frame(GPU_SCHEMA), host, steps, empty_frame(FLOW_SCHEMA))


def test_gloo_worker_pool_matched_in_start_order() -> None:
    """The k-th gloo span of a rank (any worker thread) is its k-th collective: the pool's queue is FIFO."""
    ex = [comm_events(_gloo_rank(r, 300.0 if r == 1 else 0.0)) for r in range(3)]
    assert set(ex[0]["backend"]) == {"gloo"} and set(ex[0]["stream"]) == {0}  # one lane for the pool
    assert len(set(ex[1]["end"])) == 6
    # issue = the c10d op on the main thread; arrival = the worker's span start 30 µs later
    assert (ex[1]["ts"] - ex[1]["launch_ts"]).to_list() == pytest.approx([30.0] * 6)
    m = match_collectives(ex)
    assert m.mismatches == []
    assert m.instances.height == 6 and m.instances["complete"].all()
    # each instance pairs the same collective on every rank: identical ends by construction
    assert (m.events.group_by("instance").agg(pl.col("end").n_unique())["end"] == 1).all()
    assert (m.events.group_by("instance").agg(pl.col("launch_ts").max() - pl.col("launch_ts").min())
            ["launch_ts"] == 300.0).all()
    rows = collective_table(m)
    assert rows[0]["wait_us"] == pytest.approx(300.0 * 2 / 3)  # two ranks wait 300 µs, rank 1 none


def test_gloo_single_group_named_from_pg_config() -> None:
    """With one gloo group in ``distributedInfo.pg_config`` its name/ranks fill the extract, so
    membership is known (a missing rank shows as incomplete instead of a smaller group)."""
    cfg = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cpu:gloo,cuda:gloo", "pg_size": 3,
            "ranks": [0, 1, 2]}]
    ex = [comm_events(_gloo_rank(r, 0.0, cfg)) for r in range(2)]
    assert ex[0]["pg"].unique().to_list() == ["0"] and ex[0]["group_size"].unique().to_list() == [3]
    m = match_collectives(ex)
    assert m.instances.height == 6 and not m.instances["complete"].any()
    assert m.instances["missing"].to_list() == [[2]] * 6
    # two gloo groups: the trace cannot say which pool a thread serves, so no name is guessed
    two = cfg + [{"pg_name": "1", "pg_desc": "sub", "backend_config": "cpu:gloo", "pg_size": 3, "ranks": [0, 1, 2]}]
    assert comm_events(_gloo_rank(0, 0.0, two))["pg"].null_count() == 6


def test_pg_ranks_compacted_in_the_summary_and_read_back() -> None:
    """Complete member lists become range text (the summary must not grow with the world size);
    truncated ones stay as written; both forms give the same expected membership."""
    from traceread.analysis.comm.collectives import _parse_ranks, compact_pg_ranks

    full = str(list(range(0, 4096)))
    strided = str(list(range(3, 64, 8)))
    odd = "[0, 1, 5]"
    truncated = "[0, 1, 2, ...]"
    df = pl.DataFrame({"pg_ranks": [full, strided, odd, truncated, None, full]})
    got = compact_pg_ranks(df)["pg_ranks"].to_list()
    assert got == ["0-4095", "3-59:8", "0-1,5", truncated, None, "0-4095"]
    for raw, compact, size in ((full, "0-4095", 4096), (strided, "3-59:8", 8), (odd, "0-1,5", 3)):
        assert _parse_ranks(compact, size) == _parse_ranks(raw, size) is not None
    assert _parse_ranks("0-4095", 4000) is None and _parse_ranks(truncated, 4) is None
    assert _parse_ranks("rank one", None) is None


def test_summary_size_does_not_grow_with_the_world(tmp_path) -> None:
    """A DDP rank's summary at 64 ranks is the size of the same rank's at 8 ranks, to a few bytes (the
    member lists written out would add ~4 bytes per member per collective row: +195 bytes here)."""
    from traceread.assemble.run_map import summarise
    from traceread.engine.tasks import RankTask
    from traceread.simulate import simulate

    sizes = {}
    for world in (8, 64):
        simulate("ddp", tmp_path / str(world), ranks=world, steps=2, layers=1, hidden=256, seq_len=128, heads=4)
        _, data = summarise(RankTask(tmp_path / str(world) / "rank1.pt.trace.json.gz", use_cache=False))
        sizes[world] = len(data)
    assert abs(sizes[64] - sizes[8]) < 64, sizes


def test_message_size_is_nccl_tests_s() -> None:
    """nccl-tests' S: the gathered output for all-gather, the input for reduce-scatter and all-reduce
    (bus bandwidth is computed from it: a shard-sized S would be off by the group size)."""
    rows = [ev(r, 100.0, 300.0, op="allgather", kernel="ncclDevKernel_AllGather_RING_LL", seq=1,
               in_nelems=1 << 20, out_nelems=4 << 20, dtype="BFloat16", group_size=4) for r in range(4)]
    rows += [ev(r, 400.0, 600.0, op="reducescatter", kernel="ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL",
                seq=2, in_nelems=4 << 20, out_nelems=1 << 20, dtype="BFloat16", group_size=4) for r in range(4)]
    m = match_collectives(frame(rows))
    assert dict(zip(m.instances["op"], m.instances["bytes"])) == {"allgather": 8 << 20, "reducescatter": 8 << 20}


def test_a_rank_without_a_trace_is_missing_from_its_groups_collectives() -> None:
    """The group has 4 members (torch records the size) but rank 3 left no trace and the rank list was
    not recorded: every instance lacks a rank, and the matching says so."""
    rows = [r for r in ddp_rows(4, 2, 1, 0.0) if r["rank"] != 3]
    for r in rows:
        r["pg_ranks"] = None
    m = match_collectives(frame(rows))
    assert m.instances.height == 4
    assert m.instances["expected"].to_list() == [4] * 4 and not m.instances["complete"].any()
    assert any("lack ranks" in x for x in m.mismatches)


def test_clock_uncertainty_covers_the_noise_of_collective_ends() -> None:
    """Two hosts 5 ms apart; each collective's ends scatter by ±25 µs on every rank (busy hosts stamp
    late). The uncertainty must cover that scatter, so no wait below it is blamed, and stay under the
    200 µs that one rank really arrived late."""
    rows = ddp_rows(4, 6, 1, 200.0, skew={2: 5_000.0, 3: 5_000.0})
    for i, row in enumerate(rows):
        row["end"] = float(row["end"]) + (25.0 if (i // 4 + int(row["rank"])) % 2 else -25.0)  # type: ignore[arg-type]
    c = estimate_offsets(match_collectives(frame(rows)))
    assert c.method == "estimated" and c.offsets_us[2] == pytest.approx(5_000.0, abs=25.0)
    assert 25.0 <= c.epsilon_us < 200.0


def test_broadcasts_and_transfers_do_not_move_clocks() -> None:
    """One host. A broadcast's root is done as soon as it has sent (here 300 µs before the receivers),
    and so is a send before its recv: only collectives that end together on every member (all-reduce,
    all-gather, ...) may estimate offsets. Many broadcasts, few all-reduces: still one clock."""
    rows = ddp_rows(4, 2, 1, 0.0)
    for k in range(12):
        t = 50_000.0 + 1_000.0 * k
        rows += [ev(r, t, t + (100.0 if r == 0 else 400.0), op="broadcast", kernel="ncclDevKernel_Broadcast_RING_LL",
                    seq=100 + k, group_size=4) for r in range(4)]
        rows += [ev(0, t + 500.0, t + 600.0, op="send", p2p=True, kernel="ncclDevKernel_SendRecv", src_rank=0,
                    dst_rank=1, seq=None), ev(1, t + 500.0, t + 900.0, op="recv", p2p=True,
                                              kernel="ncclDevKernel_SendRecv", src_rank=0, dst_rank=1, seq=None)]
    c = estimate_offsets(match_collectives(frame(rows)))
    assert c.method == "single-clock" and set(c.offsets_us.values()) == {0.0}
