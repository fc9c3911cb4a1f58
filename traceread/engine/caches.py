"""The three caches of the report (parse, summary, document) with one keying rule; data only.

Keying rule (all three): an entry lives in a *slot* named by a hash of what it is about (the cache
kind, the inputs' locations and the variant, e.g. whether a summary carries the roofline); it holds
its *key*: the inputs' identities (:func:`identity`: local path + size + ``mtime_ns`` + inode +
``ctime_ns``, so a file replaced by another of the same size and mtime is a miss; object URL +
size + ETag/generation/mtime), the code (:data:`READER_VERSION` for tables, :func:`code_fingerprint`
for summaries and documents) and the options that change the result. A lookup is a hit only when the
stored key equals the key computed now; anything else (another file, another version, a corrupt or
foreign file) is a miss and the entry is rewritten. Cache trouble is never an error.

Integrity: every entry carries a SHA-256 of its bytes, checked on every read (a parse-cache folder:
``checksums.json`` over its files; a msgpack entry: the digest of its payload beside it). An entry
that fails the check (a flipped bit on disk, a truncated copy) is deleted, recomputed, and said once
in the report's warnings (:func:`take_notes`): a damaged cache can cost time, never change an answer.

Data only, never pickles, so a file in the cache directory can never run code, whoever wrote it:

- parse cache: one folder per trace file, its five tables as parquet + ``meta.json`` (key, rank,
  meta) — see :func:`load_tables` / :func:`store_tables`;
- summary cache: one msgpack file per rank and variant. :func:`encode_summary` is generic over the
  fields of :class:`traceread.assemble.rank_map.RankSummary`: a polars DataFrame field becomes Arrow IPC bytes,
  a dataclass field (:class:`RankMeta`) its fields as a map, anything else (dict, list, str, number,
  bool, None) is stored as msgpack. Adding a field to RankSummary needs nothing here. The same bytes
  carry a summary from a worker process or a Ray task back to the driver;
- document cache: the report document as msgpack, keyed by every input file's identity, the run
  folder's side files (run.json, NCCL logs, Flight Recorder dumps, stacks), the analysis options and
  the code, so a second ``report`` of an unchanged run only renders.

The cache is bounded (:func:`evict`, after each report): a hit touches its entry's mtime, and when
the whole folder is over :func:`max_bytes` (4 GiB by default, ``$TRACEREAD_CACHE_MAX`` or
``traceread cache limit``) the least recently used entries go first.

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
FORMAT = "traceread.cache/3"
SUMMARY_FOLDER = "summaries"
DOCUMENT_FOLDER = "documents"
TABLES = ("gpu", "host", "steps", "flows", "memory")
CHECKSUMS = "checksums.json"

#: Damaged entries met by this process since the last :func:`take_notes` (said as report warnings).
_NOTES: list[str] = []


def take_notes() -> list[str]:
    """The one-line notes about damaged cache entries met since the last call (and forget them)."""
    taken: list[str] = []
    while _NOTES:
        taken.append(_NOTES.pop(0))
    return list(dict.fromkeys(taken))


def note(text: str) -> None:
    """Record a damaged-entry note (also used for notes a worker process sent back)."""
    _NOTES.append(text)


def _damaged(what: str, about: Any, path: Path) -> None:
    """Delete a damaged entry and say so: it is recomputed by the caller."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    except OSError:
        pass
    note(f"cache: the cached {what} of {about} failed its integrity check (damaged on disk); dropped and recomputed")


def digest(data: bytes) -> str:
    """The checksum stored with every cache entry."""
    return hashlib.sha256(data).hexdigest()


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
    return {"path": str(p.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino,
            "ctime_ns": st.st_ctime_ns}


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


def _read_entry(path: Path, field: str, key: dict[str, Any], what: str, about: Any) -> bytes | None:
    """The payload bytes (``field``) of the msgpack entry at ``path`` when its key is ``key`` and its
    checksum holds; None on a miss. A file that is there but damaged is dropped with a note."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    try:
        doc = msgspec.msgpack.decode(raw)
    except Exception:  # not msgpack any more
        doc = None
    if isinstance(doc, dict) and doc.get("key") != key:
        return None  # another input, version or options (an older traceread's entry): a plain miss
    if not isinstance(doc, dict) or not isinstance(doc.get(field), bytes) or not isinstance(doc.get("sha256"), str):
        _damaged(what, about, path)
        return None
    if digest(doc[field]) != doc["sha256"]:
        _damaged(what, about, path)
        return None
    return doc[field]


def _entry_bytes(key: dict[str, Any], field: str, payload: bytes) -> bytes:
    return _ENCODER.encode({"key": key, field: payload, "sha256": digest(payload)})


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

        from traceread.model import (
            FLOW_SCHEMA,
            GPU_SCHEMA,
            HOST_SCHEMA,
            MEMORY_SCHEMA,
            STEP_SCHEMA,
            RankMeta,
            RankTrace,
        )
        from traceread.read.columns import null_series

        schemas = {"gpu": GPU_SCHEMA, "host": HOST_SCHEMA, "steps": STEP_SCHEMA, "flows": FLOW_SCHEMA,
                   "memory": MEMORY_SCHEMA}
        d = entry_dir(root, f)
        info_file = d / "meta.json"
        if not info_file.is_file():
            return None
        files = _verified_files(d, f)
        if files is None:
            return None
        info = msgspec.json.decode(files["meta.json"])
        if info.get("key") != parse_key(f):
            return None
        tables = {}
        for name, schema in schemas.items():
            df = pl.read_parquet(io.BytesIO(files[f"{name}.parquet"]))
            # All-null columns are not stored; rebuilt for free (see columns.null_series).
            df = df.with_columns(null_series(c, schema[c], df.height) for c in info["null_columns"][name])
            if set(df.columns) != set(schema):
                return None
            df = df.select(list(schema))
            if dict(df.schema) != schema:
                return None
            tables[name] = df
        mark_used(info_file)
        return RankTrace(rank=info["rank"], file=str(f), meta=_dataclass_from(RankMeta, info["meta"]), **tables)
    except Exception:  # a broken cache entry is a miss, never an error
        return None


def _verified_files(d: Path, f: Any) -> dict[str, bytes] | None:
    """Every file of a parse-cache entry, read once and checked against ``checksums.json``; None (and
    the entry dropped with a note when it is damaged) otherwise. An entry from before checksums is a
    plain miss."""
    names = ["meta.json", *(f"{t}.parquet" for t in TABLES)]
    try:
        sums_raw = (d / CHECKSUMS).read_bytes()
        data = {n: (d / n).read_bytes() for n in names}
    except OSError:  # absent: an entry from before checksums or another version, or being rewritten
        return None  # by a report running beside this one: a plain miss
    try:
        if msgspec.json.decode(data["meta.json"]).get("key") != parse_key(f):
            return None  # another reader version or another file: a plain miss
    except Exception:
        pass  # an unreadable meta.json is judged by its checksum below
    try:
        sums = msgspec.json.decode(sums_raw)
        ok = isinstance(sums, dict) and set(sums) == set(names) and all(digest(data[n]) == sums[n] for n in names)
    except msgspec.DecodeError:
        ok = False
    if not ok:
        _damaged("tables", f, d)
        return None
    return data


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
            sums = {n: digest((tmp / n).read_bytes()) for n in ["meta.json", *(f"{t}.parquet" for t in TABLES)]}
            (tmp / CHECKSUMS).write_bytes(_json(sums))
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
    data = _read_entry(_summary_file(root, key), "summary", key, "summary", f)
    if data is None:
        return None
    try:
        out = decode_summary(data, cls)
        mark_used(_summary_file(root, key))
        return out
    except Exception:  # a well-formed but wrong entry is a miss too
        return None


def store_summary(summary_bytes: bytes, key: dict[str, Any], root: Path) -> bool:
    """Write an encoded summary under ``key`` (taken before the file was read) atomically."""
    return _write_atomic(_summary_file(root, key), _entry_bytes(key, "summary", summary_bytes))


def encode_summary(summary: Any) -> bytes:
    """A rank summary (a dataclass such as :class:`traceread.assemble.rank_map.RankSummary`) as data
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
    data = _read_entry(_document_file(root, key), "report", key, "report", ", ".join(key["paths"]))
    if data is None:
        return None
    try:
        report = msgspec.msgpack.decode(data)
    except Exception:  # checked bytes that are not a document: a miss
        return None
    if not isinstance(report, dict):
        return None
    mark_used(_document_file(root, key))
    return report  # type: ignore[return-value]


def store_document(root: Path, key: dict[str, Any], report: Report) -> bool:
    try:
        data = _entry_bytes(key, "report", _ENCODER.encode(report))
    except Exception:  # a document that cannot be stored is simply not cached
        return False
    return _write_atomic(_document_file(root, key), data)


# ------------------------------------------------------------------------------------------------
# size bound: accounting and least-recently-used eviction (``traceread cache``)

#: The cache's default bound on disk (parse + summaries + documents), bytes.
DEFAULT_MAX_BYTES = 4 * 2**30
#: Environment variable that sets the bound (``8GiB``, ``500MB``; ``0`` or ``off``: no bound).
MAX_ENV = "TRACEREAD_CACHE_MAX"
#: File in the cache folder holding the bound set by ``traceread cache limit SIZE``.
LIMIT_FILE = "max-size"
#: Eviction goes down to this share of the bound, so that the next report does not evict again.
EVICT_TO = 0.9


@dataclasses.dataclass(frozen=True)
class Entry:
    """One cache entry: a parse-cache folder, a summary or a document file."""

    path: Path
    kind: str  # "parse" | "summary" | "document"
    bytes: int
    last_used: float  # mtime of the file a hit touches (meta.json for a parse entry)


def mark_used(path: Path) -> None:
    """Record a hit for least-recently-used eviction (the entry's mtime; atime is often off)."""
    try:
        os.utime(path)
    except OSError:
        pass


def _folder_bytes(folder: str) -> tuple[int, float]:
    """(bytes of the files in a parse-cache folder, mtime of its meta.json or of the folder)."""
    total, used = 0, 0.0
    with os.scandir(folder) as it:
        for f in it:
            try:
                st = f.stat(follow_symlinks=False)
            except OSError:
                continue
            total += st.st_size
            if f.name == "meta.json":
                used = st.st_mtime
    return total, used or os.stat(folder).st_mtime


def entries(root: Path) -> list[Entry]:
    """Every entry under ``root``, whatever wrote it (temporary ``.tmp-*`` files excluded). One
    ``scandir`` pass: a few thousand entries take tens of milliseconds."""
    out: list[Entry] = []
    if not root.is_dir():
        return out
    with os.scandir(root) as top:
        for d in top:
            if d.name.startswith(".") or d.name in (LIMIT_FILE, SUMMARY_FOLDER, DOCUMENT_FOLDER):
                continue
            try:
                if d.is_dir(follow_symlinks=False):
                    size, used = _folder_bytes(d.path)
                    out.append(Entry(Path(d.path), "parse", size, used))
            except OSError:
                continue
    for kind, folder in (("summary", SUMMARY_FOLDER), ("document", DOCUMENT_FOLDER)):
        try:
            it = os.scandir(root / folder)
        except OSError:
            continue
        with it:
            for f in it:
                if f.name.startswith("."):
                    continue
                try:
                    st = f.stat(follow_symlinks=False)
                except OSError:
                    continue
                out.append(Entry(Path(f.path), kind, st.st_size, st.st_mtime))
    return out


def max_bytes(root: Path) -> int | None:
    """The bound: ``$TRACEREAD_CACHE_MAX``, else ``traceread cache limit``'s file, else 4 GiB;
    None when set to ``0``/``off``/``none`` (no bound). A value that is not a size is ignored."""
    from traceread.read.inflate import parse_size

    text = os.environ.get(MAX_ENV)
    if text is None:
        try:
            text = (root / LIMIT_FILE).read_text().strip()
        except OSError:
            return DEFAULT_MAX_BYTES
    if text.strip().lower() in ("0", "off", "none", "unlimited"):
        return None
    try:
        return parse_size(text)
    except ValueError:
        return DEFAULT_MAX_BYTES


def set_max_bytes(root: Path, value: int | None) -> None:
    """Store the bound for later runs (None: no bound)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / LIMIT_FILE).write_text("off\n" if value is None else f"{value}\n")


def _remove(e: Entry) -> bool:
    try:
        if e.path.is_dir():
            # rename first: a reader that opened the folder meanwhile sees a miss, never half an entry
            tmp = e.path.with_name(f".tmp-evict-{e.path.name}")
            os.replace(e.path, tmp)
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            e.path.unlink()
        return True
    except OSError:
        return False


def evict(root: Path, limit: int | None = None) -> tuple[int, int]:
    """Remove least-recently-used entries until the cache is under :data:`EVICT_TO` of the bound,
    when it is over the bound. Returns (entries removed, bytes freed); never raises."""
    try:
        limit = max_bytes(root) if limit is None else limit
        if limit is None:
            return 0, 0
        found = entries(root)
        total = sum(e.bytes for e in found)
        if total <= limit:
            return 0, 0
        removed = freed = 0
        for e in sorted(found, key=lambda e: e.last_used):
            if total - freed <= limit * EVICT_TO:
                break
            if _remove(e):
                removed += 1
                freed += e.bytes
        return removed, freed
    except Exception:  # the cache is an optimisation: never fail a report over it
        return 0, 0


def clear(root: Path) -> tuple[int, int]:
    """Remove every entry (the bound setting stays). Returns (entries removed, bytes freed)."""
    removed = freed = 0
    for e in entries(root):
        if _remove(e):
            removed += 1
            freed += e.bytes
    return removed, freed
