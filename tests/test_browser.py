"""The HTML report in a real headless browser: every chart renders, no console message, no script
injection, and a screenshot can be taken. Chromium is required: `make test` installs it; missing, every
test here fails with one line saying so (``-m "not browser"`` leaves them out on purpose).

``python tests/test_browser.py --update-screenshot`` writes ``docs/img/report.png`` from the demo
sample ``sample_traces/ddp_straggler_h100`` (the README's screenshot).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

import needs
import pytest
from report_fixture import EVIL, full_report

from traceread.build.findings import assemble as findings
from traceread.render import html

REPO = Path(__file__).resolve().parents[1]
CHARTS = ("breakdown", "timeline", "heatmap", "collectives", "roofline", "pipeline", "slow_steps")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--virtual-time-budget=20000"]

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def run_browser(page: Path, profile: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [needs.chromium(), *FLAGS, f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", *extra,
           page.resolve().as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180)


def console_lines(stderr: str, page: Path) -> list[str]:
    """Console messages the page produced (chromium logs them as INFO:CONSOLE lines)."""
    return [ln for ln in stderr.splitlines() if "CONSOLE" in ln and page.name in ln]


def check_page(page: Path, tmp: Path) -> str:
    res = run_browser(page, tmp / "profile-dom", "--dump-dom")
    assert res.returncode == 0, res.stderr[-2000:]
    dom = res.stdout
    assert console_lines(res.stderr, page) == []
    assert 'data-charts-done="1"' in dom, "the chart script did not finish"
    for key in re.findall(r'id="chart-([a-z_]+)"', dom):
        m = re.search(rf'<div class="chart[^"]*" id="chart-{key}"[^>]*>', dom)
        assert m is not None
        start = m.start()
        nxt = dom.find('<div class="chart', start + 10)
        body = dom[start: nxt if nxt > 0 else len(dom)]
        assert 'data-rendered="1"' in m.group(0), f"chart {key} not rendered"
        assert "main-svg" in body, f"chart {key} has no plotly svg"
        assert "data-error" not in m.group(0)
    return dom


def timeline_traces(dom: str) -> int:
    """Bars drawn in the timeline chart (plotly gives each bar a path in a 'point' group)."""
    m = re.search(r'id="chart-timeline".*?(?=<div class="chart|</section>)', dom, re.S)
    assert m is not None
    return m.group(0).count('class="point"')


def test_every_chart_renders_without_console_errors(tmp_path: Path) -> None:
    doc = full_report()
    doc["findings"] = findings.build_findings(doc)
    page = tmp_path / "report.html"
    html.write_html(doc, page)
    dom = check_page(page, tmp_path)
    for key in CHARTS:
        assert f'id="chart-{key}"' in dom
    assert EVIL not in dom  # the hostile kernel name is text, never a script element
    assert dom.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 3
    assert timeline_traces(dom) >= 2 * 4 * 3  # 2 steps x 4 ranks x 3 lanes


def test_browser_without_decompression_stream_gets_tables_and_one_line(tmp_path: Path) -> None:
    """A browser that cannot unpack the embedded plotly.js (no DecompressionStream) shows every table
    and says why there are no charts, without a console error."""
    doc = full_report()
    doc["findings"] = findings.build_findings(doc)
    page = tmp_path / "old-browser.html"
    html.write_html(doc, page)
    text = page.read_text(encoding="utf-8").replace(
        "<head>", "<head><script>window.DecompressionStream = undefined;</script>", 1)
    page.write_text(text, encoding="utf-8")
    res = run_browser(page, tmp_path / "profile-old", "--dump-dom")
    assert res.returncode == 0, res.stderr[-2000:]
    assert console_lines(res.stderr, page) == []
    dom = res.stdout
    assert 'data-charts-done="1"' in dom and 'data-rendered="1"' not in dom
    note = re.search(r'<p id="traceread-no-charts"[^>]*>([^<]*)</p>', dom)
    assert note is not None and "hidden" not in note.group(0)
    assert note.group(1).startswith("Charts not drawn: this browser cannot unpack the embedded plotly.js")
    assert '<section id="kernels">' in dom and "<td" in dom


@pytest.mark.parametrize("sample", ["ddp_straggler_h100", "tp_dp_h100"])
def test_real_step_timeline_renders(sample: str, tmp_path: Path) -> None:
    """The real step timeline of a sample: both steps, every rank's streams, the critical path."""
    from traceread.build.report import ReportOptions, build_report

    folder = REPO / "sample_traces" / sample
    doc = build_report([folder], ReportOptions(workers=1))
    page = tmp_path / "t.html"
    html.write_html(doc, page)
    assert page.stat().st_size <= 0.8 * 2**20  # the partial plotly bundle, gzipped, keeps the page light
    dom = check_page(page, tmp_path)
    assert timeline_traces(dom) > 100
    assert "median step" in dom and "slowest step" in dom and "critical path" in dom
    assert "r7 s" in dom and "r0 GPU" in dom


def test_screenshot(tmp_path: Path) -> None:
    doc = full_report()
    doc["findings"] = findings.build_findings(doc)
    page = tmp_path / "report.html"
    html.write_html(doc, page)
    shot = tmp_path / "report.png"
    res = run_browser(page, tmp_path / "profile-shot", f"--screenshot={shot}", "--window-size=1400,4000")
    assert res.returncode == 0, res.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 50_000


def update_docs_screenshot(tmp_path: Path) -> Path:
    """docs/img/report.png: the report of the demo sample, exactly as the README's console shows it
    (a tool, not a test: ``python tests/test_browser.py --update-screenshot``)."""
    import os

    from traceread.build.report import ReportOptions, build_report

    os.chdir(REPO)
    doc = build_report(["sample_traces/ddp_straggler_h100"], ReportOptions(workers=2, use_cache=False))
    page = tmp_path / "report.html"
    html.write_html(doc, page, title="traceread report — sample_traces/ddp_straggler_h100 (simulated 8×H100 DDP, rank 5 slow)")
    check_page(page, tmp_path)
    out = REPO / "docs" / "img" / "report.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    res = run_browser(page, tmp_path / "profile-doc", f"--screenshot={out}", "--window-size=1400,5200")
    assert res.returncode == 0 and out.stat().st_size > 50_000
    return out


def test_real_pipeline_sample_renders(tmp_path: Path) -> None:
    from traceread.build.report import ReportOptions, build_report

    folder = REPO / "sample_traces" / "pp_1f1b_h100"
    doc = build_report([folder], ReportOptions(workers=1, use_cache=False))
    page = tmp_path / "pp.html"
    html.write_html(doc, page)
    dom = check_page(page, tmp_path)
    for key in ("breakdown", "timeline", "heatmap", "collectives", "roofline", "pipeline", "slow_steps"):
        assert f'id="chart-{key}"' in dom, key


if __name__ == "__main__":
    if sys.argv[1:] != ["--update-screenshot"]:
        raise SystemExit("usage: python tests/test_browser.py --update-screenshot")
    with tempfile.TemporaryDirectory() as tmp:
        print(update_docs_screenshot(Path(tmp)))
