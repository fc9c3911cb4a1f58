"""The report's fast paths give the same document as the slow ones: per-rank summaries from the
summary cache, parse-cached ranks summarised in-process (threads), ranks parsed in worker processes.
And a cached summary is never used once its trace file, the code or the device spec changed."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from traceread.assemble.rank_map import RankSummary
from traceread.assemble.report import ReportOptions, build_report
from traceread.engine import caches
from traceread.engine.caches import DOCUMENT_FOLDER, SUMMARY_FOLDER, load_summary
from traceread.render import json_report

SAMPLE = Path(__file__).resolve().parents[1] / "sample_traces" / "ddp_straggler_h100"


def _doc(folder: Path, cache: Path | None, workers: int) -> str:
    opts = ReportOptions(workers=workers, use_cache=cache is not None, cache_dir=cache)
    if cache is not None:
        shutil.rmtree(cache / DOCUMENT_FOLDER, ignore_errors=True)  # these tests are about the summaries
    return json_report.to_json(build_report([folder], opts))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run")
    for f in SAMPLE.glob("rank*.pt.trace.json.gz"):
        shutil.copy(f, out / f.name)
    return out


@pytest.mark.slow
def test_every_path_gives_the_same_document(run: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    reference = _doc(run, None, 1)  # no cache, in-process
    assert _doc(run, cache, 2) == reference  # parsed in worker processes, caches filled
    summaries = list((cache / SUMMARY_FOLDER).glob("*.msgpack"))
    assert len(summaries) == len(list(run.glob("rank*.pt.trace.json.gz")))
    assert _doc(run, cache, 2) == reference  # every rank from the summary cache
    shutil.rmtree(cache / SUMMARY_FOLDER)
    assert _doc(run, cache, 2) == reference  # parse cache only: summarised in threads
    shutil.rmtree(cache / SUMMARY_FOLDER)
    assert _doc(run, cache, 1) == reference  # parse cache only, one worker


def test_stale_summary_is_a_miss(run: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    build_report([run], ReportOptions(workers=1, use_cache=True, cache_dir=cache))
    f = sorted(run.glob("rank*.pt.trace.json.gz"))[0]
    args = (f, cache, None, True, RankSummary)
    assert load_summary(*args) is not None
    caches.code_fingerprint.cache_clear()
    real = caches.code_fingerprint
    caches.code_fingerprint = lambda: "other code"  # type: ignore[assignment]
    try:
        assert load_summary(*args) is None  # code changed
    finally:
        caches.code_fingerprint = real
    assert load_summary(f, cache, None, False, RankSummary) is None  # without the roofline detail
    spec = tmp_path / "spec.toml"
    spec.write_text("")
    assert load_summary(f, cache, str(spec), True, RankSummary) is None  # another --device-spec
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # the file was rewritten
    assert load_summary(*args) is None


def test_corrupt_summary_is_a_miss(run: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first = _doc(run, cache, 1)
    for p in (cache / SUMMARY_FOLDER).glob("*.msgpack"):
        p.write_bytes(b"not a pickle")
    again = json.loads(_doc(run, cache, 1))
    notes = [w for w in again["warnings"] if w.startswith("cache: ")]  # each damaged entry, said once
    again["warnings"] = [w for w in again["warnings"] if w not in notes]
    assert again == json.loads(first) and len(notes) == len(list((cache / SUMMARY_FOLDER).glob("*.msgpack")))
