"""Several profiling cycles and runs in one folder: grouping, choice, drift, warm-up (docs/cycles.md).

Simulated cycles carry their truth from the simulator's own knobs (a planted 3 ms GPU slowdown of
one rank in cycle 3); tensorboard_trace_handler folders are the real kineto sample (two cycles of
worker 0) and folders built with its naming; warm-up is judged on the recorded CPU sample and on
a real job that compiles inside the profiled window (tests/test_cycles_e2e.py records those).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from traceread.assemble.report import ReportOptions, build_report
from traceread.cli import cli
from traceread.compare import drift as drift_mod
from traceread.read import cycles
from traceread.read.warmup import judge, warmup_event
from traceread.simulate import simulate

REPO = Path(__file__).resolve().parents[1]
SLOW_MS = 3.0  # planted: rank 2's compute kernels take 3 ms more per step in cycle 3
T0_MS = 1_700_000_000_000


@pytest.fixture(scope="module", autouse=True)
def _own_cache(tmp_path_factory: pytest.TempPathFactory) -> object:
    """One parse/summary cache for the module: each cycle is parsed once, then reports reuse it."""
    mp = pytest.MonkeyPatch()
    mp.setenv("TRACEREAD_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    yield
    mp.undo()


def _opts(**kw: object) -> ReportOptions:
    return ReportOptions(workers=1, **kw)  # type: ignore[arg-type]


def _tb_name(rank: int, stamp_ms: int) -> str:
    return f"worker{rank}.{stamp_ms}.pt.trace.json.gz"


@pytest.fixture(scope="module")
def sim_cycles(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three cycles of a 4-rank DDP job (steps 10-12, 20-22, 30-32) in one tensorboard-style folder;
    rank 2's GPU is 3 ms/step slower in cycle 3 only."""
    root = tmp_path_factory.mktemp("simcycles")
    out = root / "tb"
    out.mkdir()
    for c in (1, 2, 3):
        d = root / f"c{c}"
        simulate("ddp", d, ranks=4, steps=3, first_step=10 * c,
                 stragglers=[(2, SLOW_MS * 1000, "gpu")] if c == 3 else [])
        for r in range(4):
            shutil.copy(d / f"rank{r}.pt.trace.json.gz", out / _tb_name(r, T0_MS + 60_000 * c + r))
    return out


def test_names_give_rank_cycle_and_timestamp() -> None:
    f = cycles.name_facts(Path("logs/worker3.1623143089861.pt.trace.json"))
    assert (f.rank, f.name_time_ns, f.cycle_hint) == (3, 1623143089861 * 10**6, None)
    f = cycles.name_facts(Path("run/traces/cycle12/rank5.pt.trace.json.gz"))
    assert (f.rank, f.cycle_hint) == (5, 12)
    f = cycles.name_facts(Path("host-a_4242.1773709742341309550.pt.trace.json.gz"))
    assert (f.rank, f.name_time_ns) == (None, 1773709742341309550)


def test_tensorboard_folder_latest_by_default_all_on_request(sim_cycles: Path) -> None:
    rep = build_report([sim_cycles], _opts())
    src = rep["source"]
    assert src["cycle"]["cycle"] == 3 and src["cycle"]["steps"] == [30, 32]
    assert [c["steps"] for c in src["cycles"]] == [[10, 12], [20, 22], [30, 32]]
    assert all(c["complete"] and c["ranks"] == [0, 1, 2, 3] for c in src["cycles"])
    assert any("3 profiling cycles found; analysing latest complete cycle 3" in w for w in rep["warnings"])
    assert sorted(s["step"] for s in rep["ranks"][0]["steps"]) == [30, 31, 32]
    one = build_report([sim_cycles], _opts(cycle="1"))
    assert sorted(s["step"] for s in one["ranks"][0]["steps"]) == [10, 11, 12] and len(one["ranks"]) == 4


def test_planted_slowdown_is_drift_with_rank_and_category(sim_cycles: Path) -> None:
    res = CliRunner().invoke(cli, ["report", str(sim_cycles), "--cycle", "all", "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    d = doc["drift"]
    assert [row["steps"] for row in d["cycles"]] == [[10, 12], [20, 22], [30, 32]]
    g = d["growth"]
    # exact on simulator truth: the slowed rank's compute grew by the planted 3 ms, the others' not at all
    assert g["rank_compute"]["rank"] == 2
    assert g["rank_compute"]["delta_us"] == pytest.approx(SLOW_MS * 1000, rel=1e-3)
    assert abs(g["rank_compute"]["others_median_delta_us"]) < 0.01 * SLOW_MS * 1000
    assert g["straggler_appeared"]["rank"] == 2 and g["straggler_appeared"]["cause"] == "gpu"
    assert d["cycles"][0]["straggler"] is None or d["cycles"][0]["straggler"]["blame_us_per_step"] < 300
    # the others wait for it: exposed communication grows, the job's median compute does not
    grown = {r["what"]: r["delta_us"] for r in g["categories"]}
    assert grown["exposed_comm"] > 0.5 * SLOW_MS * 1000 and abs(grown["compute"]) < 0.05 * SLOW_MS * 1000
    assert 0.5 * SLOW_MS * 1000 < g["step_delta_us"] < 1.5 * SLOW_MS * 1000
    assert "rank 2's compute +3.00 ms/step" in d["headline"] and "straggler rank 2 appeared" in d["headline"]
    text = CliRunner().invoke(cli, ["report", str(sim_cycles), "--cycle", "all", "--format", "text"]).output
    assert "Drift over cycles" in text and "DRIFT: step time grew" in text and "1:3 (steps 30-32)" in text


def test_drift_html_section_escapes(sim_cycles: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    res = CliRunner().invoke(cli, ["report", str(sim_cycles), "--cycle", "all", "-o", str(out)])
    assert res.exit_code == 0, res.output
    html = out.read_text()
    assert '<section id="drift">' in html and "rank 2&#39;s compute" in html


def test_diff_two_cycles_of_one_run(sim_cycles: Path) -> None:
    res = CliRunner().invoke(cli, ["diff", str(sim_cycles), "--cycles", "1,3", "--format", "json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert (d["a"]["cycle"], d["b"]["cycle"]) == ("1:1", "1:3")
    assert d["step_us"]["delta"] > 0.5 * SLOW_MS * 1000
    same = CliRunner().invoke(cli, ["diff", f"{sim_cycles}@1", f"{sim_cycles}@3", "--format", "json"])
    assert json.loads(same.output)["step_us"] == d["step_us"]
    bad = CliRunner().invoke(cli, ["diff", str(sim_cycles), "--cycles", "1,7"])
    assert bad.exit_code == 2 and "no such cycle" in bad.output and "Traceback" not in bad.output


def test_real_tensorboard_sample_two_cycles(shared_traces: Path) -> None:
    """kineto's tb_plugin sample: worker0 profiled twice (steps 5-10 and 16-21) used to be refused."""
    folder = shared_traces / "kineto_tb_resnet50_num_workers_0"
    rep = build_report([folder], ReportOptions(workers=1))
    assert rep["source"]["cycle"]["steps"] == [16, 21] and "worker0.1623143566756" in rep["ranks"][0]["file"]
    res = CliRunner().invoke(cli, ["report", str(folder), "--cycle", "all", "--format", "json"])
    assert res.exit_code == 0, res.output[-500:]
    assert [c["steps"] for c in json.loads(res.output)["drift"]["cycles"]] == [[5, 10], [16, 21]]


def test_mixed_runs_are_split_not_refused(tmp_path: Path) -> None:
    """The same job run twice into one folder (pid-style names, step numbers restart): two runs."""
    folder = tmp_path / "mixed"
    folder.mkdir()
    for run, first in ((1, 10), (2, 10)):
        d = tmp_path / f"run{run}"
        simulate("ddp", d, ranks=2, steps=2, first_step=first, seed=run)
        for r in range(2):
            shutil.copy(d / f"rank{r}.pt.trace.json.gz",
                        folder / f"node_{100 * run + r}.{T0_MS + run * 3_600_000}.pt.trace.json.gz")
    rep = build_report([folder], _opts())
    assert [(c["run"], c["cycle"]) for c in rep["source"]["cycles"]] == [(1, 1), (2, 1)]
    assert rep["source"]["cycle"]["run"] == 2 and {Path(e["file"]).name[:8] for e in rep["ranks"]} == {"node_200", "node_201"}
    assert any("in 2 runs" in w for w in rep["warnings"])
    first = build_report([folder], _opts(cycle="1:1"))
    assert {Path(e["file"]).name[:8] for e in first["ranks"]} == {"node_100", "node_101"}


def test_two_world_sizes_claiming_one_cycle_are_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "traces" / "cycle1").mkdir(parents=True)
    (run / "run.json").write_text("{}")
    for ranks in (2, 4):
        simulate("ddp", tmp_path / f"w{ranks}", ranks=ranks, steps=1, layers=1)
    shutil.copy(tmp_path / "w2" / "rank0.pt.trace.json.gz", run / "traces" / "cycle1" / "rank0.pt.trace.json.gz")
    shutil.copy(tmp_path / "w4" / "rank1.pt.trace.json.gz", run / "traces" / "cycle1" / "rank1.pt.trace.json.gz")
    res = subprocess.run([sys.executable, "-m", "traceread.cli", "report", str(run), "--format", "json"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "files from different jobs" in res.stderr and "world size 4" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and not res.stdout


def test_bad_cycle_choice_is_one_line() -> None:
    res = CliRunner().invoke(cli, ["report", str(REPO / "sample_traces" / "cpu_ddp_gloo"), "--cycle", "x2"])
    assert res.exit_code == 2 and res.output.count("\n") == 1 and "--cycle 'x2'" in res.output


# ------------------------------------------------------------------------------------------ warm-up


def test_warmup_names() -> None:
    for name in ("_compile.compile_inner (dynamo_timed)", "entire_frame_compile", "create_aot_dispatcher_function",
                 "CachingAutotuner.benchmark_all_configs (dynamo_timed)", "ncclCommInitRankConfig", "cudnnFind"):
        assert warmup_event(name), name
    for name in ("TorchDynamo Cache Lookup", "Torch-Compiled Region: 0/0", "CompiledFunction", "aten::mm",
                 "## Call CompiledFxGraph fabc ##", "triton_poi_fused__to_copy_1", "nccl:all_reduce"):
        assert not warmup_event(name), name


def test_warmup_verdict_numbers() -> None:
    v = judge([30_000.0, 10_000.0, 11_000.0, 9_000.0], {})
    assert v.is_warmup and v.first_step_ratio == pytest.approx(3.0) and "3.0x" in v.reasons[0]
    assert not judge([10_500.0, 10_000.0, 11_000.0], {}).is_warmup  # 1.0x: steady
    assert not judge([30_000.0], {}).is_warmup  # one step: no comparison
    v = judge([10_000.0, 10_000.0], {"entire_frame_compile": 4_000.0, "_compile.compile_inner (dynamo_timed)": 3_900.0})
    assert v.is_warmup and v.startup_us == 4_000.0 and "entire_frame_compile" in v.reasons[0]


def test_recorded_sample_of_early_steps_warns() -> None:
    """cpu_ddp_gloo recorded ProfilerStep#2-#3 with the old defaults: #2 takes ~3x #3 (lazy start-up)."""
    rep = build_report([REPO / "sample_traces" / "cpu_ddp_gloo"], _opts())
    assert rep["source"]["cycle"]["warmup"] is True
    assert any(w.startswith("recorded steps look like warm-up") and "first recorded step" in w for w in rep["warnings"])


def test_compiled_steady_state_is_not_warmup() -> None:
    """The H100 torch.compile sample recorded steps 7-11, after compilation: steady-state names only."""
    rep = build_report([REPO / "sample_traces" / "h100_compiled_1gpu"], _opts())
    assert not any("warm-up" in w for w in rep["warnings"]), rep["warnings"]


def test_drift_needs_two_cycles() -> None:
    assert drift_mod.drift([({"cycle": 1}, {"ranks": []})])["growth"] is None


def test_broken_file_among_cycles_is_named_and_the_rest_analysed(sim_cycles: Path, tmp_path: Path) -> None:
    folder = tmp_path / "tb"
    shutil.copytree(sim_cycles, folder)
    victim = folder / _tb_name(1, T0_MS + 60_000 * 3 + 1)
    victim.write_bytes(victim.read_bytes()[:2000])  # truncated gzip: cycle 3 loses rank 1
    (folder / "notes.json").write_text('{"lr": 0.1}')  # a stray non-trace JSON
    rep = build_report([folder], _opts())
    assert rep["source"]["cycle"]["steps"] == [20, 22]  # cycle 3 is incomplete now: the latest complete is 2
    assert [c["complete"] for c in rep["source"]["cycles"]] == [True, True, False]
    skipped = [w for w in rep["warnings"] if w.startswith("skipped")]
    assert len(skipped) == 2 and any(victim.name in w and "truncated" in w for w in skipped)
    assert [e["rank"] for e in rep["ranks"]] == [0, 1, 2, 3]


def test_drift_terminal_strips_control_characters() -> None:
    from rich.console import Console

    from traceread.render.drift_view import render_terminal

    row = {"label": "1:1", "steps": [1, 2], "step_us": 1000.0, "pg_comm_us": {"evil\x1b[2J\x1b]0;t\x07": 5.0}}
    doc = {"drift": {"cycles": [row, dict(row, label="1:2")], "headline": "grew \x1b[2J"}}
    con = Console(record=True, width=200, color_system=None)
    render_terminal(doc, con)
    out = con.export_text()
    assert "\x1b" not in out and "\x07" not in out and "evil?[2J" in out and "grew ?[2J" in out


def test_drift_html_escapes_trace_strings() -> None:
    from traceread.render.drift_view import html_section

    row = {"label": "1:1", "steps": [1, 2], "step_us": 1000.0, "pg_comm_us": {"<script>alert(1)</script>": 5.0}}
    doc = {"drift": {"cycles": [row, dict(row, label="1:2")], "headline": "<img src=x onerror=alert(1)>",
                     "growth": {"categories": [{"what": "comm pg <b>x</b>", "first_us": 1.0, "last_us": 2.0,
                                                "delta_us": 1.0}]}}}
    out = str(html_section(doc))
    assert "<script>" not in out and "<img" not in out and "<b>" not in out
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in out and "&lt;img src=x onerror=alert(1)&gt;" in out


@pytest.mark.slow
def test_drift_page_renders_in_chromium(sim_cycles: Path, tmp_path: Path) -> None:
    from test_browser import check_page

    page = tmp_path / "drift.html"
    res = CliRunner().invoke(cli, ["report", str(sim_cycles), "--cycle", "all", "-o", str(page)])
    assert res.exit_code == 0, res.output
    dom = check_page(page, tmp_path)
    assert '<section id="drift">' in dom and "1:3 (steps 30-32)" in dom


def test_per_host_layout_is_one_run(tmp_path: Path) -> None:
    """srun/mpirun per-node launches write RUN/<host>/traces/cycle{C}/...: the hosts are one run."""
    simulate("ddp", tmp_path / "sim", ranks=2, steps=1, layers=1)
    run = tmp_path / "RUN"
    for host, r in (("nodeA", 0), ("nodeB", 1)):
        (run / host / "traces" / "cycle1").mkdir(parents=True)
        (run / host / "run.json").write_text(json.dumps({"layout": "per-host"}))
        shutil.copy(tmp_path / "sim" / f"rank{r}.pt.trace.json.gz",
                    run / host / "traces" / "cycle1" / f"rank{r}.pt.trace.json.gz")
    facts = [cycles.name_facts(p) for p in sorted(run.rglob("*.gz"))]
    got = cycles.group_cycles(facts)
    assert [(c.label, c.ranks) for c in got] == [("1:1", [0, 1])]
