"""Everything ``hang`` reads from a run folder (or a flat folder of dumps, or one dump), bounded.

* Flight Recorder dumps anywhere below, found by content (:mod:`traceread.analysis.hang.dumps`).
* Stack dumps (faulthandler / py-spy): files in a ``stacks/`` folder, or named ``*stack*``,
  ``*traceback*``, ``*py-spy*``/``*pyspy*``; the last MiB of each.
* torchelastic error files: ``errors/*.json``; the collector's ``hang.json``; ``run.json`` (world size).
* Logs: ``launcher.log``, ``nccl/``, torchrun ``--log-dir`` files, and ``*.log`` files that say NCCL.
  The watchdog and NCCL lines are parsed by :mod:`traceread.analysis.hang.nccl_log` from the whole log
  up to 8 MiB, else from its first 2 and last 6 MiB; torchrun's "Root Cause" summary and each rank's
  last line come from the last MiB. A 1 GiB ``launcher.log`` costs a few MiB and seconds.

Every file is checked to be a regular file before it is opened (a FIFO named ``errors/rank2.json``
never blocks), every JSON file is size- and depth-bounded, and a file that cannot be read becomes one
line in ``problems``.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traceread.analysis.hang.dumps import DumpSet, collect
from traceread.analysis.hang.files import read_head, read_tail, regular, size_of, walk
from traceread.analysis.hang.flight_recorder import rank_from_name
from traceread.analysis.hang.nccl_log import find_nccl_logs, looks_like_nccl_log, parse_nccl_logs
from traceread.analysis.hang.stack_dumps import RankStack, read_stack_file
from traceread.errors import TraceFileError, TraceReadError
from traceread.read.jsonfile import load_json_object, plausible_rank, plausible_world_size
from traceread.read.rank_prefix import leading_rank_prefix

#: The end of each log read for the "Root Cause" block and each rank's last line.
LOG_TAIL_BYTES = 1 << 20
#: A log larger than this is parsed for watchdog/NCCL lines by its head and its tail only.
LOG_PARSE_BYTES = 8 << 20
LOG_PARSE_HEAD = 2 << 20
#: A world size above this is not believed (it would only size lists of missing ranks).
MAX_WORLD = 1 << 20
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):")
_RC_RANK = re.compile(r"rank\s*:\s*(\d+)")
_STACK_NAMES = re.compile(r"stack|traceback|py-?spy", re.I)
_LOG_NAMES = (".log", ".txt", ".out", ".err")


@dataclass
class HangSources:
    """Everything read (kept so the command can say what was used)."""

    run_dir: Path
    world_size: int | None = None
    dumps: DumpSet = field(default_factory=DumpSet)
    stacks: dict[int, RankStack] = field(default_factory=dict)
    nccl: dict[str, Any] | None = None
    errors: dict[int, dict[str, Any]] = field(default_factory=dict)
    hang_records: list[dict[str, Any]] = field(default_factory=list)
    root_cause_rank: int | None = None
    last_lines: dict[int, str] = field(default_factory=dict)  # rank -> the last line a log shows for it
    logs: list[Path] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was read only in part

    @property
    def fr(self) -> dict[int, Any]:
        return self.dumps.dumps

    def any_evidence(self) -> bool:
        return bool(self.fr or self.stacks or self.hang_records
                    or (self.nccl and (self.nccl["timeouts"] or self.nccl["torch_messages"]))
                    or any(is_timeout(e) for e in self.errors.values()))


def error_message(err: dict[str, Any]) -> str:
    msg = err.get("message")
    if isinstance(msg, dict):
        msg = msg.get("message")
    return str(msg or "")[:2000] if isinstance(msg, (str, int, float)) or msg is None else ""


def is_timeout(err: dict[str, Any]) -> bool:
    return bool(re.search(r"timed out|timeout|watchdog", error_message(err), re.I))


def error_time(err: dict[str, Any]) -> float | None:
    msg = err.get("message")
    if isinstance(msg, dict):
        extra = msg.get("extraInfo")
        ts = extra.get("timestamp") if isinstance(extra, dict) else None
        try:
            v = float(ts)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return None
        return v if v == v and abs(v) < 1e12 else None
    return None


def _json(path: Path, problems: list[str]) -> Any:
    return load_json_object(path, problems)  # the one side-file loader: regular files, bounded, depth-safe


def world_from_run(doc: dict[str, Any], path: Path | None = None, problems: list[str] | None = None) -> int | None:
    """The job's world size from ``run.json``; an impossible value is said in ``problems`` and ignored."""
    world = doc.get("world")
    for value in (doc.get("world_size"), world.get("world_size") if isinstance(world, dict) else None):
        if value is None:
            continue
        size = plausible_world_size(value)
        if size is not None:
            return size
        if problems is not None:
            problems.append(f"{path}: world_size {str(value)[:40]!s} is not a possible number of ranks; ignored")
    return None


def hang_record(doc: dict[str, Any], path: Path, problems: list[str]) -> dict[str, Any]:
    """``doc`` with the fields the diagnosis reads in their expected shapes: a record damaged or written
    by hand is read for what is usable, and what is not is said once in ``problems``."""
    rec = dict(doc)
    steps = rec.get("last_step_per_rank")
    if steps is not None:
        good = ({str(r): v for k, v in list(steps.items())[:1 << 16] if (r := plausible_rank(k)) is not None
                 and isinstance(v, int) and not isinstance(v, bool)} if isinstance(steps, dict) else {})
        if not isinstance(steps, dict) or len(good) != len(steps):
            problems.append(f"{path}: last_step_per_rank is not a map of rank to step; "
                            f"{'the entries that are' if good else 'nothing'} used")
        rec["last_step_per_rank"] = good
    unanswered = rec.get("unanswered_ranks")
    if unanswered is not None:
        ranks = [r for r in unanswered[:1 << 16] if isinstance(r, int) and plausible_rank(r) is not None] \
            if isinstance(unanswered, list) else []
        if not isinstance(unanswered, list) or len(ranks) != len(unanswered):
            problems.append(f"{path}: unanswered_ranks is not a list of ranks; "
                            f"{'the entries that are' if ranks else 'nothing'} used")
        rec["unanswered_ranks"] = ranks
    t = rec.get("timeout_s")
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float))):
        problems.append(f"{path}: timeout_s is not a number; ignored")
        rec["timeout_s"] = None
    return rec


def load_sources(path: str | Path, workers: int | None = None) -> HangSources:
    """Read every hang source under ``path`` (a folder or one dump file); unreadable files become
    ``problems``, never errors. Raises :class:`TraceReadError` when ``path`` does not exist."""
    root = Path(path)
    if not root.exists():
        raise TraceReadError("no such file or folder", str(root))
    if not root.is_dir() and not regular(root):
        raise TraceReadError("not a folder or a regular file", str(root))
    src = HangSources(run_dir=root if root.is_dir() else root.parent)
    src.dumps = collect([root], workers)
    src.problems += src.dumps.problems
    if not root.is_dir():
        return src
    logs: dict[Path, None] = {}
    for f in walk(root):
        rel = f.relative_to(root).parts
        name = f.name
        low = name.lower()
        if "stacks" in rel[:-1] or (_STACK_NAMES.search(name) and not low.endswith((".json", ".pkl", ".gz"))):
            if f.stat().st_size == 0:
                continue  # the rank was never asked to dump
            try:
                st = read_stack_file(f)
            except TraceFileError as exc:
                if "stacks" in rel[:-1]:
                    src.problems.append(str(exc))
                continue
            if st.rank is not None and st.threads:
                src.stacks.setdefault(st.rank, st)
        elif "errors" in rel[:-1] and low.endswith(".json"):
            doc = _json(f, src.problems)
            r = rank_from_name(f)
            if isinstance(doc, dict) and r is not None:
                src.errors[r] = doc
        elif name == "hang.json":
            doc = _json(f, src.problems)
            if isinstance(doc, dict):
                src.hang_records.append(hang_record(doc, f, src.problems))
        elif name == "run.json" and len(rel) <= 2 and src.world_size is None:
            doc = _json(f, src.problems)
            if isinstance(doc, dict):
                src.world_size = world_from_run(doc, f, src.problems)
        elif low.endswith(_LOG_NAMES) and len(rel) == 1 and name != "launcher.log" and looks_like_nccl_log(f):
            logs.setdefault(f, None)
    for d in [root] + [p for p in sorted(root.iterdir()) if p.is_dir() and not p.name.startswith(".")]:
        for p in find_nccl_logs(d):
            if regular(p):
                logs.setdefault(p, None)
    src.logs = list(logs)
    if src.logs:
        with tempfile.TemporaryDirectory(prefix="traceread-hang-") as tmp:
            parts, notes = _bounded_logs(src.logs, Path(tmp))
            src.nccl = parse_nccl_logs(parts)
            src.nccl["files"] = [str(p) for p in src.logs]
        src.notes += notes
        src.root_cause_rank, src.last_lines = _log_tails(src.logs, src.problems)
    return src


def _bounded_logs(logs: list[Path], tmp: Path) -> tuple[list[Path], list[str]]:
    """Logs as the watchdog-line parser gets them: whole up to :data:`LOG_PARSE_BYTES`, else their first
    :data:`LOG_PARSE_HEAD` (NCCL's init lines) and the rest of the budget from their end (the timeouts)."""
    out: list[Path] = []
    notes: list[str] = []
    for i, p in enumerate(logs):
        size = size_of(p) or 0
        if size <= LOG_PARSE_BYTES:
            out.append(p)
            continue
        try:
            head = read_head(p, LOG_PARSE_HEAD)
            tail, _cut = read_tail(p, LOG_PARSE_BYTES - LOG_PARSE_HEAD)
        except TraceFileError as exc:
            notes.append(str(exc))
            continue
        part = tmp / f"{i}.log"
        part.write_bytes(head[: head.rfind(b"\n") + 1] + tail)
        out.append(part)
        notes.append(f"{p}: {size:,} bytes; its first {LOG_PARSE_HEAD >> 20} MiB and last "
                     f"{(LOG_PARSE_BYTES - LOG_PARSE_HEAD) >> 20} MiB were read for watchdog and NCCL lines")
    return out, notes


def _log_tails(logs: list[Path], problems: list[str]) -> tuple[int | None, dict[int, str]]:
    """torchrun's "Root Cause" rank and each rank's last line, from the end of each log."""
    root_cause: int | None = None
    last: dict[int, str] = {}
    for p in logs:
        try:
            data, _cut = read_tail(p, LOG_TAIL_BYTES)
        except TraceFileError as exc:
            problems.append(str(exc))
            continue
        lines = data.decode("utf-8", "replace").splitlines()
        file_rank = _rank_of_log(p)
        for i, line in enumerate(lines):
            if _ROOT_CAUSE.search(line):
                for nxt in lines[i + 1:i + 8]:
                    m = _RC_RANK.search(nxt)
                    if m:
                        root_cause = int(m.group(1))
                        break
            pre = leading_rank_prefix(line)
            if pre and pre.rest.strip():
                last[pre.rank] = pre.rest.strip()[:300]
            elif file_rank is not None and line.strip():
                last[file_rank] = line.strip()[:300]
    return root_cause, last


def _rank_of_log(p: Path) -> int | None:
    """``nccl/rank3.host.123.log`` or ``torchrun/.../attempt_0/3/stderr.log`` -> 3 when the name says so."""
    m = re.match(r"rank(\d+)\b", p.name)
    return int(m.group(1)) if m else None
