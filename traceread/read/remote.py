"""Traces where they live: ``s3://``, ``gs://``, ``az://``, ``https://`` URLs and globs, through fsspec.

A URL names a file, a folder (searched recursively, with the same rules as a local folder) or a glob.
Each object found becomes a :class:`RemoteFile` carrying its identity from the listing (URL, size and
ETag / generation / mtime), which is what the caches key on: a re-uploaded object is a miss, an
unchanged one is never downloaded again once summarised. A rank is read by downloading the object to
a temporary file in the worker and parsing that file (the reader streams from local disk).

Bounded: every connection has a connect and a read timeout (``$TRACEREAD_URL_TIMEOUT`` seconds of
silence, default 30; connecting at most 10 s), not fsspec's and aiohttp's 300 s; the download of one
rank stops at ``--max-rank-bytes`` (an object that says it is bigger is not downloaded at all), so an
endless or huge response never fills the disk. Every problem is one line naming the URL.

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
URL_TIMEOUT_ENV = "TRACEREAD_URL_TIMEOUT"
DEFAULT_READ_TIMEOUT_S = 30.0
MAX_CONNECT_TIMEOUT_S = 10.0
DOWNLOAD_CHUNK = 4 << 20
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


def read_timeout_s() -> float:
    """Seconds of silence after which a connection is given up (``$TRACEREAD_URL_TIMEOUT``)."""
    try:
        value = float(os.environ.get(URL_TIMEOUT_ENV, ""))
    except ValueError:
        return DEFAULT_READ_TIMEOUT_S
    return value if value > 0 else DEFAULT_READ_TIMEOUT_S


def _protocol(url: str) -> str:
    return url.split("://", 1)[0].lower() if "://" in url else ""


def _with_timeouts(url: str, options: dict[str, Any]) -> dict[str, Any]:
    """``options`` plus connect/read timeouts for HTTP(S) and S3, unless the user set their own."""
    read = read_timeout_s()
    connect = min(read, MAX_CONNECT_TIMEOUT_S)
    proto = _protocol(url)
    opts = dict(options)
    if proto in ("http", "https"):
        client = dict(opts.get("client_kwargs") or {})
        if "timeout" not in client:
            import aiohttp

            client["timeout"] = aiohttp.ClientTimeout(total=None, connect=connect, sock_connect=connect, sock_read=read)
            opts["client_kwargs"] = client
    elif proto in ("s3", "s3a"):
        config = dict(opts.get("config_kwargs") or {})
        config.setdefault("connect_timeout", connect)
        config.setdefault("read_timeout", read)
        opts["config_kwargs"] = config
    return opts


def _fs(url: str, options: dict[str, Any]) -> tuple[Any, str]:
    try:
        import fsspec
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError("reading traces from URLs needs fsspec: pip install 'traceread[remote]'") from exc
    return fsspec.core.url_to_fs(url, **_with_timeouts(url, storage_options(options)))


def network_problem(exc: BaseException) -> str:
    """One line for a failed request: a timeout says how long was waited, not an empty message."""
    import asyncio

    names = {t.__name__ for t in type(exc).__mro__}
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError)) or names & {"FSTimeoutError", "ServerTimeoutError",
                                                                          "ConnectTimeoutError", "ReadTimeoutError"}:
        return f"no answer within {read_timeout_s():g} s (${URL_TIMEOUT_ENV} sets the limit)"
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


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
        found.missing.append(url)
        found.reasons[url] = str(exc)
        return
    except Exception as exc:  # network/credential trouble: one line, not a traceback
        found.missing.append(url)
        found.reasons[url] = f"cannot list: {network_problem(exc)}"
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
    from traceread.read.parse import parse_named

    with tempfile.TemporaryDirectory(prefix="traceread-remote-") as tmp:
        local = Path(tmp) / (rf.name or "trace.json")
        download(rf, local, options, max_rank_bytes)
        return parse_named(local, rf.url, max_rank_bytes=max_rank_bytes)


def download(rf: RemoteFile, local: Path, options: dict[str, Any] | None = None,
             max_rank_bytes: int | None = None) -> int:
    """Copy the object to ``local``, stopping past ``--max-rank-bytes`` (a compressed trace is never
    larger than what it expands to, so no rank worth reading is cut); the bytes copied. Raises
    :class:`TraceFileError` naming the URL."""
    from traceread.errors import TraceFileError
    from traceread.read.inflate import human_bytes
    from traceread.read.inflate import max_rank_bytes as limit_of

    limit = limit_of(max_rank_bytes)
    if rf.size is not None and rf.size > limit:
        raise TraceFileError(f"{human_bytes(rf.size)}: larger than --max-rank-bytes ({human_bytes(limit)}); "
                             "not downloaded", rf.url)
    total = 0
    try:
        fs, path = _fs(rf.url, options or {})
        stream = {"block_size": 0} if _protocol(rf.url) in ("http", "https") else {}
        with fs.open(path, "rb", **stream) as src, open(local, "wb") as dst:
            while chunk := src.read(DOWNLOAD_CHUNK):
                total += len(chunk)
                if total > limit:
                    raise TraceFileError(f"more than {human_bytes(limit)} (--max-rank-bytes) while downloading: "
                                         "stopped, nothing kept", rf.url)
                dst.write(chunk)
    except TraceFileError:
        raise
    except Exception as exc:  # network trouble fails this rank only
        raise TraceFileError(f"cannot fetch: {network_problem(exc)}", rf.url) from None
    return total
