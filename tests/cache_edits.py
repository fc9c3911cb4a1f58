"""A cached trace edited so that only its content differs: the setup the cache-identity tests share."""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass
from pathlib import Path

from traceread.engine.jobs import read_rank
from traceread.model import RankTrace


@dataclass
class SameSizeEdit:
    trace: Path  # the plain-JSON trace, read once into ``cache``
    cache: Path
    before: RankTrace  # what that first read gave
    stat: os.stat_result  # the trace's stat before the edit
    new_name: str  # the first cpu_op renamed to this (same length)
    changed: bytes  # the edited trace: same length as the original


def cached_then_edited(sample_gz: Path, tmp_path: Path) -> SameSizeEdit:
    """``sample_gz`` written as plain JSON under ``tmp_path``, read into a cache there, and its edit prepared:
    the first ``cpu_op``'s name replaced by as many ``z`` (the file keeps its size); not yet written."""
    doc = json.loads(gzip.decompress(sample_gz.read_bytes()))
    text = json.dumps(doc)
    trace = tmp_path / "rank0.pt.trace.json"
    trace.write_text(text)
    cache = tmp_path / "cache"
    before = read_rank(trace, cache_dir=cache)
    st = trace.stat()
    op = next(e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op")
    op["name"] = "z" * len(op["name"])
    changed = json.dumps(doc).encode()
    assert len(changed) == st.st_size
    return SameSizeEdit(trace, cache, before, st, op["name"], changed)
