"""The small things a new user hits first: ``--version``, ``python -m traceread``, ``-o -`` for
stdout, and the report pointing at ``traceread export`` for the full timeline."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from traceread import __version__

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "sample_traces" / "pp_gpipe_h100"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "traceread", *args], capture_output=True, text=True, timeout=300)


def test_version_and_python_m() -> None:
    res = run("--version")
    assert res.returncode == 0 and res.stdout.strip() == f"traceread, version {__version__}"
    assert "export" in run("--help").stdout


def test_json_on_stdout_and_the_export_hint(tmp_path: Path) -> None:
    res = run("report", str(SAMPLE), "--format", "json", "-o", "-", "--no-cache")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)  # stdout holds the document and nothing else
    assert doc["schema"] == "traceread.report/1" and len(doc["ranks"]) == 4
    assert not (Path.cwd() / "-").exists()
    text = run("report", str(SAMPLE), "--format", "text")
    # the text report is 120 columns wide: a long checkout path wraps the hint, so compare without whitespace
    assert "".join(f"traceread export {SAMPLE} -o timeline.json.gz".split()) in "".join(text.stdout.split())
    page = tmp_path / "r.html"
    assert run("report", str(SAMPLE), "-o", str(page)).returncode == 0
    assert f"traceread export {SAMPLE} -o timeline.json.gz" in page.read_text()
