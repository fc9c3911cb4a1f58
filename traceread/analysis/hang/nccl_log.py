"""Parse ``NCCL_DEBUG=INFO`` logs and PyTorch c10d watchdog lines into a summary with diagnoses.

The summary (``Report["nccl"]``) answers: which NCCL version, how many ranks/nodes, which transport
each pair of GPUs uses (NVLink/PCIe P2P, host shared memory, InfiniBand with or without GPUDirect
RDMA, TCP sockets, AWS EFA), whether NVLS is on, how long init took, which WARN/errors were logged,
and which collectives timed out on which rank. Diagnoses turn that into advice, e.g. "inter-node
traffic fell back to TCP sockets" (``NET/Socket`` between nodes is 10-100x slower than IB/EFA).

Launchers prefix lines (torchrun ``[default0]:``/``[rank0]:``, mpirun ``[1,3]<stdout>:``, dates,
line numbers); the parser finds the NCCL ``host:pid:tid [dev] NCCL INFO`` token anywhere in a line
and also accepts lines whose prefix was stripped. Garbled lines are skipped, never fatal.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

_NCCL_LINE = re.compile(
    r"(?P<host>[^\s:\[\]<>]{1,255}):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] "
    r"(?:(?P<src>\S+:\d+)(?: \((?P<func>[^)]*)\))? )?NCCL (?P<lvl>INFO|WARN|TRACE|ABORT) ?(?P<msg>.*)$"
)
_MPI_PREFIX = re.compile(r"\[(\d+),(\d+)\]<std(?:out|err)>:")
_TORCHRUN_PREFIX = re.compile(r"\[(?:default|rank)(\d+)\]:")

_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+\S*)")
_DRIVER = re.compile(r"cudaDriverVersion (\d+)")
_BOOTSTRAP = re.compile(r"Bootstrap ?: Using (\S+?):([0-9A-Fa-f.:%\w]+?)<")
_NO_PLUGIN = re.compile(r"NET/Plugin ?: No plugin found")
_LOADED_PLUGIN = re.compile(r"Loaded (net|collnet) plugin (.+?)(?: \(v\d+\))?\s*$")
_PLUGIN_MISSING_SYM = re.compile(r"NET/Plugin ?: Failed to find (\w+) symbol")
_P2P_PLUGIN = re.compile(r"P2P plugin (\S+)")
_OFI_PROVIDER = re.compile(r"NET/OFI Selected Provider is (\S+)")
_USING_NETWORK = re.compile(r"Using network (.+?)\s*$")
_IB_USING = re.compile(r"NET/IB ?: Using (.+?)(?:; OOB (\S+))?\s*$")
_IB_NODEV = re.compile(r"NET/IB ?: No device found")
_GDR_DISABLED = re.compile(r"GPU Direct RDMA Disabled for GPU (\S+) / HCA (\d+)")
_SOCKET_USING = re.compile(r"NET/Socket ?: Using (.+?)\s*$")
_INIT = re.compile(
    r"comm (0x[0-9a-fA-F]+) rank (\d+) nranks (\d+) cudaDev (\d+)(?: nvmlDev (\d+))?(?: busId (\w+))?"
    r"(?: commId (0x[0-9a-fA-F]+))? - Init (START|COMPLETE)"
)
_TOPO = re.compile(r"comm (0x[0-9a-fA-F]+) rank (\d+) nRanks (\d+) nNodes (\d+) localRanks (\d+) localRank (\d+)")
_SPLIT = re.compile(r"bootstrapSplit: comm (0x[0-9a-fA-F]+) parent (0x[0-9a-fA-F]+) rank (\d+) nranks (\d+) color (-?\d+)")
_RING = re.compile(r"Channel (\d+)/(\d+) :((?:\s+\d+)+)\s*$")
_TREES = re.compile(r"Trees \[\d+\]")
_TRANSPORT = re.compile(
    r"(?:Channel|Ring) (\d+)(?:/\d+)? : (\d+)(?:\[(\w+)\])? -> (\d+)(?:\[(\w+)\])?(?: \[(send|receive)\])? via (\S.*?)\s*$"
)
_NVLS_AVAIL = re.compile(r"NVLS multicast support is (not )?available on dev (\d+)")
_NVLS_COMM = re.compile(r"NVLS comm 0x[0-9a-fA-F]+ headRank")
_CHANNELS = re.compile(
    r"(\d+) coll channels, (?:(\d+) collnet channels, )?(?:(\d+) nvls channels, )?(\d+) p2p channels"
)
# NCCL >= 2.19 (init.cc): "Init timings[ - <func>]: rank R nranks N total T (kernels a, [alloc b,] bootstrap c,
# allgathers d, topo e, graphs f, connections g, rest h)", all in seconds.
_INIT_TIMING = re.compile(r"Init timings(?: - \w+)?: rank (\d+) nranks (\d+) total ([\d.]+)(?: \(([^)]*)\))?")
_PHASE = re.compile(r"(\w+) ([\d.]+)")
_BOOT_TIMING = re.compile(r"Bootstrap timings total ([\d.]+)")
_UNWIND = re.compile(r"^(\S+\.(?:cc|cu|h|cpp):\d+) -> (\d+)")
_BUSBW = re.compile(r"# Avg bus bandwidth\s*:\s*([\d.]+)")
_CONNECTED = re.compile(r"Connected all (rings|trees)")

# --- PyTorch c10d / gloo lines ---
_WD_TIMEOUT = re.compile(
    r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(\d+), OpType=(\w+)"
    r"(?:, NumelIn=(\d+), NumelOut=(\d+))?[^)]*?Timeout\(ms\)=(\d+)\)(?: ran for (\d+) milliseconds)?"
)
_PG_RANK = re.compile(r"\[(?:PG (?:ID )?(\d+)(?: PG GUID ([^ \]]+))? )?Rank (\d+)\]")
_LAST_WORK = re.compile(r"(?i:last) enqueued (?:NCCL )?work: (-?\d+), last completed (?:NCCL )?work: (-?\d+)")
_AT_WORK = re.compile(r"(?:detected by watchdog at work(?: sequence id)?|Timeout at NCCL work): (\d+)")
_DUMP_FROM = re.compile(r"dump signal due to a collective timeout from\s+(this local rank|rank (\d+))")
_FR_DISABLED = re.compile(r"Stack trace of the failed collective not found")
_GLOO_TIMEOUT = re.compile(r"Timed out waiting (\d+)ms for (recv|send) operation")
_MONITORED = re.compile(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier")
_FINGERPRINT = re.compile(
    r"Rank (\d+) is running collective: CollectiveFingerPrint\((.*?)\), but Rank (\d+) is running collective: "
    r"CollectiveFingerPrint\((.*?)\)"
)
_LINE_RANK = re.compile(r"\[rank(\d+)\]:")

_TORCH_KEYS = ("atchdog", "Rank", "Timed out", "dump signal", "Stack trace of the failed", "monitoredBarrier")
_FAIL_WORDS = re.compile(r"fail|error|closed|abort|refused|reset|timeout|timed out|retcode|status=\d+", re.I)


def _strip_launcher(line: str) -> tuple[str, int | None]:
    """Remove mpirun/torchrun prefixes; return the rest and the launcher's rank when it says one."""
    rank = None
    m = _MPI_PREFIX.search(line)
    if m:
        rank = int(m.group(2))
        line = line[m.end():]
    m = _TORCHRUN_PREFIX.match(line.lstrip())
    if m:
        if rank is None:
            rank = int(m.group(1))
        line = line.lstrip()[m.end():]
    return line, rank


#: NCCL and c10d lines are short; a longer "line" (a binary file, a dumped tensor) is cut here so the
#: patterns, which search anywhere in a line, stay linear.
MAX_LINE_CHARS = 4096


def _iter_lines(paths: Iterable[str | Path]) -> Iterable[tuple[str, str]]:
    for p in paths:
        try:
            with open(p, errors="replace") as fh:
                while line := fh.readline(1 << 16):
                    if len(line) >= 1 << 16 and not line.endswith("\n"):
                        while (rest := fh.readline(1 << 16)) and not rest.endswith("\n"):
                            pass  # skip the remainder of an overlong line without holding it
                    yield str(p), line[:MAX_LINE_CHARS].rstrip("\n")
        except OSError:
            continue


def _transport_label(via: str) -> tuple[str, str | None, bool]:
    """``NET/IB/0/GDRDMA`` -> ("NET/IB", "IB", True); ``P2P/direct pointer/read`` -> ("P2P/direct", None, False)."""
    parts = via.split("/")
    kind = parts[0].strip()
    if kind == "NET" and len(parts) > 1:
        net = parts[1].strip()
        gdr = "GDRDMA" in parts[2:]
        return f"NET/{net}", net, gdr
    if kind == "P2P" and len(parts) > 1:
        sub = parts[1].split(" ")[0]
        return f"P2P/{sub}", None, False
    return kind, None, False


def _empty_summary() -> dict[str, Any]:
    return {
        "files": [],
        "version": None,
        "versions": {},
        "cuda_driver": None,
        "hosts": [],
        "nodes": None,
        "nranks": None,
        "local_ranks": None,
        "comms": [],
        "network": None,
        "net_plugin": None,
        "ofi_provider": None,
        "ib_devices": [],
        "bootstrap_interfaces": [],
        "transports": {},
        "gdrdma": None,
        "rings": {},
        "trees": 0,
        "nvls": {"available": None, "channels": None, "comms": 0},
        "channels": None,
        "init_time_s": None,
        "init_timings": {},
        "init_phases": {},
        "warnings": [],
        "errors": [],
        "timeouts": [],
        "torch_messages": [],
        "nccl_tests_busbw_gbps": None,
        "diagnoses": [],
        "lines_parsed": 0,
    }


def parse_nccl_logs(paths: Sequence[str | Path]) -> dict[str, Any]:
    """Summarise NCCL_DEBUG logs (and PyTorch watchdog lines in them). See the module docstring.

    Keys: ``version`` (most common ``NCCL version``), ``hosts``/``nodes`` (distinct hostnames, or
    NCCL's own ``nNodes`` when larger), ``nranks`` (largest communicator), ``transports``
    (label -> number of channel connections, e.g. ``{"P2P/IPC": 8, "NET/IB": 4}``), ``gdrdma``
    (True when every NET connection uses GPUDirect RDMA), ``init_time_s`` (longest
    ``Init timings ... total``), ``warnings``/``errors`` (NCCL WARN lines), ``timeouts`` (one per
    rank and collective: rank, pg, seq, op, numel_in, timeout_ms, ran_for_ms, last_enqueued,
    last_completed) and ``diagnoses`` (``{"id", "severity", "message"}``).
    """
    s = _empty_summary()
    s["files"] = [str(p) for p in paths]
    versions: Counter[str] = Counter()
    hosts: dict[str, None] = {}
    transports: Counter[str] = Counter()
    net_gdr: list[bool] = []
    comms: dict[str, dict[str, Any]] = {}
    nnodes_seen: list[int] = []
    local_ranks_seen: list[int] = []
    timeouts: dict[tuple[int | None, int | None, str | None], dict[str, Any]] = {}
    nvls_avail: list[bool] = []
    networks: Counter[str] = Counter()
    unwind_codes: Counter[str] = Counter()
    ib_nodev = False
    no_plugin = False
    plugins: list[str] = []

    for fname, raw in _iter_lines(paths):
        try:
            line, launcher_rank = _strip_launcher(raw)
            m = _NCCL_LINE.search(line)
            if m:
                host, lvl, msg, src = m.group("host"), m.group("lvl"), m.group("msg"), m.group("src")
                hosts.setdefault(host, None)
            else:
                host, lvl, src = None, None, None
                msg = line.strip()
            if not msg:
                continue
            s["lines_parsed"] += 1
            _torch_line(raw, msg, launcher_rank, timeouts, s)
            if lvl == "WARN":
                item = {"host": host, "src": src, "message": msg.strip(), "file": fname}
                s["warnings"].append(item)
                if _FAIL_WORDS.search(msg):
                    s["errors"].append(item)
                continue
            if "NCCL version" in msg and (v := _VERSION.search(msg)):
                versions[v.group(1)] += 1
                continue
            if "cudaDriver" in msg and (d := _DRIVER.search(msg)):
                s["cuda_driver"] = int(d.group(1))
            if "Bootstrap" in msg and (b := _BOOTSTRAP.search(msg)):
                iface = f"{b.group(1)}:{b.group(2)}"
                if iface not in s["bootstrap_interfaces"]:
                    s["bootstrap_interfaces"].append(iface)
            if "No plugin" in msg and _NO_PLUGIN.search(msg):
                no_plugin = True
            if "plugin" in msg and (pl := _LOADED_PLUGIN.search(msg)):
                plugins.append(f"{pl.group(1)}: {pl.group(2).strip()}")
            if "P2P plugin" in msg and (pl := _P2P_PLUGIN.search(msg)):
                plugins.append(f"p2p: {pl.group(1)}")
            if "Provider" in msg and (ofi := _OFI_PROVIDER.search(msg)):
                s["ofi_provider"] = ofi.group(1)
            if "Using network" in msg and (un := _USING_NETWORK.search(msg)):
                networks[un.group(1)] += 1
            if "NET/IB" in msg and (ib := _IB_USING.search(msg)):
                for dev in re.findall(r"\[\d+\](\S+)", ib.group(1)):
                    if dev not in s["ib_devices"] and dev != "[RO]":
                        s["ib_devices"].append(dev)
            if "No device" in msg and _IB_NODEV.search(msg):
                ib_nodev = True
            if "GPU Direct" in msg and _GDR_DISABLED.search(msg):
                net_gdr.append(False)
            if "Init " in msg and (it := _INIT.search(msg)):
                _add_init(comms, it, host)
                continue
            if "nNodes" in msg and (tp := _TOPO.search(msg)):
                nnodes_seen.append(int(tp.group(4)))
                local_ranks_seen.append(int(tp.group(5)))
                c = comms.setdefault(tp.group(1), _new_comm(tp.group(1)))
                c["nranks"] = int(tp.group(3))
                c["nnodes"] = int(tp.group(4))
                c["local_ranks"] = int(tp.group(5))
                c["ranks"].add(int(tp.group(2)))
                continue
            if "bootstrapSplit" in msg and (sp := _SPLIT.search(msg)):
                c = comms.setdefault(sp.group(1), _new_comm(sp.group(1)))
                c["nranks"] = int(sp.group(4))
                c["ranks"].add(int(sp.group(3)))
                c["split_color"] = int(sp.group(5))
                continue
            if " via " in msg and (tr := _TRANSPORT.search(msg)):
                label, net, gdr = _transport_label(tr.group(7))
                transports[label] += 1
                if net is not None:
                    net_gdr.append(gdr)
                continue
            if "Channel" in msg and (rg := _RING.search(msg)):
                s["rings"].setdefault(int(rg.group(1)), [int(x) for x in rg.group(3).split()])
                continue
            if "Trees" in msg and _TREES.search(msg):
                s["trees"] += 1
                continue
            if "NVLS" in msg and (nv := _NVLS_AVAIL.search(msg)):
                nvls_avail.append(nv.group(1) is None)
                continue
            if "NVLS" in msg and _NVLS_COMM.search(msg):
                s["nvls"]["comms"] += 1
                continue
            if "coll channels" in msg and (ch := _CHANNELS.search(msg)):
                s["channels"] = {
                    "coll": int(ch.group(1)),
                    "collnet": int(ch.group(2)) if ch.group(2) else 0,
                    "nvls": int(ch.group(3)) if ch.group(3) else 0,
                    "p2p": int(ch.group(4)),
                }
                continue
            if "timings" in msg and (ti := _INIT_TIMING.search(msg)):
                s["init_timings"][int(ti.group(1))] = float(ti.group(3))
                if ti.group(4):
                    s["init_phases"][int(ti.group(1))] = {k: float(v) for k, v in _PHASE.findall(ti.group(4))}
                continue
            if "timings" in msg and (bt := _BOOT_TIMING.search(msg)):
                s.setdefault("bootstrap_time_s", float(bt.group(1)))
                continue
            if " -> " in msg and (uw := _UNWIND.search(msg.strip())):
                unwind_codes[uw.group(2)] += 1
                continue
            if "bus bandwidth" in msg and (bw := _BUSBW.search(msg)):
                s["nccl_tests_busbw_gbps"] = float(bw.group(1))
        except Exception:  # one garbled line must never stop the summary
            continue

    s["versions"] = dict(versions)
    s["version"] = versions.most_common(1)[0][0] if versions else None
    s["hosts"] = list(hosts)
    nodes = max([len(hosts)] + nnodes_seen) if (hosts or nnodes_seen) else None
    s["nodes"] = nodes
    s["local_ranks"] = max(local_ranks_seen) if local_ranks_seen else None
    s["comms"] = _merge_comms(comms)
    nranks = [c["nranks"] for c in s["comms"] if c.get("nranks")]
    nranks += [len(r) for r in s["rings"].values()]
    s["nranks"] = max(nranks) if nranks else None
    s["transports"] = dict(transports)
    s["gdrdma"] = all(net_gdr) if net_gdr else None
    s["network"] = networks.most_common(1)[0][0] if networks else _network_from_transports(transports)
    s["net_plugin"] = "; ".join(dict.fromkeys(plugins)) if plugins else ("none (internal)" if no_plugin else None)
    s["nvls"]["available"] = any(nvls_avail) if nvls_avail else (True if s["nvls"]["comms"] else None)
    if s["channels"]:
        s["nvls"]["channels"] = s["channels"]["nvls"]
    s["init_time_s"] = max(s["init_timings"].values()) if s["init_timings"] else None
    s["init_timings"] = {str(k): v for k, v in sorted(s["init_timings"].items())}
    s["init_phases"] = {str(k): v for k, v in sorted(s["init_phases"].items())}
    s["rings"] = {str(k): v for k, v in sorted(s["rings"].items())}
    s["timeouts"] = sorted(timeouts.values(), key=lambda t: (t.get("rank") is None, t.get("rank") or 0))
    s["error_codes"] = dict(unwind_codes)
    s["diagnoses"] = _diagnose(s, ib_nodev=ib_nodev, no_plugin=no_plugin)
    return s


def _new_comm(ptr: str) -> dict[str, Any]:
    return {"comm": ptr, "comm_id": None, "nranks": None, "nnodes": None, "local_ranks": None,
            "ranks": set(), "started": set(), "completed": set(), "hosts": set()}


def _add_init(comms: dict[str, dict[str, Any]], m: re.Match[str], host: str | None) -> None:
    ptr, rank, nranks, comm_id, phase = m.group(1), int(m.group(2)), int(m.group(3)), m.group(7), m.group(8)
    c = comms.setdefault(ptr, _new_comm(ptr))
    c["comm_id"] = comm_id or c["comm_id"]
    c["nranks"] = nranks
    c["ranks"].add(rank)
    if host:
        c["hosts"].add(host)
    (c["completed"] if phase == "COMPLETE" else c["started"]).add(rank)


def _merge_comms(per_ptr: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Comm pointers are per process: one communicator = all pointers with the same commId.

    Pointers whose lines carry no commId (old NCCL, topology lines) join the only communicator of
    the same size, or else group by size.
    """
    groups: dict[str, dict[str, Any]] = {}
    for c in per_ptr.values():
        if c["comm_id"]:
            _merge_into(groups.setdefault(c["comm_id"], _new_comm(c["comm"])), c)
    for c in per_ptr.values():
        if c["comm_id"]:
            continue
        same_size = [k for k, g in groups.items() if g["nranks"] == c["nranks"] and g["comm_id"]]
        key = same_size[0] if len(same_size) == 1 else f"nranks={c['nranks']}"
        _merge_into(groups.setdefault(key, _new_comm(c["comm"])), c)
    return [_finish_comm(g) for g in groups.values()]


def _merge_into(g: dict[str, Any], c: dict[str, Any]) -> None:
    g["comm_id"] = g["comm_id"] or c["comm_id"]
    for k in ("nranks", "nnodes", "local_ranks"):
        if c[k] is not None:
            g[k] = c[k] if g[k] is None else max(g[k], c[k])
    for k in ("ranks", "started", "completed", "hosts"):
        g[k] |= c[k]


def _finish_comm(c: dict[str, Any]) -> dict[str, Any]:
    return {
        "comm_id": c["comm_id"],
        "nranks": c["nranks"],
        "nnodes": c["nnodes"],
        "local_ranks": c["local_ranks"],
        "ranks_seen": sorted(c["ranks"]),
        "init_started": sorted(c["started"]),
        "init_complete": sorted(c["completed"]),
        "hosts": sorted(c["hosts"]),
    }


def _network_from_transports(transports: Counter[str]) -> str | None:
    nets = [k.split("/", 1)[1] for k in transports if k.startswith("NET/")]
    return Counter(nets).most_common(1)[0][0] if nets else None


def _torch_line(raw: str, msg: str, launcher_rank: int | None,
                timeouts: dict[tuple[int | None, int | None, str | None], dict[str, Any]], s: dict[str, Any]) -> None:
    """PyTorch watchdog / gloo / debug-mode lines -> ``timeouts`` and ``torch_messages``."""
    if not any(k in raw for k in _TORCH_KEYS):
        return
    pr = _PG_RANK.search(raw)
    lr = _LINE_RANK.search(raw)
    rank = int(pr.group(3)) if pr else (int(lr.group(1)) if lr else launcher_rank)
    pg = pr.group(1) if pr and pr.group(1) is not None else None
    pg_guid = pr.group(2) if pr else None
    if (wd := _WD_TIMEOUT.search(raw)):
        seq = int(wd.group(1))
        t = timeouts.setdefault((rank, seq, pg), {"rank": rank, "pg": pg, "seq": seq})
        t.update({
            "op": wd.group(2),
            "numel_in": int(wd.group(3)) if wd.group(3) else None,
            "numel_out": int(wd.group(4)) if wd.group(4) else None,
            "timeout_ms": int(wd.group(5)),
            "ran_for_ms": int(wd.group(6)) if wd.group(6) else None,
        })
        return
    if (lw := _LAST_WORK.search(raw)):
        at = _AT_WORK.search(raw)
        work_seq = int(at.group(1)) if at else None
        # attach to this rank's timeout record (which was logged without a PG id)
        match = None
        for key, rec in timeouts.items():
            if work_seq is not None and key[0] == rank and rec["seq"] == work_seq:
                match = rec
        if match is None and work_seq is not None:
            match = timeouts.setdefault((rank, work_seq, pg), {"rank": rank, "pg": pg, "seq": work_seq, "op": None})
        if match is not None:
            match["last_enqueued"] = int(lw.group(1))
            match["last_completed"] = int(lw.group(2))
            if pg is not None:
                match["pg"] = pg
            if pg_guid:
                match["pg_guid"] = pg_guid
        dump = _DUMP_FROM.search(raw)
        if dump:
            s["torch_messages"].append({"rank": rank, "kind": "dump_signal",
                                        "from_rank": rank if dump.group(2) is None else int(dump.group(2)),
                                        "last_enqueued": int(lw.group(1)), "last_completed": int(lw.group(2))})
        return
    if (dump := _DUMP_FROM.search(raw)):
        s["torch_messages"].append({"rank": rank, "kind": "dump_signal",
                                    "from_rank": rank if dump.group(2) is None else int(dump.group(2))})
    elif "Observed flight recorder dump signal from another rank" in raw:
        s["torch_messages"].append({"rank": rank, "kind": "dump_signal_observed"})
    elif _FR_DISABLED.search(raw):
        s["torch_messages"].append({"rank": rank, "kind": "flight_recorder_disabled"})
    elif (gt := _GLOO_TIMEOUT.search(raw)):
        s["torch_messages"].append({"rank": rank, "kind": "gloo_timeout", "timeout_ms": int(gt.group(1))})
    elif (mb := _MONITORED.search(raw)):
        s["torch_messages"].append({"rank": rank, "kind": "monitored_barrier",
                                    "missing_ranks": [int(x) for x in re.findall(r"\d+", mb.group(1))]})
    elif (fp := _FINGERPRINT.search(raw)):
        s["torch_messages"].append({"rank": rank, "kind": "fingerprint_mismatch",
                                    "ranks": {fp.group(1): fp.group(2), fp.group(3): fp.group(4)}})


def _diagnose(s: dict[str, Any], *, ib_nodev: bool, no_plugin: bool) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    nodes = s["nodes"] or 1
    transports: dict[str, int] = s["transports"]
    socket_used = "NET/Socket" in transports or (s["network"] or "").lower() == "socket"
    multi_node = nodes > 1 or any(k.startswith("NET/") for k in transports)
    if socket_used and multi_node:
        out.append({"id": "socket_fallback", "severity": "error",
                    "message": "inter-node traffic fell back to TCP sockets (NET/Socket): expect 10-100x lower "
                               "bandwidth than InfiniBand/EFA; check that the IB/EFA devices are visible "
                               "(NCCL_IB_HCA, NCCL_SOCKET_IFNAME, container --device/--cap-add IPC_LOCK) and that the "
                               "network plugin loads"})
    if socket_used and (no_plugin or ib_nodev) and multi_node:
        out.append({"id": "net_plugin_missing", "severity": "warning",
                    "message": "no IB device and no IB/EFA network plugin was loaded (libnccl-net.so not found), "
                               "so NCCL could only use sockets"})
    if ib_nodev and not socket_used:
        out.append({"id": "ib_not_found", "severity": "warning", "message": "NET/IB found no InfiniBand device"})
    ib_like = [k for k in transports if k.startswith("NET/") and k != "NET/Socket"]
    if ib_like and s["gdrdma"] is False:
        out.append({"id": "no_gdrdma", "severity": "warning",
                    "message": f"network transfers ({', '.join(sorted(ib_like))}) do not use GPUDirect RDMA: data is "
                               "staged through host memory; load nvidia-peermem / check NCCL_NET_GDR_LEVEL and the "
                               "PCIe distance between GPU and NIC"})
    shm = transports.get("SHM", 0)
    if shm and not any(k.startswith("P2P") for k in transports):
        out.append({"id": "shm_instead_of_p2p", "severity": "warning",
                    "message": f"GPUs of one node exchange data through host shared memory (SHM, {shm} channel "
                               "connections) instead of NVLink/PCIe P2P: check P2P support (PCIe ACS/IOMMU, "
                               "containers, NCCL_P2P_DISABLE)"})
    if s["nvls"]["available"] is False:
        out.append({"id": "nvls_unavailable", "severity": "info",
                    "message": "NVLS (NVLink SHARP) multicast is not available: all-reduce inside the node uses "
                               "rings/trees only"})
    for comm in s["comms"]:
        missing = sorted(set(comm["init_started"]) - set(comm["init_complete"]))
        if missing and comm["init_started"] and not comm["init_complete"]:
            out.append({"id": "init_incomplete", "severity": "warning",
                        "message": f"communicator {comm['comm_id'] or ''} (nranks {comm['nranks']}): ranks "
                                   f"{_ranks(missing)} logged Init START but no Init COMPLETE (init hang, or the "
                                   "log ends early)"})
    for w in s["warnings"]:
        m = w["message"]
        if "nvmlDeviceGetHandleByPciBusId" in m:
            out.append({"id": "nvml_not_found", "severity": "warning",
                        "message": "NVML cannot see the other GPUs (each rank sees only its own GPU, e.g. "
                                   "CUDA_VISIBLE_DEVICES per process): NCCL cannot detect NVLink/P2P topology"})
            break
    for w in s["errors"]:
        m = w["message"]
        if "closed by remote peer" in m:
            peer = re.search(r"peer (\S+)", m)
            out.append({"id": "peer_closed", "severity": "error",
                        "message": f"connection closed by remote peer {peer.group(1) if peer else ''}: that peer "
                                   "likely died first - look at its log, not this one"})
        elif "Connect to" in m and "failed" in m:
            out.append({"id": "connect_failed", "severity": "error",
                        "message": f"NCCL could not connect: {m} (firewall, wrong NCCL_SOCKET_IFNAME, routing)"})
        elif "status=12" in m:
            out.append({"id": "ib_retry_exceeded", "severity": "error",
                        "message": f"InfiniBand retry-exceeded completion error (link/fabric problem): {m}"})
        elif "Cuda failure" in m:
            out.append({"id": "cuda_failure", "severity": "error", "message": f"NCCL hit a CUDA error: {m}"})
    by_seq: dict[tuple[Any, Any, Any], list[int]] = defaultdict(list)
    for t in s["timeouts"]:
        by_seq[(t.get("pg"), t.get("seq"), t.get("op"))].append(t["rank"] if t["rank"] is not None else -1)
    for (pg, seq, op), ranks in by_seq.items():
        out.append({"id": "collective_timeout", "severity": "error",
                    "message": f"collective #{seq} ({op or 'unknown op'}) on PG {pg if pg is not None else '?'} "
                               f"timed out on ranks {_ranks(sorted(ranks))}; these ranks are victims - the culprit is "
                               "a rank that never joined it (see `traceread hang`)"})
    slow_init = _slow_init(s)
    if slow_init:
        out.append(slow_init)
    if any(m.get("kind") == "flight_recorder_disabled" for m in s["torch_messages"]):
        out.append({"id": "flight_recorder_disabled", "severity": "info",
                    "message": "Flight Recorder was disabled: set TORCH_FR_BUFFER_SIZE=20000 to record collectives"})
    return _dedupe(out)


#: Communicator init slower than this is diagnosed (a healthy init of 8-1000 ranks takes ~1-5 s).
SLOW_INIT_S = 10.0
#: What each ``Init timings`` phase does in NCCL's init.cc, and what usually makes it slow.
_PHASE_ADVICE = {
    "bootstrap": "the TCP rendezvous of all ranks: it waits for the last rank to call init, so a rank that "
                 "started late (slow imports, container start, data loading before init) or a slow/wrong "
                 "NCCL_SOCKET_IFNAME interface shows here",
    "topo": "topology detection (PCI/NVML/NIC discovery under /sys): slow in VMs or containers with a partial "
            "/sys; an NCCL_TOPO_FILE skips the probing",
    "graphs": "the ring/tree search over the topology: grows with GPUs and NICs per node; NCCL_GRAPH_FILE "
              "reuses a saved search",
    "connections": "connecting every channel to its peers (IB queue pairs, P2P/IPC buffers): grows with "
                   "channels x peers; NCCL_RUNTIME_CONNECT=1 (default since 2.22) connects lazily, fewer "
                   "channels (NCCL_MAX_NCHANNELS) connect faster",
    "allgathers": "bootstrap all-gathers of every rank's peer info over TCP: network latency x ranks",
    "kernels": "loading NCCL's device kernels (CUDA module load): CUDA_MODULE_LOADING=LAZY helps",
    "alloc": "device memory allocation for NCCL buffers",
    "rest": "work NCCL does not attribute to a named phase",
}


def _slow_init(s: dict[str, Any]) -> dict[str, str] | None:
    """The slowest communicator init when it takes >= SLOW_INIT_S: which phase dominates, on which rank.

    When bootstrap dominates, the rank with the shortest bootstrap is the one the others waited for
    (it arrived last, so it waited least).
    """
    totals = {int(k): v for k, v in s["init_timings"].items()}
    if not totals or max(totals.values()) < SLOW_INIT_S:
        return None
    rank = max(totals, key=lambda r: totals[r])
    total = totals[rank]
    phases = s["init_phases"].get(str(rank)) or {}
    msg = f"communicator init took {total:.1f} s on rank {rank} (nranks {s['nranks'] or '?'})"
    if phases:
        phase, secs = max(phases.items(), key=lambda kv: kv[1])
        msg += f"; {phase} {secs:.1f} s = {100 * secs / total:.0f}% of it: {_PHASE_ADVICE.get(phase, phase)}"
        boot = {int(r): p["bootstrap"] for r, p in s["init_phases"].items() if "bootstrap" in p}
        if phase == "bootstrap" and len(boot) > 1:
            late = min(boot, key=lambda r: boot[r])
            msg += f". Rank {late} waited least in bootstrap ({boot[late]:.1f} s): the others waited for it"
    return {"id": "slow_init", "severity": "warning", "message": msg}


def _dedupe(items: list[dict[str, str]]) -> list[dict[str, str]]:
    seen: set[tuple[str, str]] = set()
    out = []
    for d in items:
        key = (d["id"], d["message"])
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


def _ranks(ranks: Sequence[int]) -> str:
    return ", ".join(str(r) for r in ranks)


def find_nccl_logs(run_dir: str | Path) -> list[Path]:
    """NCCL/launcher logs in a RUN folder: ``nccl/*``, ``launcher.log``, torchrun ``--log-dir`` files."""
    d = Path(run_dir)
    out: list[Path] = []
    if (d / "nccl").is_dir():
        out += sorted(p for p in (d / "nccl").rglob("*") if p.is_file())
    if (d / "launcher.log").is_file():
        out.append(d / "launcher.log")
    for sub in ("torchrun", "logs"):
        if (d / sub).is_dir():
            out += sorted(p for p in (d / sub).rglob("*.log") if p.is_file())
    return out


#: Text that only an NCCL_DEBUG log or a PyTorch c10d NCCL/gloo message contains.
_LOG_MARKERS = (b"NCCL INFO", b"NCCL WARN", b"NCCL version", b"Init timings", b"Watchdog caught",
                b"ProcessGroupNCCL", b"ProcessGroupGloo")
LOG_SUFFIXES = (".log", ".txt", ".out", ".err")
#: Only the head of a file is sniffed, and only this many files per folder walk (a huge tree of logs
#: must not turn `report` into a grep of the file system).
SNIFF_BYTES = 1 << 20
MAX_LOG_FILES = 2000


def looks_like_nccl_log(path: Path) -> bool:
    """Whether the first MiB of ``path`` holds an NCCL/c10d marker (any launcher prefix, any name)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(SNIFF_BYTES)
    except OSError:
        return False
    return any(m in head for m in _LOG_MARKERS)


def nccl_logs_under(paths: Sequence[str | Path], run_dir: str | Path | None = None) -> list[Path]:
    """NCCL logs the user pointed at: the RUN folder's logs, ``*.log``/``*.txt``/``*.out``/``*.err`` files
    under the folders given, and any file named explicitly that is not a trace, when their content
    says NCCL. Lets ``traceread report`` answer from logs alone (a job that died before any trace)."""
    out: dict[Path, None] = {}
    if run_dir is not None:
        out.update(dict.fromkeys(find_nccl_logs(run_dir)))
    for raw in paths:
        p = Path(raw)
        if p.is_file() and not p.name.endswith((".json", ".json.gz", ".json.zst")):
            if looks_like_nccl_log(p):
                out.setdefault(p, None)
        elif p.is_dir():
            seen = 0
            for f in sorted(p.rglob("*")):
                rel = f.relative_to(p).parts
                if not f.name.endswith(LOG_SUFFIXES) or any(x.startswith(".") for x in rel) or not f.is_file():
                    continue
                seen += 1
                if seen > MAX_LOG_FILES:
                    break
                if looks_like_nccl_log(f):
                    out.setdefault(f, None)
    return list(out)
