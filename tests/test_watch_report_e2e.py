"""End-to-end: a real collected run (2-rank torchrun, gloo on CPU) whose rank 1 loads its batch 120 ms
slower in optimizer steps 200-239, collected with default options (but no capture cool-down: on a
loaded machine a false trigger must not hide the real slowdown from this test), then ``traceread report``.

Truth from the job script (tests/jobs/slow_train.py): rank 1, steps 200-239, +120 ms per step. Stated
tolerances: the slow stretch's first and last step within 2 steps (a step's time is measured between
two optimizer steps); the excess per step within 0.6-1.5 x 120 ms and the time lost within 0.6-1.5 x
(40 x 120 ms): the slowdown is a sleep, so it adds the same on an idle machine and beside a CPU hog,
while the healthy step's own time (15 ms of sleep plus the model) varies with the load.
"""

from __future__ import annotations

import json
from pathlib import Path

import needs
import pytest
from click.testing import CliRunner
from test_watch_e2e import _collect

from traceread.cli import cli

needs.module("torch")
pytestmark = pytest.mark.slow
SLOW_MS = 120.0


def test_report_of_a_real_watched_run_names_rank_steps_and_size(tmp_path: Path) -> None:
    run = tmp_path / "run"
    # no cool-down: a false trigger on a loaded machine must not hide the real slowdown from this test
    # (false triggers are the watch's own tests' business, tests/test_watch_e2e.py)
    _collect(run, ["--steps", "320", "--slow-rank", "1", "--slow-steps", "200:239", "--slow-ms", str(SLOW_MS)],
             ["--watch-cooldown", "0"])
    assert list((run / "captures").glob("capture*/rank*.pt.trace.json.gz")), "the watch recorded no capture"
    res = CliRunner().invoke(cli, ["report", str(run), "--format", "json", "--no-cache"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    a = doc["watch"]["answer"]
    assert a is not None and a["rank"] == 1, a
    first, last = a["slow_steps"]
    assert abs(first - 200) <= 2 and abs(last - 239) <= 2, a["slow_steps"]
    assert 0.6 * SLOW_MS * 1e3 <= a["excess_us"] <= 1.5 * SLOW_MS * 1e3
    assert 0.6 * 40 * SLOW_MS * 1e3 <= a["lost_us"] <= 1.5 * 40 * SLOW_MS * 1e3
    assert a["what"]["category"] == "host_bound"  # rank 1's host was late: its CPU trace has the gap
    assert a["waited_in"] is not None and a["waited_in"]["role"] == "dp"
    series = doc["watch"]["series"]
    assert series["last_step"] == 320 and series["steps"] == 319
    text = CliRunner().invoke(cli, ["report", str(run), "--format", "text", "-q"]).output
    assert text.startswith("ANSWER: from step ") and "rank 1's host-bound idle grew by" in text


def test_with_stack_the_answer_names_the_python_function(tmp_path: Path) -> None:
    """``collect --with-stack``: the traces hold Python functions, so the grown host span
    (``<built-in function sleep>``) is named by its caller, the job's own ``load_batch``."""
    run = tmp_path / "run"
    _collect(run, ["--steps", "320", "--slow-rank", "1", "--slow-steps", "200:239", "--slow-ms", str(SLOW_MS)],
             ["--with-stack", "--watch-cooldown", "0"])
    res = CliRunner().invoke(cli, ["report", str(run), "--format", "json", "--no-cache"])
    assert res.exit_code == 0, res.output
    a = json.loads(res.output)["watch"]["answer"]
    assert a is not None and a["rank"] == 1, a
    caller = a["host_span"]["caller"]
    assert caller["name"].endswith(": load_batch") and caller["readable"].startswith("load_batch (slow_train.py:")
    assert 0.6 * SLOW_MS * 1e3 <= caller["delta_us"] <= 1.5 * SLOW_MS * 1e3
    assert f"rank 1's `{caller['readable']}` took" in a["sentence"]
