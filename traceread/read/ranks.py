"""Which rank a file is, and whether a set of files can be one job.

Order of evidence: ``distributedInfo.rank`` (written by torch itself), then the file name
(``rank-3``, ``rank3``, ``rank_3``, ``worker3``, ``worker_3``; then the same in parent folder
names), then, for a single file, 0. Several files without any rank evidence get their position in
sorted path order, with a warning, because nothing better is known.

Mixed jobs are refused rather than silently analysed together: two files claiming one rank, or
files that disagree on world size / backend / NCCL version, files on different GPU models that
torch does not call one job (no common world size), or a rank outside the world size. Files whose
names do not decide are grouped into jobs first (:mod:`traceread.read.cycles`: time, GPU model,
job shape, the model's kernel names).
"""

from __future__ import annotations

import re
from pathlib import Path

from traceread.errors import RankConflictError
from traceread.model import RankTrace
from traceread.read.columns import to_int

_RANK_RE = re.compile(r"(?<![a-z])(?:rank|worker)[-_]?(\d+)", re.IGNORECASE)


def rank_from_name(path: str | Path) -> int | None:
    """Rank written in the file name (or, failing that, in a parent folder name)."""
    p = Path(path)
    for part in (p.name, *[q.name for q in p.parents][:3]):
        m = _RANK_RE.findall(part)
        if m:
            return int(m[-1]) if part != p.name else int(m[0])
    return None


def identify(rt: RankTrace, *, single: bool) -> None:
    """Set ``rt.rank``/``rt.meta.rank``/``rank_source`` for one file in isolation."""
    dist = rt.meta.distributed_info or {}
    recorded = to_int(dist.get("rank"))
    if recorded is not None:
        rt.rank = recorded
        rt.meta.rank = recorded
        rt.meta.rank_source = "distributedInfo"
        return
    named = rank_from_name(rt.file)
    if named is not None:
        rt.rank = named
        rt.meta.rank = named
        rt.meta.rank_source = "filename"
        return
    rt.rank = 0
    rt.meta.rank_source = "unknown"
    rt.meta.rank = 0 if single else None


def assign_ranks(traces: list[RankTrace]) -> list[str]:
    """Give every trace a rank, check the set is one job; returns warnings. Sorts in place."""
    warnings: list[str] = []
    for rt in traces:
        identify(rt, single=len(traces) == 1)
    unknown = [rt for rt in traces if rt.meta.rank_source == "unknown"]
    if unknown and len(traces) > 1:
        taken = {rt.rank for rt in traces if rt.meta.rank_source != "unknown"}
        free = (r for r in range(len(traces) + len(taken)) if r not in taken)
        for rt in sorted(unknown, key=lambda t: t.file):
            rt.rank = next(free)
            rt.meta.rank = rt.rank
            warnings.append(
                f"rank {rt.rank} assumed for {rt.file}: no distributedInfo.rank and no rank in "
                "the file name (ranks given by file order)"
            )
    check_one_job(traces)
    traces.sort(key=lambda t: t.rank)
    return warnings


def check_one_job(traces: list[RankTrace]) -> None:
    """Raise :class:`RankConflictError` naming the files when the set cannot be one job."""
    by_rank: dict[int, list[str]] = {}
    for rt in traces:
        by_rank.setdefault(rt.rank, []).append(rt.file)
    dup = {r: fs for r, fs in by_rank.items() if len(fs) > 1}
    if dup:
        r, files = min(dup.items())
        raise RankConflictError(
            f"rank {r} appears in {len(files)} files: {', '.join(sorted(files))} "
            "(two runs mixed in one folder? pass the files of one run)"
        )
    for field, label in (
        ("world_size", "world size"),
        ("backend", "backend"),
        ("nccl_version", "NCCL version"),
    ):
        seen: dict[object, str] = {}
        for rt in traces:
            v = getattr(rt.meta, field)
            if v is not None:
                seen.setdefault(v, rt.file)
        if len(seen) > 1:
            parts = "; ".join(f"{f} has {label} {v}" for v, f in seen.items())
            raise RankConflictError(f"files from different jobs: {parts}")
    # different GPU models are different jobs, unless torch says they are one (same world size)
    gpus: dict[str, str] = {}
    for rt in traces:
        if rt.meta.device_name:
            gpus.setdefault(rt.meta.device_name, rt.file)
    all_sizes = {rt.meta.world_size for rt in traces}
    if len(gpus) > 1 and (None in all_sizes or len(all_sizes) > 1):
        parts = "; ".join(f"{f} ran on {d}" for d, f in gpus.items())
        raise RankConflictError(f"files from different jobs: {parts}")
    sizes = {rt.meta.world_size for rt in traces if rt.meta.world_size is not None}
    job_world = sizes.pop() if len(sizes) == 1 else None
    for rt in traces:
        ws = rt.meta.world_size if rt.meta.world_size is not None else job_world
        if ws is not None and not 0 <= rt.rank < ws:
            how = {"unknown": " (given by file order: the file names no rank and has no distributedInfo)",
                   "filename": " (from the file name)"}.get(rt.meta.rank_source or "", "")
            raise RankConflictError(
                f"rank {rt.rank}{how} is outside world size {ws}"
                + ("" if rt.meta.world_size is not None else " (the other files' distributedInfo)"), rt.file
            )
