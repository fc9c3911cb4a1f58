"""``NCCL_DEBUG=INFO`` logs (and the PyTorch c10d lines in them) -> the report's ``nccl`` summary.

The summary answers: which NCCL version, how many ranks and nodes, every communicator NCCL created
and how long each rank's init of it took, which transport each pair of GPUs uses (NVLink/PCIe P2P,
host shared memory, InfiniBand with or without GPUDirect RDMA, TCP sockets, AWS EFA through
aws-ofi-nccl), what the network plugin said (provider, fabric, NICs, GPUDirect support, failure),
the environment settings NCCL printed, what the hardware is, which WARN lines were logged and
which collectives timed out on which rank. :mod:`~traceread.analysis.comm.nccl.diagnose` turns that
into diagnoses that cite the lines they rest on. Garbled lines are skipped, never fatal.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from traceread.analysis.comm.nccl import platform
from traceread.analysis.comm.nccl.comms import CommTracker
from traceread.analysis.comm.nccl.diagnose import diagnose, is_failure
from traceread.analysis.comm.nccl.files import nccl_logs_under
from traceread.analysis.comm.nccl.inspector import inspector_files_under, read_inspector, with_peaks
from traceread.analysis.comm.nccl.lines import LogLine, iter_raw_lines, split_line
from traceread.analysis.comm.nccl.network import KEEP, NetTracker
from traceread.analysis.comm.nccl.problems import MAX_PROBLEMS, find_problem, last_error
from traceread.analysis.comm.nccl.torch_lines import torch_line

_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+\S*)")
_DRIVER = re.compile(r"cudaDriverVersion (\d+)")
_RING = re.compile(r"Channel (\d+)/(\d+) :((?:\s+\d+)+)\s*$")
_TREES = re.compile(r"Trees \[\d+\]")
_TRANSPORT = re.compile(
    r"(?:Channel|Ring) (\d+)(?:/\d+)? : (\d+)(?:\[(\w+)\])? -> (\d+)(?:\[(\w+)\])?(?: \[(send|receive)\])? via (\S.*?)\s*$"
)
_CHANNELS = re.compile(
    r"(\d+) coll channels, (?:(\d+) collnet channels, )?(?:(\d+) nvls channels, )?(\d+) p2p channels"
)
_BOOT_TIMING = re.compile(r"Bootstrap timings total ([\d.]+)")
_UNWIND = re.compile(r"^(\S+\.(?:cc|cu|h|cpp):\d+) -> (\d+)")
_BUSBW = re.compile(r"# Avg bus bandwidth\s*:\s*([\d.]+)")
_WATCHDOG = "Watchdog caught collective operation timeout"
#: Lines that name NCCL and are read without NCCL's host:pid:tid prefix (versions, c10d, nccl-tests)
_READ_WITHOUT_PREFIX = re.compile(r"NCCL version|ProcessGroupNCCL|NCCL_\w+|NCCL INFO|nccl-tests|Watchdog|c10d|"
                                  r"NCCL error|NCCL (?:WARN|ABORT|TRACE)")
#: NCCL <= 2.3 listed interfaces one per line: ``NET : Using interface enp3s0:192.168.1.3<0>``
_OLD_IFACE = re.compile(r"NET ?: Using interface (\S+?)<\d+>")
_PLUGIN_HOST = re.compile(r"NET/Plugin ?: ?(?:No plugin found|Could not find)|Plugin Path ?: ?(\S+)|"
                          r"Loaded (?:net|coll) plugin (.+?)(?: \(v\d+\))?\s*$|Successfully loaded external plugin (\S+)")
_FR_DISABLED = "Stack trace of the failed collective not found"


def transport_label(via: str) -> tuple[str, str | None, bool]:
    """``NET/IB/0/GDRDMA`` -> ("NET/IB", "IB", True); ``P2P/direct pointer/read`` -> ("P2P/direct", None, False)."""
    parts = via.split("/")
    kind = parts[0].strip()
    if kind == "NET" and len(parts) > 1:
        net = parts[1].strip()
        gdr = "GDRDMA" in parts[2:] or any(p.startswith("GDRDMA") for p in parts[2:])
        return f"NET/{net}", net, gdr
    if kind == "P2P" and len(parts) > 1:
        sub = parts[1].split(" ")[0]
        return f"P2P/{sub}", None, False
    return kind, None, False


def empty_summary() -> dict[str, Any]:
    return {
        "files": [], "version": None, "versions": {}, "cuda_driver": None, "hosts": [], "nodes": None,
        "nranks": None, "local_ranks": None, "comms": [], "network": None, "net_plugin": None,
        "ofi_provider": None, "ib_devices": [], "bootstrap_interfaces": [], "transports": {}, "gdrdma": None,
        "rings": {}, "trees": 0, "nvls": {"available": None, "channels": None, "comms": 0}, "channels": None,
        "init_time_s": None, "init_timings": {}, "init_phases": {}, "init_total_s": {}, "init_slowest": None,
        "env": {}, "plugin": None, "hardware": None, "socket_interfaces": [], "nics": None,
        "warnings": [], "errors": [], "timeouts": [], "torch_messages": [], "nccl_tests_busbw_gbps": None,
        "diagnoses": [], "evidence": {}, "lines_parsed": 0, "inspector": None,
        "problems": [], "problems_total": 0, "versions_by_host": {}, "plugin_by_host": {}, "interfaces_seen": [],
        "unread": {"count": 0, "first": None},
    }


class _Evidence:
    """The first few lines per topic, quoted, for the diagnoses (kept in the summary as text)."""

    def __init__(self) -> None:
        self.quotes: dict[str, list[str]] = {}

    def cite(self, topic: str, ln: LogLine) -> None:
        lst = self.quotes.get(topic)
        if lst is None:
            lst = self.quotes[topic] = []
        if len(lst) < KEEP:
            lst.append(ln.quote())


def parse_nccl_logs(paths: Sequence[str | Path], devices: Sequence[str] = ()) -> dict[str, Any]:
    """Summarise NCCL_DEBUG logs (and PyTorch watchdog lines in them); see docs/hang-and-nccl.md.

    ``devices``: GPU names the traces give (``deviceProperties``), the best evidence of what the
    hardware is; without them the log's own hints are used (see :mod:`.platform`).
    """
    s = empty_summary()
    s["files"] = [str(p) for p in paths]
    versions: Counter[str] = Counter()
    hosts: dict[str, None] = {}
    transports: Counter[str] = Counter()
    net_gdr: list[bool] = []
    timeouts: dict[tuple[int | None, int | None, str | None], dict[str, Any]] = {}
    unwind_codes: Counter[str] = Counter()
    comms, net, ev = CommTracker(), NetTracker(), _Evidence()
    after_last_error: tuple[str, int] | None = None  # PyTorch prints NCCL's last WARN on the line after it

    for fname, lineno, raw in iter_raw_lines(paths):
        try:
            ln = split_line(fname, lineno, raw)
            msg = ln.msg
            if ln.host:
                hosts.setdefault(ln.host, None)
            if not msg:
                continue
            s["lines_parsed"] += 1
            prob = find_problem(fname, lineno, raw, ln.level)
            if prob is None and after_last_error == (fname, lineno - 1):
                prob = last_error(fname, lineno, raw)
            if raw.rstrip().endswith("Last error:"):
                after_last_error = (fname, lineno)
            if prob is not None:
                s["problems_total"] += 1
                if len(s["problems"]) < MAX_PROBLEMS:
                    s["problems"].append(prob)
            elif ln.level is None and "NCCL " in raw and not _READ_WITHOUT_PREFIX.search(raw):
                s["unread"]["count"] += 1  # said once, in the summary, with the first such line
                s["unread"]["first"] = s["unread"]["first"] or ln.quote()
            _context_line(s, ln, ev)
            torch_line(raw, ln.launcher_rank, timeouts, s)
            if _WATCHDOG in raw:
                ev.cite("watchdog", ln)
            elif _FR_DISABLED in raw:
                ev.cite("fr_disabled", ln)
            if ln.level == "WARN":
                item = {"host": ln.host, "src": ln.src, "message": msg.strip(), "file": fname, "line": lineno,
                        "quote": ln.quote()}
                s["warnings"].append(item)
                if is_failure(msg):
                    s["errors"].append(item)
                net.feed(ln)  # a plugin's WARN says what failed
                continue
            if "NCCL version" in msg and (v := _VERSION.search(msg)):
                versions[v.group(1)] += 1
                s["versions_by_host"].setdefault(ln.host or Path(fname).name, v.group(1))
                ev.cite("version", ln)
                continue
            if "cudaDriver" in msg and (d := _DRIVER.search(msg)):
                s["cuda_driver"] = int(d.group(1))
            if " via " in msg and (tr := _TRANSPORT.search(msg)):  # most lines of a log: first
                label, netname, gdr = transport_label(tr.group(7))
                transports[label] += 1
                ev.cite("transport:" + label, ln)
                if netname is not None:
                    net_gdr.append(gdr)
                continue
            if comms.feed(ln) or net.feed(ln):
                continue
            if "Channel" in msg and (rg := _RING.search(msg)):
                s["rings"].setdefault(int(rg.group(1)), [int(x) for x in rg.group(3).split()])
                continue
            if "Trees" in msg and _TREES.search(msg):
                s["trees"] += 1
                continue
            if "coll channels" in msg and (ch := _CHANNELS.search(msg)):
                s["channels"] = {"coll": int(ch.group(1)), "collnet": int(ch.group(2) or 0),
                                 "nvls": int(ch.group(3) or 0), "p2p": int(ch.group(4))}
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
    nnodes = comms.nnodes_seen
    s["nodes"] = max([len(hosts)] + nnodes) if (hosts or nnodes) else None
    s["local_ranks"] = max(comms.local_ranks_seen) if comms.local_ranks_seen else None
    groups, init = comms.finish()
    s["comms"] = [c.to_json() for c in groups]
    s.update(init)
    sizes = [c["nranks"] for c in s["comms"] if c.get("nranks")] + [len(r) for r in s["rings"].values()]
    s["nranks"] = max(sizes) if sizes else None
    s["transports"] = dict(transports)
    s["gdrdma"] = all(net_gdr) if net_gdr else None
    s["network"] = net.networks.most_common(1)[0][0] if net.networks else _network_from_transports(transports)
    s["net_plugin"] = ("; ".join(dict.fromkeys(net.plugins)) if net.plugins
                       else ("none (internal)" if net.no_plugin else None))
    s["ib_devices"] = net.ib_devices
    s["socket_interfaces"] = net.socket_ifaces
    s["bootstrap_interfaces"] = net.bootstrap
    s["env"] = net.env_values()
    plugin = net.plugin_summary(s["network"])
    plugin["gdr_off_on_capable"] = net.ofi.get("gdr_off_on_capable")
    s["plugin"] = plugin
    s["ofi_provider"] = plugin["provider"]
    s["nics"] = plugin["nics"]
    s["nvls"]["comms"] = net.nvls_comms
    s["nvls"]["available"] = any(net.nvls_avail) if net.nvls_avail else (True if net.nvls_comms else None)
    if s["channels"]:
        s["nvls"]["channels"] = s["channels"]["nvls"]
    s["rings"] = {str(k): v for k, v in sorted(s["rings"].items())}
    s["timeouts"] = sorted(timeouts.values(), key=lambda t: (t.get("rank") is None, t.get("rank") or 0))
    s["error_codes"] = dict(unwind_codes)
    quotes = dict(ev.quotes)
    for topic, lines in net.evidence.items():
        quotes[topic] = [ln.quote() for ln in lines]
    s["evidence"] = quotes
    s["hardware"] = {"log_hints": {"nccl_tests_gpus": sorted(set(net.gpus.values())),
                                   "platform": plugin["platform"], "nvlink": net.nvlink_hint,
                                   "nvswitch": net.nvswitch_hint}}
    return refit(s, devices)


def _context_line(s: dict[str, Any], ln: LogLine, ev: _Evidence) -> None:
    """Facts the diagnoses compare across hosts: interfaces (old wording) and the network plugin per host."""
    msg = ln.msg
    if "Using interface" in msg and (m := _OLD_IFACE.search(msg)):
        if m.group(1) not in s["interfaces_seen"]:
            s["interfaces_seen"].append(m.group(1))
    if "lugin" in msg and ln.host and (m := _PLUGIN_HOST.search(msg)):
        loaded = next((g for g in m.groups() if g), None)
        if loaded is not None and loaded.strip() in ("IB", "Socket"):
            return  # NCCL >= 2.27 loads its own transports as plugins
        name = "no external plugin" if loaded is None else "an external plugin (libnccl-net)"
        if ln.host not in s["plugin_by_host"] or s["plugin_by_host"][ln.host] == "no external plugin":
            s["plugin_by_host"][ln.host] = name
            ev.cite("plugin_host", ln)


def refit(s: dict[str, Any], devices: Sequence[str] = ()) -> dict[str, Any]:
    """Work out the hardware again with the traces' GPU names, and diagnose again (both read only
    the summary, so a report can call this once its traces are read)."""
    hints = (s.get("hardware") or {}).get("log_hints") or {}
    hw = platform.hardware(devices, hints.get("nccl_tests_gpus") or [], hints.get("platform"),
                           nvls_available=(s.get("nvls") or {}).get("available"),
                           nvlink_hint=bool(hints.get("nvlink")), nvswitch_hint=bool(hints.get("nvswitch")))
    hw["log_hints"] = hints
    s["hardware"] = hw
    if s.get("inspector"):
        with_peaks(s["inspector"], hw["gpu"], s.get("plugin"), s.get("network"))
    s["diagnoses"] = diagnose(s)
    return s


def load(paths: Sequence[str | Path], run_dir: str | Path | None = None,
         devices: Sequence[str] = ()) -> tuple[dict[str, Any] | None, list[Path]]:
    """Everything NCCL recorded that the user pointed at: the NCCL logs and the NCCL Inspector files
    (named, under the folders given, or in the run folder), as one summary (Inspector under
    ``inspector``), and the files it used (so they are not read as traces); (None, []) without any."""
    logs = nccl_logs_under(paths, run_dir)
    where = list(paths) + ([run_dir] if run_dir is not None else [])
    ins_files = [f for f in inspector_files_under(where) if f not in logs]
    if not logs and not ins_files:
        return None, []
    s = parse_nccl_logs(logs, devices) if logs else empty_summary()
    if ins_files:
        s["inspector"] = read_inspector(ins_files)
    return refit(s, devices), logs + ins_files


def _network_from_transports(transports: Counter[str]) -> str | None:
    nets = [k.split("/", 1)[1] for k in transports if k.startswith("NET/")]
    return Counter(nets).most_common(1)[0][0] if nets else None
