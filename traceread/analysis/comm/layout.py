"""The job's parallel layout: what each process group is for (dp, fsdp, tp, cp, pp, ep, other).

Advice depends on it: a tensor-parallel all-reduce and a gradient all-reduce are both "all-reduce on
a process group", but one runs per layer and must stay on NVLink, the other runs once per step and
may cross the network. Works on the reduce side, from what the per-rank summaries keep: a compact
record of each group (:func:`compact_groups`, from ``distributedInfo.pg_config``) and the
communication extract (:func:`traceread.analysis.comm.collectives.comm_events`).

Role of a group, first rule that applies:

1. **Description** (``pg_desc``, e.g. DeviceMesh's ``mesh_tp``, Megatron's
   ``TENSOR_MODEL_PARALLEL_GROUP``) when it names a dimension: tp (tp, tensor), pp (pp, pipe,
   pipeline), ep (ep, expert, moe), fsdp (fsdp, shard), cp (cp, context), dp (dp, data, replicate,
   ddp). Generic descriptions (``default_pg``, ``undefined``, empty) say nothing.
2. **The collectives the group runs** in the traced steps (per rank and step, median):
   point-to-point send/recv make up most calls → ``pp`` (a chain of stages);
   all-to-all without all-reduce → ``ep``; all-gather together with reduce-scatter → ``fsdp`` (parameters gathered,
   gradients reduce-scattered); all-reduce / all-gather / reduce-scatter at least twice per step
   whose calls spread over at least :data:`PER_LAYER_SPREAD` of the step's compute (per layer, in
   forward and backward; for CPU collectives :data:`PER_LAYER_SPREAD_TIME` of the step's wall time
   outside the calls, and at least 4 calls) → ``tp``; other all-reduces (gradients, during backward only) → ``dp``.
3. Otherwise (no communication in the traced steps, barriers only) → ``other``.

Degrees: for each role the most common size of its groups (``pp``: the longest chain of ranks
linked by send/recv, so a pipeline over the default group still counts its stages); 1 when absent.

Nodes: from ``run.json`` (each rank's host), else from the NCCL log (``nNodes`` × ``localRanks`` =
world size: ranks placed node by node, as torchrun does), else from the device index as the local
rank (a new node starts where the device index decreases; two ranks on the same index are taken to
share one GPU). Each group's evidence says which.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import polars as pl

from traceread.fmt import rank_runs

ROLES = ("dp", "fsdp", "tp", "cp", "pp", "ep")
#: Every value ``Group.role`` takes: the roles, ``other`` (no traffic, barriers, metrics) and
#: ``unknown`` (traffic whose pattern fits two roles the trace cannot tell apart).
ROLE_VALUES = (*ROLES, "other", "unknown")
#: Collectives whose calls span at least this share of the step's compute run per layer (forward and
#: backward); gradient reductions run during backward only (about half of the compute or less).
PER_LAYER_SPREAD = 0.75
#: The same in wall time (CPU collectives, no GPU compute to measure against), with >= 4 calls per step.
PER_LAYER_SPREAD_TIME = 0.9
DEFAULT_PG = "0"  # torch's name of the default (world) group
GENERIC_DESCS = frozenset({"", "undefined", "default_pg", "default", "none", "world"})

# (role, tokens of the description that name it), checked in this order ("dp_shard" is fsdp, not dp).
_DESC_TOKENS: tuple[tuple[str, frozenset[str]], ...] = (
    ("tp", frozenset({"tp", "tensor"})),
    ("pp", frozenset({"pp", "pipe", "pipeline"})),
    ("ep", frozenset({"ep", "expert", "experts", "moe"})),
    ("fsdp", frozenset({"fsdp", "shard", "zero"})),
    ("cp", frozenset({"cp", "context"})),
    ("dp", frozenset({"dp", "data", "replicate", "ddp", "hsdp"})),
)


# ------------------------------------------------------------------------------------------------
# compact group records (map side)


def compact_ranks(ranks: Sequence[int]) -> str:
    """``[0, 1, 2, 3]`` → ``"0-3"``, ``[0, 4, 8]`` → ``"0-8:4"``, else comma-separated runs."""
    rs = sorted(int(r) for r in ranks)
    if not rs:
        return ""
    if len(rs) > 2:
        step = rs[1] - rs[0]
        if step > 0 and all(b - a == step for a, b in zip(rs, rs[1:])):
            return f"{rs[0]}-{rs[-1]}" + (f":{step}" if step != 1 else "")
    return ",".join(rank_runs(rs))


def expand_ranks(text: str | Sequence[int] | None) -> list[int]:
    """Inverse of :func:`compact_ranks`; also reads ``"[0, 1, 2]"`` as torch writes it."""
    if text is None:
        return []
    if not isinstance(text, str):
        return [int(r) for r in text]
    out: list[int] = []
    for part in text.strip().strip("[]").split(","):
        part = part.strip()
        if not part or part == "...":
            continue
        m = re.fullmatch(r"(-?\d+)-(\d+)(?::(\d+))?", part)
        if m:
            out.extend(range(int(m.group(1)), int(m.group(2)) + 1, int(m.group(3) or 1)))
        elif re.fullmatch(r"-?\d+", part):
            out.append(int(part))
    return out


def compact_groups(pg_config: Iterable[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """A rank's ``pg_config`` with each group's member list written as a compact range
    (:func:`compact_ranks`): the raw config lists every member of every group, megabytes per rank
    on a large job. Keys: ``pg_name``, ``pg_desc``, ``pg_size``, ``ranks`` (text)."""
    out = []
    for g in pg_config or []:
        if not isinstance(g, Mapping):
            continue
        ranks = g.get("ranks")
        members = expand_ranks(ranks if isinstance(ranks, (list, tuple)) else str(ranks or ""))
        out.append({"pg_name": str(g.get("pg_name")), "pg_desc": g.get("pg_desc"),
                    "pg_size": int(g.get("pg_size") or len(members) or 0), "ranks": compact_ranks(members)})
    return out


# ------------------------------------------------------------------------------------------------
# the layout


@dataclass
class Group:
    """One process group: its members, its role and why."""

    pg: str
    desc: str | None
    size: int
    ranks: list[int]
    role: str = "other"
    nodes: list[int] = field(default_factory=list)
    evidence: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"pg": self.pg, "desc": self.desc, "role": self.role, "size": self.size, "ranks": self.ranks,
                "nodes": self.nodes, "evidence": self.evidence}


@dataclass
class Layout:
    """Roles of the job's process groups and the parallel degrees they give."""

    degrees: dict[str, int]
    groups: list[Group]
    node_source: str | None = None  # "run.json" | "NCCL log" | "device index" | None

    def role_of(self, pg: str | None) -> str:
        """The role of process group ``pg`` (its name; None: the traffic no group name was recorded
        for, :func:`group_key`); ``"other"`` when unknown."""
        g = self.group(pg)
        return g.role if g is not None else "other"

    def group(self, pg: str | None) -> Group | None:
        key = group_key(pg, {g.pg for g in self.groups})
        return next((g for g in self.groups if g.pg == key), None)

    def to_json(self) -> dict[str, Any]:
        return {"degrees": dict(self.degrees), "groups": [g.to_json() for g in self.groups],
                "node_source": self.node_source}


def role_from_desc(desc: str | None) -> str | None:
    """The role a process-group description names, None when it is generic or says nothing."""
    if not desc or desc.strip().lower() in GENERIC_DESCS:
        return None
    tokens = {t for t in re.split(r"[^a-z0-9]+", desc.lower()) if t}
    if tokens & {"data", "dp"} and "with" in tokens:  # Megatron DATA_PARALLEL_GROUP_WITH_CP: gradients
        return "dp"
    for role, names in _DESC_TOKENS:
        if tokens & names:
            return role
    return None


@dataclass
class _Usage:
    """What one group did in the traced steps (per rank and step, medians over ranks and steps)."""

    calls: Counter[str]  # op -> calls per rank per step
    spread: float | None  # share of the step's compute between the group's first and last dense call
    spread_of: str  # "compute" | "time": what ``spread`` measures
    per_step: float
    phases: dict[str, Counter[str]] = field(default_factory=dict)  # phase -> op -> calls per rank per step
    launchers: Counter[str] = field(default_factory=Counter)  # launcher (ddp, fsdp, engine op) -> events
    p2p: str | None = None  # send/recv topology: "ring" (one-way rotation, closed), "one-way" (not closed
    #                         over the ranks given), "two-way" (each rank exchanges both ways), None


#: Collectives that carry per-layer activations or parameters (a broadcast or barrier does not).
DENSE = ("allreduce", "allgather", "reducescatter")


def _dense_spread(ev: pl.DataFrame, windows: Mapping[int, pl.DataFrame],
                  compute: Mapping[tuple[int, int], float]) -> pl.DataFrame:
    """Per group: median over ranks and steps of how much of the step its dense calls span (see
    :func:`_usages`), in compute time (``by_compute``) and in wall time outside them (``by_time``)."""
    dense = ev.filter(pl.col("op").is_in(list(DENSE)))
    if dense.height == 0:
        return pl.DataFrame(schema={"pg": pl.Utf8, "by_compute": pl.Float64, "by_time": pl.Float64})
    dur = pl.col("end") - pl.col("ts")
    per_rs = dense.group_by(["pg", "rank", "step"]).agg(
        pl.col("busy_at_start").min().alias("b0"), pl.col("busy_at_start").max().alias("b1"),
        pl.col("ts").min().alias("t0"), pl.col("ts").max().alias("t1"),
        dur.sum().alias("dur"), dur.sort_by("ts").last().alias("last"))
    comp = pl.DataFrame([{"rank": r, "step": k, "c": c} for (r, k), c in compute.items()],
                        schema={"rank": pl.Int64, "step": pl.Int64, "c": pl.Float64})
    cols: dict[str, list[Any]] = {"rank": [], "step": [], "start": [], "end": []}
    for r, w in windows.items():  # plain lists: a thousand tiny frames cost more to select than to read
        if w is None or w.height == 0:
            continue
        cols["rank"] += [r] * w.height
        cols["step"] += w["step"].to_list()
        cols["start"] += w["start"].to_list()
        cols["end"] += w["end"].to_list()
    win = pl.DataFrame(cols, schema={"rank": pl.Int64, "step": pl.Int64, "start": pl.Float64, "end": pl.Float64})
    per_rs = per_rs.join(comp, on=["rank", "step"], how="left").join(win, on=["rank", "step"], how="left")
    rest = pl.col("end") - pl.col("start") - pl.col("dur")  # the step's time outside these calls
    per_rs = per_rs.with_columns(
        pl.when((pl.col("c") > 0) & pl.col("b0").is_not_null())
        .then(((pl.col("b1") - pl.col("b0")) / pl.col("c")).clip(0.0, 1.0)).alias("by_compute"),
        pl.when(rest > 0).then(((pl.col("t1") - pl.col("t0") - (pl.col("dur") - pl.col("last"))) / rest)
                               .clip(0.0, 1.0)).alias("by_time"),
    )
    return per_rs.group_by("pg").agg(pl.col("by_compute").median(), pl.col("by_time").median())


def _p2p_topology(ev: pl.DataFrame, members: Mapping[str, Sequence[int]]) -> dict[str, str]:
    """Per group with send/recv: ``ring`` when every rank given sends to one peer and receives from
    another and the partners close a cycle of 3 or more over all members (a context-parallel ring
    rotation); ``one-way`` when the given ranks rotate one way but not every member was given;
    ``two-way`` when a rank exchanges with a peer in both directions or with several peers (a
    pipeline stage: activations one way, gradients back)."""
    p = ev.filter(pl.col("p2p") & pl.col("src_rank").is_not_null() & pl.col("dst_rank").is_not_null())
    out: dict[str, str] = {}
    if p.height == 0:
        return out
    for (pg,), g in p.group_by(["pg"]):
        edges = {(int(s), int(d)) for s, d in g.select("src_rank", "dst_rank").unique().iter_rows() if s != d}
        seen = set(g["rank"].unique().to_list())
        outs: dict[int, set[int]] = defaultdict(set)
        ins: dict[int, set[int]] = defaultdict(set)
        for s, d in edges:
            outs[s].add(d)
            ins[d].add(s)
        one_way = all(len(outs[r]) == 1 and len(ins[r]) == 1 and outs[r] != ins[r] for r in seen)
        if not one_way:
            out[str(pg)] = "two-way"
            continue
        nodes = {x for e in edges for x in e}
        closed = len(nodes) >= 3 and all(len(outs[x]) == 1 and len(ins[x]) == 1 for x in nodes)
        every = set(members.get(str(pg)) or []) <= seen and bool(members.get(str(pg)))
        out[str(pg)] = "ring" if closed and every else "one-way"
    return out


def _usages(ev: pl.DataFrame, windows: Mapping[int, pl.DataFrame],
            compute: Mapping[tuple[int, int], float], members: Mapping[str, Sequence[int]] | None = None
            ) -> dict[str, _Usage]:
    """Per group: calls per rank and step by op and by phase, who launched them, the send/recv
    topology, and how much of the step the group's dense calls span.

    The spread tells per-layer collectives (first call in the first layer's forward, last in the
    last layer's backward: nearly all of the compute) from gradient reductions (backward only),
    where the trace cannot say which phase launched a call. It is measured in compute time
    (``busy_at_*``, the compute kernels' busy time, against the step's ``compute_us``) so that
    pipeline bubbles and data loading do not count; on CPU collectives (gloo), in the step's wall
    time outside the group's own calls. Broadcasts and barriers are left out of it (a DDP buffer
    broadcast at the start of forward would stretch a gradient all-reduce group over the step).
    Vectorised over all groups at once (a large job has thousands of groups).
    """
    if ev.height == 0:
        return {}
    cols = [c for c in ("pg", "rank", "step", "op", "ts", "end", "busy_at_start", "phase", "launcher", "p2p",
                        "src_rank", "dst_rank") if c in ev.columns]
    ev = ev.select(cols)
    for c in ("phase", "launcher"):
        if c not in ev.columns:
            ev = ev.with_columns(pl.lit(None, pl.Utf8).alias(c))
    if (ev["step"] >= 0).any():
        ev = ev.filter(pl.col("step") >= 0)
    ranksteps = {str(pg): max(int(n), 1) for pg, n in
                 ev.select("pg", "rank", "step").unique().group_by("pg").len().iter_rows()}
    spread = {str(pg): (bc, bt) for pg, bc, bt in _dense_spread(ev, windows, compute).iter_rows()}
    calls: dict[str, Counter[str]] = defaultdict(Counter)  # values are calls per rank and step (floats)
    phases: dict[str, dict[str, Counter[str]]] = defaultdict(lambda: defaultdict(Counter))
    for name, op, phase, n in ev.group_by(["pg", "op", "phase"]).agg(pl.len()).iter_rows():
        per = float(n) / ranksteps.get(str(name), 1)
        calls[str(name)][op] += per  # type: ignore[assignment]
        phases[str(name)][phase or "?"][op] += per  # type: ignore[assignment]
    launchers: dict[str, Counter[str]] = defaultdict(Counter)
    for name, who, n in ev.filter(pl.col("launcher").is_not_null()).group_by(["pg", "launcher"]).agg(pl.len()).iter_rows():
        launchers[str(name)][who] += int(n)
    topo = _p2p_topology(ev, members or {}) if "p2p" in ev.columns else {}
    out = {}
    for key in ranksteps:
        cnt = calls[key]
        by_c, by_t = spread.get(key, (None, None))
        sp: float | None
        if by_c is not None:
            sp, of = float(by_c), "compute"
        else:
            sp, of = (float(by_t) if by_t is not None else None), "time"
        out[key] = _Usage(cnt, sp, of, float(sum(cnt.values())), dict(phases[key]), launchers[key], topo.get(key))
    return out


def _fmt_calls(calls: Counter[str]) -> str:
    """The group's most frequent collectives; ties in name order, so the evidence text does not
    depend on the order the ranks' summaries arrived in (local pool vs Ray)."""
    top = sorted(calls.items(), key=lambda kv: (-kv[1], kv[0]))[:4]
    return ", ".join(f"{op} {n:.3g}/step" for op, n in top)


def _fmt_phases(u: _Usage) -> str:
    """``forward: allreduce 8/step; backward: allreduce 8/step`` (phases the trace tells apart)."""
    label = {"fwd": "forward", "bwd": "backward", "post": "after backward", "nobwd": "no backward in the step"}
    parts = [f"{label[p]}: {_fmt_calls(u.phases[p])}" for p in ("fwd", "bwd", "post", "nobwd") if u.phases.get(p)]
    return "; ".join(parts)


#: Engines whose own collective operators carry tensor parallelism (vLLM, SGLang, TensorRT-LLM...).
def _engine_ops(u: _Usage) -> list[str]:
    return sorted(w for w in u.launchers if w not in ("ddp", "fsdp"))


def role_from_usage(u: _Usage) -> tuple[str, str]:
    """(role, evidence) from the collectives a group runs; see the module docstring."""
    if u.per_step <= 0:
        return "other", "no communication in the traced steps"
    c = u.calls
    what = _fmt_calls(c)
    p2p = c["send"] + c["recv"] + c["sendrecv"]
    of = "the step's compute" if u.spread_of == "compute" else "the step's time outside them"
    dense = c["allreduce"] + c["allgather"] + c["reducescatter"]
    pos = f", calls spread over {100 * u.spread:.0f}% of {of}" if u.spread is not None and dense >= 2 else ""
    engine = _engine_ops(u)
    total_launch = sum(u.launchers.values())
    if p2p >= 0.5 * u.per_step:
        if u.p2p == "ring":
            return "cp", (f"point-to-point send/recv ({what}) rotating one way around a closed ring of the group's "
                          "ranks: context-parallel exchange of keys/values")
        if u.p2p == "one-way":
            return "unknown", (f"point-to-point send/recv ({what}) passed one way (receive from one peer, send to "
                               "another): a context-parallel ring or a forward-only pipeline; the ranks given do not "
                               "close the ring")
        return "pp", f"point-to-point send/recv ({what}): activations passed between pipeline stages"
    if c["alltoall"] > 0 and c["allreduce"] == 0 and c["alltoall"] >= max(c["allgather"], c["reducescatter"]):
        return "ep", f"all-to-all ({what}): tokens exchanged between expert ranks"
    if engine and sum(u.launchers[w] for w in engine) * 2 >= total_launch:
        return "tp", (f"{what}, issued by {', '.join(engine[:2])}: inference engines route their tensor-parallel "
                      "collectives through their own operators")
    if u.launchers.get("fsdp", 0) * 2 > total_launch > 0 and dense > 0:
        return "fsdp", f"{what}, issued by FullyShardedDataParallel: parameters gathered, gradients reduced"
    ph = u.phases
    fwd, bwd, post, nobwd = (ph.get(k, Counter()) for k in ("fwd", "bwd", "post", "nobwd"))
    if fwd or bwd or post:  # the trace shows forward and backward: the phases decide
        return _role_by_phase(u, fwd, bwd, post, what)
    if nobwd and not (ph.keys() - {"nobwd", "?"}):  # no backward anywhere in its steps: inference or serving
        return _role_without_backward(nobwd, what)
    if u.spread_of == "compute":
        per_layer = u.spread is not None and u.spread >= PER_LAYER_SPREAD
    else:  # wall time is a weaker witness (host stalls, waits inside the step): ask for more
        per_layer = u.spread is not None and u.spread >= PER_LAYER_SPREAD_TIME and dense >= 4
    if c["allgather"] > 0 and c["reducescatter"] > 0 and c["allreduce"] < min(c["allgather"], c["reducescatter"]):
        return "fsdp", f"all-gather with reduce-scatter ({what}{pos}): parameters gathered, gradients reduce-scattered"
    if dense >= 2 and per_layer:
        return "tp", f"{what}{pos}: per-layer activation collectives in forward and backward"
    if c["allreduce"] > 0:
        also = " (its all-to-alls exchange embeddings or tokens on the same group)" if c["alltoall"] else ""
        return "dp", (f"{what}{pos}: all-reduces not spread over the step like per-layer collectives, taken as "
                      f"gradient reduction (the trace does not say forward from backward){also}")
    if dense > 0:  # all-gather or reduce-scatter alone, not per layer (metrics, checkpoint gathers)
        return "other", f"{what}{pos}"
    return "other", f"{what} (barriers/broadcasts only)"


def _role_by_phase(u: _Usage, fwd: Counter[str], bwd: Counter[str], post: Counter[str], what: str) -> tuple[str, str]:
    """Roles of a training group from what it runs in forward and in backward (module docstring)."""
    where = _fmt_phases(u)
    ddp = " under DistributedDataParallel" if u.launchers.get("ddp") else ""
    if fwd["reducescatter"] >= 1 and fwd["allgather"] >= 1:
        return "tp", (f"{where}: all-gather and reduce-scatter inside forward (FSDP reduce-scatters gradients only "
                      "in backward): sequence-parallel tensor parallelism")
    if fwd["allreduce"] >= 2 and bwd["allreduce"] >= 2:
        return "tp", f"{where}: per-layer activation all-reduces in forward and backward"
    if (fwd["allgather"] + bwd["allgather"]) > 0 and (bwd["reducescatter"] + post["reducescatter"]) > 0:
        return "fsdp", f"{where}: parameters all-gathered, gradients reduce-scattered in backward"
    if bwd["allreduce"] + post["allreduce"] > 0 and fwd["allreduce"] < 2:
        also = " (its all-to-alls exchange embeddings or tokens on the same group)" if u.calls["alltoall"] else ""
        bc = " and a broadcast of buffers in forward" if fwd["broadcast"] else ""
        return "dp", f"{where}: gradient all-reduce in backward only{bc}{ddp}{also}"
    if fwd["allreduce"] >= 2:
        return "tp", f"{where}: per-layer all-reduces in forward (none in backward)"
    return "other", f"{where or what}: no per-layer or gradient pattern"


def _role_without_backward(nobwd: Counter[str], what: str) -> tuple[str, str]:
    """Roles when the steps have no backward (inference, serving, forward-only windows)."""
    if nobwd["allreduce"] >= 2 or (nobwd["allgather"] >= 1 and nobwd["reducescatter"] >= 1):
        return "tp", f"{what} with no backward in the trace: per-layer activation collectives of inference"
    if nobwd["allgather"] >= 2:
        return "unknown", (f"{what} with no backward in the trace: parameter gathers (FSDP) or activation gathers "
                           "(tensor/sequence parallel) cannot be told apart")
    return "other", f"{what} with no backward in the trace"


def _chain_length(ev: pl.DataFrame) -> int:
    """Ranks in the largest connected set of send/recv partners (a pipeline's stage count)."""
    p = ev.filter(pl.col("p2p") & pl.col("src_rank").is_not_null() & pl.col("dst_rank").is_not_null())
    if p.height == 0:
        return 0
    adj: dict[int, set[int]] = defaultdict(set)
    for rank, s, d in p.select("rank", "src_rank", "dst_rank").unique().iter_rows():
        peer = d if s == rank else s
        if peer != rank:
            adj[rank].add(peer)
            adj[peer].add(rank)
    best, seen = 0, set()
    for start in adj:
        if start in seen:
            continue
        comp, stack = set(), [start]
        while stack:
            x = stack.pop()
            if x not in comp:
                comp.add(x)
                stack.extend(adj[x] - comp)
        seen |= comp
        best = max(best, len(comp))
    return best


def node_map(ranks: Iterable[int], *, hosts: Mapping[int, str] | None = None,
             nccl: Mapping[str, Any] | None = None, devices: Mapping[int, int | None] | None = None,
             world_size: int | None = None) -> tuple[dict[int, int], str | None]:
    """Node index of each rank (nodes numbered by their lowest rank) and where it came from."""
    rs = sorted(set(int(r) for r in ranks))
    if hosts and all(r in hosts for r in rs):
        order: dict[str, int] = {}
        for r in rs:
            order.setdefault(hosts[r], len(order))
        return {r: order[hosts[r]] for r in rs}, "run.json"
    if nccl and nccl.get("nodes") and nccl.get("local_ranks") and world_size:
        n, local = int(nccl["nodes"]), int(nccl["local_ranks"])
        if n * local == world_size:
            return {r: r // local for r in rs}, "NCCL log"
    if devices and all(devices.get(r) is not None for r in rs):
        node, prev, out = 0, None, {}
        for r in rs:
            d = int(devices[r] or 0)  # never None here (checked above)
            if prev is not None and d < prev:  # equal: two processes sharing one GPU
                node += 1
            out[r], prev = node, d
        return out, "device index"
    return {}, None


#: Name of the row that gathers collectives the trace attributes to no process group (engines' own
#: communicators, custom all-reduce and expert-parallel kernels, older traces' unnamed kernels).
UNNAMED_PG = "(unnamed)"


def group_key(pg: str | None, groups: Iterable[str]) -> str:
    """The layout row of traffic of process group ``pg``: its name; for traffic that names no group,
    the :data:`UNNAMED_PG` row when named groups exist beside it, else the default group (a trace that
    names no group anywhere: :func:`infer_layout` takes every collective as the default group's)."""
    if pg is not None:
        return str(pg)
    return UNNAMED_PG if UNNAMED_PG in set(groups) else DEFAULT_PG
_NGPUS_RE = re.compile(r"(?:cross_?device_?reduce|all_?reduce)\w*<[^<>]*?,\s*(\d+)\s*>", re.IGNORECASE)


def _unnamed_size(ev: pl.DataFrame, world_size: int | None) -> tuple[int, str]:
    """Size of the unnamed traffic's group and where it came from: ``Group size`` when recorded, the
    GPU count a custom all-reduce kernel is compiled for (``cross_device_reduce_1stage<T, 4>``), else
    the world size."""
    gs = ev["group_size"].drop_nulls()
    if gs.len():
        return int(gs.max()), "the Group size recorded on its collectives"  # type: ignore[arg-type]
    sizes = Counter(int(m.group(1)) for k in ev["kernel"].drop_nulls().unique().to_list()
                    for m in [_NGPUS_RE.search(k)] if m)
    if sizes:
        n = max(sizes.items(), key=lambda kv: kv[1])[0]
        return n, f"the GPU count its all-reduce kernel is compiled for ({n})"
    if world_size:
        return int(world_size), "the world size (the trace names no group for it)"
    return len(ev["rank"].unique()), "the ranks given"


def infer_layout(comm: pl.DataFrame | Sequence[pl.DataFrame], groups: Iterable[Mapping[str, Any]] = (), *,
                 windows: Mapping[int, pl.DataFrame] | None = None, hosts: Mapping[int, str] | None = None,
                 nccl: Mapping[str, Any] | None = None, devices: Mapping[int, int | None] | None = None,
                 world_size: int | None = None, compute: Mapping[tuple[int, int], float] | None = None) -> Layout:
    """The layout of a job from its communication extracts and compact group records.

    ``comm``: the per-rank ``comm_events`` extracts (one frame or a list); ``groups``: ``pg_config``
    entries (raw or :func:`compact_groups`) from any ranks, duplicates allowed; ``windows``: each rank's
    device step windows (step, start, end); ``hosts`` (run.json), ``nccl`` (parsed NCCL log) and
    ``devices`` (each rank's device index) place ranks on nodes; ``compute``: compute time
    (``compute_us``) per (rank, step).
    """
    frames = [comm] if isinstance(comm, pl.DataFrame) else [f for f in comm if f.height]
    ev = pl.concat(frames, how="vertical_relaxed") if frames else pl.DataFrame()
    by_pg: dict[str, Group] = {}
    listed: set[str] = set()
    for g in groups:
        pg = str(g.get("pg_name"))
        if pg not in by_pg:
            members = expand_ranks(g.get("ranks"))
            by_pg[pg] = Group(pg, g.get("pg_desc"), int(g.get("pg_size") or len(members)), members)
            listed.add(pg)
    unnamed = False
    if ev.height:
        unnamed = ev["pg"].null_count() == ev.height and not by_pg
        if unnamed:  # older torch names no group anywhere: every collective is the default group's
            ev = ev.with_columns(pl.col("pg").fill_null(DEFAULT_PG))
        elif ev["pg"].null_count():  # named groups exist, but some traffic names none: one row of its own
            orphans = ev.filter(pl.col("pg").is_null())
            size, size_src = _unnamed_size(orphans, world_size)
            seen = sorted(orphans["rank"].unique().to_list())
            members = list(range(size)) if world_size and size == world_size else seen
            grp = Group(UNNAMED_PG, None, size, members)
            grp.evidence = (f"collectives the trace attributes to no process group, size from {size_src}"
                            + ("" if members != seen or size == len(seen) else "; members as given"))
            by_pg[UNNAMED_PG] = grp
            ev = ev.with_columns(pl.col("pg").fill_null(UNNAMED_PG))
        missing = ev.filter(~pl.col("pg").is_in(list(by_pg))).group_by("pg").agg(
            pl.col("pg_ranks").drop_nulls().first(), pl.col("group_size").max(),
            pl.col("pg_desc").drop_nulls().first(), pl.col("rank").unique().sort().alias("seen"))
        for pg, pg_ranks, size, desc, seen in missing.iter_rows():  # groups no pg_config listed
            members = expand_ranks(pg_ranks) or list(seen)
            if str(pg) == DEFAULT_PG and not expand_ranks(pg_ranks) and not size and world_size:
                members = list(range(int(world_size)))  # torch's group "0" is the world
            by_pg[str(pg)] = Group(str(pg), desc, int(size or len(members)), members)
        # a listed group whose own collectives say it is larger (a stale or one-rank pg_config): the
        # collectives' Group size and member list win, and the evidence says so
        bigger = ev.filter(pl.col("pg").is_in(list(listed))).group_by("pg").agg(
            pl.col("group_size").max(), pl.col("pg_ranks").drop_nulls().first())
        for pg, size, pg_ranks in bigger.iter_rows():
            grp = by_pg[str(pg)]
            if size and int(size) > grp.size:
                was = grp.size
                grp.ranks = expand_ranks(pg_ranks) or (list(range(int(size))) if size == world_size else grp.ranks)
                grp.size = int(size)
                grp.evidence = f"size {grp.size} from its collectives' Group size (distributedInfo.pg_config says {was})"
    seen_ranks = set(ev["rank"].unique().to_list()) if ev.height else set()
    all_ranks = sorted({r for grp in by_pg.values() for r in grp.ranks} | seen_ranks)
    nodes, node_src = node_map(all_ranks, hosts=hosts, nccl=nccl, devices=devices, world_size=world_size)
    usages = _usages(ev, windows or {}, compute or {}, {pg: g.ranks for pg, g in by_pg.items()}) if ev.height else {}
    pp_stages = 0
    for grp in by_pg.values():
        usage = usages.get(grp.pg) or _Usage(Counter(), None, "time", 0.0)
        named = role_from_desc(grp.desc)
        role, why = role_from_usage(usage)
        lead = grp.evidence + "; " if grp.evidence else ""
        if named:
            runs = f"; runs {_fmt_calls(usage.calls)}" if usage.per_step else ""
            grp.role, grp.evidence = named, f"description '{grp.desc}'" + runs
        elif grp.size <= 1 and not usage.per_step:
            grp.role, grp.evidence = "other", "a single rank: nothing to communicate"
        else:
            grp.role, grp.evidence = role, lead + why
        if grp.pg in listed and not usage.per_step and ev.height and grp.size > 1 and not named:
            grp.evidence += " (listed in distributedInfo.pg_config)"
            if UNNAMED_PG in by_pg:
                grp.evidence += f"; collectives that name no group are in the {UNNAMED_PG} row"
        if unnamed:
            grp.evidence += "; the trace does not name process groups: all collectives taken as the default group"
        if grp.role == "pp" and usage.per_step:
            pp_stages = max(pp_stages, _chain_length(ev.filter(pl.col("pg") == grp.pg)))
        if nodes:
            grp.nodes = sorted({nodes[r] for r in grp.ranks if r in nodes})
            if len(grp.nodes) > 1:
                grp.evidence += f"; spans {len(grp.nodes)} nodes (nodes from {node_src})"
    widest = max(by_pg.values(), key=lambda x: (x.size, -len(x.pg)), default=None)
    if widest is not None and node_src and len(widest.nodes) <= 1:  # say where nodes came from once
        widest.evidence += f"; nodes from {node_src}"
    degrees = {}
    for role in ROLES:
        sizes = Counter(g.size for g in by_pg.values() if g.role == role and g.size > 1)
        degrees[role] = max(sizes.items(), key=lambda kv: (kv[1], kv[0]))[0] if sizes else 1
    if pp_stages > 1:
        degrees["pp"] = pp_stages
    ordered = sorted(by_pg.values(), key=lambda x: (int(x.pg) if x.pg.isdigit() else 1 << 60, x.pg))
    return Layout(degrees, ordered, node_src)


def layout_from_summaries(summaries: Sequence[Any], *, hosts: Mapping[int, str] | None = None,
                          nccl: Mapping[str, Any] | None = None) -> Layout:
    """:func:`infer_layout` on the report's per-rank summaries (``analyze.RankSummary``)."""
    groups = [g for s in summaries for g in (s.meta.pg_config or [])]
    return infer_layout(
        [s.comm for s in summaries], groups,
        windows={s.entry["rank"]: s.windows for s in summaries},
        hosts=hosts, nccl=nccl, devices={s.entry["rank"]: s.meta.device_id for s in summaries},
        world_size=next((s.meta.world_size for s in summaries if s.meta.world_size), None) or len(summaries),
        compute={(s.entry["rank"], int(k)): float(c) for s in summaries if s.step_frame.height
                 for k, c in s.step_frame.select("step", "compute_us").iter_rows() if c},
    )
