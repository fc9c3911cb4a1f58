"""Which files are NCCL logs: the run folder's, and any the user points at whose content says NCCL."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path


def find_nccl_logs(run_dir: str | Path) -> list[Path]:
    """NCCL/launcher logs in a RUN folder: ``nccl/*``, ``launcher.log``, torchrun ``--log-dir`` files."""
    d = Path(run_dir)
    out: list[Path] = []
    if (d / "nccl").is_dir():
        out += sorted(p for p in (d / "nccl").rglob("*") if p.is_file())
    if (d / "launcher.log").is_file():
        out.append(d / "launcher.log")
    for sub in ("torchrun", "logs"):
        if (d / sub).is_dir():
            out += sorted(p for p in (d / sub).rglob("*.log") if p.is_file())
    return out


#: Text that only an NCCL_DEBUG log or a PyTorch c10d NCCL/gloo message contains.
_LOG_MARKERS = (b"NCCL INFO", b"NCCL WARN", b"NCCL version", b"Init timings", b"Watchdog caught",
                b"ProcessGroupNCCL", b"ProcessGroupGloo",
                # what a paste of a failure holds when NCCL_DEBUG was off or the prefix was cut: nccl-tests and
                # PyTorch error wording, ncclResult_t names, NCCL <= 2.3's "file.cu:61 WARN", aws-ofi-nccl
                b"NCCL failure", b"CUDA failure common.cu", b"NCCL error", b"ncclSystemError", b"ncclInternalError",
                b"ncclRemoteError", b"ncclUnhandledCudaError", b"ncclInvalidUsage", b"NET/OFI", b"ncclSocketInit")
#: NCCL <= 2.3 wrote "include/socket.h:311 WARN msg" without the NCCL token
_OLD_WARN = re.compile(rb"\.(?:cc|cu|h|c):\d+ (?:NCCL )?WARN\b")
LOG_SUFFIXES = (".log", ".txt", ".out", ".err")
#: Only the head of a file is sniffed, and only this many files per folder walk (a huge tree of logs
#: must not turn `report` into a grep of the file system).
SNIFF_BYTES = 1 << 20
MAX_LOG_FILES = 2000
TRACE_NAMES = (".json", ".json.gz", ".json.zst")


def looks_like_nccl_log(path: Path) -> bool:
    """Whether the first MiB of ``path`` holds an NCCL/c10d marker (any launcher prefix, any name)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(SNIFF_BYTES)
    except OSError:
        return False
    return any(m in head for m in _LOG_MARKERS) or bool(_OLD_WARN.search(head))


def candidate_files(paths: Sequence[str | Path], suffixes: tuple[str, ...] = LOG_SUFFIXES) -> list[Path]:
    """Files named explicitly that are not traces, then ``suffixes`` files under the folders given
    (hidden folders skipped, at most :data:`MAX_LOG_FILES` per folder)."""
    out: dict[Path, None] = {}
    for raw in paths:
        p = Path(raw)
        if p.is_file() and not p.name.endswith(TRACE_NAMES):
            out.setdefault(p, None)
        elif p.is_dir():
            seen = 0
            for f in sorted(p.rglob("*")):
                rel = f.relative_to(p).parts
                if not f.name.endswith(suffixes) or any(x.startswith(".") for x in rel) or not f.is_file():
                    continue
                seen += 1
                if seen > MAX_LOG_FILES:
                    break
                out.setdefault(f, None)
    return list(out)


def nccl_logs_under(paths: Sequence[str | Path], run_dir: str | Path | None = None) -> list[Path]:
    """NCCL logs the user pointed at: the RUN folder's logs, ``*.log``/``*.txt``/``*.out``/``*.err`` files
    under the folders given, and any file named explicitly that is not a trace, when their content
    says NCCL. Lets ``traceread report`` answer from logs alone (a job that died before any trace)."""
    out: dict[Path, None] = {}
    if run_dir is not None:
        out.update(dict.fromkeys(find_nccl_logs(run_dir)))
    for f in candidate_files(paths):
        if looks_like_nccl_log(f):
            out.setdefault(f, None)
    return list(out)
