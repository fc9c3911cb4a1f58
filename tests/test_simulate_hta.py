"""Cross-check: Meta's HTA loads the simulated traces and its temporal breakdown agrees with truth.

Definitional notes (HTA 0.6.1 / traceinsight, ``hta/analyzers/breakdown_analysis.py``):

* HTA drops the last ``ProfilerStep`` by default; we pass ``include_last_profiler_step=True`` so it
  sees the same kernels as the truth window.
* HTA rounds float ``ts`` up and ``end`` down to whole µs ("ns rounding"); that moves every interval
  by < 1 µs, so we switch it off (``set_disable_ns_rounding(True)``) to compare exactly.
* HTA's kernel_time = last GPU end − first GPU start = our window; idle = window − |∪ all GPU rows| =
  our idle; compute = |∪ non-NCCL, non-memcpy kernels| = our compute (the simulator emits no memsets,
  which HTA would count as non-compute but we count as compute); non_compute = window − compute −
  idle = our exposed_comm + exposed_memcpy.
* HTA reads every ``*.json``/``*.gz`` in the folder and truth.json (which contains ``"rank": N`` in
  its straggler list) would be mistaken for a trace, so HTA gets a folder of links to the rank files.
"""

from __future__ import annotations

import logging
import warnings

import pytest

from traceread.simulate import simulate

pytestmark = pytest.mark.slow  # HTA parses with a process pool: ~10 s


def _hta(tmp_path_factory: pytest.TempPathFactory, scenario: str, **knobs):  # type: ignore[no-untyped-def]
    """Simulate ``scenario``, let HTA read the rank files: (truth, temporal breakdown, comm/comp overlap)."""
    try:
        from hta.configs.env_options import HTAEnvOptions
        from hta.trace_analysis import TraceAnalysis
    except Exception as exc:  # HTA or one of its undeclared deps (psutil) missing
        pytest.skip(f"HTA not importable: {exc}")
    out = tmp_path_factory.mktemp("sim")
    truth = simulate(scenario, out, **knobs)
    only = tmp_path_factory.mktemp("hta_traces")
    for f in out.glob("rank*.pt.trace.json.gz"):
        (only / f.name).symlink_to(f)
    opts = HTAEnvOptions.instance()
    old = opts.disable_ns_rounding()
    opts.set_disable_ns_rounding(True)
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ta = TraceAnalysis(trace_dir=str(only), include_last_profiler_step=True)
            temporal = ta.get_temporal_breakdown(visualize=False)
            overlap = ta.get_comm_comp_overlap(visualize=False)
    finally:
        opts.set_disable_ns_rounding(old)
        logging.disable(logging.NOTSET)
    return truth, temporal, overlap


@pytest.fixture(scope="module")
def hta_run(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    return _hta(tmp_path_factory, "ddp", ranks=4, buckets=2, layers=2, hidden=2048, heads=16, seq_len=1024, steps=3,
                stragglers=[(3, 1500.0, "gpu")])


@pytest.fixture(scope="module")
def hta_3d_moe(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    small = {"hidden": 1024, "heads": 8, "seq_len": 512, "steps": 2}
    return [_hta(tmp_path_factory, "3d", ranks=8, tp=2, pp=2, gpus_per_node=3, layers=2, microbatches=2, **small),
            _hta(tmp_path_factory, "moe", ranks=4, layers=1, **small)]


def test_hta_loads_every_rank(hta_run) -> None:  # type: ignore[no-untyped-def]
    truth, temporal, _ = hta_run
    assert sorted(int(r) for r in temporal["rank"]) == list(range(truth["world_size"]))


def test_hta_temporal_breakdown_matches_truth(hta_run) -> None:  # type: ignore[no-untyped-def]
    truth, temporal, _ = hta_run
    for _, row in temporal.iterrows():
        t = truth["ranks"][str(int(row["rank"]))]
        assert row["kernel_time(us)"] == pytest.approx(t["window_us"], abs=0.01)
        assert row["idle_time(us)"] == pytest.approx(t["idle_us"], abs=0.01)
        assert row["compute_time(us)"] == pytest.approx(t["compute_us"], abs=0.01)
        assert row["non_compute_time(us)"] == pytest.approx(t["exposed_comm_us"] + t["exposed_memcpy_us"], abs=0.01)


def test_hta_comm_comp_overlap_matches_truth(hta_run) -> None:  # type: ignore[no-untyped-def]
    truth, _, overlap = hta_run
    for _, row in overlap.iterrows():
        t = truth["ranks"][str(int(row["rank"]))]
        assert row["comp_comm_overlap_pctg"] == pytest.approx(t["comm_overlap_pct"], abs=0.006)  # HTA rounds to .01


def test_hta_reads_3d_and_moe_like_the_truth(hta_3d_moe) -> None:  # type: ignore[no-untyped-def]
    """The new scenarios' NCCL kernels (per-layer TP all-reduce, send/recv, all-to-all) are HTA's comm too."""
    for truth, temporal, _ in hta_3d_moe:
        assert sorted(int(r) for r in temporal["rank"]) == list(range(truth["world_size"]))
        for _, row in temporal.iterrows():
            t = truth["ranks"][str(int(row["rank"]))]
            assert row["compute_time(us)"] == pytest.approx(t["compute_us"], abs=0.01)
            assert row["idle_time(us)"] == pytest.approx(t["idle_us"], abs=0.01)
