"""The GPU metrics on traces recorded on a real H100 (``sample_traces/h100_*``, see
``tests/jobs/record_gpu_samples.sh``), checked against numbers that do not come from traceread.

* Model FLOPs: the recorded job is ``tests/jobs/transformer_train.py`` with known sizes, so the textbook
  count (6·N·D for every weight matmul, plus causal attention: 4·b·pairs·d forward per layer and twice that
  backward) is computed here from the model's configuration, not from the trace.
* MFU: those FLOPs over the recorded step times at the H100 SXM dense BF16 peak (989.4 TFLOP/s, datasheet).
* HTA's temporal breakdown, idle split and overlap on the same trace (``test_hta_crosscheck.check_rank``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from traceread.cli import cli

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"
H100_BF16_DENSE = 989.4e12

# tests/jobs/record_gpu_samples.sh: transformer_train.py defaults (4 layers, d=1024, seq 1024, batch 8, vocab 32768)
LAYERS, D_MODEL, SEQ, BATCH, VOCAB = 4, 1024, 1024, 8, 32768


def textbook_flops_per_step() -> float:
    matmul_params = LAYERS * 12 * D_MODEL * D_MODEL + VOCAB * D_MODEL  # qkv 3d², proj d², fc 4d², out 4d²; LM head
    tokens = BATCH * SEQ
    pairs = SEQ * (SEQ + 1) // 2  # causal (is_causal=True): query i sees keys 0..i
    attention_fwd = 4 * BATCH * LAYERS * pairs * D_MODEL  # QKᵀ and AV, 2 FLOPs per multiply-add
    return 6 * matmul_params * tokens + 3 * attention_fwd  # backward = 2 × forward


@pytest.fixture(scope="module")
def transformer_report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("h100") / "report.json"
    res = CliRunner().invoke(cli, ["report", str(SAMPLES / "h100_transformer_1gpu"), "--format", "json",
                                   "-o", str(out), "--no-cache"])
    assert res.exit_code == 0, res.output
    return json.loads(out.read_text())


def test_model_flops_match_the_textbook_count(transformer_report: dict) -> None:
    (rank,) = transformer_report["ranks"]
    assert rank["device"] == "NVIDIA H100 80GB HBM3" and rank["num_sms"] == 132
    assert rank["model_flops_per_step"] == pytest.approx(textbook_flops_per_step(), rel=1e-9)


def test_mfu_is_model_flops_over_step_time_at_the_bf16_peak(transformer_report: dict) -> None:
    (rank,) = transformer_report["ranks"]
    steps = rank["steps"]
    assert len(steps) == 5  # --active 5
    seconds = sum(s["duration_us"] for s in steps) * 1e-6
    expected = 100 * textbook_flops_per_step() * len(steps) / (seconds * H100_BF16_DENSE)
    assert rank["mfu_pct"] == pytest.approx(expected, rel=1e-6)
    assert 5 < rank["mfu_pct"] < 40  # a small bf16 transformer on one H100: sanity, not a target


def test_gpu_fields_are_consistent(transformer_report: dict) -> None:
    (rank,) = transformer_report["ranks"]
    total = rank["compute_us"] + rank["exposed_comm_us"] + rank["exposed_memcpy_us"] + rank["idle_us"]
    assert total == pytest.approx(rank["window_us"], abs=1e-3)
    assert 0 < rank["sm_efficiency_pct"] <= 100 and 0 < rank["achieved_occupancy_pct"] <= 100


def test_hta_agrees_on_the_real_h100_trace() -> None:
    import test_hta_crosscheck as hta_check
    both = hta_check.load(SAMPLES / "h100_transformer_1gpu" / "traces")
    hta_check.check_rank(both, 0, 2.0)  # ns-resolution floats: HTA rounds each event by < 2 µs
    hta_check.check_idle(both, 0, 2.0)
