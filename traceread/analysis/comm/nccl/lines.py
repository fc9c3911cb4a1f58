"""One log line -> its NCCL parts, whatever launcher or NCCL version wrote it.

NCCL's logger (``src/debug.cc``) prints ``host:pid:tid [cudaDev] NCCL INFO <msg>`` and, for warnings,
``host:pid:tid [cudaDev] <file>:<line> NCCL WARN <msg>``. The ``<file>`` of a warning is whatever
the caller passed: NCCL's own ``misc/socket.cc``, but a plugin logging through NCCL passes its
``__PRETTY_FUNCTION__`` (aws-ofi-nccl: ``int nccl_net_ofi_create_plugin(nccl_net_ofi_plugin_t**)``),
with spaces and parentheses, so the source location is taken as everything up to `` NCCL WARN``.
NCCL >= 2.26 may put a ``[date time]`` stamp first (``NCCL_DEBUG_TIMESTAMP_LEVELS``, on for WARN by
default). Launchers add ``[default0]:``/``[rank0]:`` (torchrun), ``[1,3]<stdout>:`` (mpirun) and
dates; some users strip the whole prefix. The NCCL token is searched anywhere in the line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from traceread.read.rank_prefix import leading_rank_prefix

_NCCL_LINE = re.compile(
    r"(?P<host>[^\s:\[\]<>]{1,255}):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] "
    r"(?:(?P<pre>[^\n]{1,400}?) )?NCCL (?P<lvl>INFO|WARN|TRACE|ABORT)\b ?(?P<msg>.*)$"
)
_MPI_PREFIX = re.compile(r"\[(\d+),(\d+)\]<std(?:out|err)>:")
_TRACE_STAMP = re.compile(r"^\d+\.\d+ ")

#: NCCL and c10d lines are short; a longer "line" (a binary file, a dumped tensor) is cut here so the
#: patterns, which search anywhere in a line, stay linear.
MAX_LINE_CHARS = 4096
#: Evidence quotes a line up to this many characters.
QUOTE_CHARS = 240


@dataclass(slots=True)
class LogLine:
    """A log line split into NCCL's fields (``host`` etc. are None when the prefix is absent)."""

    file: str
    lineno: int
    raw: str
    msg: str
    host: str | None = None
    pid: int | None = None
    tid: int | None = None
    dev: int | None = None
    level: str | None = None  # INFO | WARN | TRACE | ABORT, None for a line without the NCCL prefix
    src: str | None = None  # the source location of a WARN/TRACE (file:line or a function signature:line)
    launcher_rank: int | None = None

    @property
    def proc(self) -> tuple[str, int | None, int | None]:
        """Which process and GPU wrote the line: (host, pid, cudaDev), or the file when unprefixed."""
        if self.host is None:
            return (self.file, None, None)
        return (self.host, self.pid, self.dev)

    def quote(self) -> str:
        """``file:line: text`` for a diagnosis' evidence."""
        text = self.raw.strip()
        if len(text) > QUOTE_CHARS:
            text = text[: QUOTE_CHARS - 1] + "…"
        return f"{Path(self.file).name}:{self.lineno}: {text}"


def strip_launcher(line: str) -> tuple[str, int | None]:
    """Remove mpirun/torchrun prefixes; return the rest and the launcher's rank when it says one."""
    rank = None
    m = _MPI_PREFIX.search(line)
    if m:
        rank = int(m.group(2))
        line = line[m.end():]
    pre = leading_rank_prefix(line)
    if pre:
        if rank is None:
            rank = pre.rank
        line = pre.rest
    return line, rank


def split_line(file: str, lineno: int, raw: str) -> LogLine:
    """``raw`` (already cut to :data:`MAX_LINE_CHARS`) as a :class:`LogLine`."""
    line, launcher_rank = strip_launcher(raw)
    m = _NCCL_LINE.search(line)
    if not m:
        return LogLine(file, lineno, raw, line.strip(), launcher_rank=launcher_rank)
    src = m.group("pre")
    if src is not None:
        src = _TRACE_STAMP.sub("", src).strip() or None
    return LogLine(file, lineno, raw, m.group("msg"), host=m.group("host"), pid=int(m.group("pid")),
                   tid=int(m.group("tid")), dev=int(m.group("dev")), level=m.group("lvl"), src=src,
                   launcher_rank=launcher_rank)


def iter_raw_lines(paths: Iterable[str | Path]) -> Iterator[tuple[str, int, str]]:
    """(file, line number, text) of every line, each cut to :data:`MAX_LINE_CHARS`; unreadable files
    are passed over (one broken log must not cost the others)."""
    for p in paths:
        try:
            with open(p, errors="replace") as fh:
                n = 0
                while line := fh.readline(1 << 16):
                    n += 1
                    if len(line) >= 1 << 16 and not line.endswith("\n"):
                        while (rest := fh.readline(1 << 16)) and not rest.endswith("\n"):
                            pass  # skip the remainder of an overlong line without holding it
                    yield str(p), n, line[:MAX_LINE_CHARS].rstrip("\n")
        except OSError:
            continue
