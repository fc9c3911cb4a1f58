"""The three caches of the report (parse, summary, document) with one keying rule; data only.

Keying rule (all three): an entry lives in a *slot* named by a hash of what it is about (the cache
kind, the inputs' locations and the variant, e.g. whether a summary carries the roofline); it holds
its *key*: the inputs' identities (:func:`identity`: local path + size + ``mtime_ns``; object URL +
size + ETag/generation/mtime), the code (:data:`READER_VERSION` for tables, :func:`code_fingerprint`
for summaries and documents) and the options that change the result. A lookup is a hit only when the
stored key equals the key computed now; anything else (another file, another version, a corrupt or
foreign file) is a miss and the entry is rewritten. Cache trouble is never an error.

Data only, never pickles, so a file in the cache directory can never run code, whoever wrote it:

- parse cache: one folder per trace file, its four tables as parquet + ``meta.json`` (key, rank,
  meta) — see :func:`load_tables` / :func:`store_tables`;
- summary cache: one msgpack file per rank and variant. :func:`encode_summary` is generic over the
  fields of :class:`traceread.build.rank_map.RankSummary`: a polars DataFrame field becomes Arrow IPC bytes,
  a dataclass field (:class:`RankMeta`) its fields as a map, anything else (dict, list, str, number,
  bool, None) is stored as msgpack. Adding a field to RankSummary needs nothing here. The same bytes
  carry a summary from a worker process or a Ray task back to the driver;
- document cache: the report document as msgpack, keyed by every input file's identity, the run
  folder's side files (run.json, NCCL logs, Flight Recorder dumps, stacks), the analysis options and
  the code, so a second ``report`` of an unchanged run only renders.

This module imports neither polars nor the analyses at import time: the warm document path uses it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib.util
import io
import os
import shutil
import sys
import tempfile
import types
import typing
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

if TYPE_CHECKING:
    from traceread.report_schema import Report

#: Bump when the layout of a summary or document entry changes.
FORMAT = "traceread.cache/2"
SUMMARY_FOLDER = "summaries"
DOCUMENT_FOLDER = "documents"
TABLES = ("gpu", "host", "steps", "flows")


def cache_root(cache_dir: Path | str | None = None) -> Path:
    """``cache_dir``, else ``$TRACEREAD_CACHE_DIR``, else ``~/.cache/traceread``."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("TRACEREAD_CACHE_DIR")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "traceread"


# ------------------------------------------------------------------------------------------------
# the keying rule


def identity(f: Any) -> dict[str, Any]:
    """What says a trace file is unchanged: a local file's absolute path, size and ``mtime_ns``; a
    remote object's URL, size and ETag/generation (or mtime). Raises OSError when it is gone."""
    remote = getattr(f, "identity", None)
    if callable(remote):
        return remote()
    p = Path(f)
    st = p.stat()
    return {"path": str(p.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def slot(kind: str, *about: Any) -> str:
    """The entry name for ``kind`` and what it is about (locations and variant, not versions)."""
    return hashlib.sha256(msgspec.json.encode([kind, *about])).hexdigest()[:24]


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """Hash of the code a summary or document depends on: every source file of ``traceread`` and
    ``traceread.render`` and the installed polars, numpy, msgspec and pyarrow, each by (path, size,
    ``mtime_ns``) like Python's own bytecode check, plus the Python version. Any edit, checkout or
    upgrade makes every cached summary and document a miss. Stats files only, imports nothing: the
    warm document path runs it."""
    h = hashlib.sha256(sys.version.encode())

    def add(p: Path) -> None:
        st = p.stat()
        h.update(f"|{p}|{st.st_size}|{st.st_mtime_ns}".encode())

    for dist in ("polars", "numpy", "msgspec", "pyarrow"):
        spec = importlib.util.find_spec(dist)
        if spec is not None and spec.origin:
            add(Path(spec.origin))
    for pkg in ("traceread", "traceread.render"):
        spec = importlib.util.find_spec(pkg)
        for base in (spec.submodule_search_locations or []) if spec else []:
            for dirpath, dirnames, filenames in os.walk(base):
                dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
                for name in sorted(filenames):
                    if name.endswith((".py", ".json", ".toml", ".csv", ".j2", ".html", ".js", ".css")):
                        add(Path(dirpath) / name)
    return h.hexdigest()


def _read_entry(path: Path) -> Any:
    """Decode one msgpack entry file (data only; any trouble is None)."""
    try:
        return msgspec.msgpack.decode(path.read_bytes())
    except Exception:  # a corrupt or foreign entry is a miss
        return None


def _write_atomic(dest: Path, data: bytes) -> bool:
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=dest.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, dest)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except Exception:  # caching is an optimisation only
        return False
    return True


def _enc_hook(obj: Any) -> Any:
    """numpy scalars and paths, which analyses sometimes leave in plain-data results."""
    if hasattr(obj, "item") and callable(obj.item):
        return obj.item()
    if isinstance(obj, (Path, os.PathLike)):
        return str(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise NotImplementedError(f"cannot store {type(obj).__name__}")


_ENCODER = msgspec.msgpack.Encoder(enc_hook=_enc_hook)


# ------------------------------------------------------------------------------------------------
# parse cache: tables as parquet


def parse_key(f: Any) -> dict[str, Any]:
    from traceread.model import READER_VERSION

    return {**identity(f), "reader_version": READER_VERSION}


def entry_dir(root: Path, f: Any) -> Path:
    """The parse-cache folder of a trace file: its name (readable) + the slot of its location."""
    ident = identity(f)
    where = ident.get("path") or ident.get("url")
    return root / f"{Path(str(f)).name[:60]}-{slot('tables', where)[:20]}"


def load_tables(f: Any, root: Path) -> Any:
    """The cached :class:`RankTrace` of ``f`` when its entry matches the file as it is now, else None."""
    try:
        import polars as pl

        from traceread.model import FLOW_SCHEMA, GPU_SCHEMA, HOST_SCHEMA, STEP_SCHEMA, RankMeta, RankTrace
        from traceread.read.columns import null_series

        schemas = {"gpu": GPU_SCHEMA, "host": HOST_SCHEMA, "steps": STEP_SCHEMA, "flows": FLOW_SCHEMA}
        d = entry_dir(root, f)
        info_file = d / "meta.json"
        if not info_file.is_file():
            return None
        info = msgspec.json.decode(info_file.read_bytes())
        if info.get("key") != parse_key(f):
            return None
        tables = {}
        for name, schema in schemas.items():
            df = pl.read_parquet(d / f"{name}.parquet")
            # All-null columns are not stored; rebuilt for free (see columns.null_series).
            df = df.with_columns(null_series(c, schema[c], df.height) for c in info["null_columns"][name])
            if set(df.columns) != set(schema):
                return None
            df = df.select(list(schema))
            if dict(df.schema) != schema:
                return None
            tables[name] = df
        return RankTrace(rank=info["rank"], file=str(f), meta=_dataclass_from(RankMeta, info["meta"]), **tables)
    except Exception:  # a broken cache entry is a miss, never an error
        return None


def in_parse_cache(f: Any, root: Path) -> bool:
    """Whether ``f``'s parse-cache entry matches the file as it is now (cheap: reads meta.json only)."""
    try:
        info = msgspec.json.decode((entry_dir(root, f) / "meta.json").read_bytes())
        return bool(info.get("key") == parse_key(f))
    except Exception:  # any doubt: not cached
        return False


def store_tables(rt: Any, f: Any, root: Path, key: dict[str, Any] | None = None) -> bool:
    """Write the entry atomically (temp folder + rename); False (no error) when it cannot.
    ``key``: taken before the file was read, so a file rewritten meanwhile is a miss next time."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        key = key or parse_key(f)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
        try:
            null_columns: dict[str, list[str]] = {}
            for name in TABLES:
                df = getattr(rt, name)
                nulls = [c for c in df.columns if df.height and df[c].null_count() == df.height]
                null_columns[name] = nulls
                df.drop(nulls).write_parquet(tmp / f"{name}.parquet", compression="lz4", statistics=False)
            info = {"key": key, "rank": rt.rank, "meta": dataclasses.asdict(rt.meta), "null_columns": null_columns}
            (tmp / "meta.json").write_bytes(_json(info))
            dest = entry_dir(root, f)
            if dest.exists():
                shutil.rmtree(dest, ignore_errors=True)
            os.replace(tmp, dest)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    except Exception:  # caching is an optimisation only
        return False
    return True


def _json(obj: Any) -> bytes:
    return msgspec.json.encode(obj, enc_hook=_enc_hook)


# ------------------------------------------------------------------------------------------------
# summary cache and the summary wire format


def summary_key(f: Any, spec_file: str | None, detail: bool) -> dict[str, Any] | None:
    """What a cached summary must match: the path as given (it is in the summary), the file as it is
    now, the code, the --device-spec file's bytes and whether it carries the roofline."""
    try:
        spec = hashlib.sha256(Path(spec_file).read_bytes()).hexdigest() if spec_file else None
        return {"given": str(f), **identity(f), "code": code_fingerprint(), "spec": spec, "detail": detail,
                "format": FORMAT}
    except OSError:
        return None


def _summary_file(root: Path, key: dict[str, Any]) -> Path:
    return root / SUMMARY_FOLDER / f"{slot('summary', key['given'], key.get('path') or key.get('url'), key['detail'])}.msgpack"


def load_summary(f: Any, root: Path, spec_file: str | None, detail: bool, cls: type) -> Any:
    """The cached summary (a ``cls``) of ``f`` when its key still matches, else None (never raises)."""
    key = summary_key(f, spec_file, detail)
    if key is None:
        return None
    doc = _read_entry(_summary_file(root, key))
    if not isinstance(doc, dict) or doc.get("key") != key or not isinstance(doc.get("summary"), bytes):
        return None
    try:
        return decode_summary(doc["summary"], cls)
    except Exception:  # a well-formed but wrong entry is a miss too
        return None


def store_summary(summary_bytes: bytes, key: dict[str, Any], root: Path) -> bool:
    """Write an encoded summary under ``key`` (taken before the file was read) atomically."""
    return _write_atomic(_summary_file(root, key), _ENCODER.encode({"key": key, "summary": summary_bytes}))


def encode_summary(summary: Any) -> bytes:
    """A rank summary (a dataclass such as :class:`traceread.build.rank_map.RankSummary`) as data
    (see the module docstring): generic over its fields."""
    fields: dict[str, Any] = {}
    for fd in dataclasses.fields(summary):
        value = getattr(summary, fd.name)
        if _is_frame(value):
            buf = io.BytesIO()
            value.write_ipc(buf, compression="lz4")
            fields[fd.name] = {"frame": buf.getvalue()}
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            fields[fd.name] = {"record": dataclasses.asdict(value)}
        else:
            fields[fd.name] = {"value": value}
    return _ENCODER.encode({"format": FORMAT, "fields": fields})


def decode_summary(data: bytes, cls: type) -> Any:
    """The inverse of :func:`encode_summary` for dataclass ``cls``; raises ValueError on anything
    that is not one."""
    import polars as pl

    doc = msgspec.msgpack.decode(data)
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("fields"), dict):
        raise ValueError("not a traceread summary")
    hints = _hints(cls)
    kwargs: dict[str, Any] = {}
    for fd in dataclasses.fields(cls):
        raw = doc["fields"].get(fd.name)
        if raw is None:
            if fd.default is dataclasses.MISSING and fd.default_factory is dataclasses.MISSING:
                raise ValueError(f"summary lacks {fd.name}")
            continue
        if not isinstance(raw, dict) or len(raw) != 1:
            raise ValueError(f"summary field {fd.name} is malformed")
        (tag, v), = raw.items()
        hint = hints.get(fd.name)
        if tag == "frame":
            if not isinstance(v, bytes) or not _allows(hint, pl.DataFrame):
                raise ValueError(f"summary field {fd.name}: unexpected table")
            kwargs[fd.name] = pl.read_ipc(io.BytesIO(v))
        elif tag == "record":
            record = _dataclass_in(hint)
            if record is None or not isinstance(v, dict):
                raise ValueError(f"summary field {fd.name}: unexpected record")
            kwargs[fd.name] = _dataclass_from(record, v)
        elif tag == "value":
            if _allows(hint, pl.DataFrame) and v is not None:
                raise ValueError(f"summary field {fd.name}: a table was expected")
            kwargs[fd.name] = v
        else:
            raise ValueError(f"summary field {fd.name}: unknown tag")
    return cls(**kwargs)


def _is_frame(v: Any) -> bool:
    return type(v).__name__ == "DataFrame" and type(v).__module__.startswith("polars")


@functools.lru_cache(maxsize=8)
def _hints(cls: type) -> dict[str, Any]:
    mod = sys.modules[cls.__module__]
    return typing.get_type_hints(cls, vars(mod))


def _members(hint: Any) -> tuple[Any, ...]:
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        return typing.get_args(hint)
    return (hint,)


def _allows(hint: Any, cls: type) -> bool:
    return any(m is cls for m in _members(hint))


def _dataclass_in(hint: Any) -> type | None:
    return next((m for m in _members(hint) if isinstance(m, type) and dataclasses.is_dataclass(m)), None)


def _dataclass_from(cls: type, values: dict[str, Any]) -> Any:
    """``cls(**values)`` keeping only its fields (a record written by other code is not trusted)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in values.items() if k in names})


# ------------------------------------------------------------------------------------------------
# document cache


def document_key(paths: list[str], files: list[Any], side_files: list[Path], options: dict[str, Any],
                 spec_file: str | None) -> dict[str, Any] | None:
    """Everything the report document depends on; None when an input vanished meanwhile."""
    try:
        spec = hashlib.sha256(Path(spec_file).read_bytes()).hexdigest() if spec_file else None
        return {"format": FORMAT, "paths": [str(p) for p in paths], "files": [identity(f) for f in files],
                "side": [identity(p) for p in side_files], "options": options, "spec": spec,
                "code": code_fingerprint()}
    except OSError:
        return None


def _document_file(root: Path, key: dict[str, Any]) -> Path:
    return root / DOCUMENT_FOLDER / f"{slot('document', key['paths'], key['options'])}.msgpack"


def load_document(root: Path, key: dict[str, Any]) -> Report | None:
    doc = _read_entry(_document_file(root, key))
    if not isinstance(doc, dict) or doc.get("key") != key or not isinstance(doc.get("report"), dict):
        return None
    return doc["report"]


def store_document(root: Path, key: dict[str, Any], report: Report) -> bool:
    try:
        data = _ENCODER.encode({"key": key, "report": report})
    except Exception:  # a document that cannot be stored is simply not cached
        return False
    return _write_atomic(_document_file(root, key), data)
