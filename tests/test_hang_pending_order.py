"""Where a rank with work pending in several process groups waits: its oldest pending op (gloo blocks
the calling thread in it; an in-order GPU queue runs it first), never the newest. Hand-built
per-rank summaries (the reduce side's input) whose answer follows from their construction."""

from __future__ import annotations

from traceread.analysis.hang.attribution import attribute
from traceread.analysis.hang.flight_recorder import GroupView, Op, RankDump


def _op(record_id: int, pg: str, seq: int, *, completed: bool = False) -> Op:
    return Op(record_id=record_id, pg=pg, seq=seq, op="all_reduce", is_p2p=False, state="scheduled", started=False,
              completed=completed, sizes="[[1024]]", out_sizes="[[1024]]", dtypes="Float", backend="gloo")


def _dump(rank: int, views: dict[str, tuple[int, int, list[Op]]]) -> RankDump:
    """``views``: pg -> (last enqueued, last completed, pending ops)."""
    groups = {pg: GroupView(pg, "undefined" if pg != "0" else "default_pg", enqueued=e, completed=c, pending=p,
                            backend="gloo") for pg, (e, c, p) in views.items()}
    config = {"0": ("default_pg", "[0, 1, 2, 3]"), "1": ("undefined", "[0, 1]"), "2": ("undefined", "[2, 3]")}
    return RankDump(path=f"rank{rank}.json", rank=rank, fmt="json", version="2.10", comm_lib_version=None,
                    backends=["gloo"], timing=False, groups=groups, pg_config=config, entries=20, newest_ns=None)


def test_gloo_rank_waits_in_its_oldest_pending_collective() -> None:
    """World 0-3, pairs {0,1} and {2,3}. Rank 3's host stopped after 2 collectives on its pair and 4 on
    the world. Rank 2 blocks in its pair's all-reduce #3 (issued first), with a world all-reduce #5
    queued after it (async); ranks 0 and 1 wait in world #5. Rank 2 waits on rank 3 in pg 2, not in
    pg 0: it is a victim there, and rank 3 is the only culprit."""
    dumps = {
        0: _dump(0, {"0": (5, 4, [_op(40, "0", 5)]), "1": (3, 3, [])}),
        1: _dump(1, {"0": (5, 4, [_op(40, "0", 5)]), "1": (3, 3, [])}),
        2: _dump(2, {"0": (5, 4, [_op(41, "0", 5)]), "2": (3, 2, [_op(39, "2", 3)])}),
        3: _dump(3, {"0": (4, 4, []), "2": (2, 2, [])}),
    }
    a = attribute(dumps, world=4)
    assert [(c.rank, c.why) for c in a.culprits] == [(3, "host_elsewhere")]
    stuck = {(s.group.pg, s.seq): s for s in a.stuck}
    assert stuck[("2", 3)].waiting == [2] and stuck[("2", 3)].behind == {3: "never_enqueued"}
    assert stuck[("0", 5)].waiting == [0, 1] and stuck[("0", 5)].behind == {2: "busy", 3: "never_enqueued"}
    assert a.culprits[0].victims == [0, 1, 2]
