"""The report of a watched run: the whole job's step time, and each captured window against the baseline.

Above :mod:`traceread.assemble.report`, like :mod:`traceread.compare.cycles`: the baseline is the
run's default window (``RUN/traces/``, the report as always); each capture (``RUN/captures/capture{N}``,
:mod:`traceread.read.watch`) is analysed by the same report, and the two documents are compared.
Definitions (docs/watch-report.md), all per step, µs:

* ``baseline_step_us`` / ``step_us`` — median step of the baseline / the capture (``median_step_us``);
  ``excess_us`` = their difference;
* ``what`` — the step-ledger category whose per-step time grew most (the job ledger's window parts ÷
  its steps, summed over ranks), with its growth; ``growth`` lists the categories that grew;
* ``rank`` — the rank it came from: the capture's top straggler when its blame is at least
  :data:`RANK_SHARE` of the excess, else a rank whose compute grew :data:`ALONE_FACTOR` × the others',
  else the one rank a `rank_late` trigger names, else None (the whole job);
* ``host_span`` — on that rank (every rank's median when None), the host span (operator,
  annotation) whose self time per step grew most, when that growth is at least :data:`SPAN_SHARE` of
  the excess; ``kernel`` — likewise for GPU kernels (total time per step);
* ``waited_in`` — where the others waited for that rank: the capture's collective with the most wait;
* ``slow_steps`` / ``n_slow_steps`` / ``lost_us`` — from the step series (every step): the run of
  consecutive steps, from the trigger's ``since_step`` (or the capture's first step) on, whose job step
  time's median over :data:`MEDIAN_STEPS` steps centred on it exceeds the baseline by at least
  :data:`SLOW_FRACTION` of the excess; ``lost_us`` = Σ over those steps
  of (step time − baseline). Without a series: the excess × the capture's steps.

The run's answer is the capture with the largest ``lost_us`` (``watch.answer``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from statistics import median
from typing import TYPE_CHECKING, Any

from traceread.assemble.queries import median_step_us, per_step
from traceread.fmt import ms, short_name

if TYPE_CHECKING:
    from traceread.options import ReportOptions
    from traceread.read.watch import Capture, StepSeries
    from traceread.report_schema import Report

RANK_SHARE = 0.25
SPAN_SHARE = 0.25
KERNEL_SHARE = 0.1
COMPUTE = ("compute_bound", "memory_bound", "compute_other")
HOST = ("host_bound", "idle_other", "dependency")
ALONE_FACTOR = 3.0
SLOW_FRACTION = 0.5
MEDIAN_STEPS = 5
#: A capture whose step grew less than this share of the baseline step has "no change".
NOISE_SHARE = 0.05
#: A change is the run's answer only when it lost at least this share of the job's time (the series' sum).
MIN_JOB_SHARE = 0.01
#: A ``stall`` trigger's step counts when it took at least this many baseline steps.
STALL_FACTOR = 3.0
SERIES_POINTS = 1000
ROLE_WORDS = {"dp": "gradient", "tp": "tensor-parallel", "pp": "pipeline", "ep": "expert", "cp": "context-parallel"}
CATEGORY_TEXT = {"host_bound": "host-bound idle", "compute_bound": "compute", "memory_bound": "memory-bound compute",
                 "compute_other": "other compute", "comm_transfer": "communication", "comm_wait": "waiting in collectives",
                 "exposed_memcpy": "exposed memcpy", "dependency": "dependency waits", "idle_other": "idle",
                 "pipeline_bubble": "pipeline bubble"}


def run_dir_of(paths: Sequence[str | Path]) -> Path | None:
    """The run folder a watched report reads: a path holding a step series, captures or telemetry
    (also under a per-host sub-folder). Cheap: the report of a plain folder imports nothing more."""
    for p in paths:
        if isinstance(p, str) and "://" in p:
            continue
        q = Path(p)
        if not q.is_dir():
            continue
        try:
            dirs = [q, *(d for d in q.iterdir() if d.is_dir())]
        except OSError:
            continue
        for d in dirs:
            if any((d / "progress").glob("rank*.steps")) or (d / "captures").is_dir() or (d / "telemetry").is_dir():
                return q
    return None


def build_watched(paths: Sequence[str | Path], options: ReportOptions) -> Report:
    """The report as always (``--cycle all`` included), plus ``watch`` and ``telemetry`` when the run
    folder has a step series, captures or GPU telemetry."""
    from traceread.assemble.report import build_report

    if (options.cycle or "latest").strip().lower() == "all":
        from traceread.compare.cycles import build_all_cycles

        doc = build_all_cycles(paths, options)
    else:
        doc = build_report(paths, options)
    run_dir = run_dir_of(paths)
    if run_dir is None:
        return doc
    warnings = doc.setdefault("warnings", [])
    from traceread.compare import telemetry_join
    from traceread.errors import guarded

    gpus = guarded("GPU telemetry", warnings, lambda: telemetry_join.join(doc, run_dir, options, warnings.append), [])
    watch = guarded("watched run", warnings, lambda: watch_section(doc, run_dir, options, warnings.append, gpus))
    if watch is not None:
        doc["watch"] = watch
    return doc


def watch_section(base: Report, run_dir: Path, options: ReportOptions, warn: Callable[[str], None],
                  gpus: Sequence[Any] = ()) -> dict[str, Any] | None:
    """``report["watch"]``: the series (downsampled), each capture compared, the answer."""
    from traceread.read.watch import find_captures, read_series

    series = read_series(run_dir, warn)
    captures = find_captures(run_dir, warn)
    if series is None and not captures:
        return None
    profiler_steps = _steps_of(base)
    shift = _profiler_shift(run_dir)
    base_steps = [profiler_steps[0] + shift, profiler_steps[1] + shift] if profiler_steps else None
    rows = []
    for cap in captures:
        row = compare_capture(base, cap, series, options, warn, gpus, base_steps)
        if row is not None:
            rows.append(row)
    job_us = float(series.job_us.sum()) if series is not None and len(series.job_us) else None
    changed = [r for r in rows if r.get("changed")
               and (job_us is None or float(r.get("lost_us") or 0.0) >= MIN_JOB_SHARE * job_us)]
    answer = max(changed, key=lambda r: r.get("lost_us") or 0.0) if changed else None
    anchor = None  # a step both the baseline trace and the series hold: maps wall time onto the trace clock
    if series is not None and base_steps is not None and profiler_steps is not None:
        wall = series.wall_ns(base_steps[1])
        anchor = {"step": profiler_steps[1], "wall_ns": wall} if wall is not None else None
    return {"series": downsample(series) if series is not None else None, "baseline_steps": base_steps,
            "baseline_profiler_steps": profiler_steps, "anchor": anchor, "captures": rows, "answer": answer}


def _profiler_shift(run_dir: Path) -> int:
    """Optimizer step − ProfilerStep number in the default window: ``traceread collect`` starts its
    profiler at optimizer step ``profile_start_step`` (run.json, per rank), and ProfilerStep#N is then
    optimizer step N + that + 1 (docs/watch.md). 0 when run.json does not say (not a collected run):
    the series and the trace are taken to number steps alike. Captures number their ProfilerSteps as
    optimizer steps already."""
    from traceread.read.jsonfile import load_json_object

    info = load_json_object(run_dir / "run.json", None) if (run_dir / "run.json").is_file() else None
    ranks = (info or {}).get("ranks")
    starts = {r.get("profile_start_step") for r in ranks.values() if isinstance(r, dict)} if isinstance(ranks, dict) else set()
    starts.discard(None)
    if len(starts) == 1:
        start = next(iter(starts))
        if isinstance(start, int) and start >= 0:
            return start + 1
    return 0


def _steps_of(doc: Report) -> list[int] | None:
    steps = sorted({int(s["step"]) for r in doc.get("ranks") or [] for s in r.get("steps") or [] if s.get("step") is not None})
    return [steps[0], steps[-1]] if steps else None


def downsample(series: StepSeries, points: int = SERIES_POINTS) -> dict[str, Any]:
    """The job series in at most ``points`` buckets (first/last step, median and max step time), and
    each rank's bucketed mean."""
    import numpy as np

    n = len(series.steps)
    width = max(1, -(-n // points))
    first, last, med, top, wall = [], [], [], [], []
    for i in range(0, n, width):
        s = series.steps[i:i + width]
        v = series.job_us[i:i + width]
        wall.append(int(series.end_ns[min(n, i + width) - 1]))
        first.append(int(s[0]))
        last.append(int(s[-1]))
        med.append(float(np.median(v)))
        top.append(float(v.max()))
    return {"steps": n, "first_step": int(series.steps[0]) if n else None,
            "last_step": int(series.steps[-1]) if n else None,
            "median_us": float(np.median(series.job_us)) if n else None, "bucket_steps": width,
            "step_first": first, "step_last": last, "job_median_us": med, "job_max_us": top, "wall_end_ns": wall,
            "ranks": {str(r): v for r, v in series.rank_buckets.items()},
            "rank_bucket_steps": [list(b) for b in series.bucket_steps]}


def _ledger_per_step(doc: Report) -> dict[tuple[str, int | None], float]:
    """(category, rank) → µs per step of the job ledger's window (roles summed)."""
    window = ((doc.get("ledger") or {}).get("window") or {})
    steps = max(1, int(window.get("steps") or 1))
    out: dict[tuple[str, int | None], float] = {}
    for p in window.get("parts") or []:
        key = (str(p["category"]), p.get("rank"))
        out[key] = out.get(key, 0.0) + float(p["us"]) / steps
    return out


def _growth(base: Report, cap: Report) -> tuple[list[dict[str, Any]], dict[tuple[str, int | None], float]]:
    b, c = _ledger_per_step(base), _ledger_per_step(cap)
    by_cat: dict[str, float] = {}
    per_key = {k: c.get(k, 0.0) - b.get(k, 0.0) for k in set(b) | set(c)}
    for (cat, _r), d in per_key.items():
        by_cat[cat] = by_cat.get(cat, 0.0) + d
    rows: list[dict[str, Any]] = [{"category": k, "words": CATEGORY_TEXT.get(k, k), "delta_us": v}
                                  for k, v in by_cat.items()]
    rows.sort(key=lambda r: -float(r["delta_us"]))
    return rows, per_key


def _culprit(base: Report, cap: Report, excess: float) -> tuple[int | None, str]:
    """(rank, how it was found) — module docstring."""
    top = next((s for s in cap.get("stragglers") or [] if not s.get("noise")), None)
    if top and float(top.get("blame_us_per_step") or 0.0) >= RANK_SHARE * excess:
        return int(top["rank"]), "straggler"
    before = {int(r["rank"]): per_step(r, "compute_us") for r in base.get("ranks") or []}
    grew = {int(r["rank"]): (per_step(r, "compute_us") or 0.0) - (before.get(int(r["rank"])) or 0.0)
            for r in cap.get("ranks") or [] if before.get(int(r["rank"])) is not None}
    if len(grew) >= 2:
        worst = max(grew, key=lambda r: grew[r])
        others = [d for r, d in grew.items() if r != worst]
        typical = max(0.0, median(others))
        if grew[worst] >= RANK_SHARE * excess and grew[worst] >= ALONE_FACTOR * max(typical, 1e-9):
            return worst, "compute"
    return None, "job"


def _per_name(summaries: dict[int, Any], rank: int | None, kind: str) -> dict[str, float]:
    """µs per step by host span (self time) or kernel (total time), on ``rank`` (every rank's median)."""
    out: dict[str, list[float]] = {}
    for r, s in summaries.items():
        if rank is not None and r != rank:
            continue
        steps = max(1, s.windows.height if s.windows is not None else 1)
        if kind == "host" and s.host_self is not None and s.host_self.height:
            per = s.host_self.group_by("name").agg(__import__("polars").col("self_us").sum())
            for name, us in per.iter_rows():
                out.setdefault(str(name), []).append(float(us) / steps)
        elif kind == "kernel":
            for k in s.kernels or []:
                if not k.get("comm_kind"):
                    out.setdefault(str(k["name"]), []).append(float(k.get("total_us") or 0.0) / steps)
    n = 1 if rank is not None else max(1, len(summaries))
    return {k: float(median(v + [0.0] * (n - len(v)))) for k, v in out.items()}


#: Host spans that are the host waiting for its GPU: their growth is an effect of a slower GPU, never a cause.
SYNC_WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "aten::item",
              "aten::_local_scalar_dense", "hipStreamSynchronize", "hipDeviceSynchronize", "cudaMemcpy")


def _grown_name(base: dict[str, float], cap: dict[str, float], excess: float,
                share: float = SPAN_SHARE) -> dict[str, Any] | None:
    d = {k: v - base.get(k, 0.0) for k, v in cap.items() if not k.startswith(SYNC_WAITS)}
    if not d:
        return None
    name = max(d, key=lambda k: (d[k], k))
    if d[name] < share * excess:
        return None
    return {"name": name, "delta_us": d[name], "baseline_us": base.get(name, 0.0), "capture_us": cap[name]}


def _grown_caller(base: Report, cap: Report, rank: int, name: str, excess: float,
                  options: ReportOptions) -> dict[str, Any] | None:
    """For a built-in that grew (``<built-in function sleep>``): the Python function around it whose
    share grew most, from both windows' host trace of ``rank`` (analysis.time.callers)."""
    from traceread.analysis.time.callers import callers, is_builtin, readable
    from traceread.engine.jobs import read_rank

    if not is_builtin(name):
        return None
    per: list[dict[str, float]] = []
    for doc in (base, cap):
        entry = next((r for r in doc.get("ranks") or [] if int(r["rank"]) == rank and r.get("file")), None)
        summary = _summaries_of_rank(doc, rank, options)
        if entry is None or summary is None:
            return None
        rt = read_rank(str(entry["file"]), use_cache=options.use_cache, cache_dir=options.cache_dir)
        per.append(callers(rt, name, summary.windows))
        del rt
    grown = _grown_name(per[0], per[1], excess)
    if grown is not None:
        grown["readable"] = readable(grown["name"])
    return grown


def _summaries_of_rank(doc: Report, rank: int, options: ReportOptions) -> Any:
    return _summaries(doc, options).get(rank)


def _compute_delta(base: Report, cap: Report, rank: int | None) -> float | None:
    """Growth of compute per step: on ``rank``, else the median over ranks."""
    before = {int(r["rank"]): per_step(r, "compute_us") for r in base.get("ranks") or []}
    deltas = {int(r["rank"]): (per_step(r, "compute_us") or 0.0) - (before.get(int(r["rank"])) or 0.0)
              for r in cap.get("ranks") or [] if before.get(int(r["rank"])) is not None}
    if rank is not None:
        return deltas.get(rank)
    return float(median(deltas.values())) if deltas else None


def _summaries(doc: Report, options: ReportOptions) -> dict[int, Any]:
    from traceread.assemble.rank_map import RankSummary
    from traceread.assemble.run_map import summarise_files

    files = {Path(str(r["file"])): int(r["rank"]) for r in doc.get("ranks") or [] if r.get("file")}
    got = summarise_files(list(files), options) if files else {}
    return {files[f]: s for f, s in got.items() if isinstance(s, RankSummary)}


def _waited_in(cap: Report, rank: int) -> dict[str, Any] | None:
    """The capture's collective with the most wait, and the role of the group the straggler held up."""
    role = next((f.get("role") for f in cap.get("findings") or [] if f.get("id") == "straggler" and f.get("rank") == rank),
                None)
    colls = sorted(cap.get("collectives") or [], key=lambda c: -float(c.get("wait_us") or 0.0) * float(c.get("count") or 0))
    if not colls or not float(colls[0].get("wait_us") or 0.0):
        return None
    c = colls[0]
    return {"collective": c.get("name"), "pg": c.get("pg"), "role": role,
            "wait_us": c.get("wait_us")}


def _slow_flags(job_us: Any, baseline_us: float, threshold_us: float) -> Any:
    """Per step: whether the median of the 5 steps centred on it exceeds the baseline by ``threshold_us``
    (edges: the steps there are). A median of 5 ignores a spike or two of a loaded machine and keeps a
    sustained slowdown to the step. Computed in blocks, so a long series needs no 5x copy."""
    import numpy as np
    from numpy.lib.stride_tricks import sliding_window_view

    half = MEDIAN_STEPS // 2
    n = len(job_us)
    padded = np.concatenate([np.full(half, np.nan), job_us, np.full(half, np.nan)])
    out = np.zeros(n, bool)
    block = 1 << 20
    for i in range(0, n, block):
        win = sliding_window_view(padded[i:min(n, i + block) + 2 * half], MEDIAN_STEPS)
        out[i:i + len(win)] = np.nanmedian(win, axis=1) - baseline_us >= threshold_us
    return out


def slow_stretch(series: StepSeries, around: int, baseline_us: float, excess_us: float,
                 capture: tuple[int, int] | None) -> tuple[int, int, int, float] | None:
    """(first, last, slow steps, µs lost) of the stretch around step ``around`` (module docstring)."""
    import numpy as np

    if not len(series.steps) or excess_us <= 0:
        return None
    slow = _slow_flags(series.job_us, baseline_us, SLOW_FRACTION * excess_us)
    start = int(np.searchsorted(series.steps, around))
    if capture is not None:  # the captured steps are slow by construction: start from the earliest
        start = min(start, int(np.searchsorted(series.steps, capture[0])))
    start = min(start, len(series.steps) - 1)
    first_i = next((j for j in range(start, len(slow)) if slow[j]), None)
    if first_i is None:
        return None
    while first_i > 0 and slow[first_i - 1] and series.steps[first_i - 1] == series.steps[first_i] - 1:
        first_i -= 1
    last_i = first_i
    while last_i + 1 < len(slow) and slow[last_i + 1] and series.steps[last_i + 1] == series.steps[last_i] + 1:
        last_i += 1
    lost = float((series.job_us[first_i:last_i + 1] - baseline_us).sum())
    return int(series.steps[first_i]), int(series.steps[last_i]), last_i - first_i + 1, lost


def compare_capture(base: Report, cap: Capture, series: StepSeries | None, options: ReportOptions,
                    warn: Callable[[str], None], gpus: Sequence[Any] = (),
                    base_steps: list[int] | None = None) -> dict[str, Any] | None:
    """One capture against the baseline (module docstring); None when it holds no trace."""
    from traceread.assemble.report import NothingUsableError, build_report

    trig = cap.trigger or {}
    row: dict[str, Any] = {"name": cap.name, "id": trig.get("id", cap.number), "kind": trig.get("kind", "unknown"),
                           "requested_by": trig.get("requested_by"), "trigger": trig,
                           "dirs": [str(d) for d in cap.dirs], "files": len(cap.files), "changed": False}
    if not cap.files:
        warn(f"{cap.dirs[0]}: capture holds no trace (trigger {trig.get('kind', '?')}); left out")
        row["note"] = "no trace"
        return row
    try:
        # the trace files by name: a capture folder also holds each rank's outcome (rank{R}.json), stacks, fr
        doc = build_report([str(f) for f in cap.files], replace(options, cycle="latest"))
    except NothingUsableError as exc:
        warn(f"{cap.dirs[0]}: {exc}")
        row["note"] = str(exc)
        return row
    for w in doc.get("warnings") or []:
        warn(f"{cap.name}: {w}")
    b_step, c_step = median_step_us(base), median_step_us(doc)
    steps = _steps_of(doc)
    row.update({"steps": steps, "ranks_read": len(doc.get("ranks") or []), "baseline_step_us": b_step,
                "step_us": c_step, "capture_answer": next((f.get("title") for f in doc.get("findings") or []), None),
                "capture_change": next((s for f in (doc.get("findings") or [])[:1] for s in f.get("suggestions") or []), None)})
    if b_step is None or c_step is None:
        row["note"] = "no step time in the baseline or the capture"
        return row
    excess = c_step - b_step
    row["excess_us"] = excess
    if trig.get("kind") == "stall" and series is not None:
        stalled = _stall(row, trig, series, base_steps, b_step)
        if stalled:
            return row
    if excess <= NOISE_SHARE * b_step:
        row["sentence"] = (f"steps {steps[0]}-{steps[1]} took {ms(c_step)}, like the baseline's {ms(b_step)}: no change"
                           if steps else "no change from the baseline")
        return row
    row["changed"] = True
    growth, _per_key = _growth(base, doc)
    row["growth"] = [g for g in growth if g["delta_us"] > NOISE_SHARE * b_step][:5]
    row["what"] = growth[0] if growth else None
    rank, how = _culprit(base, doc, excess)
    hinted = trig.get("ranks")
    if rank is None and trig.get("kind") == "rank_late" and isinstance(hinted, list) and len(hinted) == 1 \
            and isinstance(hinted[0], int):
        rank, how = hinted[0], "trigger"  # the watch saw that one rank end its steps late
    row["rank"], row["rank_from"] = rank, how
    b_sum, c_sum = _summaries(base, options), _summaries(doc, options)
    row["host_span"] = _grown_name(_per_name(b_sum, rank, "host"), _per_name(c_sum, rank, "host"), excess)
    if row["host_span"] and rank is not None:
        row["host_span"]["caller"] = _grown_caller(base, doc, rank, row["host_span"]["name"], excess, options)
    row["kernel"] = _grown_name(_per_name(b_sum, rank, "kernel"), _per_name(c_sum, rank, "kernel"), excess, KERNEL_SHARE)
    row["compute_delta_us"] = _compute_delta(base, doc, rank)
    row["waited_in"] = _waited_in(doc, rank) if rank is not None and how == "straggler" else None
    since = trig.get("since_step") if isinstance(trig.get("since_step"), int) else (steps[0] if steps else None)
    stretch = None
    if series is not None and since is not None:
        stretch = slow_stretch(series, since, _series_baseline(series, base_steps, b_step), excess,
                               (steps[0], steps[1]) if steps else None)
    if stretch is not None:
        row["slow_steps"], row["n_slow_steps"], row["lost_us"] = [stretch[0], stretch[1]], stretch[2], stretch[3]
    else:
        n = (steps[1] - steps[0] + 1) if steps else 0
        row["slow_steps"], row["n_slow_steps"], row["lost_us"] = steps, n, excess * n
    row["telemetry"] = _capture_telemetry(doc, rank, options, gpus) if gpus and rank is not None else None
    row["sentence"] = sentence(row)
    return row


def _stall(row: dict[str, Any], trig: dict[str, Any], series: StepSeries, base_steps: list[int] | None,
           b_step: float) -> bool:
    """A ``stall`` trigger: the step it names (``since_step``) from the series — how long it took against
    the baseline, the time lost, and where the stacks taken then are. False when the series does not
    show it ≥ :data:`STALL_FACTOR` baselines long (the capture's own comparison is made instead)."""
    import numpy as np

    step = trig.get("since_step")
    if not isinstance(step, int):
        return False
    i = int(np.searchsorted(series.steps, step))
    if i >= len(series.steps) or int(series.steps[i]) != step:
        return False
    base = _series_baseline(series, base_steps, b_step)
    took = float(series.job_us[i])
    if took < STALL_FACTOR * base:
        return False
    stacks = trig.get("stacks")
    row.update({"changed": True, "stall_step": step, "stall_us": took, "excess_us": took - base,
                "slow_steps": [step, step], "n_slow_steps": 1, "lost_us": took - base, "rank": None,
                "sentence": f"step {step} took {ms(took)} instead of {ms(base)}: the job stalled"
                            + (f"; the stacks taken then are in {stacks}" if stacks else "")
                            + f"; {ms(took - base)} lost"})
    return True


def _series_baseline(series: StepSeries, steps: list[int] | None, fallback: float) -> float:
    """The baseline step in the series' own terms: its median over the baseline window's steps."""
    import numpy as np

    if steps:
        v = series.between(steps[0], steps[1])
        if len(v):
            return float(np.median(v))
    return fallback


def _capture_telemetry(doc: Report, rank: int, options: ReportOptions, gpus: Sequence[Any]) -> dict[str, Any] | None:
    from traceread.analysis.telemetry import gpu_state
    from traceread.compare.telemetry_join import gpu_of, rank_facts, window_ns

    facts = rank_facts(doc, options)
    entry = next((r for r in doc.get("ranks") or [] if int(r["rank"]) == rank), None)
    if entry is None:
        return None
    g = gpu_of(rank, None, facts.get(rank, {}), entry.get("host"), gpus)
    win = window_ns(entry, facts.get(rank, {}).get("base_time_ns"))
    return gpu_state(g, *win) if g is not None and win is not None else None


def sentence(row: dict[str, Any]) -> str:
    """"from step 200 the step took 55 ms instead of 15 ms: rank 1's `load_batch` took 40 ms more per step;
    the others waited for it in the gradient all-reduce"."""
    first = (row.get("slow_steps") or row.get("steps") or [None])[0]
    head = f"from step {first} the step took {ms(row['step_us'])} instead of {ms(row['baseline_step_us'])}"
    rank = row.get("rank")
    who = f"rank {rank}'s" if rank is not None else "every rank's"
    span, kernel, what = row.get("host_span"), row.get("kernel"), row.get("what") or {}
    cat = what.get("category")
    if cat in COMPUTE and row.get("compute_delta_us"):
        cause = f"{who} GPU compute took {ms(row['compute_delta_us'])} more per step"
        if kernel:
            cause += f" (most in `{short_name(kernel['name'], 80)}`, +{ms(kernel['delta_us'])})"
    elif cat in HOST and span and span.get("caller"):
        c = span["caller"]
        cause = (f"{who} `{c['readable']}` took {ms(c['delta_us'])} more per step "
                 f"(in `{short_name(span['name'], 60)}`)")
    elif cat in HOST and span:
        cause = f"{who} `{short_name(span['name'], 80)}` took {ms(span['delta_us'])} more per step"
    elif what:
        cause = f"{who} {what.get('words')} grew by {ms(what.get('delta_us'))} per step"
    else:
        cause = f"{who} step grew by {ms(row.get('excess_us'))}"
    parts = [f"{head}: {cause}"]
    tel = row.get("telemetry")
    if tel and tel.get("throttled"):
        from traceread.analysis.telemetry import describe

        parts.append(f"its {describe(tel)}")
    w = row.get("waited_in")
    if w and rank is not None:
        role = ROLE_WORDS.get(str(w.get("role")), "")
        coll = {"allreduce": "all-reduce", "allgather": "all-gather", "reduce_scatter": "reduce-scatter",
                "alltoall": "all-to-all"}.get(str(w.get("collective")), str(w.get("collective") or "collective"))
        parts.append(f"the others waited for it in the {(role + ' ') if role else ''}{coll}"
                     + (f" (pg {w['pg']})" if w.get("pg") is not None and not role else ""))
    n = row.get("n_slow_steps")
    if row.get("slow_steps") and n:
        s = row["slow_steps"]
        parts.append(f"{n} slow step(s) in {s[0]}-{s[1]}, {ms(row.get('lost_us'))} lost")
    return "; ".join(parts)
