"""Real framework jobs under ``traceread collect``: the answer names the fault each script puts in.

``tests/jobs/frameworks/`` holds a Hugging Face Trainer job (transformers + accelerate), a PyTorch
Lightning job run with Lightning's own profiler, and a DeepSpeed job (CPU, gloo); each runs 2 ranks
under torchrun and writes the truth of its fault. Each job is collected once (a module-scoped fixture)
with a short window: profiler steps 3-8, i.e. optimizer steps 5-10.

Tolerances come from the fault's own size, never from how fast this machine is:

* a sleep is an exact floor (``time.sleep`` never returns early), so the span's time per step is at
  least 98% of it (clock granularity) and at most 2x it (the work around the sleep — ``torch.save``
  beside the storage latency, collate beside ``__getitem__`` — is small next to it on any machine);
* the GC pause has no sleep to derive from: the script times each pause itself (that is what the job
  did), and the answer is within 20% + 10 ms of the mean over the recorded steps.

"No finding double-counts it": the fault's span (or, for the GC pause, the late rank's time outside
any span) is claimed by exactly one finding.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import needs
import pytest
from ports import free_port

needs.module("torch")

JOBS = Path(__file__).resolve().parent / "jobs" / "frameworks"
WINDOW = ["--wait", "2", "--warmup", "1", "--active", "6"]
pytestmark = pytest.mark.slow


def collect_and_report(tmp: Path, script: str, job_args: list[str]) -> dict[str, Any]:
    """Collect the job once (2 ranks, gloo) and report it; everything a test needs."""
    run = tmp / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEREAD_")}
    env.update({"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "DS_ACCELERATOR": "cpu",
                "TOKENIZERS_PARALLELISM": "false", "HF_HOME": str(tmp / "hf_home")})
    cmd = [sys.executable, "-m", "traceread.cli", "collect", "-o", str(run), *WINDOW, "--",
           sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
           "--monitor-interval", "0.5", str(JOBS / script), "--truth", str(tmp / "truth"), *job_args]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200, cwd=tmp)
    assert res.returncode == 0, res.stderr[-4000:]
    rep = subprocess.run([sys.executable, "-m", "traceread.cli", "report", str(run), "--format", "json", "--no-cache"],
                         env=env, capture_output=True, text=True, timeout=600, cwd=tmp)
    assert rep.returncode == 0, rep.stderr[-3000:]
    truth = {p.name: json.loads(p.read_text()) for p in tmp.glob("truth*")}
    return {"collect": res, "report": json.loads(rep.stdout), "run": run, "truth": truth, "tmp": tmp,
            "run_json": json.loads((run / "run.json").read_text())}


@pytest.fixture(scope="module")
def hf_trainer(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    needs.module("transformers")
    needs.module("accelerate")
    return collect_and_report(tmp_path_factory.mktemp("hf"), "hf_trainer_train.py",
                              ["--max-steps", "12", "--batch", "2", "--accum", "2", "--sleep-ms", "25"])


@pytest.fixture(scope="module")
def lightning(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    needs.module("pytorch_lightning")
    return collect_and_report(tmp_path_factory.mktemp("pl"), "lightning_train.py",
                              ["--max-steps", "12", "--ckpt-every", "2", "--ckpt-sleep-ms", "150",
                               "--lightning-profiler"])


@pytest.fixture(scope="module")
def deepspeed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    needs.module("deepspeed")
    return collect_and_report(tmp_path_factory.mktemp("ds"), "deepspeed_train.py",
                              ["--steps", "12", "--accum", "2", "--gc-sleep-ms", "80"])


def claims(report: dict[str, Any], rank: int, family: str | None, at_least_us: float) -> list[str]:
    """Ids of the findings whose spans give ``rank``'s ``family`` (None: no span) ``at_least_us`` per step."""
    return [f["id"] for f in report["findings"]
            if any(s.get("rank") == rank and s.get("family") == family and s.get("us_per_step", 0) >= at_least_us
                   for s in f.get("spans") or [])]


def within(value_us: float, floor_ms: float) -> bool:
    """A sleep of ``floor_ms`` per step: at least 98% of it, at most twice it."""
    return 0.98 * floor_ms * 1e3 <= value_us <= 2 * floor_ms * 1e3


def test_hf_trainer_slow_loader_is_the_answer(hf_trainer: dict[str, Any]) -> None:
    """Rank 1's ``__getitem__`` sleeps 25 ms x 2 samples x 2 micro-batches = 100 ms per optimizer step."""
    truth = hf_trainer["truth"]["truth"]
    per_step_ms = truth["loader_sleep_ms_per_step"]
    assert per_step_ms == 100.0 and truth["late_rank"] == 1
    answer = hf_trainer["report"]["findings"][0]
    assert answer["rank"] == 1
    top = answer["spans"][0]
    assert top["rank"] == 1 and top["family"] == "data_loading" and "DataLoader" in top["span"]
    assert within(top["us_per_step"], per_step_ms), top
    assert "data loader" in answer["title"]
    assert claims(hf_trainer["report"], 1, "data_loading", 0.5 * per_step_ms * 1e3) == [answer["id"]]
    # the Trainer's steps are optimizer steps: 2 micro-batches each, 6 recorded
    assert hf_trainer["run_json"]["ranks"]["1"]["steps"] == 12
    workload = hf_trainer["report"]["workload"]
    assert workload["kind"] == "training" and workload["micro_steps"] == truth["micro_steps_per_step"] == 2


def test_lightning_slow_checkpoint_storage_is_the_answer(lightning: dict[str, Any]) -> None:
    """Lightning's own profiler ran: collect stepped aside and the report read Lightning's traces, whose
    ``save_checkpoint`` span on rank 0 holds 150 ms per save, one save every 2 steps (75 ms per step:
    any 6 consecutive steps hold exactly 3 saves), counted once over the findings; the answer names it."""
    truth = lightning["truth"]["truth.rank0.json"]
    assert truth["saves"] == 6 and truth["sleep_ms_per_step"] == 75.0
    text = "\n".join(ln for ln in lightning["collect"].stderr.splitlines() if ln.startswith("[traceread]"))
    assert "the job ran its own profiler" in text and "traceread stepped aside" in text
    report = lightning["report"]
    assert any("this report reads the job's own traces" in w and "lightning_profile" in w for w in report["warnings"])
    assert report["source"]["ranks_read"] == 2
    assert report["workload"]["framework"] == "PyTorch Lightning"  # its own [pl] spans in its own traces
    answer = report["findings"][0]
    assert answer["rank"] == 0
    top = answer["spans"][0]
    assert top["rank"] == 0 and top["family"] == "checkpoint" and "save_checkpoint" in top["span"]
    # The save's time is counted once: the findings that hold rank 0's checkpoint span add up to the sleep. The
    # answer names it first; on a busy machine part of the same time may be claimed by another finding first
    # (a late rank, a slow step: the order of docs/ledger.md), never twice. The message carries the window.
    held = [(f["id"], s["us_per_step"]) for f in report["findings"] for s in f.get("spans") or []
            if s.get("rank") == 0 and s.get("family") == "checkpoint"]
    why = (held, report["ledger"]["window"].get("by_step"), [(f["id"], f["title"], f.get("spans")) for f in report["findings"]])
    total = sum(us for _, us in held)
    assert within(total, 75.0) and total <= 1.5 * 75e3, why  # twice would be a double count
    assert answer["id"] in {fid for fid, _ in held}, why  # (a finding may list several checkpoint spans)


def test_deepspeed_gc_pause_is_the_answer(deepspeed: dict[str, Any]) -> None:
    """Rank 1 runs ``gc.collect()`` (plus an 80 ms sleep) after every optimizer step; no span covers it."""
    truth = deepspeed["truth"]["truth.rank1.json"]
    recorded = deepspeed["run_json"]["ranks"]["1"]["profiler_steps"]
    assert recorded == [3, 4, 5, 6, 7, 8]
    # the pause after optimizer step s lies in ProfilerStep#(s - 1): pauses_ms[s - 1] -> step s - 1
    pause_ms = sum(truth["pauses_ms"][k] for k in recorded) / len(recorded)
    assert pause_ms >= 80.0
    answer = deepspeed["report"]["findings"][0]
    assert answer["rank"] == 1 and answer["id"] == "straggler"
    top = answer["spans"][0]
    assert top["rank"] == 1 and top["family"] is None and top["span"] is None
    assert abs(top["us_per_step"] - pause_ms * 1e3) <= 0.2 * pause_ms * 1e3 + 10e3, (top, pause_ms)
    assert "outside any recorded span" in answer["title"]
    assert claims(deepspeed["report"], 1, None, 0.5 * pause_ms * 1e3) == [answer["id"]]


@pytest.fixture(scope="module")
def deepspeed_big_batch(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    needs.module("deepspeed")
    return collect_and_report(tmp_path_factory.mktemp("dsbig"), "deepspeed_train.py",
                              ["--steps", "12", "--accum", "2", "--gc-rank", "-1", "--big-batch-rank", "0",
                               "--big-batch-factor", "16", "--micro-batch", "32", "--width", "1024"])


def extra_work_ms(job: dict[str, Any]) -> float:
    """Rank 0's own work per optimizer step beyond rank 1's, as the script timed it over the recorded
    steps: ProfilerStep#k holds optimizer step k + 2, whose first micro-batch is ``micro_ms[k + 1]``."""
    t0, t1 = job["truth"]["truth.rank0.json"], job["truth"]["truth.rank1.json"]
    recorded = job["run_json"]["ranks"]["0"]["profiler_steps"]
    mean = [sum(t["micro_ms"][k + 1] for k in recorded) / len(recorded) for t in (t0, t1)]
    return (mean[0] - mean[1]) * t0["micro_steps_per_step"]


def test_deepspeed_larger_batch_rank_is_the_answer(deepspeed_big_batch: dict[str, Any]) -> None:
    """Rank 0's micro-batches are 16x rank 1's: it is late by its own extra work every step. No sleep here:
    the truth is the script's own timing of both ranks' micro-batches (those that exchange no gradients),
    and the answer is within 35% of it (both ranks timed in the same run, on the same machine)."""
    job = deepspeed_big_batch
    assert job["truth"]["truth.rank0.json"]["batch"] == 16 * job["truth"]["truth.rank1.json"]["batch"]
    extra_ms = extra_work_ms(job)
    assert extra_ms > 0
    answer = job["report"]["findings"][0]
    assert answer["id"] == "straggler" and answer["rank"] == 0
    assert abs(answer["impact_us_per_step"] - extra_ms * 1e3) <= 0.35 * extra_ms * 1e3, (answer["title"], extra_ms)
    assert [f["id"] for f in job["report"]["findings"] if f["id"] == "straggler"] == ["straggler"]


def test_deepspeed_larger_batch_cause_is_its_own_work(deepspeed_big_batch: dict[str, Any]) -> None:
    """A CPU rank late by its own operators (a larger batch) is not told its data loader or Python was late."""
    answer = deepspeed_big_batch["report"]["findings"][0]
    assert answer["rank"] == 0
    text = " ".join([answer["title"], *answer.get("suggestions", [])])
    assert "data loader" not in text and "(host)" not in answer["title"], text
    assert "(CPU operators)" in answer["title"], answer["title"]
    (entry,) = [s for s in deepspeed_big_batch["report"]["stragglers"] if s["rank"] == 0]
    assert entry["cause"] == "cpu_ops", entry
