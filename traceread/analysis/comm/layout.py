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
        """The role of process group ``pg`` (its name); ``"other"`` when unknown."""
        for g in self.groups:
            if g.pg == str(pg):
                return g.role
        return "other"

    def group(self, pg: str | None) -> Group | None:
        return next((g for g in self.groups if g.pg == str(pg)), None)

    def to_json(self) -> dict[str, Any]:
        return {"degrees": dict(self.degrees), "groups": [g.to_json() for g in self.groups]}


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
    """What one group did in the traced steps (medians over ranks and steps)."""

    calls: Counter[str]  # op -> calls per rank per step
    spread: float | None  # share of the step's compute between the group's first and last call
    spread_of: str  # "compute" | "time": what ``spread`` measures
    per_step: float


def _usages(ev: pl.DataFrame, windows: Mapping[int, pl.DataFrame],
            compute: Mapping[tuple[int, int], float]) -> dict[str, _Usage]:
    """Per group: calls per rank and step by op, and how much of the step the group's calls span.

    The spread tells per-layer collectives (first call in the first layer's forward, last in the
    last layer's backward: nearly all of the compute) from gradient reductions (backward only).
    It is measured in compute time (``busy_at_*``, the compute kernels' busy time, against the
    step's ``compute_us``) so that pipeline bubbles and data loading do not count; on CPU
    collectives (gloo), in the step's wall time outside the group's own calls. Vectorised over all
    groups at once (a large job has thousands of groups).
    """
    if ev.height == 0:
        return {}
    ev = ev.select("pg", "rank", "step", "op", "ts", "end", "busy_at_start")
    if (ev["step"] >= 0).any():
        ev = ev.filter(pl.col("step") >= 0)
    dur = pl.col("end") - pl.col("ts")
    per_rs = ev.group_by(["pg", "rank", "step"]).agg(
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
    spread = per_rs.group_by("pg").agg(pl.len().alias("ranksteps"), pl.col("by_compute").median(),
                                       pl.col("by_time").median())
    calls: dict[str, Counter[str]] = defaultdict(Counter)
    ranksteps = {pg: max(int(n), 1) for pg, n in spread.select("pg", "ranksteps").iter_rows()}
    for pg, op, n in ev.group_by(["pg", "op"]).agg(pl.len()).iter_rows():
        # a Counter for its zero default, though calls per rank and step are fractions (typeshed: int only)
        calls[pg][op] = float(n) / ranksteps.get(pg, 1)  # type: ignore[assignment]
    out = {}
    for pg, _n, by_c, by_t in spread.iter_rows():
        c = calls[pg]
        if by_c is not None:
            out[pg] = _Usage(c, float(by_c), "compute", sum(c.values()))
        else:
            out[pg] = _Usage(c, float(by_t) if by_t is not None else None, "time", sum(c.values()))
    return out


def _fmt_calls(calls: Counter[str]) -> str:
    """The group's most frequent collectives; ties in name order, so the evidence text does not
    depend on the order the ranks' summaries arrived in (local pool vs Ray)."""
    top = sorted(calls.items(), key=lambda kv: (-kv[1], kv[0]))[:4]
    return ", ".join(f"{op} {n:.3g}/step" for op, n in top)


def role_from_usage(u: _Usage) -> tuple[str, str]:
    """(role, evidence) from the collectives a group runs; see the module docstring."""
    if u.per_step <= 0:
        return "other", "no communication in the traced steps"
    c = u.calls
    what = _fmt_calls(c)
    p2p = c["send"] + c["recv"] + c["sendrecv"]
    of = "the step's compute" if u.spread_of == "compute" else "the step's time outside them"
    pos = f", calls spread over {100 * u.spread:.0f}% of {of}" if u.spread is not None and u.per_step >= 2 else ""
    if p2p >= 0.5 * u.per_step:
        return "pp", f"point-to-point send/recv ({what}): activations passed between pipeline stages"
    if c["alltoall"] > 0 and c["allreduce"] == 0 and c["alltoall"] >= max(c["allgather"], c["reducescatter"]):
        return "ep", f"all-to-all ({what}): tokens exchanged between expert ranks"
    if u.spread_of == "compute":
        per_layer = u.spread is not None and u.spread >= PER_LAYER_SPREAD
    else:  # wall time is a weaker witness (host stalls, waits inside the step): ask for more
        per_layer = u.spread is not None and u.spread >= PER_LAYER_SPREAD_TIME and u.per_step >= 4
    if c["allgather"] > 0 and c["reducescatter"] > 0 and c["allreduce"] < min(c["allgather"], c["reducescatter"]):
        return "fsdp", f"all-gather with reduce-scatter ({what}{pos}): parameters gathered, gradients reduce-scattered"
    dense = c["allreduce"] + c["allgather"] + c["reducescatter"]
    if dense >= 2 and per_layer:
        return "tp", f"{what}{pos}: per-layer activation collectives in forward and backward"
    if c["allreduce"] > 0:
        also = " (its all-to-alls exchange embeddings or tokens on the same group)" if c["alltoall"] else ""
        return "dp", f"{what}{pos}: gradient all-reduce during backward only{also}"
    if dense > 0:  # all-gather or reduce-scatter alone, not per layer (metrics, checkpoint gathers)
        return "other", f"{what}{pos}"
    return "other", f"{what} (barriers/broadcasts only)"


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
    for listed in groups:
        pg = str(listed.get("pg_name"))
        if pg not in by_pg:
            members = expand_ranks(listed.get("ranks"))
            by_pg[pg] = Group(pg, listed.get("pg_desc"), int(listed.get("pg_size") or len(members)), members)
    unnamed = False
    if ev.height:
        unnamed = ev["pg"].null_count() == ev.height and not by_pg
        ev = ev.with_columns(pl.col("pg").fill_null(DEFAULT_PG)) if unnamed else ev.filter(pl.col("pg").is_not_null())
        missing = ev.filter(~pl.col("pg").is_in(list(by_pg))).group_by("pg").agg(
            pl.col("pg_ranks").drop_nulls().first(), pl.col("group_size").max(),
            pl.col("pg_desc").drop_nulls().first(), pl.col("rank").unique().sort().alias("seen"))
        for pg, pg_ranks, size, desc, seen in missing.iter_rows():  # groups no pg_config listed
            members = expand_ranks(pg_ranks) or list(seen)
            by_pg[str(pg)] = Group(str(pg), desc, int(size or len(members)), members)
    traced = set(ev["rank"].unique().to_list()) if ev.height else set()
    all_ranks = sorted({r for g in by_pg.values() for r in g.ranks} | traced)
    nodes, node_src = node_map(all_ranks, hosts=hosts, nccl=nccl, devices=devices, world_size=world_size)
    usages = _usages(ev, windows or {}, compute or {}) if ev.height else {}
    pp_stages = 0
    for g in by_pg.values():
        usage = usages.get(g.pg) or _Usage(Counter(), None, "time", 0.0)
        named = role_from_desc(g.desc)
        role, why = role_from_usage(usage)
        if named:
            runs = f"; runs {_fmt_calls(usage.calls)}" if usage.per_step else ""
            g.role, g.evidence = named, f"description '{g.desc}'{runs}"
        elif g.size <= 1:
            g.role, g.evidence = "other", "a single rank: nothing to communicate"
        else:
            g.role, g.evidence = role, why
        if unnamed:
            g.evidence += "; the trace does not name process groups: all collectives taken as the default group"
        if g.role == "pp" and usage.per_step:
            pp_stages = max(pp_stages, _chain_length(ev.filter(pl.col("pg") == g.pg)))
        if nodes:
            g.nodes = sorted({nodes[r] for r in g.ranks if r in nodes})
            if len(g.nodes) > 1:
                g.evidence += f"; spans {len(g.nodes)} nodes (nodes from {node_src})"
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
