"""Process groups of a hung job: members (from pg_config, or rebuilt from the dumps and the layout) and role.

Gloo's ``pg_config`` is broken in torch 2.13 (one empty key), so a group's members are then the ranks whose
dumps mention it, and a rank with no dump is put back into the group the layout leaves for it (a group
smaller than its neighbours in creation order that their (size, stride) completes in exactly one way).
The role comes from the description (``TENSOR_MODEL_PARALLEL_GROUP``, ``mesh_tp``: the rule of
:func:`traceread.analysis.comm.layout.role_from_desc`), ``world`` for the default group, else from what
the group ran (mostly send/recv: pp; all-to-all: ep; all-gather with reduce-scatter: fsdp; all-reduce: dp,
or tp when 4x as frequent as the least frequent all-reducing group).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from traceread.analysis.hang.flight_recorder import GroupView, RankDump, parse_ranks, to_int
from traceread.fmt import rank_runs

DEFAULT_PG = "0"


@dataclass
class Group:
    pg: str
    desc: str
    role: str  # tp, pp, ep, dp, fsdp, cp, world, other
    role_why: str
    members: list[int]  # global ranks in group-rank order
    views: dict[int, GroupView]
    rebuilt: str | None = None  # how the membership was rebuilt when no pg_config said it

    def label(self) -> str:
        """``pg 3 (tp, TENSOR_MODEL_PARALLEL_GROUP)``."""
        bits = [self.role] if self.role not in ("other", "") else []
        if self.desc and self.desc.lower() not in ("undefined", ""):
            bits.append(self.desc)
        return f"pg {self.pg}" + (f" ({', '.join(bits)})" if bits else "")


def build_groups(dumps: Mapping[int, RankDump], world: int | None) -> tuple[dict[str, Group], list[str]]:
    """Every group seen in the dumps, with members and role."""
    notes: list[str] = []
    views: dict[str, dict[int, GroupView]] = {}
    descs: dict[str, str] = {}
    config: dict[str, tuple[str, str]] = {}
    for r, d in dumps.items():
        for name, v in d.groups.items():
            views.setdefault(name, {})[r] = v
            if v.desc and name not in descs:
                descs[name] = v.desc
        for name, conf in d.pg_config.items():
            config.setdefault(name, conf)
            if conf[0] and name not in descs:
                descs[name] = conf[0]
    groups: dict[str, Group] = {}
    for name in sorted(set(views) | set(config), key=name_order):
        vs = views.get(name, {})
        cfg = config.get(name)
        members = _dedupe(parse_ranks(cfg[1])) if cfg else []
        rebuilt = None
        if members:
            extra = sorted(set(vs) - set(members))
            if extra:
                notes.append(f"pg {name}: ranks {runs(extra)} recorded it but its pg_config does not list them")
                members += extra
        elif _base(name) == DEFAULT_PG and world:
            members = list(range(world))
        else:
            members = sorted(vs)
            rebuilt = "the ranks whose dumps mention it"
        if not vs and not members:
            continue
        groups[name] = Group(name, descs.get(name, ""), "", "", members, vs, rebuilt)
    if world:
        no_dump = set(range(world)) - set(dumps)
        if no_dump:
            notes += _complete_memberships(groups, no_dump, world)
    _assign_roles(groups, world)
    return groups, notes


def _base(name: str) -> str:
    return name.split(":", 1)[0]


def name_order(name: str) -> tuple[int, int, str]:
    n = to_int(_base(name))
    return (0, n, name) if n is not None else (1, 0, name)


def _dedupe(ranks: list[int]) -> list[int]:
    return list(dict.fromkeys(ranks))


def runs(ranks: Iterable[int]) -> str:
    return ", ".join(rank_runs(sorted(ranks)))


def stride_pattern(members: list[int]) -> tuple[int, int] | None:
    """(size, stride) of an evenly spaced group of at least two ranks."""
    rs = sorted(members)
    if len(rs) < 2:
        return None
    d = rs[1] - rs[0]
    if d <= 0 or any(b - a != d for a, b in zip(rs, rs[1:])):
        return None
    return len(rs), d


def _complete_memberships(groups: dict[str, Group], no_dump: set[int], world: int) -> list[str]:
    """Put ranks without a dump back into the groups the layout says they belong to.

    Only for groups rebuilt from the dumps (no pg_config). A group that is smaller than its neighbours
    in creation order (torch names groups by a global counter, and jobs create the groups of one role
    one after another) and that the neighbours' (size, stride) completes in exactly one way with ranks
    that have no dump, is completed so.
    """
    notes: list[str] = []
    order = [g for g in sorted(groups.values(), key=lambda g: name_order(g.pg)) if _base(g.pg) != DEFAULT_PG]
    for i, g in enumerate(order):
        if g.rebuilt is None:
            continue
        cands: list[tuple[int, int]] = []
        for j in (i - 1, i + 1, i - 2, i + 2):
            if 0 <= j < len(order) and order[j].desc == g.desc:
                p = stride_pattern(order[j].members)
                if p and p not in cands:
                    cands.append(p)
        fits: set[tuple[int, ...]] = set()
        for size, stride in cands:
            if len(g.members) >= size:
                continue
            low = min(g.members)
            for start in range(low - (size - 1) * stride, low + 1, stride):
                ranks = tuple(start + k * stride for k in range(size))
                if ranks[0] < 0 or ranks[-1] >= world or not set(g.members) <= set(ranks):
                    continue
                if set(ranks) - set(g.members) <= no_dump and not _taken(order, g, set(ranks) - set(g.members), size, stride):
                    fits.add(ranks)
        if len(fits) == 1:
            full = list(next(iter(fits)))
            added = sorted(set(full) - set(g.members))
            g.members = full
            g.rebuilt = (f"the dumps of its members, and rank{'s' if len(added) > 1 else ''} {runs(added)} (no dump) "
                         "from the layout")
            notes.append(f"pg {g.pg}: rank{'s' if len(added) > 1 else ''} {runs(added)} put back in it from the layout "
                         f"(its neighbours have {len(full)} ranks, stride {full[1] - full[0]})")
    return notes


def _taken(order: list[Group], g: Group, ranks: set[int], size: int, stride: int) -> bool:
    """Whether one of ``ranks`` already belongs to another group of the same description and pattern."""
    return any(o is not g and o.desc == g.desc and stride_pattern(o.members) == (size, stride) and ranks & set(o.members)
               for o in order)


def _assign_roles(groups: dict[str, Group], world: int | None) -> None:
    from traceread.analysis.comm.layout import role_from_desc

    ar_counts: dict[str, float] = {}
    for g in groups.values():
        named = role_from_desc(g.desc)
        if _base(g.pg) == DEFAULT_PG or (g.desc or "").lower() == "default_pg" or (world and len(g.members) == world
                                                                                     and world > 1 and named is None):
            g.role, g.role_why = "world", "every rank"
            continue
        if named:
            g.role, g.role_why = named, f"description '{g.desc}'"
            continue
        ops = Counter[str]()
        for v in g.views.values():
            ops.update(v.ops)
        total = sum(ops.values())
        n = max(1, len(g.views))
        if not total:
            g.role, g.role_why = "other", "nothing recorded"
        elif (ops["send"] + ops["recv"]) * 2 >= total:
            g.role, g.role_why = "pp", "point-to-point sends and receives"
        elif ops["all_to_all"] and not ops["all_reduce"]:
            g.role, g.role_why = "ep", "all-to-all"
        elif ops["all_gather"] and ops["reduce_scatter"] and ops["all_reduce"] < min(ops["all_gather"], ops["reduce_scatter"]):
            g.role, g.role_why = "fsdp", "all-gather with reduce-scatter"
        elif ops["all_reduce"]:
            ar_counts[g.pg] = ops["all_reduce"] / n
            g.role, g.role_why = "dp", f"{ops['all_reduce'] / n:.0f} all-reduces per rank in the buffer"
        else:
            g.role, g.role_why = "other", ", ".join(f"{k} {v}" for k, v in ops.most_common(3))
    if len(set(ar_counts.values())) > 1:  # the groups that all-reduce most often do it per layer: tensor parallel
        low = min(ar_counts.values())
        for pg, c in ar_counts.items():
            if c >= 4 * low:
                groups[pg].role = "tp"
                groups[pg].role_why += " (≥ 4x the least frequent all-reducing group: per layer)"
