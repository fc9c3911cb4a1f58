"""The HTML report in a real headless browser: every chart renders, no console message, no script
injection, and a screenshot can be taken. Chromium is required: `make test` installs it; missing, every
test here fails with one line saying so (``-m "not browser"`` leaves them out on purpose).

``python tests/test_browser.py --update-screenshot`` writes ``docs/img/report.png`` from the demo
sample ``sample_traces/ddp_straggler_h100`` (the README's screenshot).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import needs
import pytest
from report_fixture import EVIL, full_report

from traceread.assemble.findings import assemble as findings
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
    from traceread.assemble.report import ReportOptions, build_report

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
    from traceread.assemble.report import ReportOptions, build_report

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
    from traceread.assemble.report import ReportOptions, build_report

    folder = REPO / "sample_traces" / "pp_1f1b_h100"
    doc = build_report([folder], ReportOptions(workers=1, use_cache=False))
    page = tmp_path / "pp.html"
    html.write_html(doc, page)
    dom = check_page(page, tmp_path)
    for key in ("breakdown", "timeline", "heatmap", "collectives", "roofline", "pipeline", "slow_steps"):
        assert f'id="chart-{key}"' in dom, key


# ------------------------------------------------------------------------------------------------
# every sample: screenshot, overlaps measured in the page, section order, numbers on one line

#: Runs in the page once the charts are drawn and writes what it measured into body[data-geometry]:
#: pairs of chart parts whose boxes overlap (title, legend, mode bar, annotations, colour bar, and
#: title/legend/mode bar against the plot area), parts outside their chart, every section's id and
#: top in page order, which finding each inline chart sits in, and table cells of numbers that take
#: more than one line.
GEOMETRY_JS = """<script>
(function () {
  function box(el) {
    var r = el.getBoundingClientRect();
    return {l: r.left, t: r.top + scrollY, r: r.right, b: r.bottom + scrollY, w: r.width};
  }
  function hit(a, b) { return a.w > 0 && b.w > 0 && a.l < b.r - 1 && b.l < a.r - 1 && a.t < b.b - 1 && b.t < a.b - 1; }
  function lines(el) {
    var rg = document.createRange(); rg.selectNodeContents(el);
    var tops = {};
    Array.prototype.forEach.call(rg.getClientRects(), function (r) { if (r.width > 0) { tops[Math.round(r.top)] = 1; } });
    return Object.keys(tops).length;
  }
  function check() {
    if (document.body.getAttribute("data-charts-done") !== "1") { setTimeout(check, 50); return; }
    var out = {overlaps: [], outside: [], charts: [], sections: [], wrapped: []};
    document.querySelectorAll("div.chart[data-rendered]").forEach(function (c) {
      var key = c.getAttribute("data-chart"), cb = box(c), parts = [], plots = [];
      var finding = c.closest(".finding");
      out.charts.push({key: key, finding: finding ? finding.getAttribute("data-finding") : null, top: cb.t});
      [[".gtitle", "title"], ["g.legend", "legend"], [".modebar", "modebar"], ["g.colorbar", "colorbar"]].forEach(function (q) {
        c.querySelectorAll(q[0]).forEach(function (e) { parts.push([q[1], box(e)]); });
      });
      c.querySelectorAll("g.annotation").forEach(function (e, i) { parts.push(["annotation" + i, box(e)]); });
      c.querySelectorAll(".nsewdrag").forEach(function (e) { plots.push(box(e)); });
      for (var i = 0; i < parts.length; i++) {
        for (var j = i + 1; j < parts.length; j++) {
          if (hit(parts[i][1], parts[j][1])) { out.overlaps.push(key + ": " + parts[i][0] + " x " + parts[j][0]); }
        }
        if (["title", "legend", "modebar"].indexOf(parts[i][0]) >= 0) {
          plots.forEach(function (p) { if (hit(parts[i][1], p)) { out.overlaps.push(key + ": " + parts[i][0] + " x plot"); } });
        }
        var pb = parts[i][1];
        if (pb.w > 0 && (pb.l < cb.l - 1 || pb.r > cb.r + 1 || pb.t < cb.t - 1 || pb.b > cb.b + 1)) {
          out.outside.push(key + ": " + parts[i][0]);
        }
      }
    });
    document.querySelectorAll("main > section").forEach(function (s) { out.sections.push([s.id, box(s).t]); });
    out.overflow = [];
    document.querySelectorAll("main > section .scroll").forEach(function (d) {
      if (d.scrollWidth > d.clientWidth + 1) { out.overflow.push(d.closest("section").id); }
    });
    document.querySelectorAll("td:not(.name):not(.wrap)").forEach(function (td) {
      if (td.textContent.trim() && lines(td) > 1) { out.wrapped.push(td.textContent.trim()); }
    });
    document.body.setAttribute("data-geometry", JSON.stringify(out));
  }
  window.addEventListener("load", check);
})();
</script>"""

SAMPLES = sorted(p.name for p in (REPO / "sample_traces").iterdir() if p.is_dir())


def measured(page: Path, tmp: Path, shot: Path, width: int = 1400) -> tuple[str, dict]:
    """The page with :data:`GEOMETRY_JS`, loaded once: DOM (checked as in :func:`check_page`),
    the measurements, and a full-width screenshot written to ``shot``."""
    import html as html_lib
    import json

    probe = tmp / f"probe-{page.name}"
    probe.write_text(page.read_text(encoding="utf-8").replace("</body>", GEOMETRY_JS + "</body>", 1), encoding="utf-8")
    res = run_browser(probe, tmp / "profile-geom", "--dump-dom", f"--screenshot={shot}", f"--window-size={width},1600")
    assert res.returncode == 0, res.stderr[-2000:]
    assert console_lines(res.stderr, probe) == []
    dom = res.stdout
    assert 'data-charts-done="1"' in dom
    m = re.search(r'data-geometry="([^"]*)"', dom)
    assert m is not None, "the measuring script did not finish"
    return dom, json.loads(html_lib.unescape(m.group(1)))


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def section_rank(doc: dict, key: str) -> float:
    """Index of the first finding a section supports (inf: none) — from the section table's data."""
    sec = next(s for s in html.PAGE_SECTIONS if s.key == key)
    for i, f in enumerate(doc.get("findings") or []):
        if html._supports(sec, str(f.get("id"))):
            return i
    return float("inf")


@pytest.mark.parametrize("sample", SAMPLES)
def test_every_sample_page_reads_well(sample: str, tmp_path: Path) -> None:
    """Every sample's page in the browser: nothing in a chart overlaps (title, legend, mode bar,
    annotations, plot), no section without data, sections in the order of the findings they
    support (ledger first, warnings last), a finding's chart inside it, numbers on one line.
    Screenshots go to $TRACEREAD_SCREENSHOTS when set."""
    from traceread.assemble.report import ReportOptions, build_report

    doc = build_report([REPO / "sample_traces" / sample], ReportOptions(workers=1))
    page = tmp_path / f"{sample}.html"
    html.write_html(doc, page)
    out_dir = Path(os.environ.get("TRACEREAD_SCREENSHOTS") or tmp_path)
    out_dir.mkdir(parents=True, exist_ok=True)
    shot = out_dir / f"{sample}.png"
    dom, geo = measured(page, tmp_path, shot)
    assert png_size(shot)[0] == 1400 and shot.stat().st_size > 20_000
    assert geo["overlaps"] == [] and geo["outside"] == []
    assert geo["wrapped"] == []
    assert geo["overflow"] == []  # every table fits its section at 1400 px
    assert "data-nodata" not in dom and "No data" not in dom
    ids = [s for s, _ in geo["sections"]]
    assert ids[0] == "findings"
    body = [s for s in ids[1:] if s not in ("ledger", "warnings", "drift")]
    if "ledger" in ids:
        assert ids[1] == "ledger"
    if "warnings" in ids:
        assert ids[-1] == "warnings"
    ranks = [section_rank(doc, s) for s in body]
    assert ranks == sorted(ranks), list(zip(body, ranks))
    charts = {c["key"]: c for c in geo["charts"]}
    for f in doc.get("findings") or []:
        key = next((c for k, c in html.FINDING_CHART.items()
                    if f["id"] == k or (k.endswith("_") and f["id"].startswith(k))), None)
        if key in charts and f["id"] == "slow_steps":
            assert charts[key]["finding"] == "slow_steps"  # the slow-step chart beside its finding


def test_old_layout_overlaps_are_caught(tmp_path: Path) -> None:
    """The measuring script is not blind: a legend put back where the mode bar and the title are
    (the layout before) is reported."""
    doc = full_report()
    doc["findings"] = findings.build_findings(doc)
    page = tmp_path / "old.html"
    html.write_html(doc, page)
    text = page.read_text(encoding="utf-8")
    figs = re.search(r'(<script type="application/json" id="traceread-figures">)(.*?)(</script>)', text, re.S)
    assert figs is not None
    import json

    data = json.loads(figs.group(2))
    for fig in data.values():
        fig["layout"]["legend"] = {"orientation": "h", "y": 1.0, "x": 1.0, "xanchor": "right", "yanchor": "bottom"}
        fig["layout"]["margin"] = {"l": 70, "r": 20, "t": 40, "b": 50}
    page.write_text(text[: figs.start(2)] + html.embed_json(data) + text[figs.end(2):], encoding="utf-8")
    _, geo = measured(page, tmp_path, tmp_path / "old.png")
    assert any("legend x modebar" in o for o in geo["overlaps"]), geo["overlaps"]


if __name__ == "__main__":
    if sys.argv[1:] != ["--update-screenshot"]:
        raise SystemExit("usage: python tests/test_browser.py --update-screenshot")
    with tempfile.TemporaryDirectory() as tmp:
        print(update_docs_screenshot(Path(tmp)))


def test_watched_run_chart_renders(tmp_path: Path) -> None:
    """A watched run's page: the whole-job step-time chart with the baseline and capture bands draws
    in a real browser without a console message (tests/test_watch_report.py checks its numbers)."""
    from traceread.compare.captures import build_watched
    from traceread.options import ReportOptions
    from traceread.simulate.watched import write_watched_run

    run = tmp_path / "run"
    write_watched_run(run, total_steps=120, slow=(60, 79), capture_steps=4)
    doc = build_watched([str(run)], ReportOptions(use_cache=False, workers=1))
    page = html.write_html(doc, tmp_path / "watched.html")
    dom = check_page(page, tmp_path)
    m = re.search(r'<div class="chart[^"]*" id="chart-watch"[^>]*>', dom)
    assert m is not None and 'data-rendered="1"' in m.group(0)
    chart = re.search(r'id="chart-watch".*?(?=<div class="chart|</section>)', dom, re.S)
    assert chart is not None
    assert chart.group(0).count('class="shape-group"') == 3  # baseline, capture, slow stretch: shaded
    assert chart.group(0).count('class="annotation"') == 2  # "baseline", "capture 1"
