"""Parquet cache of parsed tables: a second read of the same file costs a few milliseconds.

One folder per trace file, named by a hash of its absolute path, holding the four tables as
parquet and ``meta.json`` with the key: absolute path, size, ``mtime_ns`` and
:data:`traceread.model.READER_VERSION`. Any mismatch (file rewritten, reader upgraded) is a miss
and the entry is rewritten. Cache trouble (read-only home, corrupt entry) is never an error: the
file is simply parsed again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import polars as pl

from traceread.model import (
    FLOW_SCHEMA,
    GPU_SCHEMA,
    HOST_SCHEMA,
    READER_VERSION,
    STEP_SCHEMA,
    RankMeta,
    RankTrace,
)
from traceread.reader.columns import null_series

TABLES: dict[str, dict[str, pl.DataType]] = {
    "gpu": GPU_SCHEMA,
    "host": HOST_SCHEMA,
    "steps": STEP_SCHEMA,
    "flows": FLOW_SCHEMA,
}


def cache_root(cache_dir: Path | str | None = None) -> Path:
    """``cache_dir``, else ``$TRACEREAD_CACHE_DIR``, else ``~/.cache/traceread``."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("TRACEREAD_CACHE_DIR")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "traceread"


def file_key(path: Path) -> dict[str, Any]:
    st = path.stat()
    return {
        "path": str(path.resolve()),
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "reader_version": READER_VERSION,
    }


def entry_dir(root: Path, path: Path) -> Path:
    digest = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:20]
    return root / f"{path.name[:60]}-{digest}"


def load(path: Path, root: Path) -> RankTrace | None:
    """The cached tables of ``path`` when the entry matches the file as it is now, else None."""
    try:
        d = entry_dir(root, path)
        info_file = d / "meta.json"
        if not info_file.is_file():
            return None
        info = json.loads(info_file.read_text())
        if info.get("key") != file_key(path):
            return None
        tables = {}
        for name, schema in TABLES.items():
            df = pl.read_parquet(d / f"{name}.parquet")
            nulls = info["null_columns"][name]
            # All-null columns are not stored; rebuilt for free (see columns.null_series).
            df = df.with_columns(null_series(c, schema[c], df.height) for c in nulls)
            if set(df.columns) != set(schema):
                return None
            df = df.select(list(schema))
            if dict(df.schema) != schema:
                return None
            tables[name] = df
        meta = RankMeta(**info["meta"])
        return RankTrace(
            rank=info["rank"], file=str(path), meta=meta, **tables  # type: ignore[arg-type]
        )
    except Exception:  # noqa: BLE001 - a broken cache entry is a miss, never an error
        return None


def store(rt: RankTrace, path: Path, root: Path) -> bool:
    """Write the entry atomically (temp folder + rename); False (no error) when it cannot."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        key = file_key(path)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
        try:
            null_columns: dict[str, list[str]] = {}
            for name in TABLES:
                df: pl.DataFrame = getattr(rt, name)
                nulls = [c for c in df.columns if df.height and df[c].null_count() == df.height]
                null_columns[name] = nulls
                df.drop(nulls).write_parquet(
                    tmp / f"{name}.parquet", compression="lz4", statistics=False
                )
            info = {
                "key": key,
                "rank": rt.rank,
                "meta": dataclasses.asdict(rt.meta),
                "null_columns": null_columns,
            }
            (tmp / "meta.json").write_text(json.dumps(info))
            dest = entry_dir(root, path)
            if dest.exists():
                shutil.rmtree(dest, ignore_errors=True)
            os.replace(tmp, dest)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    except Exception:  # noqa: BLE001 - caching is an optimisation only
        return False
    return True
