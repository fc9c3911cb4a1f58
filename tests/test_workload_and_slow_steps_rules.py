"""The workload and slow-step rules, each branch with an input that only it answers right.

Written from the survivors of the generated mutation run of the ``steps`` area (docs/benchmarks.md,
"Generated mutants"): the rank's workload kind and its evidence (docs/layout.md), the job's from its
ranks', the engine named by its operators or its iterations, and the slow-step rule's causes, details
and baseline (traceread/analysis/time/slow_steps.py's definitions). Every expected value is worked out
by hand from the hand-built input.
"""

from __future__ import annotations

from typing import Any

import polars as pl
import pytest
from rank_factory import frame, host_rows

from traceread.analysis.time.iterations import engine_iterations, job_workload, workload
from traceread.analysis.time.slow_steps import find_slow_steps
from traceread.model import HOST_SCHEMA


def _host(*rows: tuple[str, str, float, float]) -> pl.DataFrame:
    """(category, name, start µs, duration µs) rows on one thread."""
    return frame(host_rows([{"cat": c, "name": n, "ts": t, "dur": d} for c, n, t, d in rows]), HOST_SCHEMA)


# ---- workload (docs/layout.md: training, serving, inference, unknown) ---------------------------------------


def test_backward_alone_is_training() -> None:
    host = _host(("cpu_op", "autograd::engine::evaluate_function: AddmmBackward0", 0.0, 5.0),
                 ("cpu_op", "autograd::engine::evaluate_function: MulBackward0", 10.0, 5.0))
    w = workload(host, True, None, True)
    assert (w["kind"], w["engine"], w["evidence"]) == ("training", None, "2 backward node(s)")


def test_optimizer_step_alone_is_training() -> None:
    host = _host(("user_annotation", "Optimizer.step#SGD.step", 0.0, 5.0))
    w = workload(host, True, None, True)
    assert (w["kind"], w["evidence"]) == ("training", "1 optimizer step(s)")


def test_backward_and_optimizer() -> None:
    host = _host(("cpu_op", "autograd::engine::evaluate_function: AddmmBackward0", 0.0, 5.0),
                 ("user_annotation", "Optimizer.step#AdamW.step", 10.0, 5.0))
    assert workload(host, True, None, True)["evidence"] == "1 backward node(s) and 1 optimizer step(s)"


@pytest.mark.parametrize(("has_steps", "evidence"), [
    (True, "GPU work with no backward and no optimizer step"),
    (False, "GPU work with no backward and no optimizer step, no ProfilerStep"),
])
def test_gpu_work_without_backward_is_inference(has_steps: bool, evidence: str) -> None:
    host = _host(("cpu_op", "aten::mm", 0.0, 5.0))
    w = workload(host, has_steps, None, True)
    assert (w["kind"], w["engine"], w["evidence"], w["iterations"]) == ("inference", None, evidence, {})


@pytest.mark.parametrize("host", [_host(), _host(("cpu_op", "aten::mm", 0.0, 5.0))], ids=["empty", "cpu-only"])
def test_nothing_to_tell_is_unknown(host: pl.DataFrame) -> None:
    w = workload(host, False, None, False)
    assert (w["kind"], w["engine"]) == ("unknown", None)


def test_engine_operators_name_the_engine_the_most_calls_win() -> None:
    """No iteration annotation: the engine operators say serving, the engine with the most calls (vLLM's
    one call comes first, SGLang's three after it)."""
    host = _host(("cpu_op", "vllm::unified_attention", 0.0, 5.0), ("cpu_op", "sgl_kernel::rmsnorm", 10.0, 5.0),
                 ("cpu_op", "sgl_kernel::silu_and_mul", 20.0, 5.0), ("cpu_op", "sgl_kernel::rmsnorm", 30.0, 5.0))
    for _ in range(30):  # polars counts in parallel: an unsorted count's order varies run to run
        w = workload(host, False, None, True)
        assert (w["kind"], w["engine"], w["evidence"]) == ("serving", "sglang", "sglang engine operators, no backward")
    vllm = workload(_host(("cpu_op", "vllm::unified_attention", 0.0, 5.0)), False, None, True)
    assert (vllm["kind"], vllm["engine"]) == ("serving", "vllm")


def test_iterations_name_the_engine_over_its_operators() -> None:
    """SGLang's scheduler iterations with vLLM kernels inside (SGLang calls some of vLLM's ops): SGLang."""
    host = _host(("user_annotation", "step[DECODE bs=4]", 0.0, 100.0), ("cpu_op", "vllm::rms_norm", 10.0, 5.0),
                 ("user_annotation", "step[FOO bs=1]", 200.0, 100.0))
    its = engine_iterations(host)
    assert its is not None and its.engine == "sglang"
    w = workload(host, False, its, True)
    assert (w["kind"], w["engine"]) == ("serving", "sglang")
    assert w["iterations"] == {"decode": 1, "unknown": 1}  # step[FOO …]: an iteration of no known kind
    assert w["evidence"] == "2 sglang iteration annotation(s) used as steps"


def test_both_iteration_forms_name_sglang() -> None:
    """``step[…]`` is SGLang's scheduler's own name; ``execute_…`` is added to other engines' traces too."""
    host = _host(("user_annotation", "execute_8_context_0()_generation_8(a)", 0.0, 100.0),
                 ("user_annotation", "step[DECODE bs=8]", 200.0, 100.0))
    its = engine_iterations(host)
    assert its is not None and its.engine == "sglang" and its.kinds == {0: "decode", 1: "decode"}


def test_iteration_annotations_recorded_as_operators_count() -> None:
    """Some engines' iteration spans are recorded as ``cpu_op`` rows (a custom op around the model runner)."""
    its = engine_iterations(_host(("cpu_op", "execute_16_context_2(a,b)_generation_0()", 0.0, 100.0)))
    assert its is not None and its.kinds == {0: "prefill"} and its.engine == "vllm"


def test_nested_iteration_ending_with_its_parent_is_dropped() -> None:
    """Nested = starts inside the previous and ends no later than it: ending at the same µs is nested."""
    its = engine_iterations(_host(("user_annotation", "step[DECODE bs=8]", 0.0, 100.0),
                                  ("user_annotation", "step[DECODE bs=8]", 40.0, 60.0)))
    assert its is not None and its.steps["ts"].to_list() == [0.0]


def test_host_operators_outside_iterations_are_not_iterations() -> None:
    """Only the engine's iteration names are iterations: the scheduler's own operators between two
    iterations (not nested in one) are not a third."""
    its = engine_iterations(_host(("user_annotation", "step[DECODE bs=8]", 0.0, 100.0),
                                  ("cpu_op", "aten::copy_", 120.0, 10.0),
                                  ("user_annotation", "Scheduler.schedule", 140.0, 20.0),
                                  ("user_annotation", "step[DECODE bs=8]", 200.0, 100.0)))
    assert its is not None and its.steps["ts"].to_list() == [0.0, 200.0]


def test_a_nested_sglang_name_still_names_sglang() -> None:
    """``step[…]`` names SGLang even when it is nested inside an ``execute_…`` span (not an iteration of
    its own): the engine is sglang, the one iteration is the outer one."""
    its = engine_iterations(_host(("user_annotation", "execute_8_context_0()_generation_8(a)", 0.0, 100.0),
                                  ("user_annotation", "step[DECODE bs=8]", 10.0, 50.0)))
    assert its is not None and its.engine == "sglang" and its.kinds == {0: "decode"}


def test_job_workload_takes_training_over_majority_and_first_agreeing_ranks_evidence() -> None:
    serve = {"kind": "serving", "engine": "vllm", "evidence": "3 vllm iteration annotation(s) used as steps",
             "iterations": {"decode": 3}}
    serve2 = {"kind": "serving", "engine": "vllm", "evidence": "5 vllm iteration annotation(s) used as steps",
              "iterations": {"decode": 4, "prefill": 1}}
    train = {"kind": "training", "engine": None, "evidence": "1 optimizer step(s)", "iterations": {}}
    job = job_workload([serve, serve2, None])
    assert job == {"kind": "serving", "engine": "vllm", "iterations": {"decode": 3},
                   "evidence": "3 vllm iteration annotation(s) used as steps (rank evidence; 2 of 2 rank(s) agree)",
                   "framework": None, "framework_evidence": None, "micro_steps": None}  # no rank names a framework
    assert job_workload([serve, train, serve2])["kind"] == "training"  # any rank training: the job trains
    sgl = dict(serve, engine="sglang")
    assert job_workload([sgl, serve, sgl])["engine"] == "sglang"  # the engine most ranks name, not the last by name
    assert job_workload([None]) is None


# ---- slow steps (traceread/analysis/time/slow_steps.py) -------------------------------------------------------


def _steps(rows: list[dict[str, Any]]) -> pl.DataFrame:
    return pl.DataFrame(rows)


def test_one_rank_frame_without_rank_column_names_the_component() -> None:
    """Steps 0–3 of 1000 µs (compute 500, 500, 900, 900) and step 4 of 2000 µs (compute 1600). Median 1000,
    MAD 0: threshold = 1.05 × 1000 = 1050. Step 4 is slow by 1000; the baseline is the median compute of the
    normal steps, 700; compute grew 900 (≥ a third of 1000): cause compute."""
    f = _steps([{"step": s, "duration": d, "compute_us": c, "idle_us": 0.0}
                for s, d, c in [(0, 1000.0, 500.0), (1, 1000.0, 500.0), (2, 1000.0, 900.0), (3, 1000.0, 900.0),
                                (4, 2000.0, 1600.0)]])
    (e,) = find_slow_steps(f)
    assert (e["step"], e["duration_us"], e["median_us"], e["excess_us"], e["cause"], e["rank"]) == \
        (4, 2000.0, 1000.0, 1000.0, "compute", None)
    assert e["detail"] == "compute grew by a median 900 µs across ranks"


def test_a_step_exactly_at_the_threshold_is_normal_and_in_the_baseline() -> None:
    """Durations 1000, 1000, 1000, 1050, 2000: median 1000, MAD 0, threshold exactly 1050. Step 3 (1050) is
    not slow and *is* a normal step: the baseline compute is the median of 500, 500, 900, 900 = 700 (without
    step 3 it would be 500), so step 4's compute (1600) grew by 900."""
    f = _steps([{"step": s, "duration": d, "compute_us": c, "idle_us": 0.0}
                for s, d, c in [(0, 1000.0, 500.0), (1, 1000.0, 500.0), (2, 1000.0, 900.0), (3, 1050.0, 900.0),
                                (4, 2000.0, 1600.0)]])
    (e,) = find_slow_steps(f)
    assert e["step"] == 4 and e["detail"] == "compute grew by a median 900 µs across ranks"


def test_duration_is_used_over_window_when_both_are_given() -> None:
    """A frame with ``duration`` is taken as it is; ``window_us`` stands in only when there is no duration."""
    f = _steps([{"step": s, "duration": 2000.0 if s == 4 else 1000.0, "window_us": 1000.0, "compute_us": 500.0,
                 "idle_us": 0.0} for s in range(5)])
    (e,) = find_slow_steps(f)
    assert (e["step"], e["duration_us"]) == (4, 2000.0)


def _rank_frames(late_idle: float) -> dict[int, pl.DataFrame]:
    """Three ranks, five steps of 1000 µs (compute 600, idle 100, exposed comm 300); in step 4 rank 2's own
    work grows by ``late_idle`` of idle (its host stalled) and everyone's step takes 1000 + late_idle, the
    others' waiting showing as exposed communication."""
    out = {}
    for r in range(3):
        rows = []
        for s in range(5):
            slow = s == 4
            rows.append({"step": s, "window_us": 1000.0 + (late_idle if slow else 0.0), "compute_us": 600.0,
                         "idle_us": 100.0 + (late_idle if slow and r == 2 else 0.0),
                         "exposed_comm_us": 300.0 + (late_idle if slow and r != 2 else 0.0)})
        out[r] = pl.DataFrame(rows)
    return out


def test_one_rank_whose_host_stalled_is_named_with_idle() -> None:
    """Input as ``{rank: step_breakdowns}``: rank 2's idle grew by 800 (≥ half the 800 excess), the others'
    own work by 0 (< a quarter): cause ``rank:2``, what grew is its idle (host), the others waited 800."""
    (e,) = find_slow_steps(_rank_frames(800.0))
    assert (e["step"], e["excess_us"], e["cause"], e["rank"]) == (4, 800.0, "rank:2", 2)
    assert e["detail"] == ("rank 2's idle (host) grew by 800 µs; the other ranks waited for it "
                           "(their exposed communication grew by a median 800 µs)")


def test_nothing_explains_it_says_so() -> None:
    """Step 4 is 1000 µs slower but no component grew: cause unknown, and the detail says why."""
    f = _steps([{"step": s, "duration": 1000.0 if s < 4 else 2000.0, "compute_us": 500.0, "idle_us": 0.0,
                 "exposed_comm_us": 0.0} for s in range(5)])
    (e,) = find_slow_steps(f)
    assert e["cause"] == "unknown"
    assert e["detail"] == "no single component (compute, exposed communication, idle) explains the excess"
