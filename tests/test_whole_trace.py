"""A trace without step markers (issue 36): its optimizer's own spans are the steps when it has them;
without those either it is one window, "the whole trace (no step markers)", in every view — never
"step -1" / "median step -1". The simulator's DDP job with its ``ProfilerStep#N`` events removed (and
then its ``Optimizer.step#…`` spans too) is such a trace; kernels, launches and collectives unchanged."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from traceread.assemble.report import ReportOptions, build_report
from traceread.fmt import WHOLE_TRACE


def _without(out: Path, prefixes: tuple[str, ...], steps: int) -> dict:
    from traceread.simulate import simulate

    simulate("ddp", out, ranks=2, steps=steps, layers=2, hidden=2048, heads=16, seq_len=1024)
    (out / "truth.json").unlink()
    for f in out.glob("rank*.pt.trace.json.gz"):
        t = json.loads(gzip.decompress(f.read_bytes()))
        t["traceEvents"] = [e for e in t["traceEvents"] if not str(e.get("name", "")).startswith(prefixes)]
        f.write_bytes(gzip.compress(json.dumps(t).encode()))
    return build_report([out], ReportOptions(use_cache=False, workers=1))


@pytest.fixture(scope="module")
def doc(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return _without(tmp_path_factory.mktemp("no_markers"), ("ProfilerStep#", "Optimizer.step#"), 2)


def test_the_optimizers_spans_are_the_steps_without_markers(tmp_path: Path) -> None:
    """4 simulated steps, no markers: 3 steps, each from the end of one optimizer step to the end of the
    next, numbered by the optimizer step that ends it; the ledger's identities hold."""
    d = _without(tmp_path, ("ProfilerStep#",), 4)
    w = d["ledger"]["window"]
    assert w["steps"] == 3 and not w.get("whole_trace")
    assert sorted(b["step"] for b in w["by_step"]) == [1, 2, 3]
    assert sum(p["us"] for p in w["parts"]) == pytest.approx(w["total_us"], abs=1e-3)
    assert any("step(s) from the optimizer's own spans" in x for x in d["warnings"])


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
