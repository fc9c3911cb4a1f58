"""The layout's rules at their edges, on inputs whose expected role and degree follow from how they
are built (docs/layout.md): the degree of a role is its most common group size, per-layer TP needs
its collectives spread over most of the step (and, in wall time, at least 4 calls), and only the
traced steps count."""

from __future__ import annotations

from collections import Counter

import polars as pl
import pytest

from traceread.analysis.comm import layout
from traceread.analysis.comm.collectives import EXTRACT_SCHEMA


def test_degree_is_the_most_common_group_size() -> None:
    """Three data-parallel groups of 2 and one of 4 (an uneven last replica): dp degree 2, not 4."""
    groups = [{"pg_name": str(i + 1), "pg_desc": "mesh_dp", "ranks": rs, "pg_size": len(rs)}
              for i, rs in enumerate([[0, 1], [2, 3], [4, 5], [6, 7, 8, 9]])]
    lay = layout.infer_layout([], groups)
    assert {g.pg: (g.role, g.size) for g in lay.groups} == {"1": ("dp", 2), "2": ("dp", 2), "3": ("dp", 2), "4": ("dp", 4)}
    assert lay.degrees["dp"] == 2


@pytest.mark.parametrize("calls,spread,of,role", [
    ({"allreduce": 4}, 0.70, "compute", "dp"),  # backward plus an early bucket: under 3/4 of the compute
    ({"allreduce": 4}, 0.76, "compute", "tp"),
    ({"allreduce": 3}, 0.95, "time", "dp"),  # wall time: a weaker witness, 4 calls at least
    ({"allreduce": 4}, 0.95, "time", "tp"),
    ({"allreduce": 8}, 0.85, "time", "dp"),  # and 90 % of the time outside the calls
])
def test_per_layer_thresholds_at_their_edges(calls: dict[str, float], spread: float, of: str, role: str) -> None:
    u = layout._Usage(Counter(calls), spread, of, float(sum(calls.values())))
    assert layout.role_from_usage(u)[0] == role


def _row(rank: int, step: int, op: str, ts: float, **kw: object) -> dict[str, object]:
    row: dict[str, object] = {c: None for c in EXTRACT_SCHEMA}
    row.update(rank=rank, backend="nccl", stream=21, kernel=f"ncclDevKernel_{op}", op=op, p2p=op in ("send", "recv"),
               pg="5", group_size=2, ts=ts, end=ts + 10.0, launch_ts=ts - 5.0, step=step)
    row.update(kw)
    return row


def test_collectives_outside_the_traced_steps_do_not_count() -> None:
    """Two pipeline stages: 4 sends and 4 receives per step in steps 0 and 1. Before the first step
    (step -1: warm-up, a checkpoint load) the group ran 20 all-reduces. Per traced step the group is
    send/recv only: a pipeline."""
    rows = []
    for step in (0, 1):
        for k in range(4):
            t = 10_000.0 * (step + 1) + 100.0 * k
            rows.append(_row(0, step, "send", t, src_rank=0, dst_rank=1))
            rows.append(_row(1, step, "recv", t, src_rank=0, dst_rank=1))
            rows.append(_row(1, step, "send", t + 50.0, src_rank=1, dst_rank=0))
            rows.append(_row(0, step, "recv", t + 50.0, src_rank=1, dst_rank=0))
    for k in range(20):
        rows += [_row(r, -1, "allreduce", 100.0 * k) for r in (0, 1)]
    ev = pl.DataFrame(rows, schema=EXTRACT_SCHEMA)
    lay = layout.infer_layout(ev, [{"pg_name": "5", "pg_desc": "undefined", "ranks": [0, 1], "pg_size": 2}])
    (g,) = lay.groups
    assert g.role == "pp" and "allreduce" not in g.evidence, g.evidence
    assert lay.degrees["pp"] == 2
