"""GPU telemetry: the sampler off for real on this GPU-less machine, the reader, and the join of the
simulated telemetry (traceread.simulate.telemetry: exact truth) to the report's findings by time and
device — a throttled GPU straggler says so with numbers and reason, an Xid at the hang is named in
the hang answer, missing telemetry changes nothing else.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from traceread.analysis.telemetry import gpu_state
from traceread.collect.telemetry import TelemetrySampler, decode_throttle, start_telemetry
from traceread.compare.captures import build_watched
from traceread.options import ReportOptions
from traceread.read.telemetry import read_telemetry
from traceread.simulate import simulate
from traceread.simulate.telemetry import TelemetryPlan, Throttle, Xid, trace_wall_ns, write_telemetry

SMALL = {"layers": 2, "hidden": 1024, "heads": 16, "seq_len": 512}


def test_decode_throttle_names() -> None:
    assert decode_throttle(0) == []
    assert decode_throttle(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert decode_throttle(0x1 | 0x10000) == ["gpu_idle", "bit0x10000"]


def test_sampler_is_off_without_a_gpu(tmp_path: Path) -> None:
    """Real: nvidia-ml-py is installed here, the machine has no NVIDIA driver, so NVML's init fails."""
    status = TelemetrySampler(tmp_path).start()
    assert status["state"] == "off"
    assert "nvidia-ml-py" in status["why"]
    assert not (tmp_path / "telemetry").exists()


def test_sampler_off_by_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEREAD_TELEMETRY", "0")
    s = start_telemetry(tmp_path)
    assert s.stop() == {"state": "off", "why": "TRACEREAD_TELEMETRY=0"}


class _FakeBackend:
    """A backend object with the sampler's interface, so the thread's own writing is tested: the
    device readings themselves need a GPU (tests/jobs/record_gpu_telemetry.sh records real ones)."""

    vendor = "nvidia"
    library = "test"
    handles = [0, 1]

    def describe(self, i: int) -> dict[str, Any]:
        return {"name": "GPU", "max_sm_clock_mhz": 1980}

    def sample(self, i: int) -> dict[str, Any]:
        return {"sm_clock_mhz": 1980 - 500 * i, "throttle": decode_throttle(0x4 * i), "throttle_mask": 0x4 * i}

    def wait_xid(self, timeout_s: float) -> list[tuple[int, int]]:
        import time

        time.sleep(timeout_s)
        return [(1, 79)]

    def close(self) -> None:
        pass


def test_sampler_thread_writes_what_the_reader_reads(tmp_path: Path) -> None:
    s = TelemetrySampler(tmp_path, interval_s=0.05, backend_factory=lambda: (_FakeBackend(), None))
    assert s.start()["state"] == "on"
    import time

    deadline = time.monotonic() + 30
    while s.samples < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    status = s.stop()
    assert status["state"] == "on" and status["gpus"] == 2 and status["samples"] >= 3
    warns: list[str] = []
    gpus = read_telemetry(tmp_path, warns.append)
    assert not warns and [g.gpu for g in gpus] == [0, 1]
    g1 = gpus[1]
    assert len(g1.t_ns) >= 3 and g1.throttle[0] == ["sw_power_cap"] and g1.xids and g1.xids[0][1] == 79
    st = gpu_state(g1, int(g1.t_ns[0]), int(g1.t_ns[-1]))
    assert st is not None and st["throttled"] and st["sm_clock_mhz"] == 1480


def test_collect_records_telemetry_state_in_run_json(tmp_path: Path) -> None:
    run = tmp_path / "run"
    res = subprocess.run([sys.executable, "-m", "traceread.cli", "collect", "-o", str(run), "--", sys.executable, "-c",
                          "print('hi')"], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    info = json.loads((run / "run.json").read_text())
    assert info["telemetry"]["state"] == "off" and "nvidia-ml-py" in info["telemetry"]["why"]


def _straggler_run(out: Path, throttle: bool) -> dict[str, Any]:
    truth = simulate("ddp", out / "traces", ranks=4, steps=4, stragglers=[(2, 3000.0, "gpu")], **SMALL)
    starts = [s["start_us"] for r in truth["ranks"].values() for s in r["steps"]]
    ends = [s["start_us"] + s["duration_us"] for r in truth["ranks"].values() for s in r["steps"]]
    t0, t1 = trace_wall_ns(min(starts)), trace_wall_ns(max(ends))
    plan = TelemetryPlan(gpus=4, start_ns=t0 - 30 * 10**9, end_ns=t1 + 30 * 10**9, device="H100")
    if throttle:  # GPU 2 (rank 2's, device id = rank on one node) power-capped from before to after the window
        plan.throttles.append(Throttle(gpu=2, start_ns=t0 - 10 * 10**9, end_ns=t1 + 10 * 10**9,
                                       reason="sw_power_cap", sm_clock_mhz=1290))
    return {"sim": truth, "telemetry": write_telemetry(out, plan)}


def test_throttled_gpu_straggler_says_so(tmp_path: Path) -> None:
    truth = _straggler_run(tmp_path, throttle=True)
    doc = build_watched([str(tmp_path)], ReportOptions(use_cache=False, workers=1))
    f = next(f for f in doc["findings"] if f["id"] == "straggler")
    assert f["rank"] == truth["sim"]["stragglers"][0]["rank"] == 2
    assert "its GPU 2 on sim-host0 was throttled (power cap, 100% of samples)" in f["title"]
    assert "SM clock 1,290 MHz vs 1,980 MHz max (other GPUs 1,980 MHz)" in f["title"]
    assert "700 W of a 700 W limit" in f["title"]
    tel = f["telemetry"]
    assert tel["throttled"] and tel["sm_clock_mhz"] == 1290 and tel["reasons"][0]["reason"] == "sw_power_cap"
    assert tel["clock_pct"] == pytest.approx(100 * 1290 / 1980)
    assert not any(s["throttled"] for r, s in doc["telemetry"]["ranks"].items() if r != "2")


def test_healthy_clock_adds_nothing_and_missing_telemetry_changes_nothing(tmp_path: Path) -> None:
    _straggler_run(tmp_path / "a", throttle=False)
    simulate("ddp", tmp_path / "b" / "traces", ranks=4, steps=4, stragglers=[(2, 3000.0, "gpu")], **SMALL)
    a = build_watched([str(tmp_path / "a")], ReportOptions(use_cache=False, workers=1))
    b = build_watched([str(tmp_path / "b")], ReportOptions(use_cache=False, workers=1))
    assert "telemetry" in a and "telemetry" not in b

    def strip(d: dict[str, Any]) -> list[Any]:
        return [(f["id"], f["title"], f["impact_us_per_step"]) for f in d["findings"]]
    assert strip(a) == strip(b)
    assert not any("throttled" in f["title"] for f in a["findings"])


def test_xid_at_the_hang_is_named_in_the_hang_answer(tmp_path: Path) -> None:
    from traceread.simulate.fr_hang import HangKnobs, simulate_hang

    simulate_hang(tmp_path / "fr", HangKnobs(tp=2, pp=2, dp=1, faults=[(1, 0.4)]))
    (tmp_path / "fr" / "truth.json").unlink()
    detected = 1_762_200_000_000_000_000
    (tmp_path / "hang.json").write_text(json.dumps({"detected_at_ns": detected, "stalled_for_s": 30.0}))
    write_telemetry(tmp_path, TelemetryPlan(gpus=4, start_ns=detected - 300 * 10**9, end_ns=detected,
                                            xids=[Xid(1, detected - 40 * 10**9, 79), Xid(3, detected - 250 * 10**9, 13)]))
    doc = build_watched([str(tmp_path)], ReportOptions(use_cache=False, workers=1))
    hang = doc["findings"][0]
    assert hang["id"] == "hang"
    assert "the driver reported Xid 79 on GPU 1 (sim-host0) 40 s before the hang was detected" in hang["title"]
    assert "Xid 13" not in hang["title"]  # 250 s before: long before the stall began (30 s + 60 s margin)
    assert [x["xid"] for x in doc["telemetry"]["hang_xids"]] == [79]
    from click.testing import CliRunner

    from traceread.cli import cli

    out = CliRunner().invoke(cli, ["hang", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert out.output.splitlines()[1] == ("GPU telemetry: the driver reported Xid 79 on GPU 1 (sim-host0) 40 s before "
                                          "the hang was detected")
    js = json.loads(CliRunner().invoke(cli, ["hang", str(tmp_path), "--format", "json"]).output)
    assert [x["xid"] for x in js["xids"]] == [79]


def test_damaged_telemetry_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "telemetry").mkdir()
    (tmp_path / "telemetry" / "gpu0.jsonl").write_text('{"kind": "sample", "t_ns": 5, "sm_clock_mhz": 1}\nnot json\n')
    (tmp_path / "telemetry" / "gpu1.jsonl").mkdir()
    warns: list[str] = []
    gpus = read_telemetry(tmp_path, warns.append)
    assert [g.gpu for g in gpus] == [0] and len(warns) == 2
    assert "gpu0.jsonl: 1 line(s)" in warns[1] or "gpu0.jsonl: 1 line(s)" in warns[0]


def test_only_local_task_0_samples_its_host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRACEREAD_TELEMETRY", raising=False)
    monkeypatch.setenv("SLURM_LOCALID", "3")
    assert "local task 3" in start_telemetry(tmp_path).stop()["why"]
