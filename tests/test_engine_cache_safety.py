"""No file in the cache directory, a run folder or a trace folder is ever executed (issue #14).

Every file the caches wrote (parse cache, summary cache, document cache) is replaced by a hostile
payload that would create a marker file if it were unpickled, unmarshalled or evaluated; then the
real ``traceread report`` runs again (a subprocess, like a user). The marker must not exist, and
the report must be the one computed from scratch: every poisoned entry is a miss, recomputed.
"""

from __future__ import annotations

import json
import marshal
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from engine_docs import differences

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "sample_traces" / "ddp_straggler_h100"


class _Touch:
    """Unpickling this runs ``touch MARKER``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.marker}",))


def payloads(marker: Path) -> dict[str, bytes]:
    """Hostile contents, each of which runs ``touch marker`` if loaded the unsafe way."""
    evil = pickle.dumps(_Touch(marker), protocol=2)
    code = compile(f"open({str(marker)!r}, 'w').close()", "<evil>", "exec")
    return {
        "pickle": evil,
        "pickle-in-msgpack": msgspec.msgpack.encode({"key": {}, "summary": evil, "report": {"x": evil}}),
        # jinja2's bytecode cache format: magic header, pickled checksum, marshalled code.
        "jinja-bytecode": b"j2" + pickle.dumps(4, 2) + evil + marshal.dumps(code),
        "marshal": marshal.dumps(code),
        "json-reduce": json.dumps({"py/reduce": [{"py/function": "os.system"}, {"py/tuple": [f"touch {marker}"]}],
                                   "__reduce__": ["os.system", [f"touch {marker}"]]}).encode(),
        "python-source": f"import os; os.system('touch {marker}')\n".encode(),
    }


def _report(paths: list[Path], cache: Path, fmt: str, out: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TRACEREAD_CACHE_DIR=str(cache), PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "traceread.cli", "report", *map(str, paths), "--format", fmt,
                           "-o", str(out), *extra], env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run") / "run"
    shutil.copytree(SAMPLE, out)
    return out


def test_poisoned_cache_runs_nothing_and_is_recomputed(run: Path, tmp_path: Path) -> None:
    reference = tmp_path / "reference.json"
    assert _report([run], tmp_path / "unused", "json", reference, "--no-cache").returncode == 0
    expected = json.loads(reference.read_text())
    cache = tmp_path / "cache"
    first = _report([run], cache, "json", tmp_path / "first.json")
    assert first.returncode == 0, first.stderr
    assert _report([run], cache, "html", tmp_path / "first.html").returncode == 0
    written = sorted(p for p in cache.rglob("*") if p.is_file())
    kinds = {p.relative_to(cache).parts[0] for p in written}
    assert {"summaries", "documents"} <= kinds and any(p.suffix == ".parquet" for p in written)
    for name, payload in payloads(tmp_path / "marker").items():
        marker = tmp_path / "marker"
        for p in written:
            p.write_bytes(payload)
        # also where jinja2 would look for compiled templates, had it a bytecode cache here
        (cache / "templates").mkdir(exist_ok=True)
        (cache / "templates" / "__jinja2_report.html.j2.cache").write_bytes(payloads(marker)["jinja-bytecode"])
        for fmt in ("json", "html"):
            r = _report([run], cache, fmt, tmp_path / f"again.{fmt}")
            assert r.returncode == 0, f"{name}: {r.stderr}"
            assert not marker.exists(), f"{name}: a cache file ran code"
        again = json.loads((tmp_path / "again.json").read_text())
        again["warnings"] = [w for w in again["warnings"] if not w.startswith("cache: ")]  # damaged entries, said
        assert differences(expected, again) == [], name
        written = sorted(p for p in cache.rglob("*") if p.is_file() and p.parent.name != "templates")


def test_run_and_trace_folders_run_nothing(run: Path, tmp_path: Path) -> None:
    """Hostile files in a run folder, under every name the analyses look at, execute nothing."""
    folder = tmp_path / "run"
    shutil.copytree(run, folder)
    marker = tmp_path / "marker"
    evil = payloads(marker)["pickle"]
    for rel in ("fr/rank0.pkl", "fr/rank1", "fr/rank2.pickle", "stacks/rank0.pkl", "stacks/rank1.txt",
                "nccl/rank0.log", "hang.json", "errors/rank0.json", "progress/rank0.json", "rank9.pt.trace.json",
                "notes.pkl", "rank10.pt.trace.json.gz"):
        p = folder / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(evil)
    r = _report([folder], tmp_path / "cache", "json", tmp_path / "out.json")
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "out.json").read_text())
    assert len(doc["ranks"]) == len(list(run.glob("rank*.pt.trace.json.gz")))
    env = dict(os.environ, TRACEREAD_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=str(REPO))
    subprocess.run([sys.executable, "-m", "traceread.cli", "hang", str(folder)], env=env, capture_output=True,
                   timeout=300)
    assert not marker.exists(), "a file in the run folder ran code"
