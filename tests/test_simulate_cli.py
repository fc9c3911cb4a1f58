"""``traceread simulate`` on the command line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from traceread.commands.simulate import simulate

SMALL = ["--layers", "1", "--hidden", "1024", "--heads", "8", "--seq-len", "512", "--steps", "2"]


def test_cli_writes_traces_and_truth_with_stragglers(tmp_path: Path) -> None:
    res = CliRunner().invoke(simulate, ["ddp", "-o", str(tmp_path), "--ranks", "4", "--straggler", "1",
                                        "--straggler", "3", "--straggler-delay-us", "800",
                                        "--straggler-delay-us", "1200", "--straggler-cause", "gpu",
                                        "--straggler-cause", "host", *SMALL])
    assert res.exit_code == 0, res.output
    assert "straggler rank 1 (gpu)" in res.output and "straggler rank 3 (host)" in res.output
    truth = json.loads((tmp_path / "truth.json").read_text())
    assert [(s["rank"], s["injected_delay_us"], s["cause"]) for s in truth["stragglers"]] == [
        (1, 800.0, "gpu"), (3, 1200.0, "host")]
    assert len(list(tmp_path.glob("rank*.pt.trace.json.gz"))) == 4


def test_cli_pp_and_slow_steps_and_device(tmp_path: Path) -> None:
    r = CliRunner()
    res = r.invoke(simulate, ["pp", "-o", str(tmp_path / "pp"), "--ranks", "2", "--microbatches", "2",
                              "--schedule", "gpipe", "--p2p-us", "5", "--stage-factors", "1,1.2", "--batch", "1",
                              *SMALL])
    assert res.exit_code == 0, res.output
    assert "pipeline bubble" in res.output
    res = r.invoke(simulate, ["slow_steps", "-o", str(tmp_path / "s"), "--ranks", "2", "--device", "b200",
                              "--slow-step", "11:checkpoint:5000", *SMALL])
    assert res.exit_code == 0, res.output
    truth = json.loads((tmp_path / "s" / "truth.json").read_text())
    assert truth["device"] == "NVIDIA B200" and truth["num_sms"] == 148
    assert [s["cause"] for s in truth["slow_steps"]] == ["checkpoint"]


def test_cli_bad_input_is_one_line_without_traceback(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "traceread.cli", "simulate", "tp", "-o", str(tmp_path),
                           "--ranks", "6", "--tp", "4"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "--tp 4 must divide --ranks 6" in proc.stderr
    res = CliRunner().invoke(simulate, ["slow_steps", "-o", str(tmp_path), "--slow-step", "eleven"])
    assert res.exit_code == 2 and "STEP:CAUSE:US" in res.output


def test_cli_help_has_examples() -> None:
    res = CliRunner().invoke(simulate, ["--help"])
    assert res.exit_code == 0
    assert "traceread simulate ddp -o /tmp/ddp --straggler 5" in res.output


def test_cli_new_scenarios_take_their_defaults_and_options(tmp_path: Path) -> None:
    r = CliRunner()
    res = r.invoke(simulate, ["host_bound", "-o", str(tmp_path / "hb"), "--steps", "2"])
    assert res.exit_code == 0, res.output
    truth = json.loads((tmp_path / "hb" / "truth.json").read_text())
    assert truth["knobs"]["loader_us"] == 6000.0 and truth["world_size"] == 4  # the scenario's defaults
    assert "job ledger of step" in res.output and "host_bound rank" in res.output
    # every number of the rank line is per step (means over rank 0's steps) and the parts add up to the step
    from statistics import fmean

    r0 = truth["ranks"]["0"]
    line = next(ln for ln in res.output.splitlines() if ln.startswith("rank 0, mean per step:"))
    nums = [float(x) / (1000.0 if unit == "µs" else 1.0)
            for x, unit in re.findall(r"([0-9.]+) (ms|µs)", line.split(";")[0])]
    assert nums[0] == pytest.approx(fmean(s["duration_us"] for s in r0["steps"]) / 1000.0, abs=0.006)
    assert sum(nums[1:]) == pytest.approx(nums[0], abs=0.02)
    assert nums[-1] == pytest.approx(fmean(s["idle_us"] for s in r0["steps"]) / 1000.0, abs=0.006)
    res = r.invoke(simulate, ["3d", "-o", str(tmp_path / "3d"), "--ranks", "8", "--tp", "2", "--pp", "2",
                              "--gpus-per-node", "3", "--microbatches", "2", *SMALL])
    assert res.exit_code == 0, res.output
    truth = json.loads((tmp_path / "3d" / "truth.json").read_text())
    assert truth["layout"]["degrees"]["tp"] == 2 and truth["hosts"] == 3
    res = r.invoke(simulate, ["ddp", "-o", str(tmp_path / "f"), "--ranks", "2", "--comm", "fsdp", "--no-prefetch",
                              *SMALL])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "f" / "truth.json").read_text())["knobs"]["prefetch"] is False
    res = r.invoke(simulate, ["custom_allreduce", "-o", str(tmp_path / "c"), "--ranks", "2", "--tp", "2",
                              "--allreduce-kernel", "vllm", *SMALL])
    assert res.exit_code == 0, res.output
    res = r.invoke(simulate, ["moe", "-o", str(tmp_path / "m"), "--ranks", "4", "--hot-rank", "7", *SMALL])
    assert res.exit_code != 0 and "--hot-rank 7 outside 0..3" in str(res.exception)
