"""Why did the job hang? Every culprit rank, every stuck process group, and each culprit's line.

A distributed hang is one or a few ranks that stopped (a GPU that stopped, a host stuck, spinning or
stopped, a collective skipped or issued out of order) while every other rank waits, directly or
through other groups, until the timeout. The ranks that time out are *victims*; torchrun's "Root
Cause (first observed failure)" names the first victim to exit, not the culprit. Sources, best
first, all optional (:mod:`traceread.analysis.hang.sources` reads them):

1. Flight Recorder dumps, anywhere: every group, every culprit
   (:mod:`traceread.analysis.hang.attribution`).
2. PyTorch watchdog lines in NCCL/launcher logs: the ranks that report a timeout on (PG, N) wait in
   it; world members that report none are the suspects.
3. Stack dumps (faulthandler, py-spy): ranks whose main thread is inside a ``torch.distributed`` call
   wait; the others are the suspects. Always used for the "where" of each culprit.
4. torchelastic error files and the collector's ``hang.json`` add evidence (who timed out first, who
   stopped stepping, who did not answer the dump request); each culprit gets the last log line it wrote.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traceread.analysis.hang.attribution import WHY_TEXT, Attribution, Culprit, Stuck, attribute
from traceread.analysis.hang.flight_recorder import normalize_op
from traceread.analysis.hang.sources import HangSources, error_message, error_time, is_timeout, load_sources
from traceread.analysis.hang.stack_dumps import collective_call, source_line, stuck_frame
from traceread.errors import TraceReadError
from traceread.fmt import rank_runs
from traceread.read.jsonfile import plausible_rank
from traceread.report_schema import HangBehind, HangCulprit, HangEntry, HangGroup

__all__ = ["HangDiagnosis", "HangSources", "diagnose", "diagnose_hang", "headline", "normalize_op"]

_CALL = re.compile(r"([A-Za-z_][\w.]*)\s*\(")
#: Culprits spelled out in the evidence list; all are in ``culprits``.
MAX_LISTED = 50


@dataclass
class HangDiagnosis:
    entry: HangEntry
    headline: str
    sources: HangSources
    attribution: Attribution | None = None

    @property
    def lines(self) -> list[str]:
        """One line per culprit (or the single answer when there is no Flight Recorder); ranks without a
        dump that miss the same collective share one line."""
        return culprit_lines(self.entry.get("culprits") or []) or [self.headline]


def culprit_lines(culprits: list[HangCulprit]) -> list[str]:
    """Each culprit's summary, ranks with no dump and no stack that miss one collective folded into one line."""
    out: list[str] = []
    folded: dict[tuple[str, int], list[HangCulprit]] = {}
    for c in culprits:
        if c["why"] == "no_dump" and not c.get("stack"):
            key = (c["pg"], c["seq"])
            if key in folded:
                folded[key].append(c)
                continue
            folded[key] = [c]
        out.append(c["summary"])
    for i, line in enumerate(out):
        for cs in folded.values():
            if len(cs) > 1 and line == cs[0]["summary"]:
                ranks = [c["rank"] for c in cs]
                out[i] = f"Ranks {_ranks(ranks)}" + line[len(f"Rank {cs[0]['rank']}"):].replace(
                    " and left no Flight Recorder dump", " and left no Flight Recorder dumps")
    return out


def _ranks(ranks: list[int]) -> str:
    return ", ".join(rank_runs(sorted(ranks)))


def _plural(ranks: list[int], one: str, many: str) -> str:
    return f"{one} {_ranks(ranks)}" if len(ranks) == 1 else f"{many} {_ranks(ranks)}"


def _world(src: HangSources) -> int | None:
    if src.world_size:
        return src.world_size
    seen: set[int] = set(src.fr) | set(src.stacks) | set(src.errors)
    for rec in src.hang_records:
        steps = rec.get("last_step_per_rank")
        if isinstance(steps, dict):
            seen |= {int(r) for r in list(steps)[:1 << 16] if str(r).isdigit() and len(str(r)) < 8}
    seen = {r for r in seen if plausible_rank(r) is not None}
    return max(seen) + 1 if seen else None


# ----------------------------------------------------------------------------- Flight Recorder


def _group_json(s: Stuck) -> HangGroup:
    g = s.group
    note = None
    if s.done and (s.waiting or s.behind):
        past = sorted(s.done)
        note = f"{_plural(past, 'rank', 'ranks')} completed it and went past it"
        if not any(v.backend in ("gloo", "mpi", "ucc") for v in g.views.values()):
            note += (": it completed, so the members whose record never shows it complete are not waiting for "
                     "anyone (their GPU stopped)")
    elif not s.behind and s.waiting and not s.mismatch:
        note = "every member is in it and none completes"
        if any(v.backend not in ("gloo", "mpi", "ucc") and not v.timing for v in g.views.values()):
            note += ("; Flight Recorder recorded no start events, so it cannot tell which GPU never started it "
                     "(set TORCH_NCCL_ENABLE_TIMING=1)")
    behind: list[HangBehind] = []
    for r, why in sorted(s.behind.items()):
        v = g.views.get(r)
        behind.append(HangBehind(rank=r, why=why, enqueued=v.enqueued if v else None,
                                 completed=v.completed if v else None))
    return HangGroup(
        pg=g.pg, desc=g.desc, role=g.role, role_from=g.role_why, op=s.ref.op if s.ref else "unknown", seq=s.seq,
        sizes=s.ref.sizes if s.ref else "", dtype=s.ref.dtypes if s.ref else "", members=len(g.members),
        waiting=list(s.waiting), behind=behind, culprits=list(s.causes), enqueued_at=s.ref.where if s.ref else None,
        first=s.first, mismatch=list(s.mismatch), note=note, done=sorted(s.done))


def _culprit_line(c: Culprit) -> str:
    """The one line the text and HTML print for a culprit."""
    s = c.stuck
    what = s.what() if s else "a collective"
    waiting = [w for w in (s.waiting if s else []) if w != c.rank]
    others = len(set(c.victims) - set(waiting))
    tail = ""
    if waiting:
        tail = f"; {_plural(waiting, 'rank', 'ranks')} {'waits' if len(waiting) == 1 else 'wait'} in it"
    if others:
        tail += f" ({others} more rank{'s wait' if others > 1 else ' waits'} on it{' too' if waiting else ''})"
    if c.why == "host_elsewhere":
        return f"Rank {c.rank} never joined {what}{tail}."
    if c.why == "no_dump":
        return f"Rank {c.rank} never joined {what} and left no Flight Recorder dump (stopped or dead){tail}."
    if c.why == "gpu_stopped":
        likely = c.detail.startswith("GPU most likely stopped: ")  # inferred: no member completed it
        first = c.detail.split(";")[0].removeprefix("GPU stopped: ").removeprefix("GPU most likely stopped: ")
        return f"Rank {c.rank}'s GPU {'most likely ' if likely else ''}stopped: {first}{tail}."
    if c.why == "out_of_order":
        return f"Rank {c.rank} {c.detail}."
    return f"Rank {c.rank}: collective mismatch: {c.detail}."


def _culprit_json(c: Culprit, src: HangSources) -> HangCulprit:
    s = c.stuck
    stack = None
    st = src.stacks.get(c.rank)
    if st is not None and st.main is not None:
        f = stuck_frame(st.main) or (st.main.frames[0] if st.main.frames else None)
        if f is not None:
            text = _code(source_line(f))
            coll = collective_call(st.main)
            stack = f.short() + (f" ({text})" if text else "") + (f" in torch.distributed.{coll}" if coll else "")
    summary = _culprit_line(c)
    if stack and c.why in ("host_elsewhere", "no_dump", "out_of_order"):
        summary = summary[:-1] + f"; it is at {stack}."
    evidence = [c.detail] + list(c.evidence)
    if c.why == "no_dump":
        evidence.append("its stack: " + stack if stack else
                        "no stack dump either: the process is stopped (SIGSTOP, uninterruptible I/O) or gone"
                        if src.stacks else "no stack dumps in the folder")
    if c.positions:
        evidence.append("where it stopped: " + "; ".join(f"pg {pg}: enqueued #{e}, completed #{d}"
                                                         for pg, (e, d) in list(c.positions.items())[:20]))
    log = src.last_lines.get(c.rank)
    return HangCulprit(
        rank=c.rank, why=c.why, summary=summary, pg=s.group.pg if s else "?", role=s.group.role if s else "other",
        op=s.ref.op if s and s.ref else "unknown", seq=s.seq if s else -1, sizes=s.ref.sizes if s and s.ref else "",
        dtype=s.ref.dtypes if s and s.ref else "", waiting=[w for w in (s.waiting if s else []) if w != c.rank],
        victims=len(c.victims), stack=stack, log=log,
        positions={pg: [e, d] for pg, (e, d) in c.positions.items()}, evidence=evidence)


def _code(text: str | None) -> str | None:
    """A source line without its trailing comment (``time.sleep(5)  # wait`` -> ``time.sleep(5)``)."""
    if not text:
        return text
    cut = text.find("  #")
    return (text[:cut] if cut > 0 else text).strip() or None


def _from_fr(src: HangSources, world: int | None) -> tuple[HangEntry, Attribution] | None:
    a = attribute(src.fr, world)
    if not a.stuck:
        return None
    culprits = [_culprit_json(c, src) for c in a.culprits]
    groups = [_group_json(s) for s in a.stuck]
    top: Stuck | None = a.culprits[0].stuck if a.culprits else (a.unexplained[0] if a.unexplained else a.stuck[0])
    never = [c.rank for c in a.culprits if c.why != "mismatch"]
    evidence = [src.dumps.summary(world)]
    for c in culprits[:MAX_LISTED]:
        evidence.append(f"rank {c['rank']} ({WHY_TEXT.get(c['why'], c['why'])}): {c['evidence'][0]}")
        if c.get("log"):
            evidence.append(f"rank {c['rank']} last log line: {c['log']}")
    if len(culprits) > MAX_LISTED:
        evidence.append(f"… and {len(culprits) - MAX_LISTED} more culprits (all in 'culprits')")
    for s in a.unexplained:
        hint = ("every member's kernel started" if s.group.views and any(v.timing for v in s.group.views.values())
                else "Flight Recorder has no start events here (set TORCH_NCCL_ENABLE_TIMING=1 to see which GPU did "
                "not start it)" if any(v.backend not in ("gloo", "mpi", "ucc") for v in s.group.views.values())
                else "every member's thread is inside it")
        evidence.append(f"{s.what()}: every member ({_ranks(s.waiting)}) is in it and none completes: a GPU stopped "
                        f"inside it, or the network failed; {hint}")
    evidence += [f"note: {n}" for n in a.notes]
    for s in a.stuck[:MAX_LISTED]:
        if s.group.rebuilt:
            evidence.append(f"{s.group.label()}: members {_ranks(s.group.members)} rebuilt from {s.group.rebuilt} "
                            "(its dumps carry no usable pg_config)")
    if any(v.backend == "gloo" for d in src.fr.values() for v in d.groups.values()):
        evidence.append("gloo Flight Recorder records no start/end times: a rank is taken to be in its oldest "
                        "unfinished collective, completion comes from pg_status and retired entries")
    mismatches = [m for s in a.stuck for m in s.mismatch]
    entry = HangEntry(
        pg=top.group.label().removeprefix("pg ") if top else "?", seq=top.seq if top else None,
        op=normalize_op(top.ref.op if top and top.ref else None), missing_ranks=sorted(never),
        waiting_ranks=a.waiting_ranks(), stacks={}, mismatches=mismatches, evidence=evidence,
        culprits=culprits, groups=groups, dumps=src.dumps.summary(world))
    return entry, a


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
                          for t in recs[:20] if t.get("last_enqueued") is not None)]
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


def diagnose(run_dir: str | Path, workers: int | None = None) -> HangDiagnosis | None:
    """Full diagnosis (entry + answer + the sources read), or None without hang evidence.

    ``run_dir``: a run folder, any folder holding dumps (flat or nested), or one dump file.
    """
    src = load_sources(_latest_attempt(Path(run_dir)), workers)
    world = _world(src)
    attribution = None
    fr = _from_fr(src, world) if src.fr else None
    entry: HangEntry | None = None
    if fr is not None:
        entry, attribution = fr
        if src.nccl and src.nccl["timeouts"]:
            wd = _from_watchdog(src, world)
            if wd is not None:
                entry["evidence"] += wd["evidence"][:1]
    inferred = entry is None
    entry = entry or _from_watchdog(src, world) or _from_debug_messages(src) or _from_stacks(src, world)
    debug = _from_debug_messages(src)
    if entry is not None and debug is not None and debug is not entry:
        entry["evidence"] += [x for x in debug["evidence"] if x not in entry["evidence"]]
        entry["mismatches"] += [x for x in debug["mismatches"] if x not in entry["mismatches"]]
        if not entry["missing_ranks"]:
            entry["missing_ranks"] = debug["missing_ranks"]
    if entry is None:
        timed_out = any(is_timeout(e) for e in src.errors.values())
        if not (src.hang_records or timed_out):
            if src.problems and not src.any_evidence():
                raise TraceReadError("no readable hang evidence: " + "; ".join(src.problems[:3]), str(src.run_dir))
            return None  # e.g. a healthy run whose FR dumps show every collective completed
        evidence = ["no Flight Recorder entry, watchdog line or stack shows a rank inside a collective"]
        if src.fr:
            evidence.insert(0, src.dumps.summary(world))
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
    entry["evidence"] += [f"note: {n}" for n in src.notes[:MAX_LISTED]]
    entry["evidence"] += [f"unreadable: {p}" for p in src.problems[:MAX_LISTED]]
    if len(src.problems) > MAX_LISTED:
        entry["evidence"].append(f"… and {len(src.problems) - MAX_LISTED} more unreadable files")
    return HangDiagnosis(entry=entry, headline=headline(entry, calls, inferred=inferred), sources=src,
                         attribution=attribution)


def _latest_attempt(run_dir: Path) -> Path:
    """The folder of the latest torchrun attempt that left hang evidence (``RUN/attempts/attempt{K}``: its
    dumps, stacks or errors), else ``run_dir`` itself (attempt 0, or no restart)."""
    from traceread.analysis.hang.failure import attempt_folders

    if not run_dir.is_dir() or not (run_dir / "attempts").is_dir():
        return run_dir
    for _k, folder in reversed(attempt_folders(run_dir)[1:]):
        if any(any(f.stat().st_size for f in (folder / sub).glob("*") if f.is_file())
               for sub in ("fr", "stacks", "errors") if (folder / sub).is_dir()):
            return folder
    return run_dir


def diagnose_hang(run_dir: Path, workers: int | None = None) -> HangEntry | None:
    """``Report["hang"]`` for a RUN folder: culprits, stuck groups, waiting ranks, stacks, evidence.

    Returns None when the folder holds no hang evidence (no FR dump with an unfinished collective, no
    stack dump, hang.json, watchdog timeout line or timeout error file).
    """
    d = diagnose(run_dir, workers)
    return d.entry if d else None


def _add_stacks(entry: HangEntry, src: HangSources) -> dict[int, str]:
    """Fill ``stacks`` (rank -> "file:line in function") and return rank -> the call on that line."""
    calls: dict[int, str] = {}
    named = set(entry.get("missing_ranks", [])) | {c["rank"] for c in entry.get("culprits") or []}
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
        text = source_line(frame) if r in named else None
        m = _CALL.search(text) if text else None
        call = m.group(1) if m else None
        if coll:
            call = f"in torch.distributed.{coll}"
        if call:
            calls[r] = call
        if r in named:
            entry["evidence"].append(f"rank {r} main thread: {frame.file}:{frame.line} in {frame.func}"
                                     + (f": {text}" if text else "") + f" ({st.fmt} dump)")
    return calls


def _add_errors(entry: HangEntry, src: HangSources) -> None:
    culprits = set(entry.get("missing_ranks", []))
    victims = sorted(r for r, e in src.errors.items() if is_timeout(e))
    for r in victims[:MAX_LISTED]:
        entry["evidence"].append(f"rank {r} error file: {error_message(src.errors[r])[:200]}")
    for r, e in sorted(src.errors.items())[:MAX_LISTED]:
        if r not in victims:
            entry["evidence"].append(f"rank {r} raised: {error_message(e)[:200]}")
    named, verb = src.root_cause_rank, "names"
    if named is None and victims:
        stamps = {r: error_time(src.errors[r]) for r in victims}
        named, verb = min(stamps, key=lambda r: (stamps[r] is None, stamps[r] or 0)), "will name"
    if named is not None and culprits and named not in culprits:
        entry["evidence"].append(
            f"torchrun's 'Root Cause (first observed failure)' {verb} rank {named}, the first process to exit after "
            f"timing out: a victim, not the culprit ({_plural(sorted(culprits), 'rank', 'ranks')})")


def _add_hang_records(entry: HangEntry, src: HangSources) -> None:
    for rec in src.hang_records:
        t = rec.get("timeout_s")
        t = t if isinstance(t, (int, float)) and not isinstance(t, bool) else None
        entry["evidence"].append(
            f"collector watchdog: no progress for {t} s" if t is not None else "collector watchdog fired"
        )
        raw = rec.get("last_step_per_rank")
        steps = {int(k): v for k, v in list(raw.items())[:1 << 16]
                 if str(k).isdigit() and len(str(k)) < 8 and isinstance(v, int)} if isinstance(raw, dict) else {}
        if steps and len(set(steps.values())) > 1:
            low = min(steps.values())
            behind = sorted(r for r, s in steps.items() if s == low)
            entry["evidence"].append(f"last optimizer step per rank: {_plural(behind, 'rank', 'ranks')} behind "
                                     f"(step {low}; others up to {max(steps.values())})")
        unanswered = rec.get("unanswered_ranks")
        unanswered = [r for r in unanswered[:1 << 16] if isinstance(r, int)] if isinstance(unanswered, list) else []
        if unanswered:
            entry["evidence"].append(f"{_plural(sorted(unanswered), 'rank', 'ranks')} did not answer the dump request "
                                     "(process dead, or stuck in C code holding the GIL)")


def headline(entry: HangEntry, calls: dict[int, str] | None = None, *, inferred: bool = False) -> str:
    """The answer: one sentence per culprit (Flight Recorder), or culprit, collective and where everyone is.

    ``inferred``: the culprits were deduced without Flight Recorder (from who did *not* time out or
    whose stack is outside a collective), so the sentence says "most likely".
    """
    calls = calls or {}
    culprits = entry.get("culprits") or []
    stacks = entry.get("stacks") or {}
    if culprits:
        lines = culprit_lines(culprits)
        return " ".join(lines[:3]) + (f" (+{len(lines) - 3} more)" if len(lines) > 3 else "")
    stuck_in = [g for g in entry.get("groups") or [] if g.get("waiting")]
    groups = [g for g in stuck_in if str(g.get("note") or "").startswith("every member")] or stuck_in
    if groups:
        g = groups[0]
        what = f"{g['op']} #{g['seq']} on pg {g['pg']} ({g.get('role')}" + (
            f", {g['desc']})" if g.get("desc") and g["desc"] != "undefined" else ")")
        no_start = "start events" in (g.get("note") or "")
        if len(g["waiting"]) == 1:  # one member: it is the one whose GPU never finished the collective
            return (f"Rank {g['waiting'][0]} is in {what} and it never completes: its GPU stopped inside or before it"
                    + (", or the network failed." if (g.get("members") or 1) > 1 else ".")
                    + (" Flight Recorder recorded no start events, so it cannot tell whether the GPU started it "
                       "(set TORCH_NCCL_ENABLE_TIMING=1)." if no_start else ""))
        hint = "" if not no_start else (
            " Flight Recorder recorded no start events, so it cannot tell which of their GPUs never started it "
            "(set TORCH_NCCL_ENABLE_TIMING=1).")
        return (f"Ranks {_ranks(g['waiting'])} are all in {what} and none completes, but no rank is missing from it: "
                f"a GPU stopped inside or before it, or the network failed.{hint}")
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
    for r in missing[:8]:
        if str(r) in stacks:
            call = calls.get(r)
            parts.append(f"Rank {r} is at {stacks[str(r)]}" + (f" ({call})" if call else "") + ".")
    if not parts:
        parts.append("The job stopped making progress, but no source names a culprit rank.")
    return " ".join(parts)
