"""Ground truth of which recorded host span covers each piece of host time, from the simulator's own
host events (never from ``traceread.analysis``).

The rule (docs/ledger.md, "Which span covers host time"): a ``host_bound`` piece of rank r's step
belongs to the thread whose runtime call launched the GPU work that ended the idle gap (the launch
starts where ``host_bound`` ends); an ``idle_other`` piece to the rank's main thread. At each instant
the **chain** is that thread's events covering it (``ProfilerStep#N`` excluded, zero-length events
excluded); the **span** is the innermost chain event with a family (the simulator knows the family of
every span it records: :data:`SPAN_FAMILY`), else the innermost user annotation, else the innermost
event of any kind; none when the chain is empty. Innermost: the latest start, then the earliest end.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from traceread.simulate.schedule import HostEvent, RankCtx

#: ``ledger_truth.Seg`` (which imports this module: named loosely to keep the imports one way).
Seg = Any

#: The family of every span the simulator records that has one, by its own design.
SPAN_FAMILY: dict[str, str] = {
    "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__": "data_loading",
    "checkpoint.save": "checkpoint",
    "aten::item": "sync", "aten::_local_scalar_dense": "sync",
    "cudaStreamSynchronize": "sync", "cudaDeviceSynchronize": "sync",
    "Optimizer.step#AdamW.step": "optimizer",
    "Python GC": "gc",
    "c10d::allreduce_": "communication", "record_param_comms": "communication",
}
#: Name prefixes with a family (the host-side collectives' spans).
PREFIX_FAMILY: tuple[tuple[str, str], ...] = (("gloo:", "communication"), ("nccl:", "communication"))
#: Families of spans without one, by category.
GENERIC = {"user_annotation": "annotation", "python_function": "python"}
HOST_CATS = frozenset({"cpu_op", "user_annotation", "python_function", "cuda_runtime"})
#: Ledger categories whose time is labelled with a span.
LABELLED = ("host_bound", "idle_other")


def specific(name: str) -> str | None:
    if name in SPAN_FAMILY:
        return SPAN_FAMILY[name]
    return next((f for p, f in PREFIX_FAMILY if name.startswith(p)), None)


def _span(chain: list[HostEvent]) -> tuple[str, str] | None:
    """(span name, family) of a chain (module docstring), None when empty."""
    if not chain:
        return None

    def inner(evs: Iterable[HostEvent]) -> HostEvent | None:
        return max(evs, key=lambda e: (e.ts, -(e.ts + e.dur)), default=None)

    best = inner(e for e in chain if specific(e.name))
    if best is not None:
        return best.name, str(specific(best.name))
    best = inner(e for e in chain if e.cat == "user_annotation")
    if best is None:
        best = inner(chain)
    assert best is not None
    return best.name, GENERIC.get(best.cat, "operator")


def label(ctx: RankCtx, segs: list[Seg]) -> list[Seg]:
    """``segs`` with each :data:`LABELLED` segment cut where its covering span changes, each piece
    carrying ``span`` and ``family`` (None: no recorded span). Category sums are unchanged."""
    launch_tid: dict[int, int] = {}
    for o in ctx.gpu:
        if o.launch is not None:
            launch_tid.setdefault(o.launch.ts, o.launch.tid)
    by_tid: dict[int, list[HostEvent]] = {}
    for e in ctx.events:
        if e.cat in HOST_CATS and e.dur > 0 and not e.name.startswith("ProfilerStep#"):
            by_tid.setdefault(e.tid, []).append(e)
    out: list[Seg] = []
    for g in segs:
        if g.category not in LABELLED:
            out.append(g)
            continue
        tid = launch_tid.get(g.t1, ctx.main_tid) if g.category == "host_bound" else ctx.main_tid
        evs = [e for e in by_tid.get(tid, []) if e.ts < g.t1 and e.ts + e.dur > g.t0]
        cuts = sorted({g.t0, g.t1} | {t for e in evs for t in (e.ts, e.ts + e.dur) if g.t0 < t < g.t1})
        for x, y in zip(cuts, cuts[1:]):
            got = _span([e for e in evs if e.ts <= x < e.ts + e.dur])
            piece = replace(g, t0=x, t1=y, span=got[0] if got else None, family=got[1] if got else None)
            last = out[-1] if out else None
            if last is not None and last.t1 == x and (last.category, last.span, last.family) == (
                    piece.category, piece.span, piece.family) and last.role == piece.role:
                out[-1] = replace(last, t1=y)
            else:
                out.append(piece)
    return out
