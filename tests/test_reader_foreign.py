"""Other tools' files are named, with what to do instead: one line, exit 2, also inside a folder.

Each file is built the way its tool writes it: an SQLite database with Nsight Systems' export tables
(``nsys export --type sqlite``), an XSpace protobuf whose planes are named ``/device:GPU:0``, a Perfetto
``Trace`` of ``TracePacket``s, a PyTorch ``ExecutionTraceObserver`` JSON (Chakra ET), an Excel workbook
with TraceLens' sheets, a CSV table."""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from traceread.cli import cli
from traceread.read.foreign import foreign_format

ET = {"schema": "1.1.1-chakra.0.0.4", "pid": 4711, "time": "2025-06-01 10:00:00", "start_ts": 1000,
      "nodes": [{"id": 1, "name": "[pytorch|profiler|execution_trace|process]", "ctrl_deps": 0,
                 "inputs": {"values": [], "shapes": [], "types": []},
                 "outputs": {"values": [], "shapes": [], "types": []}, "attrs": []}],
      "finish_ts": 2000}


def _nsys_sqlite(p: Path) -> None:
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE TARGET_INFO_GPU (id INTEGER, name TEXT)")
    con.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, shortName INTEGER)")
    con.commit()
    con.close()


def _sqlite(p: Path, table: str) -> None:
    con = sqlite3.connect(p)
    con.execute(f"CREATE TABLE {table} (a INTEGER)")
    con.commit()
    con.close()


def _xlsx(p: Path) -> None:
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("[Content_Types].xml", "<Types/>")
        z.writestr("xl/workbook.xml", '<workbook><sheets><sheet name="gpu_timeline"/><sheet name="ops_summary"/>'
                                      "</sheets></workbook>")


def _pb(field_text: bytes) -> bytes:
    """One length-delimited field 1 (XSpace.planes / Trace.packet) holding field 2 text."""
    inner = b"\x12" + bytes([len(field_text)]) + field_text
    return b"\x0a" + bytes([len(inner)]) + inner + b"\x00\x01\x02\x03" * 8


CASES = {
    "report1.nsys-rep": (lambda p: p.write_bytes(b"\x00\x01NSYS" + bytes(range(256)) * 4), "an Nsight Systems report"),
    "report1.sqlite": (_nsys_sqlite, "an Nsight Systems SQLite export"),
    "results.db": (lambda p: _sqlite(p, "rocpd_kernel_dispatch"), "a rocprof (rocpd) SQLite database"),
    "other.sqlite": (lambda p: _sqlite(p, "users"), "an SQLite database, not a trace"),
    "host0.xplane.pb": (lambda p: p.write_bytes(_pb(b"/device:GPU:0")), "an XPlane protobuf"),
    "profile.pb": (lambda p: p.write_bytes(_pb(b"/host:CPU")), "an XPlane protobuf"),
    "trace.pftrace": (lambda p: p.write_bytes(_pb(b"track_event")), "a Perfetto protobuf trace"),
    "trace.pb": (lambda p: p.write_bytes(_pb(b"clock_snapshot")), "a Perfetto protobuf trace"),
    "rank0.pt.trace.json": (lambda p: p.write_text(json.dumps(ET)), "a PyTorch execution trace (Chakra ET"),
    "rank1.pt.trace.json.gz": (lambda p: p.write_bytes(gzip.compress(json.dumps(ET).encode())),
                               "a PyTorch execution trace (Chakra ET"),
    "perf_report.xlsx": (_xlsx, "a TraceLens performance report (Excel workbook)"),
    "ops_summary.csv": (lambda p: p.write_text("name,count,total_us\naten::mm,10,123.4\n"), "a CSV table"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_defect_named_file_is_named(tmp_path: Path, name: str) -> None:
    """defect: these were refused as "invalid JSON ... byte 0" or "no traceEvents"."""
    make, what = CASES[name]
    f = tmp_path / name
    make(f)
    found = foreign_format(f)
    assert found is not None and found.what.startswith(what), (name, found)
    res = CliRunner().invoke(cli, ["report", str(f), "--no-html"])
    assert res.exit_code == 2, res.output
    (line,) = [ln for ln in res.output.splitlines() if ln.strip()]
    assert str(f) in line and f"not a Kineto trace: it is {what}" in line and "Traceback" not in res.output
    assert "rank ? missing" not in line


@pytest.mark.parametrize("name", ["report1.nsys-rep", "report1.sqlite", "host0.xplane.pb", "rank0.pt.trace.json"])
def test_defect_foreign_file_in_a_folder_is_named_exit_2(tmp_path: Path, name: str) -> None:
    """defect: a folder holding only an Nsight SQLite export or an XPlane file exited 3 naming nothing."""
    make, what = CASES[name]
    (tmp_path / "prof").mkdir()
    make(tmp_path / "prof" / name)
    res = CliRunner().invoke(cli, ["report", str(tmp_path), "--no-html"])
    assert res.exit_code == 2, res.output
    assert str(tmp_path / "prof" / name) in res.output and f"it is {what}" in res.output


def test_foreign_file_beside_a_trace_is_a_warning(tmp_path: Path, samples_dir: Path) -> None:
    shutil.copy(samples_dir / "h100_compiled_1gpu" / "traces" / "rank0.pt.trace.json.gz", tmp_path)
    _nsys_sqlite(tmp_path / "report1.sqlite")
    res = CliRunner().invoke(cli, ["report", str(tmp_path), "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert len(doc["ranks"]) == 1
    assert any(str(tmp_path / "report1.sqlite") in w and "Nsight Systems SQLite export" in w for w in doc["warnings"])


def test_kineto_traces_are_not_foreign(samples_dir: Path) -> None:
    for f in sorted(samples_dir.rglob("*.pt.trace.json.gz"))[:5]:
        assert foreign_format(f) is None, f
