"""Hang and memory answers on runs recorded with ``traceread collect`` on a real H100 (torch 2.11, NCCL 2.28.9;
``tests/jobs/record_gpu_samples.sh``), checked against what torch itself wrote, not against traceread.

* ``h100_nccl_timeout_1gpu``: the GPU spins in a kernel from step 16 (``--stall-gpu-step``); NCCL's own watchdog
  times out after 20 s and torch dumps its Flight Recorder (pickle, ``TORCH_NCCL_ENABLE_TIMING=1``). Truth: torch's
  watchdog line in ``launcher.log`` (``WorkNCCL(SeqNum=…, NumelIn=…)``, ``last enqueued work: …``).
* ``h100_nccl_gpu_stall_1gpu``: the same stall, dumped by the collector's hang watchdog (torch's JSON, no start
  events): no rank is missing, and Flight Recorder cannot say whether the GPU started the collective.
* ``h100_memory_1gpu``: ``--profile-memory --memory-snapshot`` on the 2-layer model: the peak from the trace's own
  ``[memory]`` events, the fp32 logits (batch x seq x vocab x 4 bytes) live at the snapshot's peak, named by the
  backward node that allocated them on autograd's thread.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from traceread.cli import cli

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"
TIMEOUT, STALL, MEMORY = (SAMPLES / n for n in ("h100_nccl_timeout_1gpu", "h100_nccl_gpu_stall_1gpu",
                                                 "h100_memory_1gpu"))
# record_gpu_samples.sh: transformer_train.py --layers 2 (d 1024, seq 1024, batch 8, vocab 32768)
BATCH, SEQ, VOCAB, D, LAYERS = 8, 1024, 32768, 1024, 2


def _run(*args: str) -> str:
    res = CliRunner().invoke(cli, list(args))
    assert res.exit_code == 0, res.output
    return res.output


def _torch_watchdog(run: Path) -> tuple[int, int, int, int]:
    """(seq, numel, last enqueued, last completed) from ProcessGroupNCCL's own log lines."""
    log = (run / "launcher.log").read_text()
    work = re.search(r"WorkNCCL\(SeqNum=(\d+), OpType=ALLREDUCE, NumelIn=(\d+)", log)
    status = re.search(r"last enqueued work: (\d+), last completed work: (\d+)", log)
    assert work and status
    return int(work[1]), int(work[2]), int(status[1]), int(status[2])


def test_nccl_timeout_names_the_rank_whose_gpu_never_started_the_collective() -> None:
    seq, numel, enqueued, completed = _torch_watchdog(TIMEOUT)
    assert seq == completed + 1  # torch: the first collective not completed is the one that timed out
    first = _run("hang", str(TIMEOUT)).splitlines()[0]
    assert first == (f"Rank 0's GPU stopped: its host enqueued all_reduce #{seq} on pg 0 (world, default_pg) but its "
                     f"GPU never started it ({enqueued - seq} more queued behind it).")
    doc = json.loads(_run("hang", str(TIMEOUT), "--format", "json"))
    (culprit,) = doc["culprits"]
    assert (culprit["rank"], culprit["why"], culprit["seq"]) == (0, "gpu_stopped", seq)
    assert culprit["sizes"] == f"[[{numel}]]"


def test_report_advice_follows_the_hang_evidence_not_a_missing_rank() -> None:
    seq = _torch_watchdog(TIMEOUT)[0]
    lines = _run("report", str(TIMEOUT), "--no-cache", "--format", "text", "-o", "-").splitlines()
    answer = " ".join(lines[1:3])
    assert f"seq {seq}): the GPU of rank 0 never started it" in answer
    change = next(i for i, line in enumerate(lines) if line.startswith("CHANGE:"))
    assert lines[change].startswith("CHANGE: Check the GPU of rank 0")
    assert "never joined" not in answer and "missing ranks" not in "\n".join(lines)


def test_stall_without_start_events_says_what_flight_recorder_cannot_tell() -> None:
    raw = json.loads((STALL / "fr" / "rank0.json").read_text())
    seq = int(raw["pg_status"]["0"]["last_completed_collective"]) + 1
    first = _run("hang", str(STALL)).splitlines()[0]
    assert first.startswith(f"Rank 0 is in all_reduce #{seq} on pg 0 (world, default_pg) and it never completes: "
                            "its GPU stopped inside or before it.")
    assert "TORCH_NCCL_ENABLE_TIMING=1" in first and "network" not in first  # one rank: no network in between
    text = _run("report", str(STALL), "--no-cache", "--format", "text", "-o", "-")
    change = next(line for line in text.splitlines() if line.startswith("CHANGE:"))
    assert change.startswith("CHANGE: No rank is missing from the stuck collective")


def _trace_peak_allocated(run: Path) -> int:
    """The largest 'Total Allocated' of the CUDA [memory] events inside the profiled steps, from the raw trace."""
    with gzip.open(next((run / "traces").glob("*.pt.trace.json.gz"))) as f:
        events = json.load(f)["traceEvents"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name", "").startswith("ProfilerStep#")]
    return max(int(e["args"]["Total Allocated"]) for e in events
               if e.get("name") == "[memory]" and e["args"].get("Device Type") == 1
               and any(a <= e["ts"] <= b for a, b in steps))


@pytest.fixture(scope="module")
def memory_doc(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("mem") / "report.json"
    _run("report", str(MEMORY), "--no-cache", "--format", "json", "-o", str(out))
    return json.loads(out.read_text())


def test_memory_peak_is_the_traces_own_peak(memory_doc: dict) -> None:
    m = memory_doc["memory"]
    assert m["peak_allocated_bytes"] == _trace_peak_allocated(MEMORY)
    params = VOCAB * D + SEQ * D + LAYERS * (12 * D * D + 13 * D) + 2 * D + VOCAB * D  # weights and biases
    assert params == 93_351_936
    (rank,) = m["ranks"]
    assert rank["window_start_allocated_bytes"] >= 16 * params  # fp32 weights, grads, two AdamW moments
    assert not any("hang" in w for w in memory_doc["warnings"])  # a memory snapshot is not a bad dump


def test_snapshot_names_who_allocated_the_logits_at_the_peak(memory_doc: dict) -> None:
    (snap,) = memory_doc["memory"]["snapshots"]
    frames = {f["frame"]: f for f in snap["devices"][0]["top_frames"]}
    logits_fp32 = BATCH * SEQ * VOCAB * 4
    for node in ("LogSoftmaxBackward0", "NllLossBackward0"):  # allocated on autograd's thread: no Python frame
        f = frames[f"backward: {node} (autograd thread, no Python frame)"]
        assert (f["bytes"], f["blocks"]) == (logits_fp32, 1)
    assert "(no Python frame recorded)" not in frames
