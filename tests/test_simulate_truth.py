"""Ground-truth arithmetic of the simulator: interval sweeps, breakdown identity, bubble theory, blame."""

from __future__ import annotations

import random
from fractions import Fraction
from pathlib import Path

import pytest

from traceread.simulate import simulate
from traceread.simulate.devices import DEVICES, launch_stats
from traceread.simulate.scenarios import pipeline_order
from traceread.simulate.truth import breakdown, sm_efficiency, union_len

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
