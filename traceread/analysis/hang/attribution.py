"""Who stopped the job: every stuck process group, every culprit, every victim, from Flight Recorder.

The reduce side of ``hang``: it takes one :class:`~traceread.analysis.hang.flight_recorder.RankDump`
per rank (what each rank enqueued, started and completed in each of its groups) and decides.

1. **Groups.** Members come from ``pg_config`` (NCCL dumps). Gloo's is broken (one empty key), so
   members are the ranks whose dumps mention the group; a rank with no dump is put back into the
   group the layout says it belongs to (a group of one rank between groups of two with stride 1 is
   completed with the missing rank that fits). The role (tp/pp/ep/dp/…/world) comes from the
   description (``TENSOR_MODEL_PARALLEL_GROUP``, ``mesh_tp``…), else from what the group ran.
2. **Where each rank is.** A rank *is in* an op when it waits in it: for gloo the oldest pending op
   (gloo blocks the calling thread); for NCCL with start events (``TORCH_NCCL_ENABLE_TIMING=1``) every
   op whose kernel started; for NCCL without them the oldest pending op (the GPU runs its queue in
   order). A rank with nothing pending has its host outside collectives.
3. **Stuck collectives.** Per group, the first collective not completed by every member (``N`` = the
   smallest last-completed seq + 1), plus any later one a rank is in. For each, every member is *done*,
   *in it* (waiting), or *behind*: never enqueued it, enqueued it while its GPU never started it, or
   is in another op first; members with no dump are behind as far as anyone can tell.
4. **Culprits vs victims.** Each rank in a stuck collective waits for the members behind in it. A
   member behind is a *victim* when it is itself in another stuck collective (follow it), and a
   *culprit* when it is not: no dump (stopped or dead), nothing pending (its host never arrived:
   stuck, spinning, skipped), or queued ops none of which its GPU started (GPU stopped). A rank whose
   GPU stopped is therefore never accused of ordering or mismatch: it is the end of the chain. With
   start events, a collective nobody is in (a one-rank job, or every member's GPU stuck before it)
   still names the members whose GPU never started their queue.
5. **Cycles** of ranks each in a collective the other has not joined are order deadlocks (two
   collectives issued in a different order, or one skipped). The other ranks vote: in their own
   queue, which of the two collectives (same group role, same seq) came first. The ranks on the
   minority side are named; without a majority both sides are.
6. **Mismatch.** When every member is in a collective that does not complete, the entries at that
   seq are compared (op, dtype, and sizes for the ops whose sizes must agree): the minority is named.
   If they agree, the collective is listed as stuck with no culprit (a GPU stopped inside it, or the
   network failed); without start events FR cannot tell which member, and says so.

Culprits are ranked by how many ranks wait on them (directly or through others).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from traceread.analysis.hang.flight_recorder import GroupView, Op, RankDump, parse_ranks
from traceread.analysis.hang.groups import Group, build_groups, name_order, runs, stride_pattern
from traceread.read.jsonfile import plausible_rank, plausible_world_size

#: ops whose input sizes must agree on every member (all_to_all splits, gather/scatter roots legitimately differ)
SAME_SHAPE_OPS = frozenset({"all_reduce", "broadcast", "all_gather", "reduce_scatter", "barrier", "reduce"})
GLOO_LIKE = frozenset({"gloo", "mpi", "ucc"})

WHY_TEXT = {
    "gpu_stopped": "GPU stopped",
    "host_elsewhere": "never arrived",
    "no_dump": "no dump",
    "out_of_order": "out of order",
    "mismatch": "mismatch",
}


@dataclass
class Stuck:
    """A collective that does not complete: who is in it, who is behind and why."""

    group: Group
    seq: int
    ref: Op | None  # the entry at ``seq`` from a rank that enqueued it
    waiting: list[int]  # in it
    behind: dict[int, str]  # rank -> never_enqueued | not_started | busy | no_dump
    done: list[int]  # completed it already
    first: bool  # the group's first collective not completed by every member
    mismatch: list[str] = field(default_factory=list)
    mismatch_ranks: list[int] = field(default_factory=list)
    causes: list[int] = field(default_factory=list)  # culprits this collective waits on (directly or not)

    @property
    def key(self) -> tuple[str, int]:
        return (self.group.pg, self.seq)

    def what(self) -> str:
        """``all_reduce #12 on pg 0 (world, default_pg)``."""
        op = self.ref.op if self.ref else "collective"
        return f"{op} #{self.seq} on {self.group.label()}"

    def shape(self) -> str:
        if self.ref is None:
            return ""
        return f"{self.ref.sizes} {self.ref.dtypes}".strip()


@dataclass
class Culprit:
    rank: int
    why: str  # gpu_stopped | host_elsewhere | no_dump | out_of_order | mismatch
    stuck: Stuck | None  # the collective it holds up that most ranks wait in
    detail: str  # one sentence: what it did not do
    evidence: list[str] = field(default_factory=list)
    victims: list[int] = field(default_factory=list)  # ranks that wait on it, directly or through others
    positions: dict[str, tuple[int, int]] = field(default_factory=dict)  # pg -> (last enqueued, last completed)


@dataclass
class Attribution:
    groups: dict[str, Group]
    stuck: list[Stuck]
    culprits: list[Culprit]
    unexplained: list[Stuck]  # every member in it and none completes, entries agree
    notes: list[str]
    timing: bool  # some NCCL dump had start events
    world: int | None

    def waiting_ranks(self) -> list[int]:
        return sorted({r for s in self.stuck for r in s.waiting} - {c.rank for c in self.culprits})

# ----------------------------------------------------------------------------- where each rank is


@dataclass
class _Rank:
    rank: int
    dump: RankDump
    pending: list[Op]  # every pending op (collectives and p2p), enqueue order
    inside: set[tuple[str, int, bool]]  # (pg, seq, is_p2p) of the ops it is in


def _rank_state(rank: int, dump: RankDump, job_timing: bool) -> _Rank:
    """Where the rank is. ``job_timing``: some NCCL dump of the job has start events; TORCH_NCCL_ENABLE_TIMING
    is set for the whole job, so a rank whose buffer shows none (its GPU stopped before any start
    was recorded in the window) still has them."""
    pending = sorted((o for v in dump.groups.values() for o in v.pending + v.p2p_pending), key=lambda o: o.record_id)
    inside: set[tuple[str, int, bool]] = set()
    cpu_rec = dump.recorder == "cpu"
    cpu = [o for o in pending if o.backend in GLOO_LIKE or (not o.backend and cpu_rec)]
    gpu = [o for o in pending if not (o.backend in GLOO_LIKE or (not o.backend and cpu_rec))]
    if cpu:
        inside.add((cpu[0].pg, cpu[0].seq, cpu[0].is_p2p))  # gloo blocks the calling thread in its oldest op
    timed = [o for o in gpu if job_timing or (dump.groups.get(o.pg) is not None and dump.groups[o.pg].timing)]
    started = [o for o in timed if o.started]
    if started:
        inside.update((o.pg, o.seq, o.is_p2p) for o in started)
    untimed = [o for o in gpu if not (job_timing or (dump.groups.get(o.pg) is not None and dump.groups[o.pg].timing))]
    if untimed:
        inside.add((untimed[0].pg, untimed[0].seq, untimed[0].is_p2p))  # in order: the oldest is where it is
    return _Rank(rank, dump, pending, inside)


# ----------------------------------------------------------------------------- stuck collectives


def _entry_at(v: GroupView | None, seq: int) -> Op | None:
    if v is None:
        return None
    for o in v.pending:
        if o.seq == seq:
            return o
    for o in v.recent:
        if o.seq == seq:
            return o
    return None


def _stuck(g: Group, seq: int, ranks: Mapping[int, _Rank], first: bool) -> Stuck:
    waiting: list[int] = []
    behind: dict[int, str] = {}
    done: list[int] = []
    ref: Op | None = None
    for m in g.members:
        st = ranks.get(m)
        if st is None:
            behind[m] = "no_dump"
            continue
        v = g.views.get(m)
        if v is not None and v.completed >= seq:
            done.append(m)
            continue
        if v is None or v.enqueued < seq:
            behind[m] = "never_enqueued"
            continue
        if ref is None or (ref.where is None and _entry_at(v, seq) is not None):
            ref = _entry_at(v, seq) or ref
        if (g.pg, seq, False) in st.inside:
            waiting.append(m)
        else:
            behind[m] = "busy" if st.inside else "not_started"
    return Stuck(g, seq, ref, sorted(waiting), behind, done, first)


def _signature(o: Op) -> tuple[str, str, str]:
    return (o.op, o.sizes if o.op in SAME_SHAPE_OPS else "", o.dtypes)


def _check_mismatch(s: Stuck) -> None:
    """Entries at one seq that disagree: the minority is named (both sides when there is none)."""
    have = {r: o for r in s.waiting + s.done if (o := _entry_at(s.group.views.get(r), s.seq)) is not None}
    if len(have) < 2:
        return
    sigs = Counter(_signature(o) for o in have.values())
    if len(sigs) == 1:
        return
    (top, n_top), *rest = sigs.most_common()
    tie = rest and rest[0][1] == n_top
    for r, o in sorted(have.items()):
        sig = _signature(o)
        if sig == top and not tie:
            continue
        if tie and sig == top:
            continue
        other = top if sig != top else rest[0][0]
        diff = []
        if sig[0] != other[0]:
            diff.append(f"op {sig[0]} vs {other[0]}")
        if sig[1] != other[1]:
            diff.append(f"input sizes {sig[1]} vs {other[1]}")
        if sig[2] != other[2]:
            diff.append(f"dtypes {sig[2] or '-'} vs {other[2] or '-'}")
        peers = sorted(x for x, y in have.items() if _signature(y) == other)
        s.mismatch.append(f"collective #{s.seq} on {s.group.label()}: rank {r} has {'; '.join(diff)} "
                          f"(rank{'s' if len(peers) > 1 else ''} {runs(peers)})")
        s.mismatch_ranks.append(r)
    if tie:  # no majority: the other side too
        s.mismatch_ranks = sorted(have)


# ----------------------------------------------------------------------------- attribution


def attribute(dumps: Mapping[int, RankDump], world: int | None = None) -> Attribution:
    """The whole decision (see the module docstring)."""
    world = plausible_world_size(world)  # an impossible size is not believed: it would only size rank lists
    if world is None:
        texts = {text for d in dumps.values() for _desc, text in d.pg_config.values()}  # each distinct list once
        seen = {r for r in set(dumps) | {r for text in texts for r in parse_ranks(text)}
                if plausible_rank(r) is not None}
        world = max(seen) + 1 if seen else None
    groups, notes = build_groups(dumps, world)
    timing = any(v.timing for d in dumps.values() for v in d.groups.values())
    ranks = {r: _rank_state(r, d, timing) for r, d in dumps.items()}
    stuck: dict[tuple[str, int], Stuck] = {}
    for g in groups.values():
        dumped = [m for m in g.members if m in ranks and m in g.views]
        if not dumped:
            continue
        n = min(g.views[m].completed for m in dumped) + 1
        if any(g.views[m].enqueued >= n for m in dumped):
            stuck[(g.pg, n)] = _stuck(g, n, ranks, first=True)
    for st in ranks.values():
        for pg, seq, p2p in st.inside:
            if not p2p and (pg, seq) not in stuck and pg in groups:
                stuck[(pg, seq)] = _stuck(groups[pg], seq, ranks, first=False)
    for s in stuck.values():
        if not s.behind and s.waiting:
            _check_mismatch(s)

    # rank -> ranks it waits for (through the collective it is in)
    edges: dict[int, dict[int, Stuck]] = {}
    for s in stuck.values():
        for w in s.waiting:
            for h in s.behind:
                edges.setdefault(w, {}).setdefault(h, s)
    p2p_waits: list[Stuck] = []
    for st in ranks.values():  # point-to-point: a rank in a send/recv waits for its peer
        for o in st.pending:
            if o.is_p2p and (o.pg, o.seq, True) in st.inside and o.peer is not None and o.pg in groups:
                mem = groups[o.pg].members
                if 0 <= o.peer < len(mem):
                    peer = mem[o.peer]
                    if not _peer_in_pair(ranks.get(peer), st.rank, groups[o.pg]):
                        s_p2p = _p2p_stuck(groups[o.pg], o, st.rank, peer, ranks.get(peer))
                        edges.setdefault(st.rank, {}).setdefault(peer, s_p2p)
                        p2p_waits.append(s_p2p)

    culprits: dict[int, Culprit] = {}
    held: dict[int, list[Stuck]] = {}
    for hs in edges.values():
        for h, s in hs.items():
            held.setdefault(h, []).append(s)
    for h, ss in sorted(held.items()):
        if h in ranks and ranks[h].inside:
            continue  # it is in a collective itself: a victim (or part of an order deadlock, below)
        culprits[h] = _terminal(h, _first_missed(ss, ranks, groups), ranks.get(h), groups)
    for s in stuck.values():  # nobody in it: a member whose GPU never started its queue stopped by itself
        if not s.waiting:
            for h in sorted(s.behind):
                st_h = ranks.get(h)
                if h not in culprits and st_h is not None and st_h.pending and not st_h.inside:
                    culprits[h] = _terminal(h, s, st_h, groups)
    for h, c in _stopped_behind_peers(stuck, ranks).items():  # its own record lags its peers': it stopped
        culprits.setdefault(h, c)
    named_in_place: set[tuple[str, int]] = set()
    for s in stuck.values():  # everyone is in it; the member the job also waits for elsewhere is the one
        if s.waiting and not s.behind and not s.done and not s.mismatch_ranks and not _cpu(s.group):
            alone = [w for w in s.waiting if w in held and w not in culprits]
            if alone and len(alone) < len(s.waiting):
                named_in_place.add(s.key)
                for w in alone:
                    others = sorted({x.what() for x in held[w]})
                    culprits[w] = Culprit(
                        w, "gpu_stopped", s,
                        f"GPU most likely stopped: every member of {s.what()} is in it and none completes, and of "
                        "its members "
                        f"only rank {w} is also missing from {others[0]}" + (f" (+{len(others) - 1} more)" if
                                                                            len(others) > 1 else "")
                        + f"; ranks {runs(s.waiting)} are in {s.what()}",
                        [_stateless_note(ranks[w])] if _stateless(ranks[w]) else [])
    for comp in _cycles(edges, set(culprits)):
        for c in _order_deviants(comp, edges, ranks, groups):
            culprits.setdefault(c.rank, c)
    unexplained: list[Stuck] = []
    for s in stuck.values():
        if s.behind or not s.waiting or s.done or s.key in named_in_place:
            continue
        if s.mismatch_ranks:
            for r in s.mismatch_ranks:
                if r not in culprits:
                    culprits[r] = Culprit(r, "mismatch", s, next((m for m in s.mismatch if f"rank {r} " in m),
                                                                 s.mismatch[0]))
        else:
            unexplained.append(s)

    # victims: every rank from which a culprit is reachable
    reverse: dict[int, set[int]] = {}
    for w, hs in edges.items():
        for h in hs:
            reverse.setdefault(h, set()).add(w)
    for c in culprits.values():
        reached: set[int] = set()
        todo = [c.rank]
        while todo:
            x = todo.pop()
            for w in reverse.get(x, ()):
                if w not in reached and w != c.rank:
                    reached.add(w)
                    todo.append(w)
        if c.why == "mismatch" and c.stuck is not None:
            reached |= set(c.stuck.waiting) - {c.rank}
        c.victims = sorted(reached)
        if c.rank in ranks:
            c.positions = {pg: (v.enqueued, v.completed) for pg, v in sorted(ranks[c.rank].dump.groups.items(),
                                                                               key=lambda kv: name_order(kv[0]))}
    for s in stuck.values():
        s.causes = sorted(_causes(s, edges, culprits))
    ordered = sorted(culprits.values(), key=lambda c: (-len(c.victims), _time(c), c.rank))
    for s in p2p_waits:
        s.causes = sorted(_causes(s, edges, culprits))
    listed = sorted((s for s in stuck.values() if s.waiting or s.behind),
                    key=lambda s: (-len(s.waiting), name_order(s.group.pg), s.seq)) + p2p_waits
    return Attribution(groups, listed, ordered, unexplained, notes, timing, world)


#: Ranks asked which of two collectives comes first in their own queue.
MAX_VOTERS = 64


def _first_missed(ss: list[Stuck], ranks: Mapping[int, _Rank], groups: Mapping[str, Group]) -> Stuck:
    """Of the collectives a culprit holds up, the one it would have issued first: the one the other
    ranks (at most :data:`MAX_VOTERS`) issue before the others in their own queues (same group role,
    same seq); ties by the time the waiting ranks enqueued it, then by how many wait in it."""
    uniq = list({s.key: s for s in ss}.values())
    if len(uniq) == 1:
        return uniq[0]
    voters = [ranks[r] for r in sorted(ranks)[:MAX_VOTERS]]
    wins = {s.key: 0 for s in uniq}
    for i, a in enumerate(uniq):
        for b in uniq[i + 1:]:
            v = sum(_vote(st, a, b, groups) for st in voters)
            if v > 0:
                wins[a.key] += 1
            elif v < 0:
                wins[b.key] += 1
    return min(uniq, key=lambda s: (-wins[s.key], s.ref.time_ns if s.ref and s.ref.time_ns else 1 << 62,
                                    -len(s.waiting), s.seq))


def _time(c: Culprit) -> int:
    return (c.stuck.ref.time_ns or 0) if c.stuck and c.stuck.ref else 0


def _peer_in_pair(peer: _Rank | None, me: int, g: Group) -> bool:
    """Whether ``peer`` is in a send/recv with ``me`` too (both sides posted: not a wait *for* it)."""
    if peer is None:
        return False
    for o in peer.pending:
        if o.is_p2p and o.pg == g.pg and (o.pg, o.seq, True) in peer.inside and o.peer is not None \
                and 0 <= o.peer < len(g.members) and g.members[o.peer] == me:
            return True
    return False


def _p2p_stuck(g: Group, o: Op, me: int, peer: int, peer_state: _Rank | None) -> Stuck:
    """A send/recv a rank is in while its peer has not posted the other side."""
    if peer_state is None:
        why = "no_dump"
    elif peer_state.inside:
        why = "busy"
    elif any(x.is_p2p and x.pg == g.pg and x.peer is not None and 0 <= x.peer < len(g.members)
             and g.members[x.peer] == me for x in peer_state.pending):
        why = "not_started"
    else:
        why = "never_enqueued"
    return Stuck(g, o.seq, o, [me], {peer: why}, [], first=False)


def _terminal(h: int, s: Stuck, st: _Rank | None, groups: Mapping[str, Group]) -> Culprit:
    """A member behind in ``s`` that is not itself in any collective: why."""
    what = s.what()
    if st is None:
        return Culprit(h, "no_dump", s, f"no Flight Recorder dump; ranks {runs(s.waiting)} wait for it in {what}"
                       if s.waiting else f"no Flight Recorder dump; it is behind in {what}")
    v = s.group.views.get(h)
    if not st.pending:
        last = f"last enqueued #{v.enqueued}, last completed #{v.completed} in {s.group.label()}" if v else \
            f"no record of {s.group.label()} in its dump"
        return Culprit(h, "host_elsewhere", s, f"never called {what}: every collective it enqueued completed "
                       f"({last}); its host is outside collectives", [])
    head = st.pending[0]
    hg = groups.get(head.pg)
    n_more = len(st.pending) - 1 + sum(v.more_pending for v in st.dump.groups.values())  # beyond MAX_PENDING too
    return Culprit(h, "gpu_stopped", s,
                   f"GPU stopped: its host enqueued {head.op} #{head.seq} on {hg.label() if hg else 'pg ' + head.pg} "
                   f"but its GPU never started it" + (f" ({n_more} more queued behind it)" if n_more else "")
                   + (f"; ranks {runs(s.waiting)} wait in {what}" if s.waiting else ""))


def _cpu(g: Group) -> bool:
    """A gloo-like group (its members' views say so): the calling thread is in the op, there is no GPU queue."""
    return any(v.backend in GLOO_LIKE for v in g.views.values())


def _stateless(st: _Rank) -> bool:
    """Whether every entry of the rank's NCCL dump is ``scheduled`` (no start, no completion recorded)."""
    ops = [o for v in st.dump.groups.values() for o in v.pending + v.recent]
    return bool(ops) and all(o.state == "scheduled" and o.backend not in GLOO_LIKE for o in ops)


def _stateless_note(st: _Rank) -> str:
    return ("its Flight Recorder entries carry no state beyond 'scheduled' (torch records an op without CUDA events "
            "inside a coalescing group or under graph capture, and leaves the state as it was when querying an event "
            "fails on a faulted GPU): completion comes from pg_status and the peers' records")


def _stopped_behind_peers(stuck: Mapping[tuple[str, int], Stuck], ranks: Mapping[int, _Rank]) -> dict[int, Culprit]:
    """Ranks whose own record shows a collective never completing that a peer in the group completed.

    On a GPU backend a collective completes on every member or on none, so a member that enqueued it and
    never saw it complete while a peer went past it is not waiting for anyone: its GPU (or the watchdog
    that polls its CUDA events) stopped. Gloo is left out: its ``pg_status`` lags by design.
    Each such rank is named once, at the collective earliest in its own queue."""
    found: dict[int, tuple[int, Stuck]] = {}
    for s in stuck.values():
        if not s.done or _cpu(s.group):
            continue
        lagging = list(s.waiting) + [r for r, why in s.behind.items() if why in ("busy", "not_started")]
        for r in lagging:
            st = ranks.get(r)
            o = _entry_at(s.group.views.get(r), s.seq)
            order = o.record_id if o is not None else 1 << 62
            if st is not None and (r not in found or order < found[r][0]):
                found[r] = (order, s)
    out: dict[int, Culprit] = {}
    for r, (_order, s) in sorted(found.items()):
        ahead = {m: s.group.views[m] for m in s.done if m in s.group.views}
        far = max((v.completed for v in ahead.values()), default=s.seq)
        peers = sorted(ahead)
        beyond = far - s.seq
        detail = (f"GPU stopped: its record shows {s.what()} never completing while rank{'s' if len(peers) > 1 else ''} "
                  f"{runs(peers)} completed it" + (f" and {beyond} more collective{'s' if beyond > 1 else ''} after it "
                                                    f"(to #{far})" if beyond > 0 else ""))
        detail += f"; a collective completes on every member or on none, so its GPU stopped after {s.what()} ran"
        ev = [_stateless_note(ranks[r])] if _stateless(ranks[r]) else []
        out[r] = Culprit(r, "gpu_stopped", s, detail, ev)
    return out


def _causes(s: Stuck, edges: dict[int, dict[int, Stuck]], culprits: Mapping[int, Culprit]) -> set[int]:
    out: set[int] = set()
    seen: set[int] = set()
    todo = list(s.behind) + (list(s.mismatch_ranks) if not s.behind else [])
    while todo:
        x = todo.pop()
        if x in seen:
            continue
        seen.add(x)
        if x in culprits:
            out.add(x)
            continue
        todo.extend(edges.get(x, ()))
    return out


# ----------------------------------------------------------------------------- order deadlocks


def _cycles(edges: dict[int, dict[int, Stuck]], terminal: set[int]) -> list[list[int]]:
    """Strongly connected components of two or more ranks (iterative Tarjan)."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on: set[int] = set()
    stack: list[int] = []
    out: list[list[int]] = []
    counter = 0
    nodes = [n for n in edges if n not in terminal]
    for root in nodes:
        if root in index:
            continue
        work = [(root, iter(sorted(h for h in edges.get(root, {}) if h not in terminal)))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(h for h in edges.get(nxt, {}) if h not in terminal))))
                elif nxt in on:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def _role_key(g: Group) -> tuple[str, ...]:
    if g.role == "world":
        return ("world",)
    p = stride_pattern(g.members)
    return (g.role, g.desc.lower(), str(p[0] if p else len(g.members)), str(p[1] if p else ""))


def _analog(st: _Rank, g: Group, groups: Mapping[str, Group]) -> GroupView | None:
    """The rank's own group of ``g``'s role (``g`` itself when it is a member)."""
    if st.rank in g.views or st.rank in g.members:
        return g.views.get(st.rank)
    key = _role_key(g)
    for name, v in st.dump.groups.items():
        other = groups.get(name)
        if other is not None and _role_key(other) == key:
            return v
    return None


def _vote(st: _Rank, a: Stuck, b: Stuck, groups: Mapping[str, Group]) -> int:
    """+1 when the rank did ``a`` first, -1 when ``b`` first, 0 when it cannot say."""
    va, vb = _analog(st, a.group, groups), _analog(st, b.group, groups)
    if va is None or vb is None:
        return 0
    ha, hb = va.enqueued >= a.seq, vb.enqueued >= b.seq
    if ha and hb:
        ea, eb = _entry_at(va, a.seq), _entry_at(vb, b.seq)
        if ea is None or eb is None:
            return 0
        return 1 if ea.record_id < eb.record_id else -1
    if ha:
        return 1
    if hb:
        return -1
    return 0


def _order_deviants(comp: list[int], edges: dict[int, dict[int, Stuck]], ranks: Mapping[int, _Rank],
                    groups: Mapping[str, Group]) -> list[Culprit]:
    """In a cycle, the ranks whose order of two collectives differs from everyone else's."""
    members = set(comp)
    deviant: dict[int, tuple[Stuck, Stuck, int, int]] = {}
    undecided: list[tuple[int, int, Stuck, Stuck]] = []
    for w in comp:
        for h, s_w in edges.get(w, {}).items():
            if h not in members:
                continue
            s_h = next((s for s in edges.get(h, {}).values() if h in s.waiting), None)
            if s_h is None:
                continue
            votes = [_vote(st, s_w, s_h, groups) for r, st in ranks.items() if r not in members]
            first_w, first_h = votes.count(1), votes.count(-1)
            if first_w > first_h:  # the others do w's collective first: h went ahead without it
                deviant.setdefault(h, (s_h, s_w, first_w, first_w + first_h))
            elif first_h > first_w:
                deviant.setdefault(w, (s_w, s_h, first_h, first_w + first_h))
            else:
                undecided.append((w, h, s_w, s_h))
    out: list[Culprit] = []
    for r, (own, skipped, agree, total) in deviant.items():
        detail = (f"called {own.what()} before {skipped.what()}, which {agree} of {total} other ranks call first: "
                  f"it skipped {skipped.ref.op if skipped.ref else 'the collective'} #{skipped.seq} or issued the two "
                  f"in a different order; rank{'s' if len(skipped.waiting) > 1 else ''} {runs(skipped.waiting)} "
                  f"wait{'' if len(skipped.waiting) > 1 else 's'} in it")
        out.append(Culprit(r, "out_of_order", skipped, detail))
    if not deviant:
        for w, h, s_w, s_h in undecided:
            for r, own, other in ((w, s_w, s_h), (h, s_h, s_w)):
                if all(c.rank != r for c in out):
                    out.append(Culprit(r, "out_of_order", other,
                                       f"is in {own.what()} while rank{'s' if len(other.waiting) > 1 else ''} "
                                       f"{runs(other.waiting)} wait{'' if len(other.waiting) > 1 else 's'} for it in "
                                       f"{other.what()}: the two collectives were issued in a different order on "
                                       "different ranks (no other rank tells which order is right)"))
    return out
