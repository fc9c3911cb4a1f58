"""Why did the job hang? Name the culprit rank, the collective, and the line each rank is stuck on.

A distributed hang is almost always one (or a few) ranks that never issued collective #N of a
process group while every other member sits inside #N until the timeout. The members that time
out are *victims*; torchrun's "Root Cause (first observed failure)" names the first victim to
exit, not the culprit. Sources, best first, all optional:

1. Flight Recorder dumps (``fr/rank{R}.json|.pkl``): per PG and rank the last enqueued and
   completed collective seq (``pg_status``) and the entries (op, sizes, dtypes). For the PG with
   unfinished work, N = the highest seq any member enqueued; *missing ranks* enqueued less than N,
   *waiting ranks* enqueued N and did not complete it. If every member enqueued N, the entries
   are compared: a different op/size/dtype on some ranks is a mismatch (the minority is named).
2. PyTorch watchdog lines in NCCL/launcher logs (``Watchdog caught collective operation timeout:
   WorkNCCL(SeqNum=N, OpType=...)``): the ranks that report a timeout on (PG, N) wait in it; world
   members that report none are the suspects.
3. Stack dumps (``stacks/rank{R}.txt``, faulthandler or py-spy): ranks whose main thread is inside a
   ``torch.distributed`` call wait; the others are the suspects. Always used for the "where": the
   innermost user-code frame of each rank's main thread.
4. torchelastic error files (``errors/rank{R}.json``) and the collector's ``hang.json`` add
   evidence (who timed out first, who stopped stepping, who did not answer the dump request).

A RUN folder may hold these directly or per host (``RUN/<host>/fr/...``); both are read.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traceread.analysis.hang.flight_recorder import FRDump, FREntry, pg_descriptions, pg_members, read_fr_dir
from traceread.analysis.hang.nccl_log import find_nccl_logs, parse_nccl_logs
from traceread.analysis.hang.stack_dumps import (
    Frame,
    RankStack,
    collective_call,
    is_library,
    read_stacks_dir,
    source_line,
    stuck_frame,
)
from traceread.errors import TraceReadError
from traceread.read.jsonfile import load_json_object, plausible_rank, plausible_world_size
from traceread.report_schema import HangEntry

_OPTYPE = {
    "ALLREDUCE": "all_reduce", "ALLGATHER": "all_gather", "_ALLGATHER_BASE": "all_gather",
    "ALLGATHER_COALESCED": "all_gather", "REDUCE_SCATTER": "reduce_scatter", "_REDUCE_SCATTER_BASE": "reduce_scatter",
    "BROADCAST": "broadcast", "BARRIER": "barrier", "ALLTOALL": "all_to_all", "ALLTOALL_BASE": "all_to_all",
    "SEND": "send", "RECV": "recv", "REDUCE": "reduce", "GATHER": "gather", "SCATTER": "scatter",
    "COALESCED": "coalesced",
}
_TIMEOUT_TEXT = re.compile(r"timed out|timeout|watchdog", re.I)
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):")
_RC_RANK = re.compile(r"rank\s*:\s*(\d+)")
_CALL = re.compile(r"([A-Za-z_][\w.]*)\s*\(")


@dataclass
class HangSources:
    """Everything read from a RUN folder (kept so the command can print what was used)."""

    run_dir: Path
    world_size: int | None = None
    fr: dict[int, FRDump] = field(default_factory=dict)
    stacks: dict[int, RankStack] = field(default_factory=dict)
    nccl: dict[str, Any] | None = None
    errors: dict[int, dict[str, Any]] = field(default_factory=dict)
    hang_records: list[dict[str, Any]] = field(default_factory=list)
    root_cause_rank: int | None = None
    problems: list[str] = field(default_factory=list)

    def any_evidence(self) -> bool:
        return bool(self.fr or self.stacks or self.hang_records
                    or (self.nccl and (self.nccl["timeouts"] or self.nccl["torch_messages"]))
                    or any(_is_timeout(e) for e in self.errors.values()))


@dataclass
class HangDiagnosis:
    entry: HangEntry
    headline: str
    sources: HangSources


def normalize_op(op: str | None) -> str:
    """``ALLREDUCE``/``_REDUCE_SCATTER_BASE``/``all_reduce`` -> ``all_reduce``/``reduce_scatter``."""
    if not op:
        return "unknown"
    return _OPTYPE.get(op.upper() if op.isupper() or op.startswith("_") else op, op.lower().lstrip("_"))


def _host_dirs(run: Path) -> list[Path]:
    dirs = [run]
    try:
        for d in sorted(run.iterdir()):
            if d.is_dir() and any((d / x).exists() for x in ("fr", "stacks", "hang.json", "errors", "nccl")):
                dirs.append(d)
    except OSError:
        pass
    return dirs


def _rank_of(path: Path) -> int | None:
    m = re.search(r"(\d+)(?:\.\w+)*$", path.name)
    return int(m.group(1)) if m else None


def load_sources(run_dir: str | Path) -> HangSources:
    """Read every hang source in a RUN folder; unreadable files become ``problems``, never errors."""
    run = Path(run_dir)
    if not run.is_dir():
        raise TraceReadError("not a folder (expected a RUN folder from `traceread collect`)", str(run))
    src = HangSources(run_dir=run)
    logs: list[Path] = []
    for d in _host_dirs(run):
        fr, problems = read_fr_dir(d / "fr")
        src.problems += problems
        for r, dump in fr.items():
            src.fr.setdefault(r, dump)
        stacks, problems = read_stacks_dir(d / "stacks")
        src.problems += problems
        for r, st in stacks.items():
            src.stacks.setdefault(r, st)
        if (d / "errors").is_dir():
            for f in sorted((d / "errors").glob("*.json")):
                doc = load_json_object(f, src.problems)
                rank = _rank_of(f)
                if doc is not None and rank is not None:
                    src.errors[rank] = doc
        if (d / "hang.json").is_file():
            doc = load_json_object(d / "hang.json", src.problems)
            if doc is not None:
                src.hang_records.append(_hang_record(doc, d / "hang.json", src.problems))
        logs += [p for p in find_nccl_logs(d) if p not in logs]
        if (d / "run.json").is_file() and src.world_size is None:
            doc = load_json_object(d / "run.json", src.problems)
            if doc is not None:
                src.world_size = _world_from_run(doc, d / "run.json", src.problems)
    if logs:
        src.nccl = parse_nccl_logs(logs)
        src.root_cause_rank = _torchrun_root_cause(logs)
    return src


def _world_from_run(doc: dict[str, Any], path: Path, problems: list[str]) -> int | None:
    world = doc.get("world")
    for value in (doc.get("world_size"), world.get("world_size") if isinstance(world, dict) else None):
        if value is None:
            continue
        size = plausible_world_size(value)
        if size is not None:
            return size
        problems.append(f"{path}: world_size {str(value)[:40]!s} is not a possible number of ranks; ignored")
    return None


def _hang_record(doc: dict[str, Any], path: Path, problems: list[str]) -> dict[str, Any]:
    """``doc`` with the fields the diagnosis reads in their expected shapes: a record damaged or written
    by hand is read for what is usable, and what is not is said once in ``problems``."""
    rec = dict(doc)
    steps = rec.get("last_step_per_rank")
    if steps is not None:
        good = ({str(r): v for k, v in steps.items() if (r := plausible_rank(k)) is not None
                 and isinstance(v, int) and not isinstance(v, bool)} if isinstance(steps, dict) else {})
        if not isinstance(steps, dict) or len(good) != len(steps):
            problems.append(f"{path}: last_step_per_rank is not a map of rank to step; "
                            f"{'the entries that are' if good else 'nothing'} used")
        rec["last_step_per_rank"] = good
    unanswered = rec.get("unanswered_ranks")
    if unanswered is not None:
        ranks = [r for r in unanswered if plausible_rank(r) is not None and isinstance(r, int)] \
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


def _torchrun_root_cause(logs: list[Path]) -> int | None:
    """Global rank named under torchrun's ``Root Cause (first observed failure):``."""
    for p in logs:
        try:
            lines = p.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for i, line in enumerate(lines):
            if _ROOT_CAUSE.search(line):
                for nxt in lines[i + 1:i + 8]:
                    m = _RC_RANK.search(nxt)
                    if m:
                        return int(m.group(1))
    return None


def _is_timeout(err: dict[str, Any]) -> bool:
    return bool(_TIMEOUT_TEXT.search(_error_message(err)))


def _error_message(err: dict[str, Any]) -> str:
    msg = err.get("message")
    if isinstance(msg, dict):
        msg = msg.get("message")
    return str(msg or "")


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)


def _plural(ranks: list[int], one: str, many: str) -> str:
    return f"{one} {_ranks(ranks)}" if len(ranks) == 1 else f"{many} {_ranks(ranks)}"


# ----------------------------------------------------------------------------- Flight Recorder


@dataclass
class _PGState:
    pg: str
    members: list[int]
    enqueued: dict[int, int]
    completed: dict[int, int]
    entries: dict[int, dict[int, FREntry]]  # rank -> seq -> entry


def _pg_states(dumps: dict[int, FRDump], world: int | None) -> list[_PGState]:
    members = pg_members(dumps, world)
    out = []
    for pg, ranks in members.items():
        enq: dict[int, int] = {}
        comp: dict[int, int] = {}
        ents: dict[int, dict[int, FREntry]] = {}
        for r in ranks:
            dump = dumps.get(r)
            if dump is None:
                continue
            mine = {e.seq: e for e in dump.entries if e.pg_name == pg and not e.is_p2p and e.seq >= 0}
            ents[r] = mine
            st = dump.pg_status.get(pg)
            # gloo never marks entries completed and its pg_status completion can lag one op behind,
            # but a retired gloo entry has finished; NCCL entries say "completed" themselves
            done = [s for s, e in mine.items() if e.state == "completed" or (e.backend == "gloo" and e.retired)]
            enq[r] = max(st.last_enqueued if st else -1, max(mine, default=-1))
            comp[r] = max(st.last_completed if st else -1, max(done, default=-1))
        if enq:
            out.append(_PGState(pg, ranks, enq, comp, ents))
    return out


# ops whose input shapes must be identical on every member; all_to_all (uneven splits), gather/scatter
# (root differs) and p2p legitimately differ, so only their op and dtype are compared
_SAME_SHAPE_OPS = ("all_reduce", "allreduce", "broadcast", "all_gather", "allgather", "_allgather",
                   "reduce_scatter", "_reduce_scatter", "barrier")


def _signature(e: FREntry) -> tuple[str, str, str]:
    sizes = json.dumps(e.input_sizes) if e.op.startswith(_SAME_SHAPE_OPS) else ""
    return (e.op, sizes, ",".join(e.input_dtypes))


def _mismatch(state: _PGState, seq: int) -> tuple[list[str], list[int]]:
    """Compare entry ``seq`` across the ranks that have it; minority ranks are the culprits."""
    have = {r: ents[seq] for r, ents in state.entries.items() if seq in ents}
    if len(have) < 2:
        return [], []
    sigs = Counter(_signature(e) for e in have.values())
    if len(sigs) == 1:
        return [], []
    expected, _ = sigs.most_common(1)[0]
    msgs: list[str] = []
    culprits: list[int] = []
    exp_ranks = sorted(r for r, e in have.items() if _signature(e) == expected)
    for r, e in sorted(have.items()):
        sig = _signature(e)
        if sig == expected:
            continue
        culprits.append(r)
        what = []
        if sig[0] != expected[0]:
            what.append(f"op {e.op} vs {expected[0]}")
        if sig[1] != expected[1]:
            what.append(f"input sizes {sig[1]} vs {expected[1]}")
        if sig[2] != expected[2]:
            what.append(f"dtypes {sig[2] or '-'} vs {expected[2] or '-'}")
        msgs.append(f"collective #{seq} on pg {state.pg}: rank {r} has {'; '.join(what)} "
                    f"(ranks {_ranks(exp_ranks)})")
    return msgs, culprits


def _from_fr(src: HangSources, world: int | None) -> HangEntry | None:
    states = _pg_states(src.fr, world)
    descs = pg_descriptions(src.fr)
    candidates = []
    for st in states:
        n = max(st.enqueued.values())
        if any(e < n for e in st.enqueued.values()):
            # #n cannot have completed anywhere while a member never enqueued it
            waiting = sorted(r for r, e in st.enqueued.items() if e == n)
        else:
            waiting = sorted(r for r, e in st.enqueued.items() if st.completed.get(r, -1) < n)
        if n < 0 or not waiting:
            continue
        t0 = min((st.entries[r][n].time_created_ns or 0) for r in waiting if n in st.entries.get(r, {})) \
            if any(n in st.entries.get(r, {}) for r in waiting) else 0
        candidates.append((t0 or float("inf"), st.pg, st, n, waiting))
    if not candidates:
        return None
    candidates.sort(key=lambda c: (c[0], c[1]))
    _, _, st, n, waiting = candidates[0]
    missing = sorted(r for r, e in st.enqueued.items() if e < n)
    no_dump = sorted(set(st.members) - set(st.enqueued))
    ref = next((st.entries[r][n] for r in waiting if n in st.entries.get(r, {})), None)
    desc = descs.get(st.pg)
    evidence = [
        f"Flight Recorder, pg {st.pg}{f' ({desc})' if desc else ''}, members {_ranks(st.members)}: last enqueued "
        + ", ".join(f"rank {r}: #{st.enqueued[r]}" for r in sorted(st.enqueued))
        + "; last completed " + ", ".join(f"rank {r}: #{st.completed.get(r, -1)}" for r in sorted(st.enqueued))
    ]
    if ref is not None:
        evidence.append(f"collective #{n} = {ref.profiling_name or ref.op} input sizes {ref.input_sizes} "
                        f"dtypes {ref.input_dtypes}" + (f", timeout {ref.timeout_ms} ms" if ref.timeout_ms else ""))
        user = _user_frame(ref)
        if user:
            evidence.append(f"{_plural(waiting, 'rank', 'ranks')} enqueued #{n} at {user}")
    for r in missing:
        last = st.entries.get(r, {}).get(st.enqueued[r])
        where = _user_frame(last) if last else None
        evidence.append(f"rank {r} stopped at #{st.enqueued[r]}" + (f" ({last.op}" + (f", enqueued at {where}" if where else "")
                        + ")" if last else "") + f" and never enqueued #{n}")
        evidence += _pending_elsewhere(r, st.pg, states)
    if no_dump:
        evidence.append(f"no Flight Recorder dump from {_plural(no_dump, 'rank', 'ranks')} (dead, or did not answer)")
    mismatches: list[str] = []
    for seq in sorted({s for ents in st.entries.values() for s in ents}):
        msgs, _ = _mismatch(st, seq)
        if msgs:
            mismatches += msgs
            break
    state_of = {r: st.entries[r][n].state for r in waiting if n in st.entries.get(r, {})}
    if state_of and any(e.backend != "gloo" for e in (st.entries[r][n] for r in state_of)) and len(set(state_of.values())) > 1:
        evidence.append(f"state of #{n}: " + ", ".join(f"rank {r} {v}" for r, v in sorted(state_of.items()))
                        + " (scheduled = the GPU never started the kernel: that rank's stream is stuck earlier)")
    if not missing and not mismatches:
        evidence.append(f"every member enqueued #{n} with the same op/sizes/dtypes but it never completed: a rank is "
                        "stuck inside the kernel or the network failed (check NCCL WARN lines)")
    if not missing and no_dump:
        missing = no_dump
    backend = next((d.backend for d in src.fr.values() if d.backend), None)
    if backend == "gloo":
        evidence.append("gloo Flight Recorder records no start/end times; completion comes from pg_status")
    return HangEntry(pg=f"{st.pg} ({desc})" if desc else st.pg, seq=n, op=normalize_op(ref.op if ref else None),
                     missing_ranks=missing, waiting_ranks=waiting, stacks={}, mismatches=mismatches,
                     evidence=evidence)


def _pending_elsewhere(rank: int, pg: str, states: list[_PGState]) -> list[str]:
    out = []
    for st in states:
        if st.pg == pg or rank not in st.enqueued:
            continue
        if st.enqueued[rank] > st.completed.get(rank, -1):
            e = st.entries.get(rank, {}).get(st.enqueued[rank])
            out.append(f"rank {rank} is itself waiting in #{st.enqueued[rank]}"
                       f"{f' ({e.op})' if e else ''} on pg {st.pg}: collectives of two groups issued in a different "
                       "order on different ranks deadlock")
    return out


def _user_frame(e: FREntry | None) -> str | None:
    """First FR frame outside library code: where the script enqueued the collective."""
    if e is None:
        return None
    for f in e.frames:
        fn = str(f.get("filename", ""))
        if fn and not is_library(fn):
            return Frame(fn, int(f["line"]) if str(f.get("line", "")).isdigit() else None, str(f.get("name", "?"))).short()
    return None


# ----------------------------------------------------------------------------- watchdog / stacks


def _from_watchdog(src: HangSources, world: int | None) -> HangEntry | None:
    timeouts = (src.nccl or {}).get("timeouts") or []
    if not timeouts:
        return None
    groups: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for t in timeouts:
        groups.setdefault((t.get("pg"), t.get("seq")), []).append(t)
    (pg, seq), recs = max(groups.items(), key=lambda kv: (len(kv[1]), -(kv[0][1] or 0)))
    waiting = sorted({t["rank"] for t in recs if t.get("rank") is not None})
    op = next((t.get("op") for t in recs if t.get("op")), None)
    evidence = [f"watchdog: {_plural(waiting, 'rank', 'ranks')} timed out in collective #{seq} ({op or '?'}) on pg "
                f"{pg if pg is not None else '?'}"
                + "".join(f"; rank {t['rank']} last enqueued #{t['last_enqueued']}, last completed #{t['last_completed']}"
                          for t in recs if t.get("last_enqueued") is not None)]
    first = next((t for t in recs if t.get("numel_in") is not None), None)
    if first:
        evidence.append(f"#{seq}: NumelIn={first['numel_in']} NumelOut={first['numel_out']}, timeout "
                        f"{first['timeout_ms']} ms")
    missing: list[int] = []
    if world:
        missing = sorted(set(range(world)) - set(waiting))
        if missing:
            evidence.append(f"{_plural(missing, 'rank', 'ranks')} reported no timeout on #{seq}: never joined it "
                            "(inferred from the world size)")
    guid = next((t.get("pg_guid") for t in recs if t.get("pg_guid")), None)
    desc = re.search(r"\(([^)]+)\)", guid) if guid else None
    if pg is not None and desc:
        pg = f"{pg} ({desc.group(1)})"
    return HangEntry(pg=str(pg) if pg is not None else "?", seq=seq, op=normalize_op(op), missing_ranks=missing,
                     waiting_ranks=waiting, stacks={}, mismatches=[], evidence=evidence)


def _from_debug_messages(src: HangSources) -> HangEntry | None:
    """``TORCH_DISTRIBUTED_DEBUG=DETAIL`` / ``monitored_barrier`` messages: they name culprits themselves."""
    msgs = (src.nccl or {}).get("torch_messages") or []
    missing: set[int] = set()
    waiting: set[int] = set()
    mismatches: list[str] = []
    evidence: list[str] = []
    for m in msgs:
        if m["kind"] == "monitored_barrier":
            missing |= set(m["missing_ranks"])
            if m.get("rank") is not None:
                waiting.add(m["rank"])
            evidence.append(f"monitored_barrier on rank {m.get('rank')}: ranks {_ranks(m['missing_ranks'])} failed to "
                            "pass it")
        elif m["kind"] == "fingerprint_mismatch":
            desc = "; ".join(f"rank {r} runs {fp}" for r, fp in m["ranks"].items())
            mismatches.append(f"TORCH_DISTRIBUTED_DEBUG=DETAIL: {desc}")
    if not (missing or mismatches):
        return None
    return HangEntry(pg="?", seq=None, op="barrier" if missing else "unknown",
                     missing_ranks=sorted(missing), waiting_ranks=sorted(waiting - missing), stacks={},
                     mismatches=mismatches, evidence=evidence)


def _from_stacks(src: HangSources, world: int | None) -> HangEntry | None:
    if not src.stacks:
        return None
    in_coll: dict[int, str] = {}
    elsewhere: list[int] = []
    for r, st in sorted(src.stacks.items()):
        main = st.main
        call = collective_call(main) if main else None
        if call:
            in_coll[r] = call
        else:
            elsewhere.append(r)
    if not in_coll:
        return None
    op = Counter(in_coll.values()).most_common(1)[0][0]
    waiting = sorted(in_coll)
    missing = sorted(elsewhere)
    evidence = [f"stacks: {_plural(waiting, 'rank', 'ranks')} blocked in torch.distributed.{op}"
                + (f"; {_plural(missing, 'rank', 'ranks')} outside any collective" if missing else "")]
    if world:
        no_stack = sorted(set(range(world)) - set(src.stacks))
        if no_stack:
            evidence.append(f"no stack dump from {_plural(no_stack, 'rank', 'ranks')}")
            if not missing:
                missing = no_stack
    return HangEntry(pg="?", seq=None, op=normalize_op(op), missing_ranks=missing, waiting_ranks=waiting,
                     stacks={}, mismatches=[], evidence=evidence)


# ----------------------------------------------------------------------------- assembly


def _world(src: HangSources) -> int | None:
    if src.world_size:
        return src.world_size
    seen = {r for r in (*src.fr, *src.stacks, *src.errors) if plausible_rank(r) is not None}
    for rec in src.hang_records:
        seen |= {int(r) for r in rec.get("last_step_per_rank") or {}}
    return max(seen) + 1 if seen else None


def diagnose(run_dir: str | Path) -> HangDiagnosis | None:
    """Full diagnosis (entry + one-sentence answer + the sources read), or None without hang evidence."""
    src = load_sources(run_dir)
    world = _world(src)
    entry = _from_fr(src, world)
    if entry is not None and src.nccl and src.nccl["timeouts"] and (watchdog := _from_watchdog(src, world)) is not None:
        entry["evidence"] += watchdog["evidence"][:1]
    inferred = entry is None
    entry = entry or _from_watchdog(src, world) or _from_debug_messages(src) or _from_stacks(src, world)
    debug = _from_debug_messages(src)
    if entry is not None and debug is not None and debug is not entry:
        entry["evidence"] += [x for x in debug["evidence"] if x not in entry["evidence"]]
        entry["mismatches"] += [x for x in debug["mismatches"] if x not in entry["mismatches"]]
        if not entry["missing_ranks"]:
            entry["missing_ranks"] = debug["missing_ranks"]
    if entry is None:
        timed_out = any(_is_timeout(e) for e in src.errors.values())
        if not (src.hang_records or timed_out):
            if src.problems and not src.any_evidence():
                raise TraceReadError("no readable hang evidence: " + "; ".join(src.problems[:3]), str(src.run_dir))
            return None  # e.g. a healthy run whose FR dumps show every collective completed
        evidence = ["no Flight Recorder entry, watchdog line or stack shows a rank inside a collective"]
        if src.fr:
            evidence.append("Flight Recorder: every collective enqueued was completed on every rank that dumped; "
                            "the stall is outside collectives")
        entry = HangEntry(pg="?", seq=None, op="unknown", missing_ranks=[], waiting_ranks=[],
                          stacks={}, mismatches=[], evidence=evidence)
    calls = _add_stacks(entry, src)
    _add_errors(entry, src)
    _add_hang_records(entry, src)
    if src.nccl:
        for d in src.nccl["diagnoses"]:
            if d["severity"] == "error" and d["id"] != "collective_timeout":
                entry["evidence"].append(f"NCCL log: {d['message']}")
    entry["evidence"] += [f"unreadable: {p}" for p in src.problems]
    return HangDiagnosis(entry=entry, headline=headline(entry, calls, inferred=inferred), sources=src)


def diagnose_hang(run_dir: Path) -> HangEntry | None:
    """``Report["hang"]`` for a RUN folder: culprits, waiting ranks, collective, stacks, evidence.

    Returns None when the folder holds no hang evidence (no FR dump, stack dump, hang.json,
    watchdog timeout line or timeout error file).
    """
    d = diagnose(run_dir)
    return d.entry if d else None


def _add_stacks(entry: HangEntry, src: HangSources) -> dict[int, str]:
    """Fill ``stacks`` (rank -> "file:line in function") and return rank -> the call on that line."""
    calls: dict[int, str] = {}
    for r, st in sorted(src.stacks.items()):
        main = st.main
        if main is None:
            continue
        frame = stuck_frame(main)
        coll = collective_call(main)
        if frame is None:
            if main.frames:
                entry["stacks"][str(r)] = main.frames[0].short()
            continue
        entry["stacks"][str(r)] = frame.short()
        text = source_line(frame)
        called = _CALL.search(text) if text else None
        call = called.group(1) if called else None
        if coll:
            call = f"in torch.distributed.{coll}"
        if call:
            calls[r] = call
        if r in entry.get("missing_ranks", []):
            entry["evidence"].append(f"rank {r} main thread: {frame.file}:{frame.line} in {frame.func}"
                                     + (f": {text}" if text else "") + f" ({st.fmt} dump)")
    return calls


def _add_errors(entry: HangEntry, src: HangSources) -> None:
    culprits = set(entry.get("missing_ranks", []))
    victims = sorted(r for r, e in src.errors.items() if _is_timeout(e))
    for r in victims:
        entry["evidence"].append(f"rank {r} error file: {_error_message(src.errors[r])[:200]}")
    for r, e in sorted(src.errors.items()):
        if r not in victims:
            entry["evidence"].append(f"rank {r} raised: {_error_message(e)[:200]}")
    named, verb = src.root_cause_rank, "names"
    if named is None and victims:
        stamps = {r: _error_time(src.errors[r]) for r in victims}
        named, verb = min(stamps, key=lambda r: (stamps[r] is None, stamps[r] or 0)), "will name"
    if named is not None and culprits and named not in culprits:
        entry["evidence"].append(
            f"torchrun's 'Root Cause (first observed failure)' {verb} rank {named}, the first process to exit after "
            f"timing out: a victim, not the culprit ({_plural(sorted(culprits), 'rank', 'ranks')})")


def _error_time(err: dict[str, Any]) -> float | None:
    msg = err.get("message")
    if isinstance(msg, dict):
        ts: Any = (msg.get("extraInfo") or {}).get("timestamp")
        try:
            return float(ts)
        except (TypeError, ValueError):
            return None
    return None


def _add_hang_records(entry: HangEntry, src: HangSources) -> None:
    for rec in src.hang_records:
        t = rec.get("timeout_s")
        entry["evidence"].append(
            f"collector watchdog: no progress for {t} s" if t is not None else "collector watchdog fired"
        )
        steps = {int(k): v for k, v in (rec.get("last_step_per_rank") or {}).items()}
        if steps and len(set(steps.values())) > 1:
            low = min(steps.values())
            behind = sorted(r for r, s in steps.items() if s == low)
            entry["evidence"].append(f"last optimizer step per rank {steps}: {_plural(behind, 'rank', 'ranks')} behind")
        unanswered = rec.get("unanswered_ranks") or []
        if unanswered:
            entry["evidence"].append(f"{_plural(sorted(unanswered), 'rank', 'ranks')} did not answer the dump request "
                                     "(process dead, or stuck in C code holding the GIL)")


def headline(entry: HangEntry, calls: dict[int, str] | None = None, *, inferred: bool = False) -> str:
    """The answer, one or two sentences: culprit, collective, where everyone is.

    ``inferred``: the culprits were deduced without Flight Recorder (from who did *not* time out or
    whose stack is outside a collective), so the sentence says "most likely".
    """
    calls = calls or {}
    missing = entry.get("missing_ranks") or []
    waiting = entry.get("waiting_ranks") or []
    seq = entry.get("seq")
    coll = f"{entry.get('op', 'unknown')}" + (f" #{seq}" if seq is not None else "")
    pg = entry.get("pg") or "?"
    where = f" on pg {pg}" if pg != "?" else ""
    parts = []
    if entry.get("mismatches"):
        parts.append("Collective mismatch: " + entry["mismatches"][0] + ".")
    if missing:
        verb = "most likely never joined" if inferred else "never joined"
        parts.append(f"{_plural(missing, 'Rank', 'Ranks')} {verb} {coll}{where}"
                     + (f"; {_plural(waiting, 'rank', 'ranks')} {'waits' if len(waiting) == 1 else 'wait'} in it."
                        if waiting else "."))
    elif waiting and not entry.get("mismatches"):
        parts.append(f"{_plural(waiting, 'Rank', 'Ranks')} {'waits' if len(waiting) == 1 else 'wait'} in {coll}{where}; "
                     "no rank is missing from it.")
    stacks = entry.get("stacks") or {}
    for r in missing:
        if str(r) in stacks:
            call = calls.get(r)
            parts.append(f"Rank {r} is at {stacks[str(r)]}" + (f" ({call})" if call else "") + ".")
    if not parts:
        parts.append("The job stopped making progress, but no source names a culprit rank.")
    return " ".join(parts)
