"""The cache's size bound: accounting of every entry, least-recently-used eviction (exact on real
entries with set last-use times), hits refreshing an entry, the bound from the environment or
``traceread cache limit``, and ``traceread cache info|clear``. Every test has its own cache folder."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from traceread.assemble.report import ReportOptions, build_report
from traceread.cli import cli
from traceread.engine import caches

REPO = Path(__file__).resolve().parents[1]
SAMPLES = [REPO / "sample_traces" / s for s in ("pp_gpipe_h100", "custom_allreduce_h100", "fsdp_exposed_h100")]


@pytest.fixture()
def filled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache folder holding the parse, summary and document entries of three real reports."""
    root = tmp_path / "cache"
    monkeypatch.delenv(caches.MAX_ENV, raising=False)
    for s in SAMPLES:
        build_report([s], ReportOptions(workers=1, cache_dir=root))
    return root


def test_every_entry_is_accounted(filled: Path) -> None:
    found = caches.entries(filled)
    kinds = {k: [e for e in found if e.kind == k] for k in ("parse", "summary", "document")}
    assert len(kinds["parse"]) == 12 and len(kinds["summary"]) == 12 and len(kinds["document"]) == 3  # 4 ranks x 3
    on_disk = sum(p.stat().st_size for p in filled.rglob("*") if p.is_file())
    assert sum(e.bytes for e in found) == on_disk


def test_lru_eviction_is_exact(filled: Path) -> None:
    found = caches.entries(filled)
    for i, e in enumerate(sorted(found, key=lambda e: str(e.path))):  # a known order of last use
        t = 1_000_000 + i
        os.utime(e.path / "meta.json" if e.kind == "parse" else e.path, (t, t))
    found = caches.entries(filled)
    total = sum(e.bytes for e in found)
    limit = total // 2
    order = sorted(found, key=lambda e: e.last_used)
    expect, freed = [], 0
    for e in order:
        if total - freed <= limit * caches.EVICT_TO:
            break
        expect.append(e.path)
        freed += e.bytes
    assert caches.evict(filled, limit) == (len(expect), freed)
    left = {e.path for e in caches.entries(filled)}
    assert not left & set(expect) and left == {e.path for e in found} - set(expect)
    assert sum(e.bytes for e in caches.entries(filled)) <= limit * caches.EVICT_TO
    assert caches.evict(filled, limit) == (0, 0)  # under the bound: nothing more


def test_a_hit_makes_an_entry_recent(filled: Path) -> None:
    for e in caches.entries(filled):
        os.utime(e.path / "meta.json" if e.kind == "parse" else e.path, (1000, 1000))
    build_report([SAMPLES[1]], ReportOptions(workers=1, cache_dir=filled))  # a document-cache hit
    recent = [e for e in caches.entries(filled) if e.last_used > 1000]
    assert [e.kind for e in recent] == ["document"]
    build_report([SAMPLES[1]], ReportOptions(workers=1, cache_dir=filled, params=1e9, tokens_per_step=1e6))
    kinds = sorted({e.kind for e in caches.entries(filled) if e.last_used > 1000})
    assert kinds == ["document", "summary"]  # new options: summaries hit (and were touched), a new document


def test_reports_keep_the_cache_under_its_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "cache"
    build_report([SAMPLES[0]], ReportOptions(workers=1, cache_dir=root))
    one = sum(e.bytes for e in caches.entries(root))
    monkeypatch.setenv(caches.MAX_ENV, str(int(one * 1.5)))
    for s in SAMPLES[1:]:
        build_report([s], ReportOptions(workers=1, cache_dir=root))
        assert sum(e.bytes for e in caches.entries(root)) <= one * 1.5
    assert caches.max_bytes(root) == int(one * 1.5)
    monkeypatch.setenv(caches.MAX_ENV, "off")
    assert caches.max_bytes(root) is None
    monkeypatch.delenv(caches.MAX_ENV)
    assert caches.max_bytes(root) == caches.DEFAULT_MAX_BYTES == 4 * 2**30


def test_cache_command(filled: Path) -> None:
    r = CliRunner()
    res = r.invoke(cli, ["cache", "--cache-dir", str(filled)])
    assert res.exit_code == 0, res.output
    assert f"cache: {filled}" in res.output and "27 entries; bound 4.0 GiB (default)" in res.output
    assert re.search(r"parse +12 ", res.output) and re.search(r"document +3 ", res.output)
    res = r.invoke(cli, ["cache", "--cache-dir", str(filled), "limit", "100KB"])
    assert res.exit_code == 0 and "cache bound: 97.7 KiB (traceread cache limit); removed" in res.output
    assert sum(e.bytes for e in caches.entries(filled)) <= 100_000 * caches.EVICT_TO
    assert caches.max_bytes(filled) == 100_000
    res = r.invoke(cli, ["cache", "--cache-dir", str(filled), "limit", "lots"])
    assert res.exit_code == 2
    res = r.invoke(cli, ["cache", "--cache-dir", str(filled), "clear"])
    assert res.exit_code == 0 and "removed" in res.output and caches.entries(filled) == []
    assert caches.max_bytes(filled) == 100_000  # the bound stays
    assert "0 entries" in r.invoke(cli, ["cache", "--cache-dir", str(filled), "info"]).output
