"""Find trace files under the paths a user gave (folders recursively, globs, files).

A ``traceread collect`` run folder holds other JSON beside the traces (``run.json``,
``truth.json``, ``hang.json``, Flight Recorder dumps under ``fr/``, torchelastic errors under
``errors/``); those are skipped silently. Files named explicitly are always returned, so a bad
one is reported as a failure rather than ignored.
"""

from __future__ import annotations

import glob
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traceread.read.names import NON_TRACE_DIRS, NON_TRACE_FILES, NOT_A_TRACE, is_foreign_name, is_trace_name
from traceread.read.remote import find_remote, is_url


@dataclass
class Found:
    """Result of a search: files in a stable order, which were named explicitly, run.json files."""

    files: list[Path] = field(default_factory=list)
    explicit: set[Path] = field(default_factory=set)
    run_json: list[Path] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # said as warnings (e.g. a Ray node that could not list)
    reasons: dict[str, str] = field(default_factory=dict)  # why a ``missing`` entry is missing, when known

    def why(self, missing: str) -> str:
        """The one-line reason a ``missing`` entry gives (a URL that did not answer says so)."""
        return self.reasons.get(missing, "no such file or folder")

    def skipped(self, f: Path, reason: str) -> bool:
        """Whether a file that failed to read is passed over with a note instead of counted as a
        failed rank: a folder walk picks up any ``*.json``, and one that is not a Kineto trace (the
        decoder's message starts so) is not a rank the user asked for; a file they named always is."""
        return f not in self.explicit and reason.startswith(NOT_A_TRACE)


def find(paths: Sequence[str | Path], storage_options: dict[str, Any] | None = None) -> Found:
    found = Found()
    seen: set[Path] = set()

    def add(p: Path, explicit: bool) -> None:
        rp = p.resolve()
        if rp in seen:
            return
        seen.add(rp)
        found.files.append(p)
        if explicit:
            found.explicit.add(p)

    for raw in paths:
        if is_url(str(raw)):  # s3://, gs://, az://, https://: traceread.read.remote
            find_remote(str(raw), found, storage_options)
            continue
        p = Path(raw)
        if p.is_dir():
            run = p / "run.json"
            if run.is_file():
                found.run_json.append(run)
            for f in _walk(p):
                add(f, explicit=False)
        elif p.is_file():
            add(p, explicit=True)
        elif any(ch in str(raw) for ch in "*?["):
            matches = sorted(glob.glob(str(raw), recursive=True))
            if not matches:
                found.missing.append(str(raw))
            for m in matches:
                mp = Path(m)
                if mp.is_dir():
                    for f in _walk(mp):
                        add(f, explicit=False)
                elif mp.is_file() and (is_trace_name(mp.name) or is_foreign_name(mp.name)):
                    add(mp, explicit=True)
        else:
            found.missing.append(str(raw))
    return found


def _walk(root: Path) -> list[Path]:
    out = []
    for f in sorted(root.rglob("*")):
        if not f.is_file() or not (is_trace_name(f.name) or is_foreign_name(f.name)):
            continue  # another tool's file (Nsight, XPlane, Perfetto) is kept: the reader names it
        rel = f.relative_to(root)
        if f.name in NON_TRACE_FILES:
            continue
        if any(part in NON_TRACE_DIRS for part in rel.parts[:-1]):
            continue
        if any(part.startswith(".") for part in rel.parts):
            continue  # hidden folders (caches, .git)
        out.append(f)
    return out


def discover(paths: Sequence[str | Path]) -> list[Path]:
    """Trace files under ``paths``: folders searched recursively, globs expanded, files as given.

    Paths that do not exist are left out here; :func:`traceread.engine.jobs.read_traces` reports them.
    """
    return find(paths).files
