"""The Python API (``traceread.analyze``): the same document, answer and tables as the CLI, the
outputs it writes, its errors, and that ``import traceread`` stays light. docs/api.md runs as written."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from click.testing import CliRunner

import traceread
from traceread.assemble.queries import step_us
from traceread.cli import cli

REPO = Path(__file__).resolve().parents[1]
DDP = REPO / "sample_traces" / "ddp_straggler_h100"


@pytest.fixture(scope="module")
def rep() -> traceread.Report:
    return traceread.analyze(str(DDP), workers=1)


def test_same_document_and_answer_as_the_cli(rep: traceread.Report) -> None:
    res = CliRunner().invoke(cli, ["report", str(DDP), "--format", "json", "-o", "-"])
    assert res.exit_code == 0
    cli_doc = json.loads(res.stdout)
    assert json.loads(rep.to_json()) == cli_doc
    text = CliRunner().invoke(cli, ["report", str(DDP), "--format", "text", "-o", "-", "--top", "3"]).stdout
    answer = re.search(r"^ANSWER: (.*?)\nCHANGE:", text, re.S | re.M)
    assert answer is not None and " ".join(answer.group(1).split()) == rep.answer
    assert rep.change and rep.headline.startswith("8 rank(s) of 8 · nccl")
    assert rep.warnings == cli_doc["warnings"]


def test_tables_are_dataframes_of_the_document(rep: traceread.Report) -> None:
    doc = rep.document
    assert isinstance(rep.findings, pl.DataFrame)
    assert rep.findings["id"].to_list() == [f["id"] for f in doc["findings"]]
    assert rep.findings["impact_us_per_step"].to_list() == [f["impact_us_per_step"] for f in doc["findings"]]
    assert rep.ranks["rank"].to_list() == [r["rank"] for r in doc["ranks"]]
    assert rep.ranks["step_us"].to_list() == pytest.approx([step_us(r) for r in doc["ranks"]])
    assert rep.ledger["us"].sum() == pytest.approx(doc["ledger"]["step_us"], rel=1e-9)
    assert rep.steps.height == sum(len(r["steps"]) for r in doc["ranks"])
    assert rep.kernels.height == len(doc["kernels"]) and rep.collectives.height == len(doc["collectives"])
    assert rep.layout["role"].to_list() == [g["role"] for g in doc["layout"]["groups"]]
    assert rep.stragglers["rank"].to_list() == [s["rank"] for s in doc["stragglers"]]
    assert rep.slow_steps.height == 0 and rep.slow_steps.columns == []  # none in this run: empty, not an error
    assert set(rep.tables()) == set(rep.table_names) and rep.table("operators").height > 0
    with pytest.raises(KeyError, match="tables: findings"):
        rep.table("nope")
    assert rep.step_us == pytest.approx(42519.7, abs=0.1)


def test_outputs(rep: traceread.Report, tmp_path: Path) -> None:
    page = rep.to_html(tmp_path / "r.html")
    assert page.read_text(encoding="utf-8").startswith("<!DOCTYPE html>")
    text = rep.to_json(tmp_path / "r.json")
    assert json.loads((tmp_path / "r.json").read_text()) == json.loads(text)
    written = rep.to_csv(tmp_path / "csv")
    res = CliRunner().invoke(cli, ["report", str(DDP), "--format", "csv", "-o", str(tmp_path / "cli-csv")])
    assert res.exit_code == 0
    assert sorted(p.name for p in written) == sorted(p.name for p in (tmp_path / "cli-csv").iterdir())
    for p in written:
        assert p.read_bytes() == (tmp_path / "cli-csv" / p.name).read_bytes()
    assert rep.to_text(width=80).startswith("traceread report — ")
    assert "ANSWER:" in repr(rep) and "<strong>Answer:</strong>" in rep._repr_html_()


def test_options_and_errors(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="unknown option.*known: use_cache"):
        traceread.analyze(str(DDP), paramz=7e9)
    with pytest.raises(traceread.api.NothingUsableError, match="no trace files"):
        traceread.analyze(tmp_path)
    with pytest.raises(traceread.api.TraceReadError):
        traceread.analyze([])
    rep = traceread.analyze([DDP], params=7e9, tokens_per_step=1e6, use_cache=False, workers=1)
    assert rep.ranks["mfu_pct"].null_count() == 0


def test_import_traceread_stays_light() -> None:
    code = ("import sys, traceread; assert 'polars' not in sys.modules and 'traceread.assemble' not in sys.modules; "
            "assert callable(traceread.analyze) and 'polars' not in sys.modules; print('ok')")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.stdout.strip() == "ok", res.stderr


def test_docs_api_page_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every python block of docs/api.md, in order, in one namespace, from the repository root."""
    text = (REPO / "docs" / "api.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 4
    monkeypatch.chdir(REPO)
    ns: dict = {"__name__": "__docs__"}
    for block in blocks:
        exec(compile(block.replace("OUT/", f"{tmp_path}/"), "docs/api.md", "exec"), ns)
