"""How many ranks may be read at once on this machine: a memory budget for the local workers.

Why: one worker's peak memory grows with its rank's uncompressed size (the tables alone are about
1.3x the JSON of a real A100 rank), so "one worker per core" that is right for 8 x 40 MB ranks
kills the machine on 8 x 5 GB ones. The pool therefore starts a rank only while the estimated peaks
of the ranks running fit in the memory available when the report started; a rank larger than the
whole budget runs alone. Definitions:

* **text bytes** of a file: its uncompressed size. Plain JSON: the file size. gzip/zstd: the file
  size times the compression ratio of its first :data:`SAMPLE_BYTES` (tiled and real traces keep
  one ratio through the file; a bomb's estimate is capped at ``--max-rank-bytes``, past which the
  reader stops anyway).
* **peak** of a worker = :data:`WORKER_BASE` + :data:`PEAK_PER_TEXT_BYTE` x text bytes, the
  largest ratio measured by ``bench/bench_stream.py`` on the 1 GB and 5 GB ranks (README, Speed).
* **available**: ``MemAvailable`` of ``/proc/meminfo``, lowered to the cgroup's limit minus its
  usage inside a container; ``$TRACEREAD_MEMORY_BUDGET`` (a size such as ``12GiB``, or ``off``)
  overrides it.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Sequence
from pathlib import Path


#: Environment variable overriding the measured available memory (a size, or ``off``).
BUDGET_ENV = "TRACEREAD_MEMORY_BUDGET"
#: Compressed bytes decompressed to measure a file's compression ratio.
SAMPLE_BYTES = 1 << 20
#: A worker's memory before it reads anything (Python, polars, numpy, msgspec imported).
WORKER_BASE = 300 << 20
#: Peak bytes per uncompressed byte of a rank, report path (tables + the largest transient).
PEAK_PER_TEXT_BYTE = 1.6
#: Share of the available memory the workers may plan to use (the driver and the OS keep the rest).
USABLE_SHARE = 0.85


def text_bytes(path: str | Path) -> int | None:
    """Estimated uncompressed size of a local trace file; None when it cannot be opened."""
    from traceread.reader.inflate import GZIP_MAGIC, ZSTD_MAGIC, max_rank_bytes

    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            sample = fh.read(SAMPLE_BYTES)
    except OSError:
        return None
    if sample[:2] == GZIP_MAGIC:
        out = _gunzipped_len(sample)
    elif sample[:4] == ZSTD_MAGIC:
        out = _unzstd_len(sample)
    else:
        return size
    if not out:
        return size
    return min(int(size * out / len(sample)), max_rank_bytes())


def _gunzipped_len(sample: bytes) -> int:
    """Bytes the (possibly multi-member) gzip text ``sample`` inflates to, as far as it goes."""
    out, data = 0, sample
    while data[:2] == b"\x1f\x8b":
        d = zlib.decompressobj(wbits=31)
        try:
            out += len(d.decompress(data))
        except zlib.error:
            break
        if not d.eof:
            break
        data = d.unused_data
    return out


def _unzstd_len(sample: bytes) -> int:
    try:
        import zstandard
    except ImportError:  # pragma: no cover - zstandard is a dependency
        return 0
    try:
        reader = zstandard.ZstdDecompressor().decompressobj()
        return len(reader.decompress(sample))
    except zstandard.ZstdError:
        return 0


def worker_peak(text: int | None) -> int:
    """Planned peak of a worker reading and summarising a rank of ``text`` uncompressed bytes."""
    return WORKER_BASE + int(PEAK_PER_TEXT_BYTE * (text or 0))


def available_bytes() -> int | None:
    """Memory the workers may use now (module docstring); None: no limit known or ``off``."""
    env = os.environ.get(BUDGET_ENV, "").strip()
    if env.lower() == "off":
        return None
    if env:
        from traceread.reader.inflate import parse_size

        try:
            return parse_size(env)
        except ValueError:
            pass  # a typo must not stop the report: measure instead
    avail = _meminfo_available()
    cg = _cgroup_room()
    if avail is None:
        return cg
    return min(avail, cg) if cg is not None else avail


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_room() -> int | None:
    """cgroup v2 limit minus usage (a container's real room; /proc/meminfo shows the host's)."""
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = Path("/sys/fs/cgroup/memory.current").read_text().strip()
    except OSError:
        return None
    if not limit.isdigit() or not used.isdigit():
        return None  # "max": no limit
    return max(0, int(limit) - int(used))


class Budget:
    """Admission of tasks by planned peak: :meth:`fits` says whether task ``i`` may start now."""

    def __init__(self, peaks: Sequence[int], limit: int | None) -> None:
        self.peaks = list(peaks)
        self.limit = None if limit is None else int(limit * USABLE_SHARE)
        self.in_use = 0

    @classmethod
    def for_files(cls, files: Sequence[str | Path | None]) -> Budget:
        """The budget of local trace files (None: not local, planned as a small rank)."""
        return cls([worker_peak(text_bytes(f) if f is not None else None) for f in files],
                   available_bytes())

    def fits(self, i: int, running: int) -> bool:
        """A task fits when nothing runs (the largest rank still runs, alone) or its peak fits."""
        return running == 0 or self.limit is None or self.in_use + self.peaks[i] <= self.limit

    def start(self, i: int) -> None:
        self.in_use += self.peaks[i]

    def finish(self, i: int) -> None:
        self.in_use -= self.peaks[i]

    def concurrency(self) -> int:
        """How many of the largest tasks fit at once (1 at least): what the budget allows."""
        if self.limit is None or not self.peaks:
            return len(self.peaks) or 1
        return max(1, self.limit // max(self.peaks))


#: polars' allocator (jemalloc, its symbols prefixed ``_rjem_``) reads its settings from this
#: variable when the library loads.
ALLOCATOR_ENV = "_RJEM_MALLOC_CONF"
#: Give freed pages back to the system at once. By default jemalloc keeps them for ~10 s, so a
#: worker that has built and dropped a rank's column pieces holds them through its next phase (and
#: its next rank): measured on a 1 GB rank, the report's peak went from 2.63 to 2.36 GB, same time.
QUIET_ALLOCATOR = "dirty_decay_ms:0,muzzy_decay_ms:0"


def quiet_allocator() -> None:
    """Set :data:`QUIET_ALLOCATOR` for processes started from now on (and this one, when polars is
    not loaded yet), unless the user set the variable (even empty)."""
    os.environ.setdefault(ALLOCATOR_ENV, QUIET_ALLOCATOR)
