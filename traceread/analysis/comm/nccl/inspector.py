"""NCCL Inspector files: one JSON record per collective per rank, for jobs profiled without torch.profiler.

The Inspector profiler plugin (NCCL's ``plugins/profiler/inspector``, earlier ``ext-profiler/inspector``,
NCCL >= 2.28; ``NCCL_PROFILER_PLUGIN=.../libnccl-profiler-inspector.so NCCL_INSPECTOR_ENABLE=1``)
writes ``<dump dir>/<hostname>-pid<pid>.log``, one compact JSON object per line::

    {"header": {"id": "0x7f8c496ae9f661", "comm_name": "...", "rank": 2, "n_ranks": 8, "nnodes": 1},
     "metadata": {"inspector_output_format_version": "v4.0", "git_rev": "...", "rec_mechanism": "...",
                  "dump_timestamp_us": 1748030377748202, "hostname": "node-1", "pid": 1639453},
     "coll_perf": {"coll": "AllReduce", "coll_sn": 1407, "coll_msg_size_bytes": 17179869184,
                   "coll_exec_time_us": 61974, "coll_timing_source": "kernel_gpu",
                   "coll_algobw_gbs": 277.210914, "coll_busbw_gbs": 485.119099}}

(``p2p_perf`` records carry ``p2p``, ``p2p_sn``, ``p2p_peer`` and the same measures; verbose mode adds
event traces, ignored here; a bandwidth NCCL could not compute is the string ``"nan"``.) ``header.id``
is the communicator's hash, the same on every rank; ``header.rank`` is the rank in that communicator.

Definitions (the same as traceread's trace-based collectives, docs/cross-rank.md): a rank's
``coll_exec_time_us`` runs from its own kernel start to the end, so it includes the time it waited
for the others. Per collective instance (communicator, ``coll_sn``): **transfer** = the shortest
time of any rank (the rank that arrived last waited for nobody), **wait** = longest - shortest, the
**late rank** = the one with the shortest time, **busbw** = the late rank's busbw (nccl-tests
factors, GB = 1e9 B). Per (communicator, collective, size): the median transfer and busbw, the best
busbw, and the link's peak per direction when the hardware is known. A **slow collective** takes
more than :data:`SLOW_FACTOR` x its class's median transfer (classes of at least :data:`MIN_CLASS`
instances). A **slow rank** is the late rank of at least half the communicator's collectives with
at least :data:`MIN_WAIT_SHARE` of the others' total wait.
"""

from __future__ import annotations

import gzip
import statistics
from array import array
from collections import defaultdict
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, cast

import msgspec
import numpy as np
import polars as pl

from traceread.analysis import hardware as hw
from traceread.analysis.comm.nccl.files import candidate_files

SUFFIXES = (".log", ".jsonl", ".log.gz", ".jsonl.gz")
SLOW_FACTOR = 2.0
MIN_CLASS = 5
MIN_WAIT_SHARE = 0.5
#: Most records read in all (each ~300 bytes on disk): beyond this the summary says it was cut.
MAX_RECORDS = 5_000_000
#: A bandwidth class below this share of the link's peak is diagnosed, for messages of at least MIN_BW_BYTES.
LOW_BW_SHARE = 0.5
MIN_BW_BYTES = 64 << 20
SNIFF_BYTES = 64 << 10


class _Header(msgspec.Struct):
    id: str
    rank: int
    n_ranks: int
    nnodes: int = 0
    comm_name: str | None = None


class _Meta(msgspec.Struct):
    hostname: str | None = None
    pid: int | None = None
    inspector_output_format_version: str | None = None


class _Coll(msgspec.Struct):
    coll: str
    coll_sn: int
    coll_msg_size_bytes: int
    coll_exec_time_us: float
    coll_busbw_gbs: float | str | None = None
    coll_algobw_gbs: float | str | None = None
    coll_timing_source: str | None = None


class _P2p(msgspec.Struct):
    p2p: str
    p2p_sn: int
    p2p_msg_size_bytes: int
    p2p_exec_time_us: float
    p2p_peer: int | None = None
    p2p_busbw_gbs: float | str | None = None


class _Record(msgspec.Struct):
    header: _Header
    metadata: _Meta | None = None
    coll_perf: _Coll | None = None
    p2p_perf: _P2p | None = None


_DECODER = msgspec.json.Decoder(_Record)


def _open(path: Path) -> BinaryIO:
    if path.name.endswith(".gz"):
        return cast(BinaryIO, gzip.GzipFile(path, "rb"))
    return open(path, "rb")


def looks_like_inspector(path: Path) -> bool:
    """Whether the file's first record is an Inspector record (header + coll_perf/p2p_perf)."""
    try:
        with _open(path) as fh:
            head = fh.read(SNIFF_BYTES)
    except (OSError, EOFError, gzip.BadGzipFile):
        return False
    line = head.lstrip().split(b"\n", 1)[0]
    return line.startswith(b"{") and b'"header"' in line and (b'"coll_perf"' in line or b'"p2p_perf"' in line)


def inspector_files_under(paths: Sequence[str | Path]) -> list[Path]:
    """Inspector files named explicitly or lying under the folders given (``*.log``, ``*.jsonl``, gzipped)."""
    return [f for f in candidate_files(paths, SUFFIXES) if looks_like_inspector(f)]


def _lines(path: Path) -> Iterator[bytes]:
    try:
        with _open(path) as fh:
            yield from fh
    except (OSError, EOFError, gzip.BadGzipFile):
        return


def _num(v: float | str | None) -> float:
    try:
        return float(v) if v is not None else float("nan")
    except ValueError:
        return float("nan")


class _Columns:
    """Records as compact typed columns (a million collectives stay a few tens of MB)."""

    def __init__(self) -> None:
        self.comm, self.rank, self.coll = array("i"), array("i"), array("i")
        self.sn, self.size = array("q"), array("q")
        self.time, self.busbw = array("d"), array("d")
        self.comm_ids: dict[str, int] = {}
        self.comm_info: dict[int, dict[str, Any]] = {}
        self.colls: dict[str, int] = {}

    def add(self, r: _Record, c: _Coll) -> None:
        h = r.header
        ci = self.comm_ids.setdefault(h.id, len(self.comm_ids))
        info = self.comm_info.setdefault(ci, {"comm_id": h.id, "comm_name": h.comm_name, "nranks": h.n_ranks,
                                              "nnodes": h.nnodes, "hosts": set(), "ranks": {}})
        meta = r.metadata or _Meta()
        if meta.hostname:
            info["hosts"].add(meta.hostname)
        info["ranks"].setdefault(h.rank, (meta.hostname, meta.pid))
        self.comm.append(ci)
        self.rank.append(h.rank)
        self.sn.append(c.coll_sn)
        self.size.append(c.coll_msg_size_bytes)
        self.coll.append(self.colls.setdefault(c.coll, len(self.colls)))
        self.time.append(float(c.coll_exec_time_us))
        self.busbw.append(_num(c.coll_busbw_gbs))

    def frame(self) -> pl.DataFrame:
        return pl.DataFrame({
            "comm": np.frombuffer(self.comm, dtype=np.int32), "rank": np.frombuffer(self.rank, dtype=np.int32),
            "sn": np.frombuffer(self.sn, dtype=np.int64), "size": np.frombuffer(self.size, dtype=np.int64),
            "coll": np.frombuffer(self.coll, dtype=np.int32), "time_us": np.frombuffer(self.time, dtype=np.float64),
            "busbw": np.frombuffer(self.busbw, dtype=np.float64),
        })


def read_inspector(paths: Sequence[str | Path]) -> dict[str, Any]:
    """Read Inspector files and reduce them to the summary described in the module docstring (no
    link peaks yet: :func:`with_peaks` adds them once the hardware is known)."""
    cols = _Columns()
    bad = records = p2p = 0
    versions: set[str] = set()
    truncated = False
    p2p_bw: dict[tuple[str, str], list[float]] = defaultdict(list)
    for p in paths:
        for line in _lines(Path(p)):
            if not line.strip():
                continue
            try:
                r = _DECODER.decode(line)
            except (msgspec.DecodeError, msgspec.ValidationError):
                bad += 1
                continue
            if r.metadata and r.metadata.inspector_output_format_version:
                versions.add(r.metadata.inspector_output_format_version)
            if r.coll_perf is not None:
                cols.add(r, r.coll_perf)
                records += 1
            elif r.p2p_perf is not None:
                p2p += 1
                if len(p2p_bw[(r.header.id, r.p2p_perf.p2p)]) < 100_000:
                    p2p_bw[(r.header.id, r.p2p_perf.p2p)].append(_num(r.p2p_perf.p2p_busbw_gbs))
            if records + p2p >= MAX_RECORDS:
                truncated = True
                break
        if truncated:
            break
    out: dict[str, Any] = {"files": [str(p) for p in paths], "records": records, "p2p_records": p2p,
                           "bad_lines": bad, "truncated": truncated, "format_versions": sorted(versions),
                           "comms": [], "slow_collectives": [], "p2p": []}
    for (cid, kind), bws in sorted(p2p_bw.items()):
        ok = [b for b in bws if b == b]
        out["p2p"].append({"comm_id": cid, "op": kind, "count": len(bws),
                           "median_busbw_gbs": statistics.median(ok) if ok else None})
    if records:
        _reduce(cols, out)
    return out


def _reduce(cols: _Columns, out: dict[str, Any]) -> None:
    names = {v: k for k, v in cols.colls.items()}
    df = cols.frame()
    inst = (df.group_by(["comm", "sn"]).agg(
        pl.col("coll").first(), pl.col("size").first(), pl.len().alias("ranks"),
        pl.col("time_us").min().alias("transfer_us"), pl.col("time_us").max().alias("longest_us"),
        pl.col("rank").sort_by("time_us").first().alias("late_rank"),
        pl.col("busbw").sort_by("time_us").first().alias("busbw"),
    ).with_columns(wait_us=pl.col("longest_us") - pl.col("transfer_us")))
    classes = inst.group_by(["comm", "coll", "size"]).agg(
        pl.len().alias("count"), pl.col("transfer_us").median().alias("median_transfer_us"),
        pl.col("busbw").filter(pl.col("busbw").is_not_nan()).median().alias("median_busbw_gbs"),
        pl.col("busbw").filter(pl.col("busbw").is_not_nan()).max().alias("best_busbw_gbs"),
        pl.col("wait_us").sum().alias("wait_us"),
    ).sort(["comm", "coll", "size"])
    slow = (inst.join(classes.select("comm", "coll", "size", "count", "median_transfer_us"), on=["comm", "coll", "size"])
            .filter((pl.col("count") >= MIN_CLASS) & (pl.col("transfer_us") > SLOW_FACTOR * pl.col("median_transfer_us")))
            .with_columns(excess_us=pl.col("transfer_us") - pl.col("median_transfer_us"))
            .sort("excess_us", descending=True))
    late = (inst.filter(pl.col("ranks") > 1).group_by(["comm", "late_rank"]).agg(
        pl.len().alias("times_last"), pl.col("wait_us").sum().alias("wait_caused_us"))
        .sort(["comm", "wait_caused_us"], descending=[False, True]))
    per_comm = inst.filter(pl.col("ranks") > 1).group_by("comm").agg(
        pl.len().alias("instances"), pl.col("wait_us").sum().alias("wait_us"))
    totals = {r["comm"]: r for r in per_comm.to_dicts()}
    for ci, info in sorted(cols.comm_info.items()):
        ranks: dict[int, tuple[str | None, int | None]] = info["ranks"]
        colls = [{"coll": names[r["coll"]], "msg_bytes": r["size"], "count": r["count"],
                  "median_transfer_us": r["median_transfer_us"], "median_busbw_gbs": r["median_busbw_gbs"],
                  "best_busbw_gbs": r["best_busbw_gbs"], "wait_us": r["wait_us"]}
                 for r in classes.filter(pl.col("comm") == ci).to_dicts()]
        colls.sort(key=lambda k: (k["coll"], k["msg_bytes"]))
        tot = totals.get(ci) or {"instances": 0, "wait_us": 0.0}
        slow_ranks = []
        for r in late.filter(pl.col("comm") == ci).head(3).to_dicts():
            host, pid = ranks.get(r["late_rank"], (None, None))
            share = r["wait_caused_us"] / tot["wait_us"] if tot["wait_us"] else 0.0
            slow_ranks.append({"rank": r["late_rank"], "host": host, "pid": pid, "times_last": r["times_last"],
                               "of": tot["instances"], "wait_caused_us": r["wait_caused_us"], "wait_share": share,
                               "slow": r["times_last"] * 2 >= tot["instances"] and share >= MIN_WAIT_SHARE})
        out["comms"].append({"comm_id": info["comm_id"], "comm_name": info["comm_name"], "nranks": info["nranks"],
                             "nnodes": info["nnodes"], "ranks_seen": len(ranks), "hosts": sorted(info["hosts"]),
                             "collectives": colls, "late_ranks": slow_ranks})
    ids = {ci: info["comm_id"] for ci, info in cols.comm_info.items()}
    for r in slow.head(20).to_dicts():
        host, pid = cols.comm_info[r["comm"]]["ranks"].get(r["late_rank"], (None, None))
        out["slow_collectives"].append({
            "comm_id": ids[r["comm"]], "coll": names[r["coll"]], "coll_sn": r["sn"], "msg_bytes": r["size"],
            "transfer_us": r["transfer_us"], "median_transfer_us": r["median_transfer_us"],
            "busbw_gbs": None if r["busbw"] != r["busbw"] else r["busbw"], "late_rank": r["late_rank"],
            "late_host": host, "wait_us": r["wait_us"]})
    out["slow_collectives_total"] = slow.height


def link_peak(nnodes: int, gpu: str | None, plugin: dict[str, Any] | None,
              network: str | None) -> tuple[float | None, str | None]:
    """The per-direction peak (GB/s) a communicator's bus bandwidth is held against, and its name:
    the GPU's intra-node link on one node, the per-GPU network share across nodes; None when unknown."""
    spec = hw.resolve_device(gpu, None) if gpu else None
    if nnodes <= 1:
        if spec is None or not spec.link:
            return None, None
        link = hw.LINKS.get(spec.link)
        return (link.per_direction_bytes_per_s / 1e9, link.name) if link else (None, None)
    if network and network.lower() == "socket":
        return None, None
    key = None
    platform = ((plugin or {}).get("platform") or "").lower()
    if (plugin or {}).get("kind") == "ofi":
        key = "efa-p5" if platform.startswith("p5") else ("efa-p4d" if platform.startswith("p4") else None)
    elif spec is not None:
        key = hw.TYPICAL_NIC.get(spec.name)
    link = hw.LINKS.get(key) if key else None
    return (link.per_direction_bytes_per_s / 1e9, link.name) if link else (None, None)


def with_peaks(ins: dict[str, Any], gpu: str | None, plugin: dict[str, Any] | None, network: str | None) -> None:
    """Add each class's link peak and share of it (``peak_gbps``, ``peak_link``, ``pct_of_peak``)."""
    for c in ins.get("comms") or []:
        peak, name = link_peak(int(c.get("nnodes") or 1), gpu, plugin, network)
        c["peak_gbps"], c["peak_link"] = peak, name
        for k in c.get("collectives") or []:
            bw = k.get("median_busbw_gbs")
            k["pct_of_peak"] = 100.0 * bw / peak if (peak and bw is not None) else None
