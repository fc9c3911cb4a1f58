"""A trace without step markers is one window, "the whole trace (no step markers)", in every view: never
"step -1" / "median step -1" (issue 36). The simulator's DDP job with its ``ProfilerStep#N`` events removed
is such a trace (the kernels, launches and collectives are unchanged)."""

from __future__ import annotations

import gzip
import json
import re

import pytest

from traceread.assemble.report import ReportOptions, build_report
from traceread.fmt import WHOLE_TRACE


@pytest.fixture(scope="module")
def doc(tmp_path_factory: pytest.TempPathFactory) -> dict:
    from traceread.simulate import simulate

    out = tmp_path_factory.mktemp("no_markers")
    simulate("ddp", out, ranks=2, steps=2, layers=2, hidden=2048, heads=16, seq_len=1024)
    (out / "truth.json").unlink()
    for f in out.glob("rank*.pt.trace.json.gz"):
        t = json.loads(gzip.decompress(f.read_bytes()))
        t["traceEvents"] = [e for e in t["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")]
        f.write_bytes(gzip.compress(json.dumps(t).encode()))
    return build_report([out], ReportOptions(use_cache=False, workers=1))


STEP_MINUS_ONE = re.compile(r"\bsteps? #?-1\b|step\s*<[^>]*>\s*-1\b")


def test_terminal_says_the_whole_trace(doc: dict) -> None:
    from traceread.render.terminal import render_text

    text = render_text(doc, width=140)
    assert WHOLE_TRACE in text.splitlines()[0]
    assert f"where the time of {WHOLE_TRACE} goes" in text
    assert not STEP_MINUS_ONE.search(text), [ln for ln in text.splitlines() if "-1" in ln]


def test_html_and_json_say_the_whole_trace(doc: dict) -> None:
    from traceread.render.html import render_html
    from traceread.render.json_report import to_json

    page = render_html(doc)
    assert WHOLE_TRACE in page and not STEP_MINUS_ONE.search(page)
    data = json.loads(to_json(doc))
    assert data["ledger"]["window"]["whole_trace"] is True and data["ledger"]["window"]["steps"] == 1
    assert not any(STEP_MINUS_ONE.search(str(w)) for w in data["warnings"])
    assert not any(STEP_MINUS_ONE.search(f["title"] + " ".join(f["evidence"])) for f in data["findings"])
