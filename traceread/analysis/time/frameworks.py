"""Which training framework the trace shows, and how many micro-steps each optimizer step holds.

Frameworks leave their names in the trace: Lightning's profiler actions (``[LightningModule]…``,
``[Strategy]…``, ``[_TrainingEpochLoop]…``), DeepSpeed's engine and optimizers, and, when stacks were
recorded, the Python files of the training loop (``transformers/trainer.py``, ``accelerate/``,
``torchtitan/``, ``megatron/``). :data:`FRAMEWORKS` is the table (first match wins); a trace that
shows none is plain PyTorch as far as anyone can tell, and the report says nothing.

**Micro-steps** (gradient accumulation): the median over the rank's steps of the number of batches
the step fetched — top-level ``enumerate(DataLoader)#…__next__`` spans starting inside the step
window (a nested repeat of the name counted once), or, without a data loader span, Lightning's
``training_step`` actions. Decided from structure (what the step contains), never from a name of the
job. None with fewer than two per step.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl

#: (framework, pattern on host event names: spans, optimizer classes, Python frames) — first match wins.
FRAMEWORKS: tuple[tuple[str, str], ...] = (
    ("PyTorch Lightning", r"^\[(LightningModule|Strategy|Callback|_TrainingEpochLoop|_EvaluationLoop|"
                          r"LightningDataModule|_FitLoop)\]|^\[pl\]\[|lightning/pytorch/|pytorch_lightning/"),
    ("DeepSpeed", r"DeepSpeedEngine|DeepSpeedZeroOptimizer|DeepSpeedCPUAdam|deepspeed/|^deepspeed\."),
    ("torchtitan", r"torchtitan/|^torchtitan\."),
    ("Megatron", r"megatron/(core|training)/|^megatron\."),
    ("Hugging Face Trainer", r"transformers/trainer\.py|^Trainer\.(training_step|_inner_training_loop)|"
                             r"AcceleratedOptimizer|accelerate/(accelerator|optimizer|data_loader)\.py"),
)
_COMPILED = tuple((f, re.compile(p)) for f, p in FRAMEWORKS)
#: What one batch fetch looks like (the micro-step count).
_FETCH = re.compile(r"^enumerate\(DataLoader\)#")
_LIGHTNING_STEP = re.compile(r"^\[Strategy\].*\.training_step$")


def detect(host: pl.DataFrame) -> dict[str, str] | None:
    """``{name, evidence}`` of the framework the host events show (:data:`FRAMEWORKS`), else None."""
    if host.height == 0:
        return None
    names = host["name"].drop_nulls().unique()
    for fw, rx in _COMPILED:
        hit = names.filter(names.str.contains(rx.pattern))
        if hit.len():
            first = sorted(hit.to_list())[0]
            return {"name": fw, "evidence": f"{hit.len()} event name(s) such as {first[:80]}"}
    return None


def micro_steps(host: pl.DataFrame, windows: pl.DataFrame) -> int | None:
    """Median batches fetched per step window (module docstring); None below 2 or without steps."""
    if host.height == 0 or windows.height == 0:
        return None
    for rx in (_FETCH, _LIGHTNING_STEP):
        ev = host.filter(pl.col("name").str.contains(rx.pattern).fill_null(False) & pl.col("ts").is_not_null())
        if ev.height == 0:
            continue
        ev = _outermost(ev, host, rx)  # nested repeats of the fetch (a wrapper's __next__ around the loader's) once
        w = windows.sort("start")
        ws, we = w["start"].to_numpy(), w["end"].to_numpy()
        ts = ev["ts"].to_numpy()
        k = np.searchsorted(ws, ts, side="right") - 1
        kc = np.clip(k, 0, ws.size - 1)
        inside = (k >= 0) & (ts < we[kc])
        counts = np.bincount(kc[inside], minlength=ws.size)
        med = int(np.median(counts))
        return med if med >= 2 else None
    return None


def _outermost(ev: pl.DataFrame, host: pl.DataFrame, rx: re.Pattern[str]) -> pl.DataFrame:
    """``ev`` (rows of ``host`` matching ``rx``) without those whose parent span matches ``rx`` too."""
    if "parent" not in ev.columns:
        return ev
    pname = host["name"].to_numpy()
    par = ev["parent"].fill_null(-1).to_numpy().astype(np.int64)
    ok = par >= 0
    nested = np.zeros(ev.height, dtype=bool)
    nested[ok] = [bool(rx.search(str(n))) for n in pname[par[ok]]]
    return ev.filter(pl.Series(~nested))


def job_framework(per_rank: Sequence[dict[str, Any] | None]) -> tuple[dict[str, str] | None, int | None]:
    """(the framework most ranks show, the median micro-steps over ranks that have them)."""
    fws = [w["framework"] for w in per_rank if w and w.get("framework")]
    fw = None
    if fws:
        names = [f["name"] for f in fws]
        best = max(sorted(set(names)), key=names.count)
        fw = next(f for f in fws if f["name"] == best)
    ms = sorted(int(w["micro_steps"]) for w in per_rank if w and w.get("micro_steps"))
    return fw, (ms[(len(ms) - 1) // 2] if ms else None)


_OPT_STEP = re.compile(r"^Optimizer\.step#")


def optimizer_steps(host: pl.DataFrame) -> pl.DataFrame | None:
    """Training steps from the optimizer's own spans, for a trace without ``ProfilerStep#`` markers:
    on the thread with the most ``Optimizer.step#…`` spans (outermost only), step k runs from the end
    of the k-th optimizer step to the end of the next (the loop's data loading, forward, backward and
    its optimizer step), numbered by the optimizer step that ends it (1, 2, …). None with fewer than
    two optimizer steps. Columns: ``model.STEP_SCHEMA``."""
    from traceread.model import STEP_SCHEMA

    if host.height == 0:
        return None
    ev = host.filter(pl.col("name").str.contains(_OPT_STEP.pattern).fill_null(False)
                     & pl.col("ts").is_not_null() & pl.col("end").is_not_null() & pl.col("tid").is_not_null())
    if ev.height < 2:
        return None
    ev = _outermost(ev, host, _OPT_STEP)  # an optimizer step inside another (a wrapper's around the inner one): once
    tid = ev.group_by("tid").len().sort(["len", "tid"], descending=[True, False])["tid"][0]
    ends = ev.filter(pl.col("tid") == tid).sort("ts")["end"].to_numpy().astype(np.float64)
    if ends.size < 2:
        return None
    start, end = ends[:-1], ends[1:]
    out = pl.DataFrame({"step": np.arange(1, ends.size, dtype=np.int64), "ts": start, "dur": end - start,
                        "end": end, "tid": np.full(start.size, int(tid), dtype=np.int64)})
    return out.select([pl.col(c).cast(t) for c, t in STEP_SCHEMA.items()])
