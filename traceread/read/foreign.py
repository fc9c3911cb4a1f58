"""Name a file that is some other tool's format, and say what to do instead.

traceread reads PyTorch profiler (Kineto) JSON. Users also hand it what other profilers and analysers
write; "invalid JSON at byte 0" helps nobody at 3 a.m. This module looks at a file's name and first
64 KiB (decompressed when gzip/zstd) and names it:

* Nsight Systems reports (``.nsys-rep``, older ``.qdrep``/``.qdstrm``) and their SQLite export
  (``nsys export --type sqlite``: an SQLite file whose schema names ``CUPTI_ACTIVITY_KIND_*`` /
  ``TARGET_INFO_*`` tables); rocprof/rocpd SQLite databases; Nsight Compute reports (``.ncu-rep``);
* XPlane protobufs (``*.xplane.pb``: TensorBoard/XProf, JAX, PyTorch/XLA; the plane names
  ``/host:CPU``, ``/device:GPU:0`` appear in the first bytes);
* Perfetto protobuf traces (``.pftrace``, ``.perfetto-trace``, or an unnamed binary protobuf);
* PyTorch execution traces (Chakra ET: ``{"schema": ..., "pid": ..., "nodes": [...]}``, from
  ``ExecutionTraceObserver``), often saved under a Kineto-like ``*.pt.trace.json`` name; binary Chakra
  ``.et`` files;
* analysis outputs: Excel workbooks (TraceLens writes its performance report as one) and CSV tables
  (HTA and TraceLens results).

The reason starts with ``not a Kineto trace`` so a folder walk passes the file over with a note that
names it, and a file named explicitly fails with this one line (exit 2).
"""

from __future__ import annotations

import io
import re
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from traceread.read.names import NOT_A_TRACE
from traceread.read.names import is_foreign_name as is_foreign_name  # re-exported for the reader

HEAD_BYTES = 64 << 10

_RECORD = ("record the job with torch.profiler or `traceread collect -- <command>` and pass its "
           "*.pt.trace.json[.gz] files")
_XPLANE = re.compile(rb"/(?:host:CPU|device:(?:GPU|TPU|CPU):\d+)")
_ET_HEAD = re.compile(rb'^\s*\{\s*"schema"\s*:\s*"[^"]*"')


@dataclass(frozen=True)
class Foreign:
    """What the file is and what to do instead."""

    what: str
    advice: str

    def reason(self) -> str:
        return f"{NOT_A_TRACE}: it is {self.what}; {self.advice}"


def _head(path: Path) -> bytes:
    """The first :data:`HEAD_BYTES` of the file's content (gzip/zstd inflated, bounded)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(HEAD_BYTES)
    except OSError:
        return b""
    try:
        if raw[:2] == b"\x1f\x8b":
            return zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(raw, HEAD_BYTES)
        if raw[:4] == b"\x28\xb5\x2f\xfd":
            import zstandard

            with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(raw)) as r:
                return r.read(HEAD_BYTES)
    except Exception:  # a damaged stream is the reader's to report
        return b""
    return raw


def _sqlite(path: Path, head: bytes) -> Foreign:
    if b"CUPTI_ACTIVITY_KIND" in head or b"TARGET_INFO_GPU" in head or b"NVTX_EVENTS" in head:
        return Foreign("an Nsight Systems SQLite export (nsys export --type sqlite)", _RECORD)
    if b"rocpd_" in head:
        return Foreign("a rocprof (rocpd) SQLite database", _RECORD)
    return Foreign("an SQLite database, not a trace", _RECORD)


def _zip(path: Path) -> Foreign | None:
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
            if "xl/workbook.xml" not in names:
                return None
            book = z.read("xl/workbook.xml")[:HEAD_BYTES]
    except (OSError, zipfile.BadZipFile, KeyError):
        return None
    if b"gpu_timeline" in book or b"ops_summary" in book:
        return Foreign("a TraceLens performance report (Excel workbook)",
                       "pass the PyTorch profiler trace it was made from (*.pt.trace.json[.gz])")
    return Foreign("an Excel workbook, not a trace", "pass the PyTorch profiler traces (*.pt.trace.json[.gz])")


def foreign_format(path: str | Path) -> Foreign | None:
    """What ``path`` is when it is a known foreign format; None when it may be a Kineto trace (or
    is something this module does not know: the reader's own message stands)."""
    p = Path(path)
    name = p.name.lower()
    if name.endswith((".nsys-rep", ".qdrep", ".qdstrm")):
        return Foreign("an Nsight Systems report", "traceread reads PyTorch profiler (Kineto) JSON: " + _RECORD
                       + " (Nsight Systems itself opens this file)")
    if name.endswith(".ncu-rep"):
        return Foreign("an Nsight Compute report (per-kernel metrics, no timeline)", _RECORD)
    head = _head(p)
    if head.startswith(b"SQLite format 3\x00"):
        return _sqlite(p, head)
    if head.startswith(b"PK\x03\x04"):
        return _zip(p)
    if name.endswith(".xplane.pb") or (head[:1] == b"\x0a" and _XPLANE.search(head)):
        return Foreign("an XPlane protobuf (TensorBoard/XProf profile, written by JAX, TensorFlow or PyTorch/XLA)",
                       "XProf/TensorBoard opens it; for a PyTorch job on GPUs, " + _RECORD)
    if name.endswith((".pftrace", ".perfetto-trace")) or (head[:1] == b"\x0a" and name.endswith(".pb")):
        return Foreign("a Perfetto protobuf trace", "ui.perfetto.dev opens it; traceread reads PyTorch profiler "
                       "(Kineto) JSON: " + _RECORD)
    if name.endswith(".et"):
        return Foreign("a Chakra execution trace (protobuf): operators and their dependencies, no timings",
                       "pass the PyTorch profiler (Kineto) trace recorded beside it")
    text = head.lstrip()
    if text[:1] == b"{" and b'"traceEvents"' not in head:
        if _ET_HEAD.match(head) and b'"nodes"' in head:
            return Foreign("a PyTorch execution trace (Chakra ET from ExecutionTraceObserver: operators and their "
                           "inputs, no timings)", "pass the PyTorch profiler (Kineto) trace of the same run, "
                           "the file torch.profiler wrote with traceEvents")
    if head and _binary(head) and head[:1] == b"\x0a":
        return Foreign("a binary protobuf (a Perfetto or XPlane trace?)", _RECORD)
    if name.endswith(".csv") or (head[:1].isalpha() and b"," in head.split(b"\n", 1)[0] and b"{" not in head[:64]):
        return Foreign("a CSV table (HTA and TraceLens write their results this way), not a trace",
                       "pass the PyTorch profiler traces (*.pt.trace.json[.gz]) the table was made from")
    return None


def _binary(head: bytes) -> bool:
    sample = head[:512]
    return sum(b < 9 or 13 < b < 32 for b in sample) > len(sample) // 20
