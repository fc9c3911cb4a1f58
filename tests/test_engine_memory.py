"""The local workers' memory budget: size estimates on real trace files, admission, and a real pool."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import zstandard

from traceread.engine import memory
from traceread.engine.executors import ProcessExecutor
from traceread.engine.memory import Budget, available_bytes, text_bytes, worker_peak

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "sample_traces" / "cpu_ddp_gloo"


def _a_trace() -> tuple[Path, bytes]:
    f = sorted(SAMPLE.rglob("*.pt.trace.json*"))[0]
    data = f.read_bytes()
    return f, gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def test_plain_json_is_its_file_size(tmp_path: Path) -> None:
    _, text = _a_trace()
    p = tmp_path / "r.json"
    p.write_bytes(text)
    assert text_bytes(p) == len(text)


@pytest.mark.parametrize("how", ["gzip", "gzip-members", "zstd"])
def test_compressed_size_is_estimated_from_the_ratio(tmp_path: Path, how: str) -> None:
    """A real trace tiled to ~8 MB (past the 1 MiB sample), compressed three ways."""
    _, text = _a_trace()
    doc = json.loads(text)
    doc["traceEvents"] = doc["traceEvents"] * max(1, (8 << 20) // len(text))
    big = json.dumps(doc, indent=1).encode()
    p = tmp_path / "r.json.gz"
    if how == "gzip":
        p.write_bytes(gzip.compress(big, 1))
    elif how == "gzip-members":  # as bench/make_large.py writes: header, events, tail members
        p.write_bytes(gzip.compress(big[:100], 1) + gzip.compress(big[100:-10], 1) + gzip.compress(big[-10:], 1))
    else:
        p.write_bytes(zstandard.ZstdCompressor().compress(big))
    est = text_bytes(p)
    assert est is not None and 0.7 * len(big) <= est <= 1.3 * len(big), (est, len(big))


def test_a_bomb_is_capped_at_max_rank_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = tmp_path / "bomb.json.gz"
    p.write_bytes(gzip.compress(b"{" + b" " * (64 << 20), 9))
    monkeypatch.setenv("TRACEREAD_MAX_RANK_BYTES", str(16 << 20))
    assert text_bytes(p) == 16 << 20  # the whitespace inflates to 64 MiB: the reader stops at 16


def test_missing_file_has_no_estimate(tmp_path: Path) -> None:
    assert text_bytes(tmp_path / "nope.json") is None


def test_budget_env_overrides_the_measurement(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(memory.BUDGET_ENV, "12GiB")
    assert available_bytes() == 12 << 30
    monkeypatch.setenv(memory.BUDGET_ENV, "off")
    assert available_bytes() is None
    monkeypatch.setenv(memory.BUDGET_ENV, "twelve")  # a typo: measured instead, never an error
    measured = available_bytes()
    if Path("/proc/meminfo").exists():
        assert measured is not None and measured > 0


def test_admission_first_fit_and_the_largest_alone() -> None:
    b = Budget([worker_peak(10 << 30), worker_peak(1 << 30), worker_peak(1 << 30)].__getitem__, limit=22 << 30)
    assert b.limit == int((22 << 30) * memory.USABLE_SHARE)
    assert b.fits(0, running=0)
    b.start(0)
    assert b.fits(1, running=1)  # 16.3 + 1.9 GiB <= 18.7 GiB
    b.start(1)
    assert not b.fits(2, running=2)
    b.finish(0)
    assert b.fits(2, running=1)
    huge = Budget(lambda i: worker_peak(100 << 30), limit=8 << 30)
    assert huge.fits(0, running=0)  # larger than the machine: it still runs, alone
    huge.start(0)
    assert not huge.fits(1, running=1)  # and nothing beside it
    assert Budget([1, 1].__getitem__, limit=None).fits(1, running=5)


def test_peaks_are_estimated_once_and_only_when_asked() -> None:
    asked: list[int] = []
    b = Budget(lambda i: asked.append(i) or 100, limit=1000)
    assert asked == []
    assert b.fits(2, running=1) and b.fits(2, running=1)
    b.start(2)
    b.finish(2)
    assert asked == [2] and b.in_use == 0


def _stamp(seconds: float) -> tuple[float, float, int]:
    start = time.monotonic()
    time.sleep(seconds)
    return start, time.monotonic(), os.getpid()


def _max_overlap(spans: list[tuple[float, float, int]]) -> int:
    edges = sorted([(s, 1) for s, _, _ in spans] + [(e, -1) for _, e, _ in spans])
    run = best = 0
    for _, d in edges:
        run += d
        best = max(best, run)
    return best


def test_a_real_pool_runs_only_what_fits() -> None:
    """Two workers, three tasks whose planned peaks fit one at a time: they never overlap."""
    out: dict[int, tuple[float, float, int]] = {}
    budget = Budget([1000, 1000, 1000].__getitem__, limit=int(1500 / memory.USABLE_SHARE) + 1)
    ProcessExecutor(2, budget=budget).map(_stamp, [(0.4,)] * 3, lambda i, r: out.__setitem__(i, r))
    assert sorted(out) == [0, 1, 2]
    assert _max_overlap(list(out.values())) == 1
    assert budget.in_use == 0

    out.clear()
    roomy = Budget([1000, 1000].__getitem__, limit=10_000)
    ProcessExecutor(2, budget=roomy).map(_stamp, [(3.0,)] * 2, lambda i, r: out.__setitem__(i, r))
    assert _max_overlap(list(out.values())) == 2


def test_report_is_the_same_when_ranks_run_one_at_a_time(tmp_path: Path) -> None:
    """The whole CLI with a budget of 1 byte (every rank alone) and with none: same document."""
    docs = []
    for budget in ("1", "off"):
        out = tmp_path / f"r_{budget}.json"
        env = {**os.environ, memory.BUDGET_ENV: budget}
        res = subprocess.run(
            [sys.executable, "-m", "traceread", "report", str(SAMPLE), "--no-cache", "-j", "2",
             "--format", "json", "-o", str(out)], env=env, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stderr
        doc = json.loads(out.read_text())
        doc.pop("generated_at", None)
        docs.append(doc)
    assert docs[0] == docs[1]
