"""Training or serving: what the rank was doing, and the serving engine's iterations as its steps.

A serving engine has no ``ProfilerStep``: its unit of work is one scheduler iteration (one batch
of prefills and/or decodes), which the engines annotate themselves. Without steps every per-step
number would be a whole-trace average; with the iterations as steps the report compares
iterations, and prefill and decode apart. Evidence, per rank:

* **engine iterations** — host annotations (``user_annotation``) named as the engines name them:
  vLLM's model runner ``execute_<tokens>_context_<prefill requests>(…)_generation_<decode
  requests>(…)`` (prefill when only context requests, decode when only generation requests, else
  mixed) and SGLang's scheduler ``step[DECODE …]`` / ``step[EXTEND …]`` / ``step[PREFILL …]`` /
  ``step[MIXED …]``. Used as steps (numbered 0, 1, … in time order, outermost annotations only)
  only when the trace has no ``ProfilerStep`` markers.
* **backward** — any ``autograd::engine::evaluate_function:*`` node, or an ``Optimizer.step``
  annotation: training.
* **engine operators** — ``vllm::*``, ``sglang::*``, ``sgl_kernel::*``, ``trtllm::*``,
  ``tensorrt_llm::*`` operators name the engine.

``kind``: ``training`` (a backward or an optimizer step), else ``serving`` (engine iterations or
engine operators), else ``inference`` (GPU work, no backward: a forward-only model), else
``unknown``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from traceread.model import STEP_SCHEMA

_VLLM_ITER = re.compile(r"^execute_(\d+)_context_(\d+)\(.*?\)_generation_(\d+)")
_SGLANG_ITER = re.compile(r"^step\[(DECODE|EXTEND|PREFILL|MIXED|IDLE|TARGET_VERIFY|DRAFT_EXTEND)\b", re.IGNORECASE)
ITERATION_PATTERN = r"^(?:execute_\d+_context_\d+\(|step\[[A-Za-z_]+\b)"
_ENGINE_OP = re.compile(r"^(vllm|sglang|sgl_kernel|trtllm|tensorrt_llm)::")
_ENGINE_NAME = {"sgl_kernel": "sglang", "tensorrt_llm": "trtllm"}
_EVAL = "autograd::engine::evaluate_function:"
_OPTIMIZER = re.compile(r"^Optimizer\.step#")


def iteration_kind(name: str) -> tuple[str | None, str]:
    """(engine, prefill | decode | mixed | idle) of one iteration annotation, (None, "") otherwise."""
    m = _VLLM_ITER.match(name)
    if m:
        ctx, gen = int(m.group(2)), int(m.group(3))
        return "vllm", ("mixed" if ctx and gen else "prefill" if ctx else "decode" if gen else "idle")
    m = _SGLANG_ITER.match(name)
    if m:
        mode = m.group(1).upper()
        kind = {"DECODE": "decode", "EXTEND": "prefill", "PREFILL": "prefill", "MIXED": "mixed",
                "IDLE": "idle", "TARGET_VERIFY": "decode", "DRAFT_EXTEND": "prefill"}[mode]
        return "sglang", kind
    return None, ""


@dataclass
class Iterations:
    """A serving engine's iterations used as steps."""

    steps: pl.DataFrame  # STEP_SCHEMA: step (0, 1, ...), ts, dur, end, tid
    kinds: dict[int, str] = field(default_factory=dict)  # step -> prefill | decode | mixed | idle
    engine: str | None = None


def engine_iterations(host: pl.DataFrame) -> Iterations | None:
    """The engine's iteration annotations as step windows (module docstring); None when there are none."""
    if host.height == 0:
        return None
    ann = host.filter(pl.col("cat").is_in(["user_annotation", "cpu_op"])
                      & pl.col("name").fill_null("").str.contains(ITERATION_PATTERN)
                      & pl.col("dur").is_not_null()).sort("ts")
    if ann.height == 0:
        return None
    keep_ts: list[float] = []
    keep_end: list[float] = []
    rows = []
    for row in ann.select("name", "ts", "dur", "end", "tid").iter_rows(named=True):
        if keep_end and row["ts"] < keep_end[-1] and row["end"] <= keep_end[-1]:
            continue  # nested inside the previous iteration: outermost only
        keep_ts.append(row["ts"])
        keep_end.append(row["end"])
        rows.append(row)
    kinds: dict[int, str] = {}
    engines: set[str] = set()
    for i, row in enumerate(rows):
        engine, kind = iteration_kind(str(row["name"]))
        kinds[i] = kind
        if engine:
            engines.add(engine)
    # SGLang's scheduler names its own iterations step[...]; the execute_... form is vLLM's model
    # runner's (profiling tools add it to other engines' traces too): step[...] names the engine
    engines |= {"sglang"} if ann["name"].str.contains(_SGLANG_ITER.pattern).any() else set()
    steps = pl.DataFrame({"step": list(range(len(rows))), "ts": [r["ts"] for r in rows], "dur": [r["dur"] for r in rows],
                          "end": [r["end"] for r in rows], "tid": [r["tid"] for r in rows]})
    steps = steps.select([pl.col(c).cast(t) for c, t in STEP_SCHEMA.items()])
    return Iterations(steps, kinds, "sglang" if "sglang" in engines else (sorted(engines)[0] if engines else None))


def workload(host: pl.DataFrame, has_steps: bool, iterations: Iterations | None, has_gpu: bool) -> dict[str, Any]:
    """What one rank was doing (module docstring): ``{kind, engine, evidence, iterations}``."""
    names = host["name"].fill_null("") if host.height else pl.Series("name", [], dtype=pl.Utf8)
    bwd = int(names.str.starts_with(_EVAL).sum()) if host.height else 0
    opt = int(names.str.contains(_OPTIMIZER.pattern).sum()) if host.height else 0
    engine_ops = names.filter(names.str.contains(_ENGINE_OP.pattern)) if host.height else names
    engine = None
    if engine_ops.len():
        first = str(engine_ops.str.extract(_ENGINE_OP.pattern, 1).value_counts(sort=True)[0, 0])
        engine = _ENGINE_NAME.get(first, first)
    if iterations is not None and iterations.engine:
        engine = iterations.engine
    counts: dict[str, int] = {}
    if iterations is not None:
        for k in iterations.kinds.values():
            counts[k or "unknown"] = counts.get(k or "unknown", 0) + 1
    if bwd or opt:
        kind = "training"
        evidence = (f"{bwd} backward node(s)" if bwd else "") + (" and " if bwd and opt else "") + \
                   (f"{opt} optimizer step(s)" if opt else "")
    elif iterations is not None or engine:
        kind = "serving"
        evidence = (f"{iterations.steps.height} {engine or 'engine'} iteration annotation(s) used as steps"
                    if iterations is not None else f"{engine} engine operators, no backward")
    elif has_gpu:
        kind = "inference"
        evidence = "GPU work with no backward and no optimizer step" + ("" if has_steps else ", no ProfilerStep")
    else:
        kind, evidence = "unknown", "no backward, no engine annotation, no GPU work"
    return {"kind": kind, "engine": engine, "evidence": evidence, "iterations": counts}


def job_workload(per_rank: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The job's workload from its ranks': training when any rank trains, else the most common kind;
    iteration counts add up over the ranks that share the majority kind's engine."""
    got = [w for w in per_rank if w]
    if not got:
        return None
    kinds = [w["kind"] for w in got]
    kind = "training" if "training" in kinds else max(sorted(set(kinds)), key=kinds.count)
    mine = [w for w in got if w["kind"] == kind]
    engines = [w["engine"] for w in mine if w.get("engine")]
    first = mine[0]
    from traceread.analysis.time.frameworks import job_framework

    fw, micro = job_framework(got)
    return {"kind": kind, "engine": max(sorted(set(engines)), key=engines.count) if engines else None,
            "evidence": f"{first['evidence']} (rank evidence; {len(mine)} of {len(got)} rank(s) agree)",
            "iterations": dict(first.get("iterations") or {}),
            "framework": fw["name"] if fw else None, "framework_evidence": fw["evidence"] if fw else None,
            "micro_steps": micro}
