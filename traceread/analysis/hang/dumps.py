"""Find every Flight Recorder dump under the paths given, by content, and read them in parallel.

Dumps come from torch's dump-on-timeout (``TORCH_FR_DUMP_TEMP_FILE`` prefix + rank: ``_dump_12``,
``nccl_trace_rank_3``, ``comm_lib_trace_rank_3``), ``traceread collect`` (``RUN/fr/rank3.json``,
``rank3.cpu.json``, ``rank3.pkl``), the c10d worker/debug server, or cluster tooling — any name, flat or
nested, one file or a folder. A file is a dump when its first bytes say so (:func:`flight_recorder.sniff`);
its rank is the number its name (or its folder's name) gives. Reading goes through the engine's
executors like traces do: local processes for many dumps, this process for a few.

Per rank: of several dumps of one recorder, the pickle wins over the JSON (it also has Python
frames) and a later dump over an earlier one; the NCCL and the CPU (gloo) recorder of one rank are
merged (their groups are told apart when both recorders use the same pg name: each backend of a
group counts its collectives separately).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from traceread.analysis.hang.files import walk
from traceread.analysis.hang.flight_recorder import (
    MAX_DUMP_BYTES,
    GroupView,
    RankDump,
    looks_like_dump,
    looks_like_snapshot,
    read_dumps,
)
from traceread.fmt import rank_runs

#: Files per engine task (amortises process start and result transfer).
BATCH = 64
#: Below this many dumps they are read in this process (spawning workers costs more than it saves).
IN_PROCESS_BELOW = 48
#: Names that are never dumps (Kineto traces, logs, stacks) are not even sniffed.
_NOT_DUMPS = (".pt.trace.json", ".pt.trace.json.gz", ".trace.json", ".trace.json.gz", ".log", ".html", ".parquet",
              ".py", ".md", ".csv", ".sock", ".pipe", ".ack", ".tmp")
_DUMP_NAME = re.compile(r"(^_dump_\d+$)|(trace_rank_\d+(\.(pkl|pickle|json))?$)|(^rank\d+(\.cpu)?\.(pkl|pickle)$)", re.I)
#: The CPU recorder's groups get this suffix when another rank's NCCL recorder uses the same pg name.
CPU_SUFFIX = ":cpu"


@dataclass
class DumpSet:
    """The dumps found, one merged :class:`RankDump` per rank, and what could not be read."""

    dumps: dict[int, RankDump] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)  # every dump file read (merged or not)
    problems: list[str] = field(default_factory=list)
    formats: dict[str, int] = field(default_factory=dict)  # "pickle"/"json" -> files

    def summary(self, world: int | None) -> str:
        """``Flight Recorder: 15 dumps of 8 ranks read (pickle 8, JSON 7); no dump from rank 5``."""
        if not self.files and not self.problems:
            return "Flight Recorder: no dump found"
        fmts = ", ".join(f"{'JSON' if k == 'json' else k} {v}" for k, v in sorted(self.formats.items()))
        n = len(self.dumps)
        text = (f"Flight Recorder: {len(self.files)} dump{'s' if len(self.files) != 1 else ''} of {n} "
                f"rank{'s' if n != 1 else ''} read" + (f" ({fmts})" if fmts else ""))
        if world:
            missing = sorted(set(range(min(world, 1 << 20))) - set(self.dumps))
            if missing:
                text += f"; no dump from rank{'s' if len(missing) > 1 else ''} {', '.join(rank_runs(missing))}"
            else:
                text += f"; all {world} ranks have one" if world > 1 else "; the only rank has one"
        if self.problems:
            text += f"; {len(self.problems)} file{'s' if len(self.problems) > 1 else ''} unreadable"
        return text


def _meant_as_dump(f: Path) -> bool:
    """A file that is a dump by its place or name (``fr/…``, ``_dump_3``, ``…trace_rank_3``, ``rank3.pkl``), so
    that a damaged one is reported instead of passed over. ``rank3.json`` outside ``fr/`` counts only by its
    content: collectors keep other per-rank JSON (``ranks/rank3.json``)."""
    return f.parent.name == "fr" or bool(_DUMP_NAME.search(f.name))


def find_dumps(paths: Sequence[str | Path]) -> list[Path]:
    """Dump files under ``paths``: any file whose first bytes say Flight Recorder, and files that are
    dumps by place or name (read so that a damaged one becomes a problem line)."""
    out: dict[str, Path] = {}
    for raw in paths:
        for f in walk(raw):
            name = f.name.lower()
            if name.endswith(_NOT_DUMPS) or name in ("run.json", "hang.json", "truth.json"):
                continue
            try:
                size = f.stat().st_size
            except OSError:
                continue
            if size > MAX_DUMP_BYTES and not _meant_as_dump(f):
                continue
            if looks_like_dump(f) or (_meant_as_dump(f) and not looks_like_snapshot(f)):
                out.setdefault(str(f.resolve()), f)
    return list(out.values())


def read_all(files: Sequence[Path], workers: int | None = None) -> list[RankDump | str]:
    """Summaries (or one-line problems) of ``files``, in their order, through the engine's executors."""
    from traceread.engine.executors import InProcessExecutor, ProcessExecutor, default_workers

    paths = [str(f) for f in files]
    batches = [paths[i:i + BATCH] for i in range(0, len(paths), BATCH)]
    n = default_workers(len(batches)) if workers is None else max(1, workers)
    results: list[list[RankDump | str]] = [[] for _ in batches]

    def done(i: int, res: object) -> None:
        if isinstance(res, list):
            results[i] = res
        else:  # a worker that failed twice (engine.base.TaskFailed): every file of the batch says why
            reason = getattr(res, "reason", "worker failed")
            results[i] = [f"{p}: {reason}" for p in batches[i]]

    items = [(b,) for b in batches]
    if n <= 1 or len(paths) < IN_PROCESS_BELOW:
        InProcessExecutor().map(read_dumps, items, done)
    else:
        ProcessExecutor(n).map(read_dumps, items, done)
    return [r for batch in results for r in batch]


def collect(paths: Sequence[str | Path], workers: int | None = None) -> DumpSet:
    """Find, read and combine the dumps under ``paths``."""
    files = find_dumps(paths)
    out = DumpSet()
    read = read_all(files, workers)
    per: dict[tuple[int, str], RankDump] = {}
    for f, res in zip(files, read):
        if isinstance(res, str):
            out.problems.append(res)
            continue
        if res.rank is None:
            out.problems.append(f"{f}: a Flight Recorder dump, but its name says no rank (name it like rank3.json)")
            continue
        out.files.append(str(f))
        out.formats[res.fmt] = out.formats.get(res.fmt, 0) + 1
        key = (res.rank, res.recorder)
        old = per.get(key)
        per[key] = res if old is None else _newer(old, res)
    both = {r for (r, rec) in per if rec == "nccl"} and {r for (r, rec) in per if rec == "cpu"}
    clash = bool(both) and _names_clash(per)
    for (rank, rec), d in sorted(per.items(), key=lambda kv: (kv[0][0], kv[0][1] != "nccl")):
        if clash and rec == "cpu":
            d.groups = {f"{k}{CPU_SUFFIX}": _renamed(g, f"{k}{CPU_SUFFIX}") for k, g in d.groups.items()}
            d.pg_config = {f"{k}{CPU_SUFFIX}": v for k, v in d.pg_config.items()}
        out.dumps[rank] = _merge(out.dumps[rank], d) if rank in out.dumps else d
    return out


def _newer(a: RankDump, b: RankDump) -> RankDump:
    """Of two dumps of one recorder of one rank: the later one; at equal times the pickle (frames)."""
    ta, tb = a.newest_ns or 0, b.newest_ns or 0
    if ta != tb and a.entries and b.entries:
        keep = a if ta > tb else b
    else:
        keep = a if (a.fmt == "pickle", a.entries) >= (b.fmt == "pickle", b.entries) else b
    other = b if keep is a else a
    keep.notes.append(f"also dumped to {other.path} ({other.fmt}); {keep.path} used")
    return keep


def _names_clash(per: dict[tuple[int, str], RankDump]) -> bool:
    nccl = {g for (_r, rec), d in per.items() if rec == "nccl" for g in d.groups}
    cpu = {g for (_r, rec), d in per.items() if rec == "cpu" for g in d.groups}
    return bool(nccl & cpu)


def _renamed(g: GroupView, name: str) -> GroupView:
    g.pg = name
    for o in g.pending + g.recent + g.p2p_pending:
        o.pg = name
    return g


def _merge(a: RankDump, b: RankDump) -> RankDump:
    """One rank's NCCL and CPU recorder dumps -> one view (they record different groups)."""
    groups = dict(b.groups)
    groups.update(a.groups)
    return RankDump(
        path=a.path, rank=a.rank, fmt=a.fmt, version=a.version or b.version,
        comm_lib_version=a.comm_lib_version or b.comm_lib_version, backends=list(dict.fromkeys(a.backends + b.backends)),
        timing=a.timing, groups=groups, pg_config={**b.pg_config, **a.pg_config}, entries=a.entries + b.entries,
        newest_ns=max(a.newest_ns or 0, b.newest_ns or 0) or None, unmapped=a.unmapped + b.unmapped,
        notes=a.notes + b.notes + [f"merged with the {b.recorder} recorder's dump {b.path}"])
