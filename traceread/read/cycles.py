"""Which trace files belong together: group a folder into runs and profiling cycles, pick one.

A folder may hold several profiling windows ("cycles") of one job — ``traceread collect --repeat K``
or ``--every N`` (``traces/cycle{C}/rank{R}...``), ``torch.profiler.schedule(repeat=K)`` with
``tensorboard_trace_handler`` (``worker{r}.{timestamp}.pt.trace.json``, ``{host}_{pid}.{timestamp}...``)
— and even several runs. Evidence, strongest first (definitions in docs/cycles.md):

1. ``run.json`` of a collected run and a ``cycle{C}`` folder/name part: the cycle is named.
2. Profiler step numbers (``ProfilerStep#N``): the ranks of one cycle record the same steps;
   step numbers going backwards between cycles mean the job was restarted (a new run).
3. Job shape (``distributedInfo`` world size and backend): different shapes are different runs.
4. Time: the trace start (first step, ``baseTimeNanoseconds`` + ``ts``), else the timestamp in
   the file name; used to order cycles and to split two runs that recorded the same steps.

The cheap path needs no reading: when every file has its own rank in its name and no name
carries a timestamp or cycle, the files are one cycle (what the report always did). Otherwise
each file is *peeked* (:func:`traceread.read.peek.peek`): a light decode keeping only the header
and the step / start-up events, no tables.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import median
from typing import TYPE_CHECKING, Any

from traceread.errors import RankConflictError
from traceread.read.peek import FileFacts, name_facts, peek, sketch_similarity

if TYPE_CHECKING:
    from traceread.report_schema import Report

__all__ = ["Cycle", "CycleChoiceError", "FileFacts", "Selection", "annotate", "choose", "chosen_files",
           "group_cycles", "name_facts", "peek", "select"]


@dataclass
class Cycle:
    """One profiling window of one run: the files to analyse together."""

    run: int
    cycle: int
    files: list[FileFacts]
    world_size: int | None = None
    complete: bool = True
    warmup: Any = None  # analysis.warmup.Verdict, when judged
    label_source: str = "order"  # "collect" (named cycle{C}) | "order" (by steps/time)

    @property
    def ranks(self) -> list[int]:
        return sorted(f.rank for f in self.files if f.rank is not None)

    @property
    def steps(self) -> list[int] | None:
        s = sorted({k for f in self.files for k in f.steps})
        return [s[0], s[-1]] if s else None

    @property
    def start_ns(self) -> int | None:
        t = [f.time_ns for f in self.files if f.time_ns is not None]
        return min(t) if t else None

    @property
    def label(self) -> str:
        return f"{self.run}:{self.cycle}"

    def to_json(self) -> dict[str, Any]:
        w = self.warmup
        return {"run": self.run, "cycle": self.cycle, "label": self.label, "files": len(self.files),
                "ranks": self.ranks, "world_size": self.world_size, "steps": self.steps,
                "start_ns": self.start_ns, "complete": self.complete,
                "warmup": bool(w.is_warmup) if w is not None else None,
                "warmup_reasons": list(w.reasons) if w is not None else []}


# ------------------------------------------------------------------------------------ grouping


def _needs_peek(facts: list[FileFacts]) -> bool:
    """False when names alone say "one cycle of one run": distinct ranks, no time/cycle in names."""
    if len(facts) <= 1:
        return False
    if any(f.name_time_ns is not None for f in facts):
        return True
    if any(f.cycle_hint is not None for f in facts):
        return False  # collect's layout: cycles are named (run.json has the rest)
    ranks = [f.rank for f in facts]
    return None in ranks or len(set(ranks)) != len(ranks)


#: Ranks of one job record the same steps at the same time; their windows may disagree by the hosts'
#: clock skew, never by this much (ns).
SAME_TIME_NS = 60 * 10**9
#: Below this estimated overlap of kernel (or operator) names two files ran different models.
SAME_MODEL = 0.5


def _windows_meet(group: list[FileFacts], f: FileFacts) -> bool:
    """Whether ``f``'s recorded window overlaps the group's (within :data:`SAME_TIME_NS`); True when
    a window is unknown."""
    starts = [g.start_ns for g in group if g.start_ns is not None]
    ends = [g.end_ns if g.end_ns is not None else g.start_ns for g in group if g.start_ns is not None]
    if not starts or f.start_ns is None:
        return True
    f_end = f.end_ns if f.end_ns is not None else f.start_ns
    return f.start_ns <= max(ends) + SAME_TIME_NS and f_end >= min(starts) - SAME_TIME_NS


def same_job(a: FileFacts, b: FileFacts) -> bool:
    """Whether two files can be ranks (or cycles) of one job: same GPU model, same job shape
    (distributedInfo present or not, world size, backend) and the same model (kernel names)."""
    if a.device and b.device and a.device != b.device:
        return False
    if a.distributed is not None and b.distributed is not None and a.distributed != b.distributed:
        return False
    for field_ in ("world_size", "backend"):
        x, y = getattr(a, field_), getattr(b, field_)
        if x is not None and y is not None and x != y:
            return False
    sim = sketch_similarity(a.sketch, b.sketch)
    return sim is None or sim >= SAME_MODEL


def _split_by_time(files: list[FileFacts]) -> list[list[FileFacts]]:
    """Files in time order, a new group whenever a rank repeats (two runs of the same steps), the
    recorded windows do not meet (ranks of one job run the same step at the same time), or the file
    cannot be of the group's job (:func:`same_job`)."""
    groups: list[list[FileFacts]] = []
    for f in sorted(files, key=lambda f: (f.time_ns or 0, f.name_time_ns or 0, str(f.path))):
        if (not groups or (f.rank is not None and f.rank in {g.rank for g in groups[-1]})
                or not _windows_meet(groups[-1], f) or not same_job(groups[-1][0], f)):
            groups.append([])
        groups[-1].append(f)
    return groups


def _by_steps(files: list[FileFacts]) -> list[list[FileFacts]]:
    """Files whose step ranges overlap are one cycle; files without steps are grouped by time."""
    with_steps = sorted((f for f in files if f.steps), key=lambda f: (min(f.steps), max(f.steps)))
    groups: list[list[FileFacts]] = []
    hi = None
    for f in with_steps:
        lo_f, hi_f = min(f.steps), max(f.steps)
        if groups and hi is not None and lo_f <= hi:
            groups[-1].append(f)
            hi = max(hi, hi_f)
        else:
            groups.append([f])
            hi = hi_f
    out: list[list[FileFacts]] = []
    for g in groups:
        out.extend(_split_by_time(g))
    without = [f for f in files if not f.steps]
    if without:
        out.extend(_split_by_time(without))
    return out


def _shape_key(f: FileFacts) -> tuple[str, int, str, str]:
    return (f.run_dir or "", f.world_size or 0, f.backend or "", f.device or "")


def group_cycles(facts: list[FileFacts]) -> list[Cycle]:
    """Runs and cycles, in time order (run 1 first; cycles numbered from 1 within a run)."""
    if not facts:
        return []
    if all(f.cycle_hint is not None for f in facts):
        raw: dict[tuple[str, int], list[FileFacts]] = {}
        for f in facts:
            raw.setdefault((f.run_dir or "", f.cycle_hint or 0), []).append(f)
        runs: dict[str, list[tuple[int, list[FileFacts]]]] = {}
        for (rd, c), fs in sorted(raw.items()):
            runs.setdefault(rd, []).append((c, fs))
        out: list[Cycle] = []
        for ri, (_rd, cs) in enumerate(sorted(runs.items()), start=1):
            out.extend(Cycle(run=ri, cycle=c, files=fs, label_source="collect") for c, fs in cs)
        return _finish(out)
    shapes: dict[tuple[str, int, str, str], list[FileFacts]] = {}
    for f in facts:
        shapes.setdefault(_shape_key(f), []).append(f)
    # a file whose job shape is unknown joins the only known shape of its run folder (same GPU), if any
    for key in [k for k in shapes if k[1] == 0 and not k[2]]:
        known = [k for k in shapes if k[0] == key[0] and k != key and (not key[3] or not k[3] or k[3] == key[3])]
        if len(known) == 1 and all(same_job(shapes[known[0]][0], f) for f in shapes[key]):
            shapes[known[0]].extend(shapes.pop(key))
    groups: list[list[FileFacts]] = []
    for fs in shapes.values():
        groups.extend(_by_steps(fs))
    groups.sort(key=lambda g: (min((f.time_ns for f in g if f.time_ns is not None), default=0),
                               min((min(f.steps) for f in g if f.steps), default=0)))
    # runs: same shape and steps moving forward; a new shape or steps going backwards starts a run
    cycles: list[Cycle] = []
    run_of_shape: dict[tuple[str, int, str, str], tuple[int, int, int]] = {}  # shape -> (run, last cycle, last step)
    next_run = 0
    for g in groups:
        shape = next((_shape_key(f) for f in g if f.world_size or f.backend), _shape_key(g[0]))
        lo = min((min(f.steps) for f in g if f.steps), default=None)
        hi = max((max(f.steps) for f in g if f.steps), default=None)
        prev = run_of_shape.get(shape)
        if prev is None or (lo is not None and lo <= prev[2]):
            next_run += 1
            run, c = next_run, 1
        else:
            run, c = prev[0], prev[1] + 1
        run_of_shape[shape] = (run, c, hi if hi is not None else (prev[2] if prev else -1))
        cycles.append(Cycle(run=run, cycle=c, files=g))
    return _finish(cycles)


def _finish(cycles: list[Cycle]) -> list[Cycle]:
    """World size and completeness of each cycle (every rank of the world, same steps)."""
    most: dict[int, int] = {}
    for c in cycles:
        most[c.run] = max(most.get(c.run, 0), len(c.files))
    for c in cycles:
        sizes = {f.world_size for f in c.files if f.world_size}
        c.world_size = max(sizes) if sizes else None
        want = c.world_size or most[c.run]
        ranks = c.ranks
        same_steps = len({tuple(sorted(f.steps)) for f in c.files if f.steps}) <= 1
        c.complete = len(c.files) == want and len(set(ranks)) == len(ranks) and same_steps
    return sorted(cycles, key=lambda c: (c.run, c.cycle))


# ------------------------------------------------------------------------------------ choosing


@dataclass
class Selection:
    """What was chosen among the cycles found, and why (for the report's ``source``/warnings)."""

    cycles: list[Cycle]
    chosen: list[Cycle]
    why: str = ""

    def source_fields(self) -> dict[str, Any]:
        """Additive ``source`` fields: ``cycle`` (the analysed one) and ``cycles`` (all found)."""
        if len(self.cycles) <= 1:
            return {"cycle": self.chosen[0].to_json()} if self.chosen else {}
        return {"cycle": self.chosen[0].to_json() if len(self.chosen) == 1 else None,
                "cycles": [c.to_json() for c in self.cycles], "cycle_choice": self.why}


class CycleChoiceError(ValueError):
    """``--cycle`` names a cycle that is not there."""


def judge_warmup(cycles: list[Cycle]) -> None:
    """Warm-up verdict of each cycle from its peeked files (analysis.warmup)."""
    from traceread.read.warmup import judge

    for c in cycles:
        peeked = [f for f in c.files if f.peeked]
        if not peeked:
            continue
        steps: dict[int, list[float]] = {}
        for f in peeked:
            for s, d in f.steps.items():
                steps.setdefault(s, []).append(d)
        c.warmup = judge([median(v) for _, v in sorted(steps.items())], _longest_per_name(f.warm_names for f in peeked))


def _longest_per_name(per_file: Iterable[dict[str, float]]) -> dict[str, float]:
    """Start-up event name -> its largest total over the files (or ranks) of one cycle."""
    names: dict[str, float] = {}
    for one in per_file:
        for n, d in one.items():
            names[n] = max(names.get(n, 0.0), d)
    return names


def _skip_as_warmup(c: Cycle, run: list[Cycle]) -> bool:
    """Not a default choice: a warm-up cycle that is its run's first, or that holds start-up work
    (compilation, autotuning); a later cycle with only a slow first step is noise, not warm-up."""
    w = c.warmup
    return w is not None and w.is_warmup and (c is run[0] or bool(w.startup_events))


def choose(cycles: list[Cycle], want: str | None) -> Selection:
    """``want``: None/"latest" (default), "all", "N" (cycle N of the latest run) or "R:N"."""
    if not cycles:
        return Selection(cycles, [], "")
    want = (want or "latest").strip().lower()
    last_run = max(c.run for c in cycles)
    if want == "all":
        mine = [c for c in cycles if c.run == last_run]
        return Selection(cycles, mine, f"all {len(mine)} cycles of run {last_run}")
    if want != "latest":
        m = re.fullmatch(r"(?:(\d+):)?(\d+)", want)
        if not m:
            raise CycleChoiceError(f"--cycle {want!r}: use latest, all, N or RUN:N")
        run = int(m.group(1)) if m.group(1) else last_run
        hit = [c for c in cycles if c.run == run and c.cycle == int(m.group(2))]
        if not hit:
            have = ", ".join(c.label for c in cycles)
            raise CycleChoiceError(f"--cycle {want}: no such cycle (found run:cycle {have})")
        return Selection(cycles, hit, f"cycle {hit[0].label} as asked")
    mine = [c for c in cycles if c.run == last_run]
    good = [c for c in mine if c.complete and not _skip_as_warmup(c, mine)]
    pick = (good or [c for c in mine if c.complete] or mine)[-1]
    why = f"latest complete cycle {pick.cycle} of run {last_run}"
    if not good:
        why = f"cycle {pick.cycle} of run {last_run} (no complete steady-state cycle)"
    skipped = [c for c in mine if c.cycle > pick.cycle]
    if skipped:
        why += "; later " + ", ".join(
            f"{c.cycle} ({'warm-up' if c.complete else 'incomplete'})" for c in skipped) + " skipped"
    return Selection(cycles, [pick], why)


def select(files: Sequence[Path], want: str | None, warnings: list[str]) -> Selection:
    """Group ``files`` into cycles and choose per ``want``; says what it chose in ``warnings``."""
    facts = [name_facts(Path(f)) for f in files]
    if _needs_peek(facts):
        facts = [peek(f) for f in facts]
    broken = [f for f in facts if f.unreadable]  # always read, so the report names what is wrong
    cycles = group_cycles([f for f in facts if not f.unreadable])
    if not cycles:
        return Selection([], [Cycle(run=1, cycle=1, files=broken)] if broken else [], "")
    if len(cycles) > 1:
        # warm-up needs the steps of each cycle: peek one file per cycle if names decided the groups
        for c in cycles:
            if not any(f.peeked for f in c.files):
                peek(min(c.files, key=lambda f: (f.rank if f.rank is not None else 1 << 30, str(f.path))))
        judge_warmup(cycles)
        _finish(cycles)  # world sizes the peeks found
    jobs = distinct_jobs(cycles)
    if len(jobs) > 1 and (want or "latest").strip().lower() in ("latest", "all"):
        raise RankConflictError(_jobs_line(jobs))
    sel = choose(cycles, want)
    if len(cycles) > 1 and len(sel.chosen) == 1:
        runs = len({c.run for c in cycles})
        found = f"{len(cycles)} profiling cycles" + (f" in {runs} runs" if runs > 1 else "")
        warnings.append(f"{found} found; analysing {sel.why} (choose with --cycle N|RUN:N|all|latest)")
    if broken and len(cycles) > 1:  # it belongs to no cycle we can tell: name it, analyse the rest
        warnings.extend(f"skipped {f.path}: {f.unreadable} (not assigned to a profiling cycle)" for f in broken)
    elif broken and sel.chosen:  # one cycle: the reader reports it as that cycle's missing rank
        sel.chosen[-1].files.extend(broken)
    return sel


def distinct_jobs(cycles: list[Cycle]) -> list[list[Cycle]]:
    """The runs grouped into jobs: runs whose files could be one job (:func:`same_job`: GPU model,
    shape, model) are one job restarted or profiled again; others are different jobs."""
    jobs: list[list[Cycle]] = []
    for c in cycles:
        rep = c.files[0]
        home = next((j for j in jobs if same_job(j[0].files[0], rep)), None)
        if home is None:
            jobs.append([c])
        else:
            home.append(c)
    return jobs


def _jobs_line(jobs: list[list[Cycle]]) -> str:
    """One line naming the jobs found and what to do."""
    parts = []
    for i, job in enumerate(jobs, start=1):
        files = sorted(str(f.path.name) for c in job for f in c.files)
        shown = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
        dev = job[0].files[0].device
        parts.append(f"job {i}: {shown}" + (f" ({dev})" if dev else ""))
    return (f"the files are {len(jobs)} different jobs (different GPUs, job shape, model or time): "
            + "; ".join(parts) + ". Report each on its own (traceread report <its files>), or pick one with "
            "--cycle RUN:N")


def chosen_files(sel: Selection, order: Sequence[Path]) -> list[Path]:
    """The chosen cycles' files, in the order of ``order`` (the search order the engine expects)."""
    keep = {f.path for c in sel.chosen for f in c.files}
    return [p for p in order if p in keep]


def annotate(report: Report, sel: Selection, warnings: list[str],
             warm_names: Sequence[dict[str, float]]) -> None:
    """After the engine ran: the ``source`` cycle fields and, when the analysed steps look like
    warm-up (analysis.warmup), a warning saying so and what to record instead. ``warm_names``: the
    start-up events each rank's summary found (the map read every event, so no file is read again)."""
    from traceread.read.warmup import judge, report_step_us

    if len(sel.chosen) != 1:
        return
    c = sel.chosen[0]
    names = _longest_per_name(warm_names)
    steps = report_step_us(report.get("ranks") or [])
    if steps or names:
        c.warmup = judge(steps, names)
    _finish(sel.cycles)
    report.setdefault("source", {}).update(sel.source_fields())
    if c.warmup is not None and c.warmup.is_warmup:
        warnings.append("recorded steps look like warm-up, not the steady state: " + "; ".join(c.warmup.reasons)
                        + ". Record later steps (traceread collect --wait N) or several cycles "
                          "(--repeat K / --every N) and report the latest")
