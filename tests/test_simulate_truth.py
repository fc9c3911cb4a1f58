"""Ground-truth arithmetic of the simulator: interval sweeps, breakdown identity, bubble theory, blame, step ledger, layout."""

from __future__ import annotations

import random
from fractions import Fraction
from pathlib import Path

import pytest

from traceread.simulate import simulate
from traceread.simulate.devices import DEVICES, launch_stats
from traceread.simulate.ledger_truth import CATEGORIES, JobLedger, LedgerModel, Seg, job_segments
from traceread.simulate.scenarios import SCENARIO_DEFAULTS, Knobs, build, pipeline_order
from traceread.simulate.truth import breakdown, sm_efficiency, step_windows, union_len

SMALL = {"layers": 1, "hidden": 1024, "heads": 8, "seq_len": 512, "steps": 2}


def _cells(intervals: list[tuple[int, int]]) -> set[int]:
    """Brute force: the unit cells [t, t+1) covered by integer intervals."""
    return {t for s, e in intervals for t in range(s, e)}


def test_breakdown_matches_brute_force_cell_counting() -> None:
    rng = random.Random(7)
    for _ in range(200):
        sets = [[(s, s + rng.randint(0, 15)) for s in (rng.randint(0, 80) for _ in range(rng.randint(0, 6)))]
                for _ in range(3)]
        comp, comm, mem = sets
        window = 100
        b = breakdown(comp, comm, mem, window)
        c, m, y = _cells(comp), _cells(comm), _cells(mem)
        assert b["compute"] == len(c)
        assert b["comm"] == len(m)
        assert b["exposed_comm"] == len(m - c)
        assert b["exposed_memcpy"] == len(y - c - m)
        assert b["idle"] == window - len(c | m | y)
        assert b["overlap"] == len(c & m)
        assert b["compute"] + b["exposed_comm"] + b["exposed_memcpy"] + b["idle"] == window
        assert union_len(comp) == len(c)


def test_sm_efficiency_sums_concurrent_kernels_and_clips_at_one() -> None:
    # [0,10): 0.5 alone; [10,20): 0.5 + 0.75 -> clipped to 1; [20,30): 0.75; [30,40): nothing
    kernels = [(0, 20, 0.5), (10, 30, 0.75)]
    expected = (0.5 * 10 + 1.0 * 10 + 0.75 * 10) / 40 * 100
    assert sm_efficiency(kernels, 0, 40) == pytest.approx(expected)
    # clipping to the window
    assert sm_efficiency(kernels, 10, 20) == pytest.approx(100.0)


def test_launch_stats_follow_libkineto() -> None:
    h100 = DEVICES["H100"]
    st = launch_stats(h100, (64, 32, 1), (384, 1, 1), 168, 213_248)
    assert st.blocks_per_sm == round(2048 / 132, 6)
    assert st.warps_per_sm == pytest.approx(st.blocks_per_sm * 384 / 32, abs=1e-5)
    assert st.occupancy_pct == round(100 * 1 * 384 / 2048)  # one block fits (smem-limited)
    tiny = launch_stats(h100, (2, 1, 1), (544, 1, 1), 96, 87_568)
    assert tiny.occupancy_pct == round(100 * (2 / 132) * 544 / 2048)


def test_device_table_uses_dense_peaks_and_real_sm_counts() -> None:
    assert (DEVICES["H100"].num_sms, DEVICES["A100"].num_sms, DEVICES["B200"].num_sms) == (132, 108, 148)
    assert (DEVICES["H100"].peak_bf16_tflops, DEVICES["A100"].peak_bf16_tflops,
            DEVICES["B200"].peak_bf16_tflops) == (989.4, 312.0, 2250.0)


@pytest.mark.parametrize(("schedule", "stages", "micro", "chunks"), [
    ("gpipe", 2, 3, 1), ("gpipe", 4, 8, 1), ("gpipe", 3, 1, 1),
    ("1f1b", 2, 3, 1), ("1f1b", 4, 8, 1), ("1f1b", 3, 1, 1),
    ("interleaved", 4, 8, 2), ("interleaved", 4, 4, 2), ("interleaved", 3, 6, 3),
])
def test_pipeline_bubble_equals_theory_exactly(tmp_path: Path, schedule: str, stages: int, micro: int,
                                               chunks: int) -> None:
    """Equal stages, free transfers, no jitter, GPU-bound (fast host): bubble == (P-1)/(P-1+v·M) exactly."""
    kn = {**SMALL, "layers": stages * chunks, "steps": 1}
    truth = simulate("pp", tmp_path, ranks=stages, microbatches=micro, schedule=schedule, chunks=chunks, p2p_us=0.0,
                     jitter=0.0, batch=1, host_speed=0.05, **kn)
    p = truth["pipeline"]
    theory = Fraction(stages - 1, stages - 1 + chunks * micro)
    for ex in p["exact"]:
        for busy in ex["busy_ns"]:
            assert Fraction(ex["span_ns"] - busy, ex["span_ns"]) == theory
    assert p["bubble_pct"] == pytest.approx(float(theory) * 100, rel=1e-12)
    assert p["theory_bubble_pct"] == pytest.approx(float(theory) * 100, rel=1e-15)


def test_pipeline_orders_are_valid_schedules() -> None:
    for sched, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 2)):
        for p in range(4):
            order = pipeline_order(p, 4, 8, sched, v)
            work = [(c, i) for c in range(v) for i in range(8)]
            assert sorted(order) == sorted([("F", c, i) for c, i in work] + [("B", c, i) for c, i in work])
            assert all(order.index(("F", c, i)) < order.index(("B", c, i)) for c, i in work)
    # 1F1B keeps at most P - p forwards in flight on stage p
    order = pipeline_order(0, 4, 8, "1f1b")
    in_flight = max(sum(1 for k, *_ in order[: j + 1] if k == "F") - sum(1 for k, *_ in order[: j + 1] if k == "B")
                    for j in range(len(order)))
    assert in_flight == 4


def test_unequal_stage_slows_pipeline_beyond_theory(tmp_path: Path) -> None:
    truth = simulate("pp", tmp_path, ranks=4, microbatches=4, schedule="1f1b", p2p_us=0.0, jitter=0.0, batch=1,
                     host_speed=0.05, stage_factors=[1.0, 1.0, 1.6, 1.0], **SMALL)
    p = truth["pipeline"]
    assert p["bubble_pct"] > p["theory_bubble_pct"] + 5
    slow = p["bubble_pct_per_stage"][2]
    assert slow == min(p["bubble_pct_per_stage"])  # the slow stage is the busiest


@pytest.fixture(scope="module")
def ddp_gpu_straggler(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("ddp_gpu")
    return simulate("ddp", out, ranks=4, buckets=2, stragglers=[(2, 2000.0, "gpu")], layers=2, hidden=2048,
                    heads=16, seq_len=1024, steps=3)


def test_breakdown_identity_holds_per_rank_and_step(ddp_gpu_straggler: dict) -> None:
    for r in ddp_gpu_straggler["ranks"].values():
        b = r["breakdown_ns"]
        assert b["compute"] + b["exposed_comm"] + b["exposed_memcpy"] + b["idle"] == b["window"]
        total = r["compute_us"] + r["exposed_comm_us"] + r["exposed_memcpy_us"] + r["idle_us"]
        assert total == pytest.approx(r["window_us"], abs=1e-6)
        assert r["gpu_busy_us"] + r["idle_us"] == pytest.approx(r["window_us"], abs=1e-6)
        for st in r["steps"]:
            s = st["compute_us"] + st["exposed_comm_us"] + st["exposed_memcpy_us"] + st["idle_us"]
            assert s == pytest.approx(st["duration_us"], abs=1e-6)
        assert 0 < r["comm_overlap_pct"] <= 100
        assert 0 < r["sm_efficiency_pct"] <= 100
        assert 0 < r["achieved_occupancy_pct"] <= 100


def test_blame_follows_its_definition(ddp_gpu_straggler: dict) -> None:
    """blame = Σ over collectives a rank joined last of (its arrival − next-latest arrival) / steps."""
    truth = ddp_gpu_straggler
    blame = {int(r): 0.0 for r in truth["ranks"]}
    for c in truth["collectives"]:
        arr = sorted(((t, int(r)) for r, t in c["arrivals_us"].items()))
        assert c["last_rank"] == arr[-1][1]
        assert c["waits_us"][str(c["last_rank"])] == 0.0
        for r, t in c["arrivals_us"].items():
            assert c["waits_us"][r] == pytest.approx(arr[-1][0] - t, abs=1e-5)
        blame[arr[-1][1]] += arr[-1][0] - arr[-2][0]
    n = len(truth["steps"])
    for r, v in blame.items():
        assert truth["ranks"][str(r)]["blame_us_per_step"] == pytest.approx(v / n, abs=1e-3)
    (s,) = truth["stragglers"]
    assert (s["rank"], s["cause"]) == (2, "gpu")
    assert s["blame_us_per_step"] == max(r["blame_us_per_step"] for r in truth["ranks"].values())
    # the straggler arrived last at every all-reduce
    assert all(c["last_rank"] == 2 for c in truth["collectives"])
    # what-if cost: positive, at most the injected 2 ms of extra compute per step (plus jitter)
    assert 0 < s["step_cost_us"] <= 2000 * 1.05
    assert truth["straggler_step_cost_us"] == s["step_cost_us"]


def test_host_straggler_blame_close_to_injected_delay(tmp_path: Path) -> None:
    truth = simulate("ddp", tmp_path, ranks=4, buckets=2, stragglers=[(1, 4000.0, "host")], jitter=0.0, **SMALL)
    (s,) = truth["stragglers"]
    assert s["cause"] == "host"
    # a late host delays the straggler's first bucket by the whole delay; later ones overlap it
    assert s["blame_us_per_step"] == pytest.approx(4000.0, rel=0.05)
    others = [r["blame_us_per_step"] for k, r in truth["ranks"].items() if k != "1"]
    assert max(others) < 50
    assert s["step_cost_us"] == pytest.approx(4000.0, rel=0.05)  # a late start delays the whole step


def test_collective_ends_are_simultaneous_and_transfer_is_min_duration(ddp_gpu_straggler: dict) -> None:
    for c in ddp_gpu_straggler["collectives"]:
        last = max(c["arrivals_us"].values())
        assert c["end_us"] - last == pytest.approx(c["transfer_us"], abs=1e-5)
        assert len(c["arrivals_us"]) == 4


def test_mfu_and_model_flops_from_ops(tmp_path: Path) -> None:
    truth = simulate("ddp", tmp_path, ranks=2, **SMALL)
    r0 = truth["ranks"]["0"]
    n_steps = len(truth["steps"])
    model = sum(o["model_flops"] * o["calls"] for o in truth["ops"] if o["matmul"]) / n_steps
    hw = sum(o["flops"] * o["calls"] for o in truth["ops"] if o["matmul"]) / n_steps
    assert r0["model_flops_per_step"] == model and r0["hardware_flops_per_step"] == hw and hw > model
    assert sum(s["model_flops"] for s in r0["steps"]) == model * n_steps
    mean_step_s = sum(s["duration_us"] for s in r0["steps"]) / len(r0["steps"]) / 1e6
    assert r0["mfu_pct"] == pytest.approx(100 * model / (mean_step_s * 989.4e12), rel=1e-9)
    assert r0["hfu_pct"] == pytest.approx(100 * hw / (mean_step_s * 989.4e12), rel=1e-9)
    for st in r0["steps"]:
        assert st["mfu_pct"] == pytest.approx(100 * st["model_flops"] / (st["duration_us"] * 1e-6 * 989.4e12),
                                              rel=1e-9)
    mm = [o for o in truth["ops"] if o["name"] == "aten::mm"]
    for o in mm:
        (m, k), (k2, n) = o["input_dims"]
        assert k == k2 and o["flops"] == o["model_flops"] == 2 * m * n * k
        assert o["bytes"] == 2 * (m * k + k * n + m * n)
    (fa,) = [o for o in truth["ops"] if o["name"] == "aten::_scaled_dot_product_flash_attention"]
    b, h, s, d = fa["input_dims"][0]
    pairs = s * (s + 1) // 2  # causal: query i attends keys 0..i
    assert fa["flops"] == fa["model_flops"] == 4 * b * h * pairs * d
    (fb,) = [o for o in truth["ops"] if o["name"] == "aten::_scaled_dot_product_flash_attention_backward"]
    assert (fb["flops"], fb["model_flops"]) == (10 * b * h * pairs * d, 8 * b * h * pairs * d)
    assert fb["bytes"] == 2 * 8 * b * h * s * d + 4 * b * h * s  # + fp32 logsumexp
    (ln,) = [o for o in truth["ops"] if o["name"] == "aten::native_layer_norm"]
    (m, c), _, _ = ln["input_dims"]
    assert (ln["flops"], ln["bytes"]) == (7 * m * c, 2 * (2 * m * c + 2 * c) + 8 * m)
    assert not any(o["matmul"] for o in truth["ops"] if "norm" in o["name"] or "gelu" in o["name"])


def test_causal_pairs_row_by_row() -> None:
    from traceread.simulate.layers import causal_pairs

    assert causal_pairs(4, 4) == 1 + 2 + 3 + 4
    assert causal_pairs(2, 5) == 4 + 5  # bottom-right: the last query sees every key
    assert causal_pairs(5, 2) == 0 + 0 + 0 + 1 + 2
    assert causal_pairs(512, 512) == 512 * 513 // 2


def test_slow_steps_truth(tmp_path: Path) -> None:
    truth = simulate("slow_steps", tmp_path, ranks=2, device="A100", **{**SMALL, "steps": 5},
                     slow_steps=[(11, "dataloader", 20000.0), (12, "gc", 10000.0), (13, "checkpoint", 30000.0)])
    got = {s["step"]: s for s in truth["slow_steps"]}
    assert set(got) == {11, 12, 13}
    for step, inj in ((11, 20000.0), (12, 10000.0), (13, 30000.0)):
        assert got[step]["excess_us"] == pytest.approx(inj, rel=0.05)
    durations = [st["duration_us"] for st in truth["ranks"]["0"]["steps"]]
    assert durations[1] > durations[0] + 15000 and durations[3] > durations[4] + 25000


def test_clock_offsets_per_host(tmp_path: Path) -> None:
    truth = simulate("ddp", tmp_path, ranks=4, hosts=2, skew_us=750.0, **SMALL)
    assert truth["clock_offsets_us"] == {"0": 0.0, "1": 0.0, "2": 750.0, "3": 750.0}
    assert truth["stragglers"] == []


# ---- ledger and layout truth (issue #10) --------------------------------------------------------------


#: every scenario, small enough to run in well under a second each
LEDGER_CASES: dict[str, dict] = {
    "ddp": {**SMALL, "ranks": 4, "stragglers": [(2, 800.0, "gpu")]},
    "ddp_fsdp": {**SMALL, "ranks": 4, "comm": "fsdp", "layers": 3},
    "tp": {**SMALL, "ranks": 4, "tp": 2},
    "pp": {**SMALL, "ranks": 3, "microbatches": 3, "batch": 1, "layers": 3},
    "slow_steps": {**SMALL, "ranks": 2, "slow_steps": [(11, "dataloader", 3000.0)]},
    "skew": {**SMALL, "ranks": 4, "hosts": 2, "skew_us": 500.0},
    "3d": {**SMALL, "ranks": 8, "tp": 2, "pp": 2, "gpus_per_node": 3, "layers": 2, "microbatches": 2},
    "fsdp_exposed": {**SMALL, "ranks": 4, "layers": 3},
    "moe": {**SMALL, "ranks": 4, "hot_rank": 1},
    "custom_allreduce": {**SMALL, "ranks": 4, "tp": 2},
    "host_bound": {**SMALL, "ranks": 2, "loader_us": 2000.0},
}


def _scenario(case: str) -> str:
    return {"ddp_fsdp": "ddp", "skew": "ddp"}.get(case, case)


@pytest.fixture(scope="module")
def ledger_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    return {case: simulate(_scenario(case), tmp_path_factory.mktemp(case), **kn) for case, kn in LEDGER_CASES.items()}


def _built(case: str):  # type: ignore[no-untyped-def]
    kn = {**SCENARIO_DEFAULTS.get(_scenario(case), {}), **LEDGER_CASES[case]}
    return build(_scenario(case), Knobs(**kn))


@pytest.mark.parametrize("case", list(LEDGER_CASES))
def test_ledger_identity_exact_in_ns_per_rank_and_job(case: str) -> None:
    """Rank ledgers and the job ledger of every step sum to the step window exactly (whole ns)."""
    built = _built(case)
    windows = {c.rank: step_windows(c) for c in built.sim.ranks}
    for split in (True, False):
        segs = job_segments(built, windows, split=split)
        for r, per in segs.items():
            for step, ss in per.items():
                s, e = windows[r][step]
                assert sum(g.t1 - g.t0 for g in ss) == e - s
                assert all(g.t1 > g.t0 for g in ss)
                assert [g.t0 for g in ss] == sorted(g.t0 for g in ss)
                assert ss[0].t0 == s and ss[-1].t1 == e and all(a.t1 == b.t0 for a, b in zip(ss, ss[1:]))
                assert {g.category for g in ss} <= set(CATEGORIES)
    job = JobLedger(job_segments(built, windows), windows, built.knobs.ranks)
    for step in built.knobs.step_numbers():
        crit, parts = job.step_ns(step)
        s, e = windows[crit][step]
        assert sum(parts.values()) == e - s
        assert e - s == max(w[step][1] - w[step][0] for w in windows.values())


@pytest.mark.parametrize("case", list(LEDGER_CASES))
def test_ledger_json_shape_and_agreement_with_the_breakdown(case: str, ledger_runs: dict[str, dict]) -> None:
    """The ledger refines the independent interval breakdown of the same step: compute categories sum to
    |COMP|, exposed_memcpy equals |MEMCPY − COMP − COMM|; the one-rank view differs only in waits."""
    truth = ledger_runs[case]
    for rt in truth["ranks"].values():
        assert set(rt["ledger"]) == {str(s) for s in truth["steps"]}
        for st in rt["steps"]:
            led, loc = rt["ledger"][str(st["step"])], rt["ledger_local"][str(st["step"])]
            for part in (led, loc):
                assert sum(part.values()) == pytest.approx(st["duration_us"], abs=1e-6)
                assert all(v > 0 for v in part.values())
                for key in part:
                    cat, _, role = key.partition(":")
                    assert cat in CATEGORIES
                    assert bool(role) == (cat in ("comm_wait", "comm_transfer", "bubble"))
                    assert role in ("", "dp", "fsdp", "tp", "cp", "pp", "ep", "other")
            comp = sum(led.get(c, 0.0) for c in ("compute_bound", "memory_bound", "compute_other"))
            assert comp == pytest.approx(st["compute_us"], abs=1e-6)
            assert led.get("exposed_memcpy", 0.0) == pytest.approx(st["exposed_memcpy_us"], abs=1e-6)
            assert not any(k.startswith("comm_wait") for k in loc)
            for key in set(led) | set(loc):
                if not key.startswith(("comm_", "bubble")):
                    assert led.get(key) == loc.get(key)
            assert _waits(led) == pytest.approx(_waits(loc), abs=1e-6)
    job = truth["ledger"]
    assert set(job) == {"step", "step_us", "critical_rank", "parts", "spans"}  # spans: host time by covering span
    assert job == truth["ledger_by_step"][str(job["step"])]
    assert sum(p["us"] for p in job["parts"]) == pytest.approx(job["step_us"], abs=1e-6)
    for p in job["parts"]:
        assert set(p) == {"category", "role", "rank", "us"} and p["us"] > 0
        assert (p["role"] is None) == (p["category"] not in ("comm_wait", "comm_transfer", "bubble"))
    crits = sorted((truth["ledger_by_step"][str(s)]["step_us"], s) for s in truth["steps"])
    assert job["step"] == crits[(len(crits) - 1) // 2][1]


def test_job_ledger_gives_waits_to_the_late_peer(ledger_runs: dict[str, dict]) -> None:
    """DDP with a GPU straggler: the waiting ranks' comm_wait becomes the straggler's compute."""
    truth = ledger_runs["ddp"]
    waits = {r: sum(v for k, v in rt["ledger"][str(truth["ledger"]["step"])].items() if k.startswith("comm_wait"))
             for r, rt in truth["ranks"].items()}
    assert waits["2"] < min(v for r, v in waits.items() if r != "2")
    job = truth["ledger"]
    if job["critical_rank"] != 2:
        straggler = sum(p["us"] for p in job["parts"] if p["rank"] == 2 and p["category"].startswith("compute"))
        assert straggler > 0
        assert not any(p["category"] == "comm_wait" for p in job["parts"])


def test_host_bound_truth(ledger_runs: dict[str, dict]) -> None:
    truth = ledger_runs["host_bound"]
    for rt in truth["ranks"].values():
        for led in rt["ledger"].values():
            assert led["host_bound"] > 2000.0  # the loader's 2 ms, plus the launch path before the H2D copy
            assert led["host_bound"] == max(led.values())
    top = max(truth["ledger"]["parts"], key=lambda p: p["us"])
    assert top["category"] == "host_bound"


def test_moe_hot_expert_rank_makes_others_wait_in_all_to_all(ledger_runs: dict[str, dict]) -> None:
    truth = ledger_runs["moe"]
    step = str(truth["ledger"]["step"])
    ep_wait = {int(r): rt["ledger"][step].get("comm_wait:ep", 0.0) for r, rt in truth["ranks"].items()}
    assert ep_wait[1] < min(v for r, v in ep_wait.items() if r != 1)
    hot_compute = sum(p["us"] for p in truth["ledger"]["parts"] if p["rank"] == 1 and p["category"].startswith("comp"))
    assert hot_compute > 0
    roles = {g["desc"]: g["role"] for g in truth["layout"]["groups"]}
    assert roles == {"default_pg": "dp", "undefined": "ep"}
    assert truth["layout"]["degrees"]["ep"] == 4


def test_fsdp_without_prefetch_exposes_the_all_gather(ledger_runs: dict[str, dict]) -> None:
    def fsdp_comm(truth: dict) -> float:
        led = truth["ranks"]["0"]["ledger"][str(truth["ledger"]["step"])]
        return led.get("comm_wait:fsdp", 0.0) + led.get("comm_transfer:fsdp", 0.0)

    assert fsdp_comm(ledger_runs["fsdp_exposed"]) > 1.5 * fsdp_comm(ledger_runs["ddp_fsdp"])
    assert ledger_runs["fsdp_exposed"]["layout"]["degrees"]["fsdp"] == 4


def test_custom_allreduce_is_communication(ledger_runs: dict[str, dict]) -> None:
    truth = ledger_runs["custom_allreduce"]
    rt = truth["ranks"]["0"]
    assert rt["comm_kernels"] > rt["nccl_kernels"] > 0  # TP all-reduce: multimem; DP: NCCL
    assert rt["ledger"][str(truth["ledger"]["step"])]["comm_transfer:tp"] > 0


def test_layout_3d_tp_group_across_nodes(ledger_runs: dict[str, dict]) -> None:
    """8 ranks = DP2 x TP2 x PP2 with 3 GPUs per node: TP group [2, 3] spans nodes 0 and 1."""
    lay = ledger_runs["3d"]["layout"]
    assert lay["degrees"] == {"dp": 2, "fsdp": 1, "tp": 2, "pp": 2, "cp": 1, "ep": 1}
    assert set(lay) == {"degrees", "groups", "node_source"}
    for g in lay["groups"]:
        assert set(g) == {"pg", "desc", "role", "size", "ranks", "nodes", "evidence"}
        assert g["size"] == len(g["ranks"])
        assert g["desc"] == ("default_pg" if g["pg"] == "0" else "undefined")
        assert g["nodes"] == sorted({r // 3 for r in g["ranks"]})
    by_ranks = {tuple(g["ranks"]): g for g in lay["groups"]}
    assert by_ranks[(2, 3)]["role"] == "tp" and by_ranks[(2, 3)]["nodes"] == [0, 1]
    assert by_ranks[(0, 4)]["role"] == "pp" and by_ranks[(0, 2)]["role"] == "dp"
    assert by_ranks[tuple(range(8))]["role"] == "other"
    assert {r: rt["node"] for r, rt in ledger_runs["3d"]["ranks"].items()} == {str(r): r // 3 for r in range(8)}


def test_layout_of_the_classic_scenarios(ledger_runs: dict[str, dict]) -> None:
    deg = {case: ledger_runs[case]["layout"]["degrees"] for case in ("ddp", "ddp_fsdp", "tp", "pp")}
    assert deg["ddp"]["dp"] == 4 and deg["ddp_fsdp"]["fsdp"] == 4 and deg["ddp_fsdp"]["dp"] == 1
    assert (deg["tp"]["tp"], deg["tp"]["dp"]) == (2, 2)
    assert deg["pp"]["pp"] == 3
    assert [g["nodes"] for g in ledger_runs["skew"]["layout"]["groups"]] == [[0, 1]]


@pytest.mark.parametrize("case", ["ddp", "pp", "3d", "moe", "host_bound", "custom_allreduce"])
def test_ledger_sweep_agrees_with_the_rules_at_random_instants(case: str) -> None:
    """An independent point query of the contract's rules at random instants gives the sweep's label."""
    built = _built(case)
    model = LedgerModel(built)
    windows = {c.rank: step_windows(c) for c in built.sim.ranks}
    segs = job_segments(built, windows)
    rng = random.Random(3)
    for ctx in built.sim.ranks[:4]:
        pp_steps = {o.step for o in ctx.gpu if o.comm is not None and o.comm.src_rank is not None
                    and model.role(o) == "pp"}
        for step, (s, e) in windows[ctx.rank].items():
            for t in (rng.randrange(s, e) for _ in range(300)):
                run = [o for o in ctx.gpu if o.start <= t < o.end]
                comps = [o for o in run if o.cls == "comp"]
                comms = [o for o in run if o.cls == "comm"]
                if comps:
                    bounds = {model.bound[id(o)] for o in comps}
                    want = ("compute_bound" if "compute" in bounds else "memory_bound" if "memory" in bounds
                            else "compute_other", None)
                elif comms:
                    k = min(comms, key=lambda o: (o.start, o.launch.ts))
                    role = model.role(k)
                    waiting = t < max(m.arrival for m in built.sim.instances[k.comm.key])
                    want = (("bubble" if role == "pp" else "comm_wait") if waiting else "comm_transfer", role)
                elif run:
                    want = ("exposed_memcpy", None)
                else:
                    b = min([o.start for o in ctx.gpu if o.start > t] + [e])
                    a = max([o.end for o in ctx.gpu if o.end <= t] + [s])
                    if b >= e:
                        want = ("idle_other", None)
                    else:
                        first = min((o for o in ctx.gpu if o.start == b), key=lambda o: o.launch.ts)
                        if t < min(max(first.launch.ts, a), b):
                            want = ("host_bound", None)
                        else:
                            want = ("bubble", "pp") if step in pp_steps else ("dependency", None)
                got = next(g for g in segs[ctx.rank][step] if g.t0 <= t < g.t1)
                assert (got.category, got.role) == want, (case, ctx.rank, step, t)


def test_job_ledger_follows_late_peers_recursively() -> None:
    """Rank 0 waits [10, 40) for rank 1; rank 1 computes [10, 20), waits [20, 30) for rank 2, and has no
    step data after 30. Rank 2 is memory-bound over [20, 30). Uncovered time stays the waiter's comm_wait."""
    segs = {
        0: {10: [Seg(0, 10, "compute_bound"), Seg(10, 40, "comm_wait", "dp", 1), Seg(40, 50, "comm_transfer", "dp")]},
        1: {10: [Seg(0, 20, "compute_bound"), Seg(20, 30, "comm_wait", "tp", 2)]},
        2: {10: [Seg(0, 20, "idle_other"), Seg(20, 30, "memory_bound"), Seg(30, 45, "compute_other")]},
    }
    windows = {0: {10: (0, 50)}, 1: {10: (0, 30)}, 2: {10: (0, 45)}}
    crit, parts = JobLedger(segs, windows, 3).step_ns(10)
    assert crit == 0
    assert dict(parts) == {("compute_bound", None, 0): 10, ("compute_bound", None, 1): 10,
                           ("memory_bound", None, 2): 10, ("comm_wait", "dp", 0): 10,
                           ("comm_transfer", "dp", 0): 10}


def test_truth_never_imports_the_analysis() -> None:
    """Truth must come from the simulator's schedule: no module of traceread.simulate imports traceread.analysis."""
    import ast

    import traceread.simulate as pkg

    for path in Path(pkg.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.startswith("traceread.analysis") for n in names), path


def test_layout_nodes_are_machines_of_at_most_eight_gpus(tmp_path: Path) -> None:
    truth = simulate("ddp", tmp_path, ranks=16, **SMALL)
    assert truth["layout"]["groups"][0]["nodes"] == [0, 1]
    assert [truth["ranks"][str(r)]["node"] for r in (0, 7, 8, 15)] == [0, 0, 1, 1]


def _waits(ledger: dict[str, float]) -> float:
    """Time a ledger spends waiting: communication and pipeline bubble."""
    return sum(v for k, v in ledger.items() if k.startswith(("comm_", "bubble")))
