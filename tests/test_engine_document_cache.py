"""The report document is cached under its inputs: a second ``report`` of an unchanged run (another
format, another output path) only renders; any change of a trace, a run-folder side file, the
analysis options or the code is a miss. And the summary wire format is generic over RankSummary."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from engine_docs import differences

from traceread.assemble import run_map
from traceread.assemble.report import ReportOptions, build_report
from traceread.engine import caches

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "sample_traces" / "ddp_straggler_h100"


@pytest.fixture()
def run(tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(SAMPLE, out)
    return out


def _no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*_a: object, **_k: object) -> None:
        raise AssertionError("the engine ran although the document was cached")

    monkeypatch.setattr(run_map, "summarise_files", fail)


def test_unchanged_run_only_renders(run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opts = ReportOptions(cache_dir=tmp_path / "cache", workers=1)
    cold = build_report([run], opts)
    with monkeypatch.context() as m:
        _no_engine(m)
        warm = build_report([run], opts)
        assert differences(cold, warm) == []
        assert differences(cold, build_report([run], ReportOptions(cache_dir=tmp_path / "cache", workers=2))) == []

    # every input change is a miss
    changed = ReportOptions(cache_dir=tmp_path / "cache", workers=1, top_kernels=5)
    assert len(build_report([run], changed)["kernels"]) == 5
    f = sorted(run.glob("rank*.pt.trace.json.gz"))[0]
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    (run / "nccl").mkdir()
    (run / "nccl" / "rank0.log").write_text("host:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n")
    calls: list[int] = []
    real = run_map.summarise_files
    monkeypatch.setattr(run_map, "summarise_files", lambda files, o: calls.append(len(files)) or real(files, o))
    build_report([run], opts)
    assert calls == [len(list(run.glob("rank*.pt.trace.json.gz")))]
    caches.code_fingerprint.cache_clear()
    monkeypatch.setattr(caches, "code_fingerprint", lambda: "edited code")
    build_report([run], opts)
    assert len(calls) == 2


@pytest.mark.parametrize("fmt", ["json", "text", "html"])
def test_warm_render_imports_no_analysis(run: Path, tmp_path: Path, fmt: str) -> None:
    """The warm path (document cached) never imports polars, numpy or an analysis module, whatever
    the renderer (the HTML page and the terminal draw the ledger from the document alone)."""
    env = dict(os.environ, TRACEREAD_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(REPO))
    cmd = [sys.executable, "-m", "traceread.cli", "report", str(run), "--format", fmt, "-o", str(tmp_path / f"r.{fmt}")]
    assert subprocess.run(cmd, env=env, capture_output=True, timeout=300).returncode == 0
    probe = ("import sys, runpy; sys.argv = {argv!r}\n"
             "try:\n    runpy.run_module('traceread.cli', run_name='__main__')\nexcept SystemExit:\n    pass\n"
             "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('polars', 'numpy', 'pyarrow') "
             "or m.startswith(('traceread.analysis', 'traceread.engine.executors', 'traceread.assemble.rank_map', "
             "'traceread.assemble.run_map')))\n"
             "print(heavy)").format(argv=["traceread", *cmd[3:]])
    r = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "Usage:" not in r.stderr, r.stderr  # the probe ran the report, not a usage error
    assert r.stdout.strip().splitlines()[-1] == "[]"


def test_summary_format_is_generic_over_fields(run: Path) -> None:
    """A field added to RankSummary travels without touching the cache code (frames, dicts, meta)."""
    from traceread.assemble.rank_map import RankSummary
    from traceread.assemble.run_map import summarise
    from traceread.engine.tasks import RankTask

    s, data = summarise(RankTask(sorted(run.glob("rank*.pt.trace.json.gz"))[0], detail=True, use_cache=False))
    assert isinstance(s, RankSummary) and data is not None
    back = caches.decode_summary(data, RankSummary)
    for fd in dataclasses.fields(RankSummary):
        a, b = getattr(s, fd.name), getattr(back, fd.name)
        if isinstance(a, pl.DataFrame):
            assert a.equals(b, null_equal=True), fd.name
        elif dataclasses.is_dataclass(a):
            assert dataclasses.asdict(a) == dataclasses.asdict(b), fd.name
        else:
            assert differences(a, b) == [], fd.name
    with pytest.raises(ValueError):
        caches.decode_summary(caches._ENCODER.encode({"format": caches.FORMAT, "fields": {"comm": {"value": 1}}}), RankSummary)
