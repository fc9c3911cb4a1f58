"""Renderers and findings on a hand-built report that fills every section (no traces needed).

The fixture's numbers are chosen so every finding's impact can be computed by hand (see
tests/report_fixture.py); these tests check those numbers, the JSON contract, escaping of hostile
trace-derived strings, and that empty sections say so instead of disappearing.
"""

from __future__ import annotations

import copy
import json
import re
from typing import get_type_hints

import pytest
from report_fixture import EVIL, N_STEPS, full_report, with_ledger

from traceread import report_schema as rs
from traceread.assemble import explain
from traceread.assemble.findings import assemble as findings
from traceread.render import charts, html, json_report, terminal


@pytest.fixture()
def doc() -> dict:
    d = full_report()
    d["findings"] = findings.build_findings(d)
    return d


def by_id(doc: dict) -> dict[str, dict]:
    return {f["id"]: f for f in doc["findings"]}


# ------------------------------------------------------------------------------------------- JSON


def test_stable_fields_exist_in_the_schema() -> None:
    for name, fields in json_report.STABLE_FIELDS.items():
        hints = get_type_hints(getattr(rs, name))
        missing = [f for f in fields if f not in hints]
        assert not missing, f"{name}: stable fields not in report_schema: {missing}"


def test_fixture_is_valid_and_roundtrips(doc: dict) -> None:
    json_report.assert_valid(doc)
    back = json.loads(json_report.to_json(doc))
    assert back["schema"] == "traceread.report/1"
    json_report.assert_valid(back)
    assert back["ranks"][2]["steps"][4]["duration_us"] == 140_000.0


def test_validate_reports_each_kind_of_break(doc: dict) -> None:
    bad = copy.deepcopy(doc)
    del bad["ranks"][1]["exposed_comm_us"]
    bad["collectives"][0]["count"] = "60"
    bad["stragglers"][0]["rank"] = None
    bad["schema"] = "traceread.report/2"
    errs = json_report.validate(bad)
    assert any("$.ranks[1]: missing stable field 'exposed_comm_us'" in e for e in errs)
    assert any("$.collectives[0].count: expected an integer" in e for e in errs)
    assert any("$.stragglers[0].rank" in e for e in errs)
    assert any("$.schema" in e for e in errs)
    assert json_report.validate(doc) == []


def test_nan_becomes_null() -> None:
    d = full_report()
    d["ranks"][0]["mfu_pct"] = float("nan")
    assert json.loads(json_report.to_json(d))["ranks"][0]["mfu_pct"] is None


# --------------------------------------------------------------------------------------- findings


def test_findings_impacts_match_hand_computation(doc: dict) -> None:
    """The fixture has no step ledger: its window comes from the ranks' per-step breakdowns (every rank
    has the same steps, so rank 0 is critical in each), and every finding is a share of it, each µs once."""
    f = by_id(doc)
    window = 5 * 100_000.0 + 140_000.0  # six steps, step 14 slow by 40 ms
    assert doc["findings"][0]["id"] == "hang"  # a hang always leads
    assert f["hang"]["impact_pct"] == 100.0
    # rank 3 is late by 8 ms per step: rank 0's exposed communication above rank 3's own (12 - 4 ms)
    assert f["straggler"]["impact_us_per_step"] == pytest.approx(8_000.0)
    assert f["straggler"]["rank"] == 3 and f["straggler"]["predicted_saving_us"] == pytest.approx(8_000.0)
    # step 14's excess over the median step (40 ms), once: out of its host-bound and other idle
    assert f["slow_steps"]["impact_us_per_step"] == pytest.approx(40_000.0 / N_STEPS)
    assert f["slow_steps"]["steps"] == [14]
    # network allgather at 15 of 50 GB/s: 70 % of 24 x 400 us over 6 steps, out of the transfer
    assert f["nccl_transport_fallback"]["impact_us_per_step"] == pytest.approx(0.7 * 400 * 24 / 6)
    # exposed communication keeps what the straggler and the NCCL transport did not explain
    assert f["exposed_comm"]["impact_us_per_step"] == pytest.approx(12_000.0 - 8_000.0 - 0.7 * 400 * 24 / 6)
    assert f["exposed_comm"]["role"] == "dp"
    # host-bound idle = 60 % of idle, without step 14's stall (that is the slow step's): 6 x 6 ms
    assert f["host_bound"]["impact_us_per_step"] == pytest.approx(6_000.0)
    # SM time lost per step per rank: (7200 + 45000) / 4 ranks / 6 steps, out of the compute
    assert f["low_sm_efficiency"]["impact_us_per_step"] == pytest.approx((7_200 + 45_000) / 4 / 6)
    # the roofline's memory-bound operators: (48 + 6 ms) over 6 steps, out of the compute
    assert f["memory_bound"]["impact_us_per_step"] == pytest.approx((48_000.0 + 6_000.0) / 6)
    for x in doc["findings"]:
        if x["id"] != "hang":
            assert x["impact_us_total"] == pytest.approx(x["impact_us_per_step"] * N_STEPS)
            assert x["impact_pct"] == pytest.approx(100.0 * x["impact_us_total"] / window)
        assert x["explanation"] and x["suggestions"]
    assert sum(x["impact_us_total"] for x in doc["findings"][1:]) <= window
    rest = [x["impact_us_per_step"] for x in doc["findings"][1:]]
    assert rest == sorted(rest, reverse=True)


def test_secondary_straggler_and_small_problems_are_not_findings(doc: dict) -> None:
    ranks_blamed = [x.get("rank") for x in doc["findings"] if x["id"] == "straggler"]
    assert ranks_blamed == [3]  # rank 1 only propagated the delay (root=False)
    d = full_report()
    for r in d["ranks"]:  # per-step numbers come from the step entries
        r["exposed_comm_us"] = 100.0
        for s in r["steps"]:
            s["exposed_comm_us"] = 100.0 / N_STEPS  # 17 us per step: far below 1 % of a 107 ms step
    assert "exposed_comm" not in by_id({"findings": findings.build_findings(d)})


def test_broken_section_becomes_a_warning_not_a_crash() -> None:
    d = full_report()
    d["stragglers"] = [{"rank": "three", "blame_us_per_step": "lots"}]
    warned: list[str] = []
    out = findings.build_findings(d, warn=warned.append)
    assert any("stragglers" in w for w in warned)
    assert {"hang", "exposed_comm"} <= {x["id"] for x in out}


def test_comm_kernels_are_not_blamed_for_low_sm_efficiency() -> None:
    d = full_report()
    d["kernels"] = [{"name": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "calls": 10, "total_us": 9e6,
                     "mean_us": 9e5, "blocks_per_sm": 0.1, "occupancy_pct": 1.0, "wave_efficiency_pct": 10.0,
                     "sm_time_lost_us": 8e6, "ranks": 4}]
    assert "low_sm_efficiency" not in by_id({"findings": findings.build_findings(d)})


# ---------------------------------------------------------------------------------------- explain


def test_explain_formulas() -> None:
    assert explain.bubble_fraction(4, 8) == pytest.approx(3 / 11)
    assert explain.bubble_fraction(16, 64) == pytest.approx(15 / 79)
    assert explain.bubble_fraction(4, 8, virtual=2) == pytest.approx(3 / 19)
    assert explain.bus_factor("allreduce", 8) == pytest.approx(1.75)
    assert explain.bus_factor("all_gather", 8) == pytest.approx(0.875)
    assert explain.bus_factor("send", 2) == 1.0
    text = explain.ring_allreduce({"name": "allreduce", "group_size": 4, "bytes": 100e6, "latency_us": 2000.0,
                                   "link_peak_gbps": 450.0, "busbw_gbps": 75.0})
    assert "2(N−1)/N = 1.50" in text and "333 µs" in text and "17% of the link" in text
    p = explain.pipeline({"stages": 4, "microbatches": 8, "bubble_pct": 30.0}, 100_000.0)
    assert "27.3%" in p and "30.0%" in p and "15.8%" in p  # theory, measured, M doubled
    assert "ridge" in explain.roofline(full_report()["roofline"])
    assert "18" not in (explain.link_cliff([]) or "")


# ---------------------------------------------------------------------------------------- terminal


def test_text_summary_is_answer_first(doc: dict) -> None:
    out = terminal.render_text(doc, top=5)
    lines = out.splitlines()
    assert lines[0].startswith("traceread report — 4 rank(s)")
    assert lines[1].startswith("ANSWER: Job hung in allreduce")
    assert lines[2].startswith("CHANGE: ")
    assert EVIL in out  # shown literally
    assert "showing the" not in out  # 4 ranks fit in --top 5
    assert "Stragglers: rank 3 8.0 ms/step" in out


def test_rich_does_not_interpret_markup_in_names() -> None:
    d = full_report()
    d["collectives"][0]["name"] = "[bold red]x[/bold red]"
    d["findings"] = findings.build_findings(d)
    out = terminal.render_text(d)
    assert "[bold red]x[/bold red]" in out


def test_many_ranks_are_summarised_in_the_terminal() -> None:
    d = full_report()
    base = d["ranks"][0]
    d["ranks"] = [dict(copy.deepcopy(base), rank=r) for r in range(200)]
    out = terminal.render_text(d, top=10)
    assert "showing the 10 slowest of 200 ranks" in out


# -------------------------------------------------------------------------------------------- HTML


def test_html_escapes_trace_strings_everywhere(doc: dict) -> None:
    page = html.render_html(doc)
    assert EVIL not in page  # neither in the markup nor in the embedded figure JSON
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    fig_json = re.search(r'<script type="application/json" id="traceread-figures">(.*?)</script>', page, re.S)
    assert fig_json is not None
    assert "<" not in fig_json.group(1)
    figs = json.loads(fig_json.group(1))
    assert any("&lt;script&gt;" in json.dumps(f) for f in figs.values())  # chart labels entity-escaped


def test_html_is_self_contained_with_plotly_once(doc: dict) -> None:
    """plotly.js is in the page once, gzipped + base64, and unpacks to exactly the vendored bundle."""
    import base64
    import gzip

    page = html.render_html(doc)
    packed = html.plotly_js_packed()
    assert page.count(packed) == 1
    m = re.search(r'<script type="application/octet-stream" id="traceread-plotly"[^>]*>([A-Za-z0-9+/=]+)</script>', page)
    assert m is not None and m.group(1) == packed
    unpacked = gzip.decompress(base64.b64decode(m.group(1))).decode("utf-8")
    assert unpacked == html.PLOTLY_ASSET.read_text(encoding="utf-8")
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", page)
    assert "cdn.plot.ly" not in page.replace(packed, "")


def test_every_section_is_present_with_data(doc: dict) -> None:
    page = html.render_html(with_ledger(doc))
    for sec in ("findings", "ledger", "breakdown", "timeline", "stragglers", "collectives", "roofline", "kernels",
                "pipeline", "slow_steps", "nccl", "hang", "warnings"):
        assert f'<section id="{sec}">' in page
    for chart in ("ledger", "breakdown", "timeline", "heatmap", "collectives", "roofline", "pipeline", "slow_steps"):
        assert f'id="chart-{chart}"' in page
    assert "data-nodata" not in page
    assert "P = 4 stages and M = 8 micro-batches" in page
    assert "2(N−1)/N" in page


def test_sections_without_data_are_left_out() -> None:
    """No "No data" boxes: a section with nothing to show is not on the page; one line at the end
    names each (but the hang: most runs have none) with the reason."""
    d = full_report()
    for key in ("collectives", "stragglers", "slow_steps", "kernels"):
        d[key] = []
    for key in ("pipeline", "hang", "roofline", "straggler_heatmap", "nccl"):
        d[key] = None
    d["ranks"] = d["ranks"][:1]
    d["warnings"] = []
    d["findings"] = findings.build_findings(d)
    json_report.assert_valid(d)
    page = html.render_html(d)
    for key in ("stragglers", "collectives", "roofline", "pipeline", "kernels", "nccl", "hang", "warnings"):
        assert f'<section id="{key}">' not in page, key
    assert "data-nodata" not in page and "No data" not in page and "None." not in page
    left = re.search(r'<p class="leftout" id="left-out">(.*?)</p>', page, re.S)
    assert left is not None
    for key in ("stragglers", "collectives", "roofline", "pipeline", "kernels", "nccl"):
        assert f'data-left-out="{key}"' in left.group(1), key
    assert 'data-left-out="hang"' not in page and 'data-left-out="warnings"' not in page
    assert 'id="chart-breakdown"' in page and '<section id="breakdown">' in page


def test_big_job_page_stays_small() -> None:
    d = full_report()
    base = d["ranks"][0]
    d["ranks"] = [dict(copy.deepcopy(base), rank=r) for r in range(512)]
    d["straggler_heatmap"] = {"ranks": list(range(512)), "steps": d["straggler_heatmap"]["steps"],
                              "wait_us": [[100.0] * N_STEPS for _ in range(512)]}
    d["findings"] = findings.build_findings(d)
    page = html.render_html(d)
    extra = len(page) - len(html.plotly_js_packed())
    assert extra < 2_500_000, extra
    fig, _ = charts.timeline_figure(d)
    lanes = {y for trace in fig["data"] for y in trace["y"]}
    assert len(lanes) <= charts.MAX_LANES
    assert "255 more" not in page and "256 faster ranks not listed" in page


def test_charts_read_as_words_and_never_crowd() -> None:
    """Legend labels are words, legends sit right of the plot (never in the title row, where the
    hover-only mode bar is), log axes write powers of ten, and the critical path is markers."""
    d = with_ledger(full_report())
    d["findings"] = findings.build_findings(d)
    figs = {k: f for k, (f, _) in charts.all_figures(d).items() if f is not None}
    names = {t.get("name") for f in figs.values() for t in f["data"]}
    assert not {"idle_other", "comm_wait", "compute_bound", "fwd", "bwd", "p2p"} & names
    assert {"other idle", "comm wait", "compute-bound"} <= names
    for key, f in figs.items():
        legend = f["layout"].get("legend") or {}
        assert legend.get("x", 0) >= 1.0 and legend.get("yanchor") == "top", key  # right of the plot, top-aligned
        assert f["layout"]["title"]["yref"] == "container", key
    roof = figs["roofline"]["layout"]
    assert roof["xaxis"]["exponentformat"] == roof["yaxis"]["exponentformat"] == "power"
    crit = [t for t in figs["timeline"]["data"] if t.get("legendgroup") == "critical"]
    assert crit and all(t["mode"] == "markers" for t in crit) and all(None not in t["x"] for t in crit)
    page = html.render_html(d)
    assert "displayModeBar: \"hover\"" in page
    assert "td.name { max-width" in page and "white-space: nowrap" in page
