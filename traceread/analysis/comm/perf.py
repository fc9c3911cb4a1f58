"""Per-collective timing, wait and bandwidth (the report's ``collectives`` table).

Definitions, per matched instance (µs; arrivals on the clock-aligned timeline, :mod:`clocks`):

* ``arrival_r`` — GPU start of rank r's kernel (the device cannot join earlier); CPU span start for gloo.
* ``transfer_us`` — min over ranks of the kernel duration (TraceLens ``comm_latency``): the last
  arriver waits for nobody, so its duration is the pure transfer. Clock-free.
* ``wait_r`` — ``max arrival − arrival_r`` (Scalasca "Wait at N×N", also used for p2p pairs: NCCL
  send and recv kernels both block until the peer has posted).

Per group (process group, collective, message bytes):

* ``count``, ``bytes`` = nccl-tests message size S (allgather: output elements × dtype size; others:
  input elements × dtype size), ``latency_us`` = mean transfer, ``wait_us`` = mean over instances of
  the mean per-rank wait;
* ``algbw_gbps`` = S / latency (GB = 1e9 B), ``busbw_gbps`` = algbw × nccl-tests factor with n =
  group size: allreduce 2(n−1)/n; allgather, reduce-scatter, all-to-all (n−1)/n; broadcast, reduce,
  send/recv 1. Null when S is unknown (traces without comm args).
* ``link`` / ``link_peak_gbps`` / ``link_name`` / ``link_source``: the link the group's transfers
  used (:func:`traceread.analysis.hardware.transfer_link`), the same rule for collectives and
  point-to-point: ``host`` for gloo (CPU memory and TCP: no GPU link, no peak); ``network`` when
  the group's ranks sit on several nodes (nodes from run.json hosts, the NCCL log's nNodes ×
  localRanks, else the device index restarting at 0 on each node) — the NIC the NCCL log names
  (InfiniBand, RoCE, EFA, sockets), else the usual NIC of the GPU generation; otherwise the GPUs'
  own link inside the node from :data:`traceread.analysis.hardware.LINKS` (``nvlink``, ``xgmi``,
  ``pcie``) with its per-direction peak (busbw is "the speed of the hardware bottleneck", compared
  per direction).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import polars as pl

from traceread.analysis.comm.clocks import ClockModel, aligned
from traceread.analysis.comm.collectives import Matched
from traceread.model import as_float
from traceread.report_schema import CollectiveEntry

BUSBW_FACTORS = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "reducescatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "gather": lambda n: (n - 1) / n,
    "scatter": lambda n: (n - 1) / n,
}

def busbw_factor(op: str, n: int) -> float:
    """nccl-tests bus-bandwidth factor for ``op`` on ``n`` ranks (1 for broadcast/reduce/p2p)."""
    f = BUSBW_FACTORS.get(op)
    return f(n) if (f and n > 0) else 1.0


def intra_node_link(device_name: str | None, num_sms: int | None = None) -> tuple[str | None, float | None]:
    """``(link kind, per-direction GB/s)`` between GPUs of one node, from :mod:`devices`' table
    (``LINKS``); (None, None) for a device it does not know."""
    from traceread.analysis.hardware import intra_node_choice

    if not device_name:
        return None, None
    c = intra_node_choice(device_name, num_sms)
    return c.kind, c.peak_gbps


def instance_timing(
    matched: Matched, clock: ClockModel | None = None, ops: frozenset[str] | None = None
) -> pl.DataFrame:
    """Per (instance, rank) on the aligned clock: extract columns plus ``wait``, and the instance's
    ``last_arrival`` and ``transfer_us``; only complete instances with ≥ 2 ranks (of ``ops``)."""
    sel = pl.col("complete") & (pl.col("n_ranks") > 1)
    if ops is not None:
        sel = sel & pl.col("op").is_in(list(ops))
    ok = matched.instances.filter(sel).select("instance")
    ev = aligned(matched.events.join(ok, on="instance"), clock)
    return ev.with_columns(
        pl.col("ts").max().over("instance").alias("last_arrival"),
        (pl.col("end") - pl.col("ts")).min().over("instance").alias("transfer_us"),
    ).with_columns((pl.col("last_arrival") - pl.col("ts")).alias("wait"))


def collective_table(
    matched: Matched,
    clock: ClockModel | None = None,
    *,
    hosts: dict[int, str] | None = None,
    device_names: dict[int, str | None] | None = None,
    network_gbps: float | None = None,
    nodes: dict[int, int] | None = None,
    nccl: dict[str, Any] | None = None,
) -> list[CollectiveEntry]:
    """The report's ``collectives`` rows, largest total time first (definitions in the module doc).

    ``nodes``: rank -> node (:func:`traceread.analysis.comm.layout.node_map`); ``hosts``: rank ->
    host (run.json; used when ``nodes`` is not given); ``device_names``: rank -> deviceProperties
    name; ``nccl``: the parsed NCCL log (which NIC); ``network_gbps``: per-GPU network bandwidth per
    direction when the caller knows it better than the NIC table.
    """
    t = instance_timing(matched, clock)
    if t.height == 0:
        return []
    per_inst = t.group_by("instance").agg(
        pl.col("transfer_us").first(), pl.col("wait").mean().alias("mean_wait"),
        pl.col("rank").alias("ranks"), pl.col("backend").drop_nulls().first().alias("backend"),
    )
    inst = matched.instances.join(per_inst, on="instance")
    inst = inst.with_columns(_pg_label().alias("pg"))
    out: list[CollectiveEntry] = []
    groups = inst.group_by(["pg", "op", "bytes"], maintain_order=True)
    for (pg, op, nbytes), g in groups:
        n = int(as_float(g["group_size"].max() or g["n_ranks"].max()))
        lat = as_float(g["transfer_us"].mean())
        entry: CollectiveEntry = {
            "pg": str(pg),
            "name": str(op),
            "count": g.height,
            "bytes": int(nbytes) if nbytes is not None else None,
            "latency_us": lat,
            "wait_us": as_float(g["mean_wait"].mean()),
            "algbw_gbps": None,
            "busbw_gbps": None,
            "group_size": n,
        }
        if nbytes is not None and lat > 0:
            alg = nbytes / (lat * 1e-6) / 1e9
            entry["algbw_gbps"] = alg
            entry["busbw_gbps"] = alg * busbw_factor(str(op), n)
        members = {r for rs in g["ranks"].to_list() for r in rs}
        choice = _link_for(members, hosts, device_names, network_gbps, nodes, nccl, g["backend"][0])
        entry["link"] = choice.kind
        entry["link_peak_gbps"] = choice.peak_gbps
        entry["link_name"] = choice.name
        entry["link_source"] = choice.source
        out.append(entry)
    out.sort(key=lambda e: -(e["latency_us"] + e["wait_us"]) * e["count"])
    return out


def _pg_label() -> pl.Expr:
    """``"<pg name> (<description>)"``, the bare name, or ``"default"`` when the trace names none."""
    name = pl.col("pg").fill_null(pl.col("pg_desc")).fill_null(pl.lit("default"))
    return (
        pl.when(pl.col("pg").is_not_null() & pl.col("pg_desc").is_not_null() & (pl.col("pg") != pl.col("pg_desc")))
        .then(pl.format("{} ({})", pl.col("pg"), pl.col("pg_desc")))
        .otherwise(name)
    )


def _link_for(
    members: set[int],
    hosts: dict[int, str] | None,
    device_names: dict[int, str | None] | None,
    network_gbps: float | None,
    nodes: dict[int, int] | None = None,
    nccl: dict[str, Any] | None = None,
    backend: str | None = None,
) -> Any:
    """The :class:`~traceread.analysis.hardware.LinkChoice` of one group's transfers."""
    from traceread.analysis.hardware import LinkChoice, transfer_link

    if nodes and all(r in nodes for r in members):
        spans: bool | None = len({nodes[r] for r in members}) > 1
    elif hosts and all(r in hosts for r in members):
        spans = len({hosts[r] for r in members}) > 1
    else:
        spans = None
    names = {(device_names or {}).get(r) for r in members} - {None}
    if len(names) > 1 and backend != "gloo":
        return LinkChoice(None, None, None, "mixed devices", f"members run on {len(names)} device types")
    return transfer_link(spans_nodes=spans, backend=backend, device_name=next(iter(names), None), nccl=nccl,
                         network_gbps=network_gbps if spans else None)


def wait_matrix(
    matched: Matched, clock: ClockModel | None = None, ops: frozenset[str] | None = None
) -> tuple[list[int], list[int], np.ndarray]:
    """(ranks, steps, wait[rank, step]) — total wait per rank per step (µs), for the heat map."""
    t = instance_timing(matched, clock, ops)
    ranks = matched.ranks
    steps = matched.steps or [-1]
    m = np.zeros((len(ranks), len(steps)))
    if t.height:
        agg = t.group_by(["rank", "step"]).agg(pl.col("wait").sum())
        ri = {r: i for i, r in enumerate(ranks)}
        si = {s: i for i, s in enumerate(steps)}
        for r, s, w in agg.iter_rows():
            if r in ri and s in si:
                m[ri[r], si[s]] = w
    return ranks, steps, m
