"""Where a rank with work pending in several process groups waits: its oldest pending op (gloo blocks
the calling thread in it; an in-order GPU queue runs it first), never the newest; and who a rank in a
send/recv waits for. Hand-built per-rank summaries (the reduce side's input, as the Flight Recorder
reader makes them from gloo dumps) whose answer follows from their construction."""

from __future__ import annotations

from traceread.analysis.hang.attribution import attribute
from traceread.analysis.hang.flight_recorder import GroupView, Op, RankDump


def _op(record_id: int, pg: str, seq: int, *, completed: bool = False) -> Op:
    return Op(record_id=record_id, pg=pg, seq=seq, op="all_reduce", is_p2p=False, state="scheduled", started=False,
              completed=completed, sizes="[[1024]]", out_sizes="[[1024]]", dtypes="Float", backend="gloo")


def _p2p(record_id: int, pg: str, seq: int, op: str, peer: int) -> Op:
    """A pending send/recv; ``peer``: the other side's rank in the group."""
    return Op(record_id=record_id, pg=pg, seq=seq, op=op, is_p2p=True, state="scheduled", started=False,
              completed=False, sizes="[[1024]]", out_sizes="[[1024]]", dtypes="Float", peer=peer, backend="gloo")


def _dump(rank: int, views: dict[str, tuple[int, int, list[Op]]], p2p: list[Op] | None = None) -> RankDump:
    """``views``: pg -> (last enqueued, last completed, pending ops); ``p2p``: pending send/recv ops."""
    groups = {pg: GroupView(pg, "undefined" if pg != "0" else "default_pg", enqueued=e, completed=c, pending=p,
                            p2p_pending=[o for o in p2p or [] if o.pg == pg], backend="gloo")
              for pg, (e, c, p) in views.items()}
    config = {"0": ("default_pg", "[0, 1, 2, 3]"), "1": ("undefined", "[0, 1]"), "2": ("undefined", "[2, 3]"),
              "3": ("undefined", "[0, 2]")}
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


def test_both_sides_of_a_send_recv_wait_for_no_one_in_it() -> None:
    """Ranks 0 and 1 are in a send/recv with each other on their pair (both sides posted: neither waits
    for the other); rank 2 waits in world all-reduce #5 for rank 3, whose host never issued it, and for
    0 and 1, in their transfer before it. Rank 3 is the only culprit, and no send/recv wait is listed."""
    dumps = {
        0: _dump(0, {"0": (4, 4, []), "1": (3, 3, [])}, [_p2p(40, "1", 1, "send", 1)]),
        1: _dump(1, {"0": (4, 4, []), "1": (3, 3, [])}, [_p2p(40, "1", 1, "recv", 0)]),
        2: _dump(2, {"0": (5, 4, [_op(41, "0", 5)]), "2": (3, 3, [])}),
        3: _dump(3, {"0": (4, 4, []), "2": (3, 3, [])}),
    }
    a = attribute(dumps, world=4)
    assert [(c.rank, c.why, c.victims) for c in a.culprits] == [(3, "host_elsewhere", [2])]
    assert [(s.group.pg, s.seq, s.waiting, s.behind) for s in a.stuck] == [
        ("0", 5, [2], {0: "never_enqueued", 1: "never_enqueued", 3: "never_enqueued"})]


def test_a_receiver_waits_for_a_sender_busy_in_a_collective() -> None:
    """Rank 1 waits in a receive from rank 0 on their pair; rank 0, which would send next, is held in
    all-reduce #4 of group {0, 2}, which rank 2 (idle, every op it issued done) never issued: rank 0 is
    busy (not "has not started the send"), rank 2 the only culprit, ranks 0 and 1 its victims."""
    dumps = {
        0: _dump(0, {"0": (4, 4, []), "1": (3, 3, []), "3": (4, 3, [_op(41, "3", 4)])}),
        1: _dump(1, {"0": (4, 4, []), "1": (3, 3, [])}, [_p2p(42, "1", 1, "recv", 0)]),
        2: _dump(2, {"0": (4, 4, []), "2": (3, 3, []), "3": (3, 3, [])}),
        3: _dump(3, {"0": (4, 4, []), "2": (3, 3, [])}),
    }
    a = attribute(dumps, world=4)
    assert [(c.rank, c.why, c.victims) for c in a.culprits] == [(2, "host_elsewhere", [0, 1])]
    recv = [s for s in a.stuck if s.ref is not None and s.ref.op == "recv"]
    assert [(s.waiting, s.behind, s.causes) for s in recv] == [([1], {0: "busy"}, [2])]
