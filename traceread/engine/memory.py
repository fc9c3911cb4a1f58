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
  largest ratio measured on the 1 GB and 5 GB ranks (README, Speed, "Memory pass"), rounded up.
* **available**: ``MemAvailable`` of ``/proc/meminfo``, lowered to the cgroup's limit minus its
  usage inside a container; ``$TRACEREAD_MEMORY_BUDGET`` (a size such as ``12GiB``, or ``off``)
  overrides it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
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
    from traceread.read.inflate import max_rank_bytes, prefix_expansion

    try:
        size = os.path.getsize(path)
        with open(path, "rb") as fh:
            sample = fh.read(SAMPLE_BYTES)
    except OSError:
        return None
    limit = max_rank_bytes()
    # Counting stops once the estimate passes the limit: a bomb's sample is not inflated whole.
    out = prefix_expansion(sample, cap=limit * len(sample) // max(size, 1) + 1)
    if not out:
        return size
    return min(int(size * out / len(sample)), limit)


def worker_peak(text: int | None) -> int:
    """Planned peak of a worker reading and summarising a rank of ``text`` uncompressed bytes."""
    return WORKER_BASE + int(PEAK_PER_TEXT_BYTE * (text or 0))


def available_bytes() -> int | None:
    """Memory the workers may use now (module docstring); None: no limit known or ``off``."""
    env = os.environ.get(BUDGET_ENV, "").strip()
    if env.lower() == "off":
        return None
    if env:
        from traceread.read.inflate import parse_size

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
    """Admission of tasks by planned peak: :meth:`fits` says whether task ``i`` may start now.

    ``peak_of(i)``: task ``i``'s planned peak, asked for only when the task is considered, and once:
    the estimates (a read of each file's start) then overlap the work instead of delaying it.
    """

    def __init__(self, peak_of: Callable[[int], int], limit: int | None) -> None:
        self._peak_of = peak_of
        self._peaks: dict[int, int] = {}
        self.limit = None if limit is None else int(limit * USABLE_SHARE)
        self.in_use = 0

    @classmethod
    def for_files(cls, files: Sequence[str | Path | None]) -> Budget:
        """The budget of local trace files (None: not local, planned as a small rank)."""
        files = list(files)

        def peak_of(i: int) -> int:
            file = files[i]
            return worker_peak(text_bytes(file) if file is not None else None)

        return cls(peak_of, available_bytes())

    def peak(self, i: int) -> int:
        if i not in self._peaks:
            self._peaks[i] = self._peak_of(i)
        return self._peaks[i]

    def fits(self, i: int, running: int) -> bool:
        """A task fits when nothing runs (the largest rank still runs, alone) or its peak fits."""
        return running == 0 or self.limit is None or self.in_use + self.peak(i) <= self.limit

    def start(self, i: int) -> None:
        if self.limit is not None:
            self.in_use += self.peak(i)

    def finish(self, i: int) -> None:
        if self.limit is not None:
            self.in_use -= self.peak(i)


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
