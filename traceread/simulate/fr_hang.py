"""Simulated hangs of Megatron-like jobs, with the Flight Recorder dumps torch would write and exact truth.

``simulate_hang(out, tp=2, pp=4, dp=2, ep=1, faults=[(5, 0.4)])`` lays ranks out in Megatron's order
(tensor fastest: ``rank = tp + TP*(dp + DP*pp)``), creates the groups every rank creates (default, TP,
DP, PP, and with ``ep > 1`` expert-parallel groups inside each DP group plus expert-data-parallel
groups), runs one 1F1B training step per rank on one in-order GPU queue each, and stops the GPU of
each faulted rank part-way through its step (``(rank, share)``: at the first compute kernel after that
share of its ops). Everything else follows from the schedule:

* a collective completes when every member's GPU has reached it (``max(arrivals) + cost``);
* a send completes when posted (NCCL buffers small messages; Megatron posts its send and receive
  together); a receive completes once the matching send was posted;
* each rank's host enqueued the whole step (it blocks only at the step's end, ``loss.item()``), so
  a faulted rank's Flight Recorder shows everything after the stop enqueued and never started, while
  healthy stages keep running their micro-batches until they wait for a stuck peer.

Earlier steps (enough to fill the ring buffer) completed normally. The dumps are written by
:mod:`traceread.simulate.flight_recorder`; ``truth.json`` comes from this schedule, never from the
analysis: the culprits (the faulted ranks), every stuck collective (per group the first one not
completed by every member, and any one a rank's GPU is in) with the ranks in it, and each rank's state.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from traceread.simulate.flight_recorder import Entry, RankRecorder, write_dump

T0_NS = 1_795_000_000_000_000_000
HOST_GAP_US = 2.0  # between two enqueues on a host thread
MEGATRON = {"tp": "TENSOR_MODEL_PARALLEL_GROUP", "dp": "DATA_PARALLEL_GROUP", "pp": "PIPELINE_MODEL_PARALLEL_GROUP",
            "ep": "EXPERT_MODEL_PARALLEL_GROUP", "edp": "EXPERT_DATA_PARALLEL_GROUP"}
MEGATRON_SRC = "/workspace/Megatron-LM/megatron/core"
WHERE = {
    ("tp", "all_reduce"): ("reduce_from_tensor_model_parallel_region", f"{MEGATRON_SRC}/tensor_parallel/mappings.py", 223),
    ("ep", "all_to_all"): ("token_permutation", f"{MEGATRON_SRC}/transformer/moe/token_dispatcher.py", 481),
    ("pp", "send"): ("_communicate", f"{MEGATRON_SRC}/pipeline_parallel/p2p_communication.py", 394),
    ("pp", "recv"): ("_communicate", f"{MEGATRON_SRC}/pipeline_parallel/p2p_communication.py", 394),
    ("dp", "reduce_scatter"): ("start_grad_sync", f"{MEGATRON_SRC}/distributed/param_and_grad_buffer.py", 412),
    ("dp", "all_gather"): ("start_param_sync", f"{MEGATRON_SRC}/distributed/param_and_grad_buffer.py", 337),
    ("edp", "all_reduce"): ("start_grad_sync", f"{MEGATRON_SRC}/distributed/param_and_grad_buffer.py", 412),
    ("world", "all_reduce"): ("get_grad_norm_fp32", f"{MEGATRON_SRC}/optimizer/clip_grads.py", 138),
}
# durations (µs) of one layer's kernels and of the collectives
FWD_US, BWD_US, EXPERT_US = 700.0, 1400.0, 500.0
COST_US = {"all_reduce": 90.0, "all_to_all": 140.0, "reduce_scatter": 1800.0, "all_gather": 1500.0, "p2p": 40.0}
SIZES = {"tp": [[4096, 1, 8192]], "ep": [[8192, 8192]], "pp": [[4096, 1, 8192]], "dp": [[268435456]],
         "edp": [[134217728]], "world": [[1]]}
DTYPES = {"tp": "BFloat16", "ep": "BFloat16", "pp": "BFloat16", "dp": "Float", "edp": "Float", "world": "Float"}


@dataclass
class HangKnobs:
    tp: int = 2
    pp: int = 4
    dp: int = 2
    ep: int = 1  # expert parallel size (divides dp); 1 = dense model
    microbatches: int = 4
    layers: int = 2  # per pipeline stage
    faults: list[tuple[int, float]] = field(default_factory=lambda: [(5, 0.4)])  # (rank, share of its step)
    timing: bool = True  # TORCH_NCCL_ENABLE_TIMING=1: "started" entries and start times
    buffer: int = 2000  # TORCH_FR_BUFFER_SIZE
    descs: str = "megatron"  # "megatron" (group_desc like Megatron's) | "undefined" (new_group without desc)
    frames: bool = True  # Python stack of each enqueue (torch's default for the pickle)
    states: str = "events"  # "events" | "scheduled": every entry's state is "scheduled" (FR had no CUDA event to
    # query: ops recorded inside a coalescing group, or a faulted CUDA context); only pg_status says what completed
    blind: int = 0  # a faulted rank's record missed the completion of its last ``blind`` collectives before its
    # GPU stopped (its watchdog stopped seeing CUDA events): its peers completed them and went on past them

    @property
    def world(self) -> int:
        return self.tp * self.dp * self.pp


# op tuples: (kind, role, group, seq_or_key, op, cost_us, peer_global) -- kind C compute, K collective, S send, R recv
C, K, S, R = "C", "K", "S", "R"


@dataclass
class Layout:
    knobs: HangKnobs
    groups: list[tuple[str, str, str, list[int]]]  # (name, role, desc, members) in creation order
    of_rank: list[dict[str, str]]  # rank -> role -> group name

    def members(self, name: str) -> list[int]:
        return self._members[name]

    def __post_init__(self) -> None:
        self._members = {g[0]: g[3] for g in self.groups}
        self._role = {g[0]: g[1] for g in self.groups}

    def role(self, name: str) -> str:
        return self._role[name]


def build_layout(k: HangKnobs) -> Layout:
    if k.ep < 1 or k.dp % k.ep:
        raise ValueError(f"ep={k.ep} must divide dp={k.dp}")
    tp, dp, pp = k.tp, k.dp, k.pp

    def rank(t: int, d: int, p: int) -> int:
        return t + tp * (d + dp * p)

    lists: list[tuple[str, list[int]]] = [("world", list(range(k.world)))]
    lists += [("tp", [rank(t, d, p) for t in range(tp)]) for p in range(pp) for d in range(dp)]
    lists += [("dp", [rank(t, d, p) for d in range(dp)]) for p in range(pp) for t in range(tp)]
    lists += [("pp", [rank(t, d, p) for p in range(pp)]) for d in range(dp) for t in range(tp)]
    if k.ep > 1:
        lists += [("ep", [rank(t, b * k.ep + e, p) for e in range(k.ep)])
                  for p in range(pp) for t in range(tp) for b in range(dp // k.ep)]
        lists += [("edp", [rank(t, b * k.ep + e, p) for b in range(dp // k.ep)])
                  for p in range(pp) for t in range(tp) for e in range(k.ep)]
    groups = []
    of_rank: list[dict[str, str]] = [{} for _ in range(k.world)]
    for i, (role, members) in enumerate(lists):
        desc = "default_pg" if role == "world" else (MEGATRON[role] if k.descs == "megatron" else "undefined")
        name = str(i)
        groups.append((name, role, desc, members))
        for r in members:
            of_rank[r][role] = name
    return Layout(k, groups, of_rank)


def program(k: HangKnobs, lay: Layout, r: int) -> list[tuple[Any, ...]]:
    """One step of rank ``r``: compute kernels, collectives (seq counted from 1 in the step), sends/recvs."""
    g = lay.of_rank[r]
    stage = r // (k.tp * k.dp)
    P, M = k.pp, k.microbatches
    counts: dict[str, int] = {}
    ops: list[tuple[Any, ...]] = []

    def coll(role: str, op: str) -> None:
        name = g[role]
        counts[name] = counts.get(name, 0) + 1
        ops.append((K, role, name, counts[name], op, COST_US[op], None))

    def p2p(kind: str, peer_stage: int, tag: tuple[str, int]) -> None:
        peer = lay.members(g["pp"])[peer_stage]
        src, dst = (r, peer) if kind == S else (peer, r)
        ops.append((kind, "pp", g["pp"], (src, dst) + tag, "send" if kind == S else "recv", COST_US["p2p"], peer))

    def layer_pass(fwd: bool) -> None:
        for _ in range(k.layers):
            ops.append((C, None, None, None, "attention", (FWD_US if fwd else BWD_US) / 2, None))
            coll("tp", "all_reduce")
            if k.ep > 1:
                coll("ep", "all_to_all")
                ops.append((C, None, None, None, "experts", EXPERT_US * (1 if fwd else 2), None))
                coll("ep", "all_to_all")
            else:
                ops.append((C, None, None, None, "mlp", (FWD_US if fwd else BWD_US) / 2, None))
            coll("tp", "all_reduce")

    def forward(m: int) -> None:
        if stage > 0:
            p2p(R, stage - 1, ("fwd", m))
        layer_pass(True)
        if stage < P - 1:
            p2p(S, stage + 1, ("fwd", m))

    def backward(m: int) -> None:
        if stage < P - 1:
            p2p(R, stage + 1, ("bwd", m))
        layer_pass(False)
        if stage > 0:
            p2p(S, stage - 1, ("bwd", m))

    warm = min(P - stage - 1, M)
    for m in range(warm):
        forward(m)
    for i in range(M - warm):
        forward(warm + i)
        backward(i)
    for m in range(M - warm, M):
        backward(m)
    for _ in range(2):
        coll("dp", "reduce_scatter")
    if k.ep > 1:
        coll("edp", "all_reduce")
    coll("world", "all_reduce")
    coll("dp", "all_gather")
    return ops


@dataclass
class Outcome:
    """The step as it ran: per rank and op index, when its GPU started and ended it (None: never)."""

    progs: list[list[tuple[Any, ...]]]
    start: list[list[float | None]]
    end: list[list[float | None]]
    pos: list[int]  # index of the op each GPU is at (len(prog): done)
    stopped: dict[int, int]  # faulted rank -> index of the compute kernel its GPU stopped in
    step_us: float  # the healthy step's length (for the history before it)


def run_step(k: HangKnobs, lay: Layout) -> Outcome:
    n = k.world
    progs = [program(k, lay, r) for r in range(n)]
    stopped: dict[int, int] = {}
    for r, share in k.faults:
        if not 0 <= r < n:
            raise ValueError(f"fault rank {r} is not in a world of {n}")
        computes = [i for i, op in enumerate(progs[r]) if op[0] == C]
        at = min(max(0.0, share), 1.0) * len(progs[r])
        stopped[r] = next((i for i in computes if i >= at), computes[-1])  # the last kernel when none is later
    start: list[list[float | None]] = [[None] * len(p) for p in progs]
    end: list[list[float | None]] = [[None] * len(p) for p in progs]
    pos = [0] * n
    t = [0.0] * n
    size = {name: len(members) for name, _role, _d, members in lay.groups}
    arrived: dict[tuple[str, int], list[tuple[int, int]]] = {}
    sent: dict[tuple[Any, ...], float] = {}
    waiting_recv: dict[tuple[Any, ...], int] = {}
    queue = deque(range(n))
    queued = [True] * n
    while queue:
        r = queue.popleft()
        queued[r] = False
        prog = progs[r]
        while pos[r] < len(prog):
            i = pos[r]
            if stopped.get(r) == i:
                start[r][i] = t[r]
                break  # the GPU stops inside this kernel
            kind, _role, name, key, _op, cost, _peer = prog[i]
            if kind == C:
                start[r][i] = t[r]
                t[r] += cost
                end[r][i] = t[r]
                pos[r] += 1
            elif kind == K:
                if start[r][i] is None:
                    start[r][i] = t[r]
                    arrived.setdefault((name, key), []).append((r, i))
                here = arrived[(name, key)]
                if len(here) < size[name]:
                    break
                done = max(start[m][j] or 0.0 for m, j in here) + cost
                for m, j in here:
                    end[m][j] = done
                    t[m] = done
                    pos[m] += 1
                    if m != r and not queued[m]:
                        queue.append(m)
                        queued[m] = True
                del arrived[(name, key)]
            elif kind == S:
                start[r][i] = t[r]
                sent[key] = t[r]
                t[r] += 1.0
                end[r][i] = t[r]
                pos[r] += 1
                w = waiting_recv.pop(key, None)
                if w is not None and not queued[w]:
                    queue.append(w)
                    queued[w] = True
            else:  # receive
                if start[r][i] is None:
                    start[r][i] = t[r]
                if key not in sent:
                    waiting_recv[key] = r
                    break
                t[r] = max(t[r], sent[key]) + cost
                end[r][i] = t[r]
                pos[r] += 1
    healthy = max((sum(op[5] for op in p if op[0] == C) for p in progs), default=0.0) * 1.5 + 1000.0
    return Outcome(progs, start, end, pos, stopped, healthy)


def _steps_before(k: HangKnobs, progs: list[list[tuple[Any, ...]]]) -> int:
    """Healthy steps recorded before the stuck one: enough to fill the ring buffer on every rank."""
    per = min(sum(1 for op in p if op[0] != C) for p in progs)
    return max(1, -(-k.buffer // max(1, per)) + 1)


def blinded(k: HangKnobs, out: Outcome) -> dict[int, set[int]]:
    """Faulted rank -> indexes of the collectives that completed but whose completion its record never saw
    (its last ``k.blind`` completed collectives before the kernel its GPU stopped in)."""
    if k.blind <= 0:
        return {}
    out_map: dict[int, set[int]] = {}
    for r, stop in out.stopped.items():
        if out.start[r][stop] is None:
            continue  # it never reached its fault: a victim
        done = [i for i, op in enumerate(out.progs[r][:stop]) if op[0] == K and out.end[r][i] is not None]
        out_map[r] = set(done[-k.blind:])
    return out_map


def recorder(k: HangKnobs, lay: Layout, out: Outcome, r: int, history: int) -> RankRecorder:
    """Rank ``r``'s ring buffer after ``history`` healthy steps and the stuck one."""
    prog = out.progs[r]
    comm = [i for i, op in enumerate(prog) if op[0] != C]
    mine = [(name, role, desc, members) for name, role, desc, members in lay.groups if r in members]
    local = {name: i for i, (name, _role, _d, _m) in enumerate(mine)}
    descs = {name: desc for name, _role, desc, _m in mine}
    n_coll: dict[str, int] = {}
    n_p2p: dict[str, int] = {}
    for i in comm:
        name = prog[i][2]
        if prog[i][0] == K:
            n_coll[name] = n_coll.get(name, 0) + 1
        else:
            n_p2p[name] = n_p2p.get(name, 0) + 1
    per_step = len(comm)
    total = per_step * (history + 1)
    keep = min(k.buffer, total)
    first = total - keep
    step_ns = int(out.step_us * 1000)
    stuck_start_ns = T0_NS + history * step_ns
    entries: list[Entry] = []
    prior: dict[str, tuple[int, int, int]] = {}
    unseen = blinded(k, out).get(r, set())
    for step in range(first // per_step, history + 1):
        base_ns = T0_NS + step * step_ns
        c_seen: dict[str, int] = {}
        p_seen: dict[str, int] = {}
        for idx, i in enumerate(comm):
            kind, role, name, key, op, cost, peer = prog[i]
            if kind == K:
                c_seen[name] = c_seen.get(name, 0) + 1
            else:
                p_seen[name] = p_seen.get(name, 0) + 1
            coll_seq = step * n_coll.get(name, 0) + c_seen.get(name, 0)
            p2p_seq = step * n_p2p.get(name, 0) + p_seen.get(name, 0)
            op_id = coll_seq + p2p_seq
            record = step * per_step + idx
            if record < first:
                continue
            started: int | None
            completed: int | None
            if step < history:  # a healthy step: everything completed
                t_start = base_ns + int((out.start[r][i] or 0.0) * 1000) if out.start[r][i] is not None else base_ns
                started, completed = t_start, t_start + int(cost * 1000)
            else:
                s, e = out.start[r][i], (None if i in unseen else out.end[r][i])
                started = stuck_start_ns + int(s * 1000) if s is not None else None
                completed = stuck_start_ns + int(e * 1000) if e is not None else None
            created = (base_ns if step < history else stuck_start_ns) + int(idx * HOST_GAP_US * 1000)
            if started is not None and created > started:
                created = started
            members = lay.members(name)
            pair = (members.index(r), members.index(peer)) if kind in (S, R) else None
            where = WHERE.get((role, op)) or WHERE[("world", "all_reduce")]
            entries.append(Entry(pg=name, local_id=local[name], desc=descs[name], op=op, coll_seq=coll_seq,
                                 p2p_seq=p2p_seq if kind in (S, R) else 0, op_id=op_id, is_p2p=kind in (S, R),
                                 peer=pair, sizes=SIZES[role], dtype=DTYPES[role], created_ns=created,
                                 started_ns=started, completed_ns=completed, where=where))
    first_step = first // per_step
    if first_step > 0:  # the status of each group before the first kept entry: its last work of the step before
        for name in local:
            c = (first_step) * n_coll.get(name, 0)
            p = (first_step) * n_p2p.get(name, 0)
            last = p if _last_is_p2p(prog, comm, name) and p else c
            prior[name] = (last, last, last)
    rec = RankRecorder(rank=r, groups=[(name, desc, members) for name, _role, desc, members in mine],
                       entries=entries, first_record_id=first, prior=prior)
    return rec


def _last_is_p2p(prog: list[tuple[Any, ...]], comm: list[int], name: str) -> bool:
    last = [prog[i] for i in comm if prog[i][2] == name]
    return bool(last) and last[-1][0] in (S, R)


def truth(k: HangKnobs, lay: Layout, out: Outcome) -> dict[str, Any]:
    """What a correct analysis must find, from the schedule."""
    n = k.world
    blocked: dict[int, dict[str, Any]] = {}
    for r in range(n):
        if r in out.stopped and out.start[r][out.stopped[r]] is not None:
            continue
        i = out.pos[r]
        if i >= len(out.progs[r]):
            continue
        kind, role, name, key, op, _cost, peer = out.progs[r][i]
        if kind == K:
            blocked[r] = {"pg": name, "seq": key, "op": op, "role": role}
        elif kind == R:
            blocked[r] = {"pg": name, "op": "recv", "role": role, "from": peer}
    stuck: dict[tuple[str, int], dict[str, Any]] = {}
    unseen = blinded(k, out)
    for name, role, _desc, members in lay.groups:
        done: dict[int, int] = {}
        enq: dict[int, int] = {}
        for m in members:  # as the records say: a completion the rank never saw is not there
            seqs = [(op[3], out.end[m][i] is not None and i not in unseen.get(m, ()))
                    for i, op in enumerate(out.progs[m]) if op[0] == K and op[2] == name]
            enq[m] = max((s for s, _ in seqs), default=0)
            done[m] = max((s for s, ok in seqs if ok), default=0)
        if not enq or max(enq.values()) == 0:
            continue
        first = min(done.values()) + 1
        if first <= max(enq.values()):
            stuck[(name, first)] = {"pg": name, "role": role, "seq": first, "first": True, "waiting": []}
    for r, b in blocked.items():
        if "seq" in b:
            stuck.setdefault((b["pg"], b["seq"]), {"pg": b["pg"], "role": b["role"], "seq": b["seq"], "first": False,
                                                   "waiting": []})["waiting"].append(r)
    history = _steps_before(k, out.progs)
    # seqs in the dumps count the healthy steps before this one
    for s in stuck.values():
        per = sum(1 for op in out.progs[lay.members(s["pg"])[0]] if op[0] == K and op[2] == s["pg"])
        s["seq"] += history * per
        s["waiting"].sort()
    for b in blocked.values():
        if "seq" in b:
            per = sum(1 for op in out.progs[lay.members(b["pg"])[0]] if op[0] == K and op[2] == b["pg"])
            b["seq"] += history * per
    return {
        "scenario": "megatron_hang", "knobs": asdict(k), "world_size": n, "timing": k.timing,
        "groups": [{"pg": name, "role": role, "desc": desc, "size": len(members)} for name, role, desc, members in lay.groups
                   if len(lay.groups) <= 4096],
        # a faulted GPU that was already waiting for a stopped peer before it reached its stop point never
        # stopped of its own: it is a victim, and not a culprit
        "culprits": [{"rank": r, "why": "gpu_stopped", "stopped_in_op": out.progs[r][i][4], "op_index": i,
                      **_never_completes(out, r, i, unseen.get(r, set()), history)}
                     for r, i in sorted(out.stopped.items()) if out.start[r][i] is not None],
        "faults_not_reached": [{"rank": r, "op_index": i, "waits_in": blocked.get(r)}
                               for r, i in sorted(out.stopped.items()) if out.start[r][i] is None],
        "blocked": {str(r): b for r, b in sorted(blocked.items())},
        "stuck": sorted(stuck.values(), key=lambda s: (int(s["pg"]), s["seq"])),
        "healthy_steps_before": history,
    }


def _never_completes(out: Outcome, r: int, stop: int, unseen: set[int], history: int) -> dict[str, Any]:
    """The collective the stopped rank's own record shows never completing (pg, seq, op): its first one whose
    completion it never saw, else the first collective after the kernel its GPU stopped in."""
    prog = out.progs[r]
    first = min(unseen) if unseen else next((i for i in range(stop, len(prog)) if prog[i][0] == K), None)
    if first is None:
        return {}
    _kind, role, name, key, op, _cost, _peer = prog[first]
    per = sum(1 for x in prog if x[0] == K and x[2] == name)
    return {"pg": name, "role": role, "seq": key + history * per, "op": op}


def recorders(k: HangKnobs, ranks: list[int] | None = None) -> Iterator[RankRecorder]:
    lay = build_layout(k)
    out = run_step(k, lay)
    history = _steps_before(k, out.progs)
    for r in ranks if ranks is not None else range(k.world):
        yield recorder(k, lay, out, r, history)


def simulate_hang(out_dir: str | Path, k: HangKnobs | None = None, *, ranks: list[int] | None = None,
                  prefix: str = "nccl_trace_rank_", write_truth: bool = True) -> dict[str, Any]:
    """Write one dump per rank (``ranks``: a subset, e.g. one worker's share) and ``truth.json``; the truth."""
    k = k or HangKnobs()
    lay = build_layout(k)
    res = run_step(k, lay)
    history = _steps_before(k, res.progs)
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    for r in ranks if ranks is not None else range(k.world):
        write_dump(folder / f"{prefix}{r}", recorder(k, lay, res, r, history), timing=k.timing, buffer=k.buffer,
                   frames=k.frames, stateless=k.states == "scheduled")
    t = truth(k, lay, res)
    if write_truth:
        (folder / "truth.json").write_text(json.dumps(t, indent=1) + "\n")
    return t
