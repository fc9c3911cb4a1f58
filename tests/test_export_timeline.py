"""The report's step timeline extract against the simulator's truth and the report's own numbers:
the GPU lane's idle rows are exactly the step's idle time of the simulator's schedule (and of the
report's step entry), its host-bound rows the step entry's host-bound idle, every stream row lies
inside its step (the true step window), the extract stays bounded, and the critical path names the
straggler the simulator slowed down."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from traceread.analysis.time.step_timeline import IDLE_STREAM, MAX_ROWS_PER_STEP, MIDDLE_STEPS, category, pg_roles
from traceread.assemble.report import ReportOptions, build_report

REPO = Path(__file__).resolve().parents[1]


def report(sample: str) -> dict:
    folder = REPO / "sample_traces" / sample
    return build_report([folder], ReportOptions(workers=1))


@pytest.mark.parametrize("sample", ["ddp_straggler_h100", "tp_dp_h100", "slow_steps_a100", "h100_ddp_gloo_2proc_1gpu"])
def test_idle_rows_are_the_steps_idle_time(sample: str) -> None:
    rep = report(sample)
    truth_file = REPO / "sample_traces" / sample / "truth.json"  # simulated samples; the real one has none
    truth = json.loads(truth_file.read_text()) if truth_file.is_file() else None
    tl = rep["step_timeline"]
    rows = tl["rows"]
    entries = {e["rank"]: {s["step"]: s for s in e["steps"]} for e in rep["ranks"]}
    for p in tl["steps"]:
        for r in tl["ranks"]:
            sel = [j for j in range(len(rows["step"])) if rows["step"][j] == p["step"] and rows["rank"][j] == r]
            if not sel:
                continue
            st = entries[r][p["step"]]
            idle = sum(rows["end"][j] - rows["start"][j] for j in sel if rows["stream"][j] == IDLE_STREAM)
            host = sum(rows["end"][j] - rows["start"][j] for j in sel if rows["kind"][j] == "host_bound")
            assert idle == pytest.approx(st["idle_us"], abs=0.01), (r, p["step"])
            assert host == pytest.approx(st["host_bound_us"], abs=0.01), (r, p["step"])
            lo = min(rows["start"][j] for j in sel)
            hi = max(rows["end"][j] for j in sel)
            assert hi - lo == pytest.approx(st["duration_us"], abs=0.01)  # rows stay inside the step window
            if truth is not None:
                want = next(t for t in truth["ranks"][str(r)]["steps"] if t["step"] == p["step"])
                assert idle == pytest.approx(want["idle_us"], abs=1e-3), (r, p["step"])
                assert hi - lo == pytest.approx(want["duration_us"], abs=1e-3)
            assert len(sel) <= 2 * MAX_ROWS_PER_STEP


def test_critical_path_names_the_simulated_straggler() -> None:
    rep = report("ddp_straggler_h100")
    truth = json.loads((REPO / "sample_traces" / "ddp_straggler_h100" / "truth.json").read_text())
    slow = {int(s["rank"]) for s in truth["stragglers"]}
    assert slow == {5}
    for p in rep["step_timeline"]["steps"]:
        last = Counter(c["rank"] for c in p["critical"])
        assert last and last.most_common(1)[0][0] in slow, last
    assert {p["label"] for p in rep["step_timeline"]["steps"]} == {"median step", "slowest step"}


def test_categories_follow_roles_when_a_layout_names_them() -> None:
    roles = pg_roles({"groups": [{"pg": "1", "role": "tp"}, {"name": "2", "kind": "dp"}]})
    assert roles == {"1": "tp", "2": "dp"}
    assert category("comm", "1", roles, False) == "comm tp"
    assert category("comm", "7", roles, False) == "comm pg 7"
    assert category("idle", None, roles, True) == "idle / bubble"
    assert category("host_bound", None, {}, False) == "host-bound idle"
    assert MIDDLE_STEPS >= 1


def test_big_jobs_sample_the_ranks_that_matter_and_say_so() -> None:
    from traceread.analysis.time.step_timeline import _pick_ranks

    ranks = list(range(64))
    doc = {"stragglers": [{"rank": 41, "arrived_last": 30}],
           "pipeline": {"per_stage": [{"stage": k, "rank": 16 * k} for k in range(4)]},
           "ranks": [{"rank": r, "steps": [{"step": 1, "duration_us": 1000.0 + (500 if r == 9 else r)}]} for r in ranks]}
    chosen, note = _pick_ranks(ranks, doc, 12)
    assert len(chosen) == 12 and {41, 0, 16, 32, 48, 9} <= set(chosen)
    assert note is not None and note.startswith("12 of 64 ranks shown") and "stragglers" in note
    assert _pick_ranks(ranks[:8], doc, 12) == (ranks[:8], None)
