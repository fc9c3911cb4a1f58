"""Real H200 recordings of this wave (tests/jobs/gpu_checks.sh and gpu_checks2.sh on a lent H200, torch 2.11 +
CUDA 13.0, NCCL 2.28, nvidia-ml-py 13.610): the readers and the report against what the machine itself wrote.

- ``h200_telemetry_1gpu``: ``traceread collect`` with default options around 3000 healthy transformer steps;
  NVML telemetry at ~1 Hz. Checked against the lines the sampler wrote: one H200, every sample read, the
  clock at its maximum while the job ran, no Xid; and the watch stayed quiet (no capture on a healthy real run).
- ``h200_watch_1gpu``: tests/jobs/slow_train.py on the GPU, 320 steps of ~17 ms with 40 ms more per step in
  steps 200-239 (the script's truth), default options: the watch caught it and the report names the steps,
  the size and the window.
- ``tests/data/nccl/h200_recorded``: real NCCL 2.28 logs of a wrong NCCL_SOCKET_IFNAME, two ranks on one GPU
  and a healthy all-reduce (tests/jobs/nccl_failures_gpu.py), each with the diagnosis its cause must get.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from traceread.analysis.comm.nccl import parse_nccl_logs
from traceread.assemble.report import ReportOptions
from traceread.compare.captures import build_watched
from traceread.read.telemetry import read_telemetry

REPO = Path(__file__).resolve().parents[1]
TELEMETRY = REPO / "sample_traces" / "h200_telemetry_1gpu"
WATCH = REPO / "sample_traces" / "h200_watch_1gpu"
NCCL = REPO / "tests" / "data" / "nccl" / "h200_recorded"


def _report(run: Path) -> dict:
    return build_watched([str(run)], ReportOptions(use_cache=False, workers=1))  # type: ignore[return-value]


def test_telemetry_read_as_the_sampler_wrote_it() -> None:
    lines = [json.loads(x) for x in (TELEMETRY / "telemetry" / "gpu0.jsonl").read_text().splitlines()]
    samples = [x for x in lines if x["kind"] == "sample"]
    warnings: list[str] = []
    (g,) = read_telemetry(TELEMETRY, warnings.append)
    assert warnings == [] and g.info["name"] == "NVIDIA H200" and g.xids == []
    assert len(g.t_ns) == len(samples) >= 60  # ~1 Hz over the ~70 s run
    busy = [x["sm_clock_mhz"] for x in samples if (x.get("util_pct") or 0) > 50]
    assert busy and max(busy) == g.info["max_sm_clock_mhz"] == 1980  # the H200 ran at its maximum clock


def test_a_healthy_real_gpu_run_is_not_captured() -> None:
    watch = json.loads((TELEMETRY / "watch.json").read_text())
    assert watch["enabled"] and watch["job_step"] == 3000 and watch["captures"] == []
    doc = _report(TELEMETRY)
    assert doc["watch"]["captures"] == [] and doc["watch"]["series"]["steps"] == 2999
    tel = doc["telemetry"]
    assert tel["state"] == "on" and tel["gpus"][0]["name"] == "NVIDIA H200"
    assert tel["ranks"]["0"]["throttled"] is False and tel["ranks"]["0"]["clock_pct"] == pytest.approx(100.0)


def test_the_slowdown_on_a_real_gpu_is_caught_and_named() -> None:
    trig = json.loads((WATCH / "captures" / "capture1" / "trigger.json").read_text())
    assert trig["kind"] == "job_slowdown" and trig["since_step"] == 200
    first, last = trig["steps"]
    assert 200 <= first <= last <= 239  # inside the script's slow steps
    doc = _report(WATCH)
    (cap,) = doc["watch"]["captures"]
    assert cap["steps"] == [first, last] and cap["what"]["category"] == "host_bound"
    assert cap["excess_us"] == pytest.approx(40_000, rel=0.15)  # the script sleeps 40 ms more per step
    answer = doc["watch"]["answer"]
    assert "from step 200" in json.dumps(answer) and "40 slow step(s) in 200-239" in json.dumps(answer)


@pytest.mark.parametrize("case, want", [("no_interface", "no_socket_interface"), ("duplicate_gpu", "duplicate_gpu"),
                                        ("healthy", None)])
def test_real_nccl_failure_logs(case: str, want: str | None) -> None:
    s = parse_nccl_logs([NCCL / f"{case}.log"])
    got = next((d["id"] for d in s["diagnoses"] if d["severity"] != "info"), None)
    assert got == want
    assert s["version"].startswith("2.28")
