"""build_report on real and simulated traces: the JSON contract, numbers against ground truth,
graceful degradation, and the `traceread report` command (exit codes, outputs)."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from statistics import median

import pytest
from click.testing import CliRunner

from traceread.assemble.report import NothingUsableError, ReportOptions, build_report
from traceread.commands import report as report_cmd
from traceread.render import html, json_report

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"
SAMPLE_DIRS = sorted(p for p in SAMPLES.iterdir() if p.is_dir()) if SAMPLES.is_dir() else []


def opts(**kw: object) -> ReportOptions:
    return ReportOptions(workers=1, use_cache=False, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def ddp_straggler(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    from traceread.simulate import simulate

    out = tmp_path_factory.mktemp("ddp_straggler")
    truth = simulate("ddp", out, ranks=4, steps=3, stragglers=[(2, 3000.0, "gpu")])
    return out, truth


@pytest.fixture(scope="module")
def ddp_report(ddp_straggler: tuple[Path, dict]) -> dict:
    return build_report([ddp_straggler[0]], ReportOptions(workers=2, use_cache=False))  # type: ignore[return-value]


# ---------------------------------------------------------------------------------- contract


@pytest.mark.parametrize("folder", SAMPLE_DIRS, ids=[p.name for p in SAMPLE_DIRS])
def test_schema_on_every_sample(folder: Path) -> None:
    doc = build_report([folder], opts())
    json_report.assert_valid(json.loads(json_report.to_json(doc)))
    assert doc["ranks"], "every sample has readable ranks"
    truth_file = folder / "truth.json"
    if truth_file.is_file():
        truth = json.loads(truth_file.read_text())
        assert len(doc["ranks"]) == truth["world_size"]


def test_schema_on_dlrm_8_ranks(shared_traces: Path) -> None:
    doc = build_report([shared_traces / "param_dlrm_8rank"], ReportOptions(workers=2))
    json_report.assert_valid(json.loads(json_report.to_json(doc)))
    assert [r["rank"] for r in doc["ranks"]] == list(range(8))
    for r in doc["ranks"]:
        assert r["device"] == "Tesla V100-SXM2-32GB" and r["num_sms"] == 80
        parts = r["compute_us"] + r["exposed_comm_us"] + r["exposed_memcpy_us"] + r["idle_us"]
        assert parts == pytest.approx(r["window_us"], abs=1e-3)  # the breakdown identity
        # window_us is the whole-trace GPU window (tests/test_report_window.py); each step entry
        # carries its own breakdown, with the same identity on the step window
        for s in r["steps"]:
            step_parts = s["compute_us"] + s["exposed_comm_us"] + s["exposed_memcpy_us"] + s["idle_us"]
            assert step_parts == pytest.approx(s["duration_us"], abs=1e-3)
    names = {c["name"] for c in doc["collectives"]}
    assert {"allreduce", "alltoall"} <= names
    assert doc["findings"] and doc["findings"][0]["impact_us_per_step"] > 0
    page = html.render_html(doc)
    assert 'id="chart-breakdown"' in page and 'id="chart-heatmap"' in page


def test_hang_sample_leads_with_the_hang() -> None:
    folder = SAMPLES / "cpu_hang_gloo"
    doc = build_report([folder], opts())
    assert doc["hang"] is not None and doc["hang"]["missing_ranks"] == [1]
    assert doc["findings"][0]["id"] == "hang"


# ------------------------------------------------------------------------------- ground truth


def test_breakdown_matches_simulator_truth(ddp_straggler: tuple[Path, dict], ddp_report: dict) -> None:
    _, truth = ddp_straggler
    json_report.assert_valid(ddp_report)
    for r in ddp_report["ranks"]:
        t = truth["ranks"][str(r["rank"])]
        tol = 0.005 * t["window_us"]  # step edges are placed by the steps analysis, within 0.5 %
        for key in ("window_us", "compute_us", "comm_us", "exposed_comm_us", "idle_us"):
            assert r[key] == pytest.approx(t[key], abs=tol), (r["rank"], key)
        assert len(r["steps"]) == len(truth["steps"])


def test_straggler_is_the_answer(ddp_straggler: tuple[Path, dict], ddp_report: dict) -> None:
    _, truth = ddp_straggler
    (expected,) = truth["stragglers"]
    top = [s for s in ddp_report["stragglers"] if s.get("root", True)]
    assert top[0]["rank"] == expected["rank"] == 2
    assert top[0]["blame_us_per_step"] == pytest.approx(expected["blame_us_per_step"], rel=0.1)
    f = next(f for f in ddp_report["findings"] if f["id"] == "straggler")
    assert f["rank"] == 2 and "Rank 2" in f["title"]
    # rank 2 is the critical rank (its slow GPU sets the step): its share is the step time it costs
    # (simulator re-run without the straggler), out of its own compute, not the blame
    assert ddp_report["ledger"]["critical_rank"] == 2 and f["role"] == "dp"
    assert f["impact_us_per_step"] == pytest.approx(expected["step_cost_us"], rel=0.05)
    coll = ddp_report["collectives"][0]
    assert coll["name"] == "allreduce" and coll["busbw_gbps"] and coll["link"] == "nvlink"


@pytest.fixture(scope="module")
def straggler_sample() -> tuple[dict, dict]:
    folder = SAMPLES / "ddp_straggler_h100"
    return build_report([folder], opts()), json.loads((folder / "truth.json").read_text())  # type: ignore[return-value]


def test_straggler_headline_is_the_step_time_saved(straggler_sample: tuple[dict, dict]) -> None:
    """8 ranks, 4 DDP buckets, rank 5's GPU +3 ms/step: the others wait ~8.7 ms/step in total (blame,
    once per bucket), but re-running the job without the straggler saves only ~2.9 ms/step.

    The saving is read from the window ledger (each delay once per step, bounded by the other ranks'
    own work); truth is the difference of two simulated runs (``window_cost_us``: each step's longest
    rank, as the window counts steps), within 2 %.
    """
    doc, truth = straggler_sample
    (t,) = truth["stragglers"]
    (e,) = [s for s in doc["stragglers"] if s["rank"] == t["rank"] == 5]
    assert e["blame_us_per_step"] == pytest.approx(t["blame_us_per_step"], rel=0.05)  # stable definition kept
    assert e["impact_us_per_step"] == pytest.approx(t["window_cost_us"], rel=0.02)
    assert e["impact_us_per_step"] < 0.4 * e["blame_us_per_step"]
    f = next(f for f in doc["findings"] if f["id"] == "straggler")
    # its share: rank 5's own work on the critical path of every step, over the window
    w = doc["ledger"]["window"]
    late = next(x for x in w["late"] if x["rank"] == 5)
    assert f["rank"] == 5 and f["category"] == "comm_wait" and f["role"] == "dp"
    assert f["impact_us_per_step"] == pytest.approx(late["share_us"] / w["steps"])
    assert f["predicted_saving_us"] == pytest.approx(t["window_cost_us"], rel=0.02)
    assert "3.0 ms shorter" in f["title"] and "8.7 ms" not in f["title"]
    assert "3.0 ms shorter" in f["explanation"] and "8.7 ms per step" in f["explanation"]  # impact vs blame
    assert f["blame_us_per_step"] == pytest.approx(e["blame_us_per_step"])


def test_findings_ranked_by_impact(straggler_sample: tuple[dict, dict]) -> None:
    doc, _ = straggler_sample
    impacts = [f["impact_us_per_step"] for f in doc["findings"]]
    assert impacts == sorted(impacts, reverse=True)
    assert doc["findings"][0]["id"] == "straggler"
    # exposed communication no longer re-counts the others' waiting for rank 5 (2.0 ms is rank 5's own)
    ec = next(f for f in doc["findings"] if f["id"] == "exposed_comm")
    own = next(r for r in doc["ranks"] if r["rank"] == 5)
    assert ec["impact_us_per_step"] == pytest.approx(own["exposed_comm_us"] / len(own["steps"]), rel=0.05)


def test_straggler_finding_ranks_by_impact_not_blame(straggler_sample: tuple[dict, dict]) -> None:
    """A rank the others waited on for a long time (blame) but whose lateness costs the step little
    (impact) ranks below a problem that costs more: the finding is the window ledger's share and
    saving, whatever the straggler analysis' blame says."""
    from traceread.assemble.findings.assemble import build_findings

    doc, _ = straggler_sample
    doc = json.loads(json.dumps(doc))
    st = next(f for f in doc["findings"] if f["id"] == "straggler")
    (e,) = doc["stragglers"]
    e["blame_us_per_step"], e["impact_us_per_step"] = 40 * st["impact_us_per_step"], 0.5 * st["impact_us_per_step"]
    again = next(f for f in build_findings(doc) if f["id"] == "straggler")
    assert again["impact_us_per_step"] == pytest.approx(st["impact_us_per_step"])
    assert again["predicted_saving_us"] == pytest.approx(st["predicted_saving_us"])
    assert again["predicted_saving_us"] <= again["impact_us_per_step"]


def test_recorded_clock_uncertainty_sets_epsilon(tmp_path: Path, ddp_straggler: tuple[Path, dict]) -> None:
    """A run.json whose clock measurement is ±150 µs: no arrival difference below that is blamed."""
    run = tmp_path / "run"
    shutil.copytree(ddp_straggler[0], run)
    n = ddp_straggler[1]["world_size"]
    (run / "run.json").write_text(json.dumps({"clock": {"offsets_us": {str(r): 0.0 for r in range(n)},
                                                        "uncertainty_us": {str(r): 150.0 for r in range(n)}}}))
    doc = build_report([run], opts())
    clock = doc["source"]["clock"]
    assert clock["method"] == "recorded" and clock["epsilon_us"] >= 150.0
    assert [s["rank"] for s in doc["stragglers"] if s.get("root", True)][:1] == [2]  # gaps of ms stay blamed


def test_slow_steps_sample_matches_truth() -> None:
    """10 steps, 3 slow ones (data loader, GC, checkpoint): exactly those, each a host-side cause."""
    folder = SAMPLES / "slow_steps_a100"
    truth = json.loads((folder / "truth.json").read_text())
    assert len(truth["steps"]) >= 8 and 2 <= len(truth["slow_steps"]) < len(truth["steps"]) / 2
    assert len({t["cause"] for t in truth["slow_steps"]}) == len(truth["slow_steps"])
    doc = build_report([folder], opts())
    sim_cause = {"dataloader": "host", "gc": "host", "checkpoint": "host"}  # GPU idle while the host works
    found = {s["step"]: s for s in doc["slow_steps"]}
    assert sorted(found) == sorted(t["step"] for t in truth["slow_steps"])
    for t in truth["slow_steps"]:
        s = found[t["step"]]
        assert s["cause"] == sim_cause[t["cause"]], (t, s)
        assert s["excess_us"] == pytest.approx(t["excess_us"], rel=0.02)
        # what the host was doing instead: the data loader's __next__, checkpoint.save, or (GC) time
        # inside the forward with no operator nested in it
        names = " ".join(a["name"] for a in s["host_activity"])
        assert s["host_activity"], s
        assert ("DataLoader" in names) == (t["cause"] == "dataloader"), (t, names)
        assert ("checkpoint" in names) == (t["cause"] == "checkpoint"), (t, names)
    # each slow step is a share of the window: its excess over the median step, named by its cause
    w = doc["ledger"]["window"]
    med = next(b["step_us"] for b in w["by_step"] if b["step"] == w["median_step"])
    for t in truth["slow_steps"]:
        (f,) = [f for f in doc["findings"] if f["id"] == "slow_steps" and f["steps"] == [t["step"]]]
        step_us = next(b["step_us"] for b in w["by_step"] if b["step"] == t["step"])
        assert f["impact_us_total"] == pytest.approx(step_us - med, abs=1e-6)
        assert f["category"] in ("host_bound", "idle_other", "exposed_memcpy"), f
    assert doc["findings"][0]["id"] == "slow_steps" and doc["findings"][0]["steps"] == [18]  # the 40 ms checkpoint


# --------------------------------------------------------------------------- graceful degradation


def test_failing_cross_rank_analysis_is_a_warning(monkeypatch: pytest.MonkeyPatch,
                                                  ddp_straggler: tuple[Path, dict]) -> None:
    from traceread.analysis.comm import stragglers

    def boom(*_a: object, **_k: object) -> None:
        raise RuntimeError("synthetic failure")

    monkeypatch.setattr(stragglers, "attribute", boom)
    doc = build_report([ddp_straggler[0]], opts())
    json_report.assert_valid(doc)
    assert doc["stragglers"] == [] and doc["straggler_heatmap"] is None
    assert any(w.startswith("stragglers skipped: RuntimeError: synthetic failure") for w in doc["warnings"])
    assert doc["collectives"]  # the other analyses still ran


def test_failing_per_rank_analysis_is_a_warning(monkeypatch: pytest.MonkeyPatch,
                                                ddp_straggler: tuple[Path, dict]) -> None:
    from traceread.analysis.compute import occupancy

    monkeypatch.setattr(occupancy, "kernel_table", lambda *_a, **_k: 1 / 0)
    doc = build_report([ddp_straggler[0]], opts())
    json_report.assert_valid(doc)
    assert doc["kernels"] == []
    assert any("kernel table skipped: ZeroDivisionError" in w for w in doc["warnings"])
    assert doc["ranks"][0]["compute_us"] is not None


def test_corrupt_rank_is_reported_and_others_analysed(tmp_path: Path, ddp_straggler: tuple[Path, dict]) -> None:
    src, _ = ddp_straggler
    for f in src.glob("rank*.pt.trace.json.gz"):
        shutil.copy(f, tmp_path / f.name)
    bad = tmp_path / "rank3.pt.trace.json.gz"
    bad.write_bytes(gzip.compress(b'{"traceEvents": [')[:-8])
    doc = build_report([tmp_path], opts())
    assert [r["rank"] for r in doc["ranks"]] == [0, 1, 2]
    # The user is told whose numbers are absent and why, in one line.
    assert any(w.startswith("rank 3 missing: ") and "rank3.pt.trace.json.gz" in w for w in doc["warnings"])
    json_report.assert_valid(doc)


def test_nothing_usable_errors(tmp_path: Path) -> None:
    with pytest.raises(NothingUsableError) as e:
        build_report([tmp_path], opts())
    assert not e.value.bad_input
    with pytest.raises(NothingUsableError) as e:
        build_report([tmp_path / "missing"], opts())
    assert e.value.bad_input


# ------------------------------------------------------------------------------------ command


def test_cli_exit_codes(tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(report_cmd.report, [str(tmp_path)]).exit_code == 3
    assert runner.invoke(report_cmd.report, [str(tmp_path / "nope")]).exit_code == 2
    bad = tmp_path / "rank0.pt.trace.json"
    bad.write_text('{"not": "a trace"}')
    res = runner.invoke(report_cmd.report, [str(bad), "--no-cache"])
    assert res.exit_code == 2 and "rank0.pt.trace.json" in res.output
    res = runner.invoke(report_cmd.report, [str(bad), "--tokens-per-step", "4096"])
    assert res.exit_code == 2 and "--params" in res.output


def test_cli_help_has_examples() -> None:
    res = CliRunner().invoke(report_cmd.report, ["--help"])
    assert res.exit_code == 0
    assert "Examples:" in res.output and "--format json" in res.output and "Exit codes" in res.output


def test_cli_json_and_text(tmp_path: Path, ddp_straggler: tuple[Path, dict]) -> None:
    runner = CliRunner()
    res = runner.invoke(report_cmd.report, [str(ddp_straggler[0]), "--format", "json", "-j", "1"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    json_report.assert_valid(doc)
    out = tmp_path / "r.txt"
    res = runner.invoke(report_cmd.report, [str(ddp_straggler[0]), "-o", str(out), "-j", "1"])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert text.splitlines()[1].startswith("ANSWER: ")
    assert not list(ddp_straggler[0].glob("*.html"))  # -o given: nothing written beside the run


def test_cli_default_writes_html_beside_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                ddp_straggler: tuple[Path, dict]) -> None:
    run = tmp_path / "run"
    shutil.copytree(ddp_straggler[0], run)
    res = CliRunner().invoke(report_cmd.report, [str(run), "-j", "1"])
    assert res.exit_code == 0, res.output
    page = run / "traceread-report.html"
    assert page.is_file() and str(page) in res.output.replace("\n", "")
    assert any(line.startswith("ANSWER: ") for line in res.output.splitlines()[:4])
    # a read-only run folder: the page goes to the current folder instead
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    real_access = report_cmd.os.access
    monkeypatch.setattr(report_cmd.os, "access", lambda p, m: False if Path(p) == run else real_access(p, m))
    assert report_cmd.default_html_path((str(run),)) == cwd / "traceread-report.html"


def test_cli_html_falls_back_to_cwd_when_run_folder_write_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                ddp_straggler: tuple[Path, dict]) -> None:
    from traceread.render import html as html_mod

    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    real = html_mod.write_html

    def refuse_run_folder(doc: dict, path: Path, **kw: object) -> None:
        if Path(path).parent == ddp_straggler[0]:
            raise PermissionError(13, "Permission denied")
        real(doc, path, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(html_mod, "write_html", refuse_run_folder)
    res = CliRunner().invoke(report_cmd.report, [str(ddp_straggler[0]), "-j", "1"])
    assert res.exit_code == 0, res.output
    page = cwd / "traceread-report.html"
    assert page.is_file() and str(page) in res.output.replace("\n", "")
    assert not (ddp_straggler[0] / "traceread-report.html").exists()


def test_cli_model_shape_adds_attention_flops(tmp_path: Path, ddp_straggler: tuple[Path, dict]) -> None:
    from traceread.analysis.hardware import resolve_device

    n, d, layers, seq, dm = 2e8, 32768.0, 4, 2048, 4096
    runner = CliRunner()
    args = [str(ddp_straggler[0]), "--format", "json", "-j", "1", "--params", str(n), "--tokens-per-step", str(d)]
    res = runner.invoke(report_cmd.report, args + ["--n-layers", str(layers), "--seq-len", str(seq),
                                                   "--d-model", str(dm)])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    peak = resolve_device("NVIDIA H100 80GB HBM3", 132).peak("bf16")  # type: ignore[union-attr]
    flops_per_token = 6 * n + 12 * layers * seq * dm  # PaLM appendix B
    for r in doc["ranks"]:
        step_s = median(s["duration_us"] for s in r["steps"]) / 1e6  # the rank's median step duration
        assert r["mfu_pct"] == pytest.approx(100.0 * flops_per_token * d / 4 / (step_s * peak), rel=1e-6)
    res = runner.invoke(report_cmd.report, args + ["--n-layers", str(layers)])
    assert res.exit_code == 2 and "--seq-len" in res.output
    assert "--n-layers" in runner.invoke(report_cmd.report, ["--help"]).output


@pytest.mark.shared
def test_rank_says_why_its_mfu_is_missing(shared_traces: Path) -> None:
    """A trace without recorded shapes has no trace MFU and the rank says why (``mfu_note``); a
    formula MFU (--params) replaces both the number and the reason."""
    run = shared_traces / "hta_critical_path_alexnet"
    r = build_report([run], opts())["ranks"][0]
    assert r["mfu_pct"] is None and "record_shapes" in r["mfu_note"]
    f = build_report([run], opts(params=6.1e7, tokens_per_step=128.0))["ranks"][0]
    assert f["mfu_pct"] is not None and "mfu_note" not in f


def test_formula_mfu_from_params(ddp_straggler: tuple[Path, dict]) -> None:
    from traceread.analysis.hardware import resolve_device

    n, d = 2e8, 32768.0
    doc = build_report([ddp_straggler[0]], opts(params=n, tokens_per_step=d))
    peak = resolve_device("NVIDIA H100 80GB HBM3", 132).peak("bf16")  # type: ignore[union-attr]
    for r in doc["ranks"]:
        step_s = median(s["duration_us"] for s in r["steps"]) / 1e6  # the rank's median step duration
        assert r["mfu_pct"] == pytest.approx(100.0 * 6 * n * d / 4 / (step_s * peak), rel=1e-6)
