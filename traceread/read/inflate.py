"""A trace file's uncompressed bytes as a stream of bounded chunks, with the bomb guards.

Why chunks: a 5 GB rank must never sit in memory as one text. Why guards here: this is the one
place that knows how many bytes came in and how many went out, so a file that expands to more than
``--max-rank-bytes`` or far more than any JSON trace compresses (real Kineto traces: 13-30x with
gzip; deflate's ceiling is ~1030x, reached only by runs of one byte) stops after a bounded amount
of work, with one line naming the file.
"""

from __future__ import annotations

import io
import os
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from traceread.errors import TraceFileError

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"

#: Default of ``--max-rank-bytes``: the most uncompressed bytes one rank may have. 16 GiB is three
#: times the largest ranks users report (5 GB) and about what the tables of a rank that size need
#: in memory (0.4-0.6x the JSON), i.e. the largest rank a big workstation can hold.
DEFAULT_MAX_RANK_BYTES = 16 << 30
#: Environment variable that carries ``--max-rank-bytes`` to spawned worker processes.
MAX_RANK_BYTES_ENV = "TRACEREAD_MAX_RANK_BYTES"
#: Past this much output, a compression ratio above :data:`MAX_RATIO` is a bomb, not a trace.
RATIO_FLOOR = 256 << 20
MAX_RATIO = 200

_IN_CHUNK = 1 << 16  # compressed bytes read at a time (small: the ratio check uses the file offset)
OUT_CHUNK = 8 << 20  # at most this many uncompressed bytes per chunk


def max_rank_bytes(explicit: int | None = None) -> int:
    """The limit in force: the argument, else ``$TRACEREAD_MAX_RANK_BYTES``, else the default."""
    if explicit is not None:
        return explicit
    env = os.environ.get(MAX_RANK_BYTES_ENV, "")
    return int(env) if env.isdigit() else DEFAULT_MAX_RANK_BYTES


@contextmanager
def rank_bytes_limit(limit: int | None) -> Iterator[None]:
    """``$TRACEREAD_MAX_RANK_BYTES`` set to ``limit`` while the block runs (spawned reader workers inherit
    it), then as it was: a limit given to one command or API call never outlives it in the process."""
    if limit is None:
        yield
        return
    before = os.environ.get(MAX_RANK_BYTES_ENV)
    os.environ[MAX_RANK_BYTES_ENV] = str(limit)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(MAX_RANK_BYTES_ENV, None)
        else:
            os.environ[MAX_RANK_BYTES_ENV] = before


_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_size(text: str) -> int:
    """``"16GiB"``, ``"500MB"``, ``"2e9"`` or ``"1048576"`` -> bytes; ValueError when not a size."""
    t = text.strip().lower().replace(" ", "")
    num = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = t[len(num):]
    if unit not in _UNITS or not num:
        raise ValueError(f"not a size: {text!r} (e.g. 16GiB, 500MB, 1048576)")
    n = int(float(num) * _UNITS[unit])
    if n <= 0:
        raise ValueError(f"not a positive size: {text!r}")
    return n


def human_bytes(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.3g} {unit}"
    return f"{n} bytes"


def uncompressed_chunks(path: Path, limit: int | None = None) -> Iterator[bytes]:
    """The file's uncompressed bytes, :data:`OUT_CHUNK` at most per chunk; compression is told by
    magic bytes, not the name. Raises :class:`TraceFileError` (one line) for every problem."""
    limit = max_rank_bytes(limit)
    try:
        fh = open(path, "rb")  # closed in the finally below
    except OSError as exc:
        raise TraceFileError(f"cannot open: {exc.strerror or exc}", str(path)) from None
    try:
        head = fh.read(4)
        if not head:
            raise TraceFileError("empty file", str(path))
        fh.seek(0)
        if head[:2] == GZIP_MAGIC:
            source = _gunzip(fh, path)
        elif head[:4] == ZSTD_MAGIC:
            source = _unzstd(fh, path)
        else:
            source = _plain(fh)
        yield from _guarded(source, fh, path, limit, compressed=head[:2] == GZIP_MAGIC
                            or head[:4] == ZSTD_MAGIC)
    finally:
        fh.close()


def prefix_expansion(head: bytes, cap: int) -> int | None:
    """Uncompressed bytes the compressed start ``head`` of a file yields, counting stops past
    ``cap`` (bounded time and memory on a bomb); None when ``head`` is neither gzip nor zstd.
    A prefix ends in mid-stream: the error that says so is just its end."""
    where = Path("<prefix>")
    if head[:2] == GZIP_MAGIC:
        source = _gunzip(io.BytesIO(head), where)
    elif head[:4] == ZSTD_MAGIC:
        source = _unzstd(io.BytesIO(head), where)
    else:
        return None
    out = 0
    try:
        for chunk in source:
            out += len(chunk)
            if out > cap:
                break
    except TraceFileError:
        pass
    return out


def _guarded(source: Iterator[bytes], fh: BinaryIO, path: Path, limit: int,
             compressed: bool) -> Iterator[bytes]:
    total = 0
    for chunk in source:
        total += len(chunk)
        if total > limit:
            raise TraceFileError(
                f"expands to more than {human_bytes(limit)} (--max-rank-bytes): not read further",
                str(path),
            )
        if compressed and total > RATIO_FLOOR:
            taken = max(fh.tell(), 1)
            if total > MAX_RATIO * taken:
                raise TraceFileError(
                    f"decompression bomb: {human_bytes(taken)} expand to more than "
                    f"{human_bytes(total)} (over {MAX_RATIO}x; real traces compress 10-30x)",
                    str(path),
                )
        yield chunk


def _plain(fh: BinaryIO) -> Iterator[bytes]:
    while chunk := fh.read(OUT_CHUNK):
        yield chunk


def _gunzip(fh: BinaryIO, path: Path) -> Iterator[bytes]:
    """(Possibly multi-member) gzip, saying where a corrupt or truncated stream breaks; trailing
    zero padding is tolerated, like gzip(1) does."""
    pos = 0  # file offset of the first byte of ``pending``
    pending = b""
    d: zlib._Decompress | None = None
    while True:
        if len(pending) < 2:
            pending += fh.read(_IN_CHUNK)
        if d is None:  # at the start of a member
            if not pending:
                return
            if pending[:2] != GZIP_MAGIC:
                if _only_zeros(pending, fh):
                    return
                raise TraceFileError(f"garbage after gzip stream at byte {pos}", str(path))
            d = zlib.decompressobj(wbits=31)
        if not pending:
            out = d.decompress(b"", OUT_CHUNK)  # output zlib still holds
            if out:
                yield out
                continue
            if d.eof:
                d = None
                continue
            end = fh.tell()
            raise TraceFileError(
                f"truncated gzip stream: file ends at byte {end} before the end of the stream",
                str(path),
            )
        try:
            out = d.decompress(pending, OUT_CHUNK)
        except zlib.error as exc:
            raise TraceFileError(f"corrupt gzip stream near byte {pos} ({exc})", str(path)) from None
        rest = d.unused_data if d.eof else d.unconsumed_tail
        pos += len(pending) - len(rest)
        pending = rest
        if d.eof:
            d = None
        if out:
            yield out


def _only_zeros(pending: bytes, fh: BinaryIO) -> bool:
    if pending.strip(b"\x00"):
        return False
    while chunk := fh.read(_IN_CHUNK):
        if chunk.strip(b"\x00"):
            return False
    return True


def _unzstd(fh: BinaryIO, path: Path) -> Iterator[bytes]:
    import zstandard

    try:
        reader = zstandard.ZstdDecompressor().stream_reader(fh, read_across_frames=True)
        while chunk := reader.read(OUT_CHUNK):
            yield chunk
    except zstandard.ZstdError as exc:
        raise TraceFileError(f"corrupt zstd stream ({exc})", str(path)) from None
