"""A damaged cache costs time, never the answer; a replaced trace is never answered from the cache.

Single-bit flips in every kind of cache file (the document, the rank summaries, the parse-cache
tables, their metadata and checksums) of a real collected run (``sample_traces/cpu_ddp_gloo``):
the report must equal the one computed from the traces, and a damaged entry is said in the
warnings. ``bench/fuzz_cli.py --cache-flips N`` runs many more.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import pytest
from cache_edits import cached_then_edited

from traceread.assemble.report import build_report
from traceread.engine import caches
from traceread.engine.jobs import read_rank
from traceread.options import ReportOptions

SAMPLE = Path(__file__).resolve().parents[1] / "sample_traces" / "cpu_ddp_gloo"
FLIPS_PER_LAYER = 6


def _answer(report: dict) -> str:
    """The document without its warnings (a damaged entry adds one), as comparable text."""
    return json.dumps({k: v for k, v in report.items() if k != "warnings"}, sort_keys=True, default=str)


def _report(run: Path, cache: Path) -> dict:
    return build_report([run], ReportOptions(cache_dir=cache, workers=1))  # type: ignore[return-value]


def _layer_files(cache: Path, layer: str) -> list[Path]:
    if layer == "document":
        return sorted((cache / caches.DOCUMENT_FOLDER).glob("*.msgpack"))
    if layer == "summary":
        return sorted((cache / caches.SUMMARY_FOLDER).glob("*.msgpack"))
    return sorted(p for p in cache.glob("*/*") if p.parent.name not in (caches.DOCUMENT_FOLDER, caches.SUMMARY_FOLDER))


def _flip(path: Path, rng: random.Random) -> None:
    data = bytearray(path.read_bytes())
    i = rng.randrange(len(data))
    data[i] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("layer", ["document", "summary", "tables"])
def test_bit_flips_never_change_the_answer(tmp_path: Path, layer: str) -> None:
    run = tmp_path / "run"
    shutil.copytree(SAMPLE, run)
    truth = _answer(build_report([run], ReportOptions(use_cache=False, workers=1)))  # type: ignore[arg-type]
    pristine = tmp_path / "pristine"
    assert _answer(_report(run, pristine)) == truth
    rng = random.Random(f"{layer}-28")
    said = 0
    for _ in range(FLIPS_PER_LAYER):
        cache = tmp_path / "cache"
        shutil.rmtree(cache, ignore_errors=True)
        shutil.copytree(pristine, cache)
        if layer != "document":  # the layer under test must be the one read
            shutil.rmtree(cache / caches.DOCUMENT_FOLDER)
        if layer == "tables":
            shutil.rmtree(cache / caches.SUMMARY_FOLDER)
        _flip(rng.choice(_layer_files(cache, layer)), rng)
        report = _report(run, cache)
        assert _answer(report) == truth  # never silently wrong
        said += any("failed its integrity check" in w for w in report["warnings"])
        again = _report(run, cache)  # the damaged entry was replaced: a clean, quiet cache again
        assert _answer(again) == truth and not any("integrity" in w for w in again["warnings"])
    assert said >= FLIPS_PER_LAYER // 2  # most flips land in checked bytes (the others in a key: a plain miss)


def test_trace_replaced_by_one_of_the_same_size_and_mtime(tmp_path: Path) -> None:
    """Same path, size and mtime, other content (a copy over it, a restore): read afresh."""
    src = next((SAMPLE / "traces").glob("rank0.pt.trace.json.gz"))
    edit = cached_then_edited(src, tmp_path)
    trace, st = edit.trace, edit.stat
    replacement = tmp_path / "other.json"
    replacement.write_bytes(edit.changed)
    os.replace(replacement, trace)  # a new file (inode) in its place ...
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns))  # ... with the old mtime
    assert (trace.stat().st_size, trace.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    after = read_rank(trace, cache_dir=edit.cache)
    names = set(after.host["name"].to_list())
    assert edit.new_name in names and edit.new_name not in set(edit.before.host["name"].to_list())
