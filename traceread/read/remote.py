"""Traces where they live: ``s3://``, ``gs://``, ``az://``, ``https://`` URLs and globs, through fsspec.

A URL names a file, a folder (searched recursively, with the same rules as a local folder) or a glob.
Each object found becomes a :class:`RemoteFile` carrying its identity from the listing (URL, size and
ETag / generation / mtime), which is what the caches key on: a re-uploaded object is a miss, an
unchanged one is never downloaded again once summarised. A rank is read by downloading the object to
a temporary file in the worker and parsing that file (the reader streams from local disk).

Credentials and endpoints: fsspec's ``storage_options`` (``--storage-options '{"endpoint_url": ...}'``
or ``$TRACEREAD_STORAGE_OPTIONS``, JSON); otherwise each filesystem's own defaults (for S3: the AWS
environment, including ``AWS_ENDPOINT_URL``). fsspec and the filesystem packages are the ``remote``
extra and are imported only when a URL is given.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

_URL_RE = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
#: Object-listing fields that change when an object is rewritten, best first.
VERSION_FIELDS = ("ETag", "etag", "generation", "md5Hash", "content_md5", "LastModified", "last_modified",
                  "mtime", "updated", "created")


def is_url(s: str) -> bool:
    """``scheme://...`` (not a Windows drive or a plain path)."""
    return bool(_URL_RE.match(s)) and not s.startswith("file://")


def storage_options(given: dict[str, Any] | None = None) -> dict[str, Any]:
    """The options passed on the command line, else ``$TRACEREAD_STORAGE_OPTIONS`` (JSON), else none."""
    if given:
        return dict(given)
    env = os.environ.get("TRACEREAD_STORAGE_OPTIONS")
    if env:
        value = json.loads(env)
        if isinstance(value, dict):
            return value
    return {}


@dataclass(frozen=True)
class RemoteFile:
    """One trace object: its URL and what says it is unchanged."""

    url: str
    size: int | None = None
    version: str | None = None

    @property
    def name(self) -> str:
        return PurePosixPath(self.url.split("?", 1)[0]).name

    def identity(self) -> dict[str, Any]:
        return {"url": self.url, "size": self.size, "version": self.version}

    def __str__(self) -> str:
        return self.url


def _fs(url: str, options: dict[str, Any]) -> tuple[Any, str]:
    try:
        import fsspec
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError("reading traces from URLs needs fsspec: pip install 'traceread[remote]'") from exc
    return fsspec.core.url_to_fs(url, **storage_options(options))


def _remote_file(fs: Any, path: str, info: dict[str, Any]) -> RemoteFile:
    version = next((str(info[k]) for k in VERSION_FIELDS if info.get(k) is not None), None)
    size = info.get("size")
    return RemoteFile(fs.unstrip_protocol(path), int(size) if size is not None else None, version)


def find_remote(url: str, found: Any, options: dict[str, Any] | None = None) -> None:
    """Add the trace objects under ``url`` to ``found`` (:class:`traceread.read.discover.Found`);
    an unreachable or empty location is ``missing`` with the reason."""
    from traceread.read.names import NON_TRACE_DIRS, NON_TRACE_FILES, is_trace_name

    try:
        fs, path = _fs(url, options or {})
        if any(ch in path for ch in "*?["):
            hits = fs.glob(path, detail=True)
            explicit = True
        elif fs.isfile(path):
            hits = {path: fs.info(path)}
            explicit = True
        elif fs.isdir(path):
            hits = fs.find(path, detail=True)
            explicit = False
        else:
            hits, explicit = {}, False
    except ImportError as exc:
        found.missing.append(f"{url} ({exc})")
        return
    except Exception as exc:  # network/credential trouble: one line, not a traceback
        found.missing.append(f"{url} ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})")
        return
    base = path.rstrip("/")
    added = 0
    seen = {str(f) for f in found.files}
    for p, info in sorted(hits.items()):
        if info.get("type") == "directory" or not is_trace_name(p):
            continue
        rel = PurePosixPath(p[len(base):].lstrip("/")) if p.startswith(base) else PurePosixPath(p)
        if not explicit and (rel.name in NON_TRACE_FILES or any(
                part in NON_TRACE_DIRS or part.startswith(".") for part in rel.parts[:-1])):
            continue
        rf = _remote_file(fs, p, info)
        if rf.url in seen:
            continue
        seen.add(rf.url)
        found.files.append(rf)
        if explicit:
            found.explicit.add(rf)
        added += 1
    if not added:
        found.missing.append(url)


def parse_remote(rf: RemoteFile, options: dict[str, Any] | None = None, *,
                 max_rank_bytes: int | None = None) -> Any:
    """Download one object to a temporary file and parse it; the rank keeps the object's URL.
    Raises :class:`TraceFileError` (one line) when it cannot be fetched or read."""
    from traceread.errors import TraceFileError
    from traceread.read.parse import parse_named

    with tempfile.TemporaryDirectory(prefix="traceread-remote-") as tmp:
        local = Path(tmp) / (rf.name or "trace.json")
        try:
            fs, path = _fs(rf.url, options or {})
            fs.get_file(path, str(local))
        except Exception as exc:  # network trouble fails this rank only
            raise TraceFileError(f"cannot fetch: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                                 rf.url) from None
        return parse_named(local, rf.url, max_rank_bytes=max_rank_bytes)
