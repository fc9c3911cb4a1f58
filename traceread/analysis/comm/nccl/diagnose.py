"""Diagnoses from the NCCL summary: what is wrong, why (from the log first), what to change, and the
log lines each one rests on.

Every rule reads only the summary document (``report["nccl"]``), so the report can diagnose again
once the traces have named the GPUs (:func:`traceread.analysis.comm.nccl.refit`). A diagnosis is
``{"id", "severity", "message", "evidence", "suggestion"}``: ``severity`` is ``error`` (the job is
broken or badly slowed), ``warning`` (a likely loss), or ``info`` (a fact worth knowing that costs
nothing by itself; an ``info`` diagnosis never becomes a finding, so never the ANSWER). ``evidence``
quotes the log lines (``file:line: text``). Causes are taken from the log before generic advice: an
environment setting NCCL printed, what the network plugin said, what the GPUs are.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from traceread.analysis.comm.nccl.inspector import LOW_BW_SHARE, MIN_BW_BYTES
from traceread.analysis.comm.nccl.signatures import bad_interfaces, diagnose_problems
from traceread.analysis.comm.nccl.signatures import ifname_advice as ifname_advice

Diagnosis = dict[str, Any]
SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}

#: Communicator init slower than this is diagnosed (a healthy init of 8-1000 ranks takes ~1-5 s).
SLOW_INIT_S = 10.0
#: What each ``Init timings`` phase does in NCCL's init.cc, and what usually makes it slow.
PHASE_ADVICE = {
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
_FAIL_WORDS = re.compile(r"fail|error|closed|abort|refused|reset|timeout|timed out|retcode|status=\d+", re.I)


def is_failure(message: str) -> bool:
    """Whether a WARN line reports a failure (it then also counts as an error)."""
    return bool(_FAIL_WORDS.search(message))


def _d(id_: str, severity: str, message: str, evidence: Sequence[str] = (), suggestion: str | None = None) -> Diagnosis:
    d: Diagnosis = {"id": id_, "severity": severity, "message": message, "evidence": list(evidence)[:6]}
    if suggestion:
        d["suggestion"] = suggestion
    return d


def _ev(s: dict[str, Any], *topics: str) -> list[str]:
    ev: dict[str, list[str]] = s.get("evidence") or {}
    out: list[str] = []
    for t in topics:
        for q in ev.get(t) or []:
            if q not in out:
                out.append(q)
    return out


def _env_ev(s: dict[str, Any], *names: str) -> list[str]:
    return _ev(s, *(f"env:{n}" for n in names))


def _transport_ev(s: dict[str, Any], prefix: str) -> list[str]:
    return _ev(s, *(t for t in (s.get("evidence") or {}) if t.startswith("transport:" + prefix)))[:2]


def _nccl_before(s: dict[str, Any], version: tuple[int, int]) -> bool | None:
    """Whether the log's NCCL is older than ``version`` (None when no version line was read)."""
    m = re.match(r"(\d+)\.(\d+)", str(s.get("version") or ""))
    return None if m is None else (int(m.group(1)), int(m.group(2))) < version


def _multi_node(s: dict[str, Any]) -> bool:
    return (s.get("nodes") or 1) > 1 or any(k.startswith("NET/") for k in s.get("transports") or {})


def _socket_used(s: dict[str, Any]) -> bool:
    return "NET/Socket" in (s.get("transports") or {}) or (s.get("network") or "").lower() == "socket"


def _plugin(s: dict[str, Any]) -> dict[str, Any]:
    return s.get("plugin") or {}


def _plugin_label(p: dict[str, Any]) -> str:
    if p.get("version"):
        return str(p["version"])
    if p.get("kind") == "ofi":
        return "aws-ofi-nccl"
    return str(p.get("name") or "the network plugin")


# ---- network ------------------------------------------------------------------------------------

def net_plugin_failed(s: dict[str, Any]) -> list[Diagnosis]:
    p = _plugin(s)
    if not p.get("failed"):
        return []
    fell = s.get("network")
    msg = f"the network plugin ({_plugin_label(p)}) failed to initialise"
    if fell and fell.lower() in ("socket", "ib"):
        msg += f", so NCCL fell back to its internal {fell} transport"
    ofi = p.get("kind") == "ofi"
    sugg = ("Run `fi_info -p efa` on the node: no output means the EFA device is not visible to the job (EFA "
            "installer, security group, container without /dev/infiniband); the plugin's WARN lines name the "
            "step that failed (e.g. an old libfabric: aws-ofi-nccl needs >= 1.22 for EFA)." if ofi else
            "Read the plugin's WARN lines: a missing device, a library version mismatch or a wrong "
            "NCCL_NET_PLUGIN name stops it from loading.")
    sev = "error" if _multi_node(s) else "warning"  # on one node the network carries no collective
    return [_d("net_plugin_failed", sev, msg, _ev(s, "ofi_failed", "plugin_failed", "ofi_warn") + _ev(s, "network:Socket"),
               sugg)]


def socket_fallback(s: dict[str, Any]) -> list[Diagnosis]:
    if not (_socket_used(s) and _multi_node(s)):
        return []
    why = ""
    if _plugin(s).get("failed"):
        why = f" because the network plugin ({_plugin_label(_plugin(s))}) failed to initialise"
    elif s.get("net_plugin") == "none (internal)":
        why = " because no IB/EFA network plugin was found and NET/IB found no device"
    msg = ("inter-node traffic fell back to TCP sockets (NET/Socket)" + why + ": expect 10-100x lower bandwidth "
           "than InfiniBand/EFA")
    sugg = ("Make the IB/EFA devices visible to the job (NCCL_IB_HCA, container --device /dev/infiniband and "
            "--cap-add IPC_LOCK, the EFA/OFED drivers) and check that the network plugin loads.")
    bad = bad_interfaces(s)
    if bad:
        msg += (f"; the socket interfaces include {', '.join(bad[:4])}, which other hosts cannot reach (container "
                "bridge, veth, loopback or link-local)")
        sugg = (f"First make the sockets usable: {ifname_advice(s)}, so NCCL stops using the bridge/virtual "
                "interfaces. Then, for bandwidth, " + sugg[0].lower() + sugg[1:])
    ev = _ev(s, "network:Socket") + _transport_ev(s, "NET/Socket") + _ev(s, "socket_using")
    return [_d("socket_fallback", "error", msg, ev, sugg)]


def net_plugin_missing(s: dict[str, Any]) -> list[Diagnosis]:
    if not (_socket_used(s) and _multi_node(s) and (s.get("net_plugin") == "none (internal)" or _ev(s, "ib_nodev"))):
        return []
    if _plugin(s).get("failed"):
        return []  # the plugin was there and failed: net_plugin_failed says so
    return [_d("net_plugin_missing", "warning",
               "no IB device and no IB/EFA network plugin was loaded (libnccl-net.so not found), so NCCL could only "
               "use sockets", _ev(s, "no_plugin", "ib_nodev"),
               "Install the network plugin your fabric needs (aws-ofi-nccl for EFA, the HPC-X/nccl-rdma-sharp plugin "
               "or NCCL's built-in IB for InfiniBand) where the job's LD_LIBRARY_PATH finds libnccl-net.so.")]


def ib_not_found(s: dict[str, Any]) -> list[Diagnosis]:
    if not _ev(s, "ib_nodev") or _socket_used(s) or _plugin(s).get("kind") == "ofi":
        return []
    return [_d("ib_not_found", "warning", "NET/IB found no InfiniBand device", _ev(s, "ib_nodev"))]


def no_gdrdma(s: dict[str, Any]) -> list[Diagnosis]:
    """Network transfers without GPUDirect RDMA, with the cause the log gives."""
    p = _plugin(s)
    transports: dict[str, int] = s.get("transports") or {}
    net_links = sorted(k for k in transports if k.startswith("NET/") and k != "NET/Socket")
    plugin_says_no = p.get("gdr") is False and p.get("kind") == "ofi"  # aws-ofi-nccl's own words
    hca_off = bool(_ev(s, "gdr_hca_disabled")) and p.get("kind") != "ofi"
    if not plugin_says_no and not (net_links and s.get("gdrdma") is False) and not hca_off:
        return []
    where = f"network transfers ({', '.join(net_links)})" if net_links else "network transfers"
    staged = "data is staged through host memory"
    if plugin_says_no and p.get("gdr_off_on_capable"):
        return [_d("no_gdrdma", "error",
                   f"{where} do not use GPUDirect RDMA although this instance type supports it: the plugin "
                   f"({_plugin_label(p)}) says GDR is disabled on {p['gdr_off_on_capable']}; {staged}",
                   _ev(s, "ofi_no_gdr") + _transport_ev(s, "NET/"),
                   "Find what turned it off in the job's environment (FI_EFA_USE_DEVICE_RDMA=0, an old EFA driver or "
                   "libfabric) and remove it.")]
    if plugin_says_no:
        simple = "; the plugin also forces NCCL_PROTO=simple" if p.get("forced_simple") else ""
        provider = f" {p['provider']}" if p.get("provider") else ""
        return [_d("no_gdrdma", "warning",
                   f"{where} do not use GPUDirect RDMA: the network plugin ({_plugin_label(p)}) says the{provider} "
                   f"provider does not support it here, so {staged}{simple}. Loading nvidia-peermem or changing "
                   "NCCL_NET_GDR_LEVEL cannot change that: it is what this instance type and provider offer",
                   _ev(s, "ofi_no_gdr", "ofi_provider") + _transport_ev(s, "NET/"),
                   "Expect inter-node bandwidth below the NIC's line rate and the Simple protocol's latency; GPUDirect "
                   "RDMA over EFA needs an instance type that supports it (p4d, p5 and newer).")]
    distance = _ev(s, "gdr_distance_disabled")
    env = _env_ev(s, "NCCL_NET_GDR_LEVEL", "NCCL_NET_GDR_READ")
    if distance:
        level = (s.get("env") or {}).get("NCCL_NET_GDR_LEVEL")
        how = f"NCCL_NET_GDR_LEVEL={level} (set by environment)" if level else "NCCL's default NCCL_NET_GDR_LEVEL"
        return [_d("no_gdrdma", "warning",
                   f"{where} do not use GPUDirect RDMA: the GPU and the NIC are further apart on PCIe than {how} "
                   f"allows, so {staged}", distance + env + _transport_ev(s, "NET/"),
                   "Check the GPU-NIC placement (nvidia-smi topo -m); where the platform supports it, allow the "
                   "distance with NCCL_NET_GDR_LEVEL (e.g. PHB or SYS) and compare bandwidth with nccl-tests.")]
    hca = _ev(s, "gdr_hca_disabled")
    if hca:
        old = _nccl_before(s, (2, 23))
        module = ("NCCL <= 2.22 looks only for the old nv_peer_mem module (/sys/kernel/mm/memory_peers/nv_mem): with "
                  "the driver's nvidia-peermem loaded it still finds none (net_ib.cc, fixed in 2.23)")
        if old:
            why = f"{module}; this log's NCCL is {s.get('version')}"
        elif old is None:
            why = ("NCCL found no GPUDirect kernel module: nvidia-peermem is not loaded, or (NCCL <= 2.22) "
                   "only the old nv_peer_mem module is recognised")
        else:
            why = "NCCL found no GPUDirect kernel module (nvidia-peermem not loaded) and no DMA-BUF support"
        return [_d("no_gdrdma", "warning", f"{where} do not use GPUDirect RDMA: {why}; {staged}",
                   hca + _ev(s, "version")[:1] + _transport_ev(s, "NET/"),
                   "Upgrade NCCL to >= 2.23 if it is older (it recognises nvidia-peermem), load nvidia-peermem "
                   "(`modprobe nvidia-peermem`) or use DMA-BUF (Linux >= 5.12, NCCL_DMABUF_ENABLE=1) on every node.")]
    if env:
        return [_d("no_gdrdma", "warning",
                   f"{where} do not use GPUDirect RDMA, with GPUDirect settings changed in the environment; {staged}",
                   env + _transport_ev(s, "NET/"), "Unset the NCCL_NET_GDR_* variables listed and compare.")]
    return [_d("no_gdrdma", "warning",
               f"{where} do not use GPUDirect RDMA: {staged}", _transport_ev(s, "NET/"),
               "Load nvidia-peermem (or use DMA-BUF), and check the PCIe distance between GPU and NIC "
               "(nvidia-smi topo -m) against NCCL_NET_GDR_LEVEL.")]


# ---- inside a node ------------------------------------------------------------------------------

def shm_instead_of_p2p(s: dict[str, Any]) -> list[Diagnosis]:
    """GPUs of one node talking through host memory: the cause from the log before generic causes."""
    transports: dict[str, int] = s.get("transports") or {}
    shm = transports.get("SHM", 0)
    if not shm or any(k.startswith("P2P") for k in transports):
        return []
    env: dict[str, str] = s.get("env") or {}
    hw: dict[str, Any] = s.get("hardware") or {}
    gpu = hw.get("gpu")
    base = (f"GPUs of one node exchange data through host shared memory (SHM, {shm} channel connections) instead "
            "of direct GPU-to-GPU copies (P2P)")
    shm_ev = _transport_ev(s, "SHM")
    disable = env.get("NCCL_P2P_DISABLE")
    if disable and disable.split(" | ")[0].strip() not in ("0", ""):
        return [_d("shm_instead_of_p2p", "warning", f"{base}: NCCL_P2P_DISABLE={disable} turns P2P off",
                   _env_ev(s, "NCCL_P2P_DISABLE") + shm_ev, "Unset NCCL_P2P_DISABLE unless it works around a known "
                   "P2P fault on this machine.")]
    level = (env.get("NCCL_P2P_LEVEL") or "").split(" | ")[0].strip().upper()
    if level:
        if level in ("LOC", "0"):
            why = f"NCCL_P2P_LEVEL={level} allows no P2P at all"
        elif level in ("NVL", "NVB", "C2C"):
            if hw.get("nvlink") is False:
                why = (f"NCCL_P2P_LEVEL={level} allows P2P only over NVLink, and these GPUs ({gpu}) have no NVLink: "
                       "every pair is joined by PCIe, so NCCL uses SHM")
            else:
                why = (f"NCCL_P2P_LEVEL={level} allows P2P only over NVLink, and these GPU pairs have no NVLink path "
                       "between them")
        else:
            why = f"NCCL_P2P_LEVEL={level} allows P2P only up to that PCIe distance, and these GPUs are further apart"
        return [_d("shm_instead_of_p2p", "warning", f"{base}: {why}", _env_ev(s, "NCCL_P2P_LEVEL") + shm_ev,
                   "Unset NCCL_P2P_LEVEL (or set the distance the GPUs really are apart, e.g. PHB or SYS) and compare "
                   "intra-node bandwidth with nccl-tests.")]
    disabled = _ev(s, "p2p_disabled")
    if disabled:
        return [_d("shm_instead_of_p2p", "warning",
                   f"{base}: NCCL found the GPUs connected but P2P disabled between them (a driver, BIOS or "
                   "virtualisation setting)", disabled + shm_ev,
                   "Check `nvidia-smi topo -p2p r` and the NVLink status (`nvidia-smi nvlink -s`); a VM needs P2P "
                   "passed through.")]
    failed = _ev(s, "p2p_enable_failed")
    if failed:
        return [_d("shm_instead_of_p2p", "warning",
                   f"{base}: CUDA could not enable peer access between the GPUs (PCIe ACS/IOMMU or virtualisation "
                   "blocks it)", failed + shm_ev,
                   "Disable PCIe ACS / set the IOMMU to passthrough on bare metal; in a VM or container, P2P needs "
                   "to be passed through (check `nvidia-smi topo -p2p r`).")]
    if hw.get("nvlink") is False:
        return [_d("shm_instead_of_p2p", "warning",
                   f"{base}: these GPUs ({gpu}) have no NVLink, and NCCL uses PCIe P2P only between GPUs under one "
                   "PCIe switch (NCCL_P2P_LEVEL defaults to PXB); pairs that cross a CPU host bridge go through SHM",
                   shm_ev + _ev(s, "gpu_name"),
                   "Where the platform supports P2P across the host bridge (bare metal, ACS off), NCCL_P2P_LEVEL=SYS "
                   "enables it; measure with nccl-tests, since on some CPUs it is slower than SHM.")]
    return [_d("shm_instead_of_p2p", "warning", base, shm_ev,
               "Check P2P support: `nvidia-smi topo -p2p r`, PCIe ACS/IOMMU settings, containers (--ipc=host), and "
               "NCCL_P2P_DISABLE / NCCL_P2P_LEVEL in the job's environment.")]


def nvls_unavailable(s: dict[str, Any]) -> list[Diagnosis]:
    """Only where NVLS could exist (Hopper or newer on an NVSwitch); elsewhere NCCL's line means nothing."""
    hw: dict[str, Any] = s.get("hardware") or {}
    nvls: dict[str, Any] = s.get("nvls") or {}
    if nvls.get("available") is not False or hw.get("nvls_possible") is not True:
        return []
    env = (s.get("env") or {}).get("NCCL_NVLS_ENABLE")
    why = (f"NCCL_NVLS_ENABLE={env} turns it off" if env and env.strip() == "0" else
           "NVLS needs the CUDA driver's multicast support (driver >= 530 with the fabric manager running)")
    return [_d("nvls_unavailable", "info",
               f"NVLS (NVLink SHARP) is not available although these GPUs ({hw.get('gpu')}) could use it: {why}; "
               "all-reduce inside the node uses rings/trees only",
               _ev(s, "nvls_unavailable") + _env_ev(s, "NCCL_NVLS_ENABLE"))]


def nvml_not_found(s: dict[str, Any]) -> list[Diagnosis]:
    for w in s.get("warnings") or []:
        if "nvmlDeviceGetHandleByPciBusId" in w["message"]:
            return [_d("nvml_not_found", "warning",
                       "NVML cannot see the other GPUs (each rank sees only its own GPU, e.g. CUDA_VISIBLE_DEVICES per "
                       "process): NCCL cannot detect NVLink/P2P topology", [w.get("quote") or w["message"]],
                       "Give every process all the node's GPUs and select one with LOCAL_RANK (torch.cuda.set_device).")]
    return []


# ---- failures and hangs -------------------------------------------------------------------------

def init_incomplete(s: dict[str, Any]) -> list[Diagnosis]:
    out = []
    for comm in s.get("comms") or []:
        missing = sorted(set(comm["init_started"]) - set(comm["init_complete"]))
        if missing and comm["init_started"] and not comm["init_complete"]:
            out.append(_d("init_incomplete", "warning",
                          f"communicator {comm.get('comm_id') or ''} (nranks {comm.get('nranks')}): ranks "
                          f"{_ranks(missing)} logged Init START but no Init COMPLETE (init hang, or the log ends early)",
                          comm.get("pending_evidence") or []))
    return out


def collective_timeout(s: dict[str, Any]) -> list[Diagnosis]:
    by_seq: dict[tuple[Any, Any, Any], list[int]] = defaultdict(list)
    timeouts = s.get("timeouts") or []
    # a rank whose "Exception … detected by watchdog" line was not pasted has no PG: it timed out in the same
    # collective as the ranks that name one, when exactly one PG has that sequence number and op
    pgs: dict[tuple[Any, Any], set[Any]] = defaultdict(set)
    for t in timeouts:
        if t.get("pg") is not None:
            pgs[(t.get("seq"), t.get("op"))].add(t.get("pg"))
    for t in timeouts:
        pg = t.get("pg")
        known = pgs.get((t.get("seq"), t.get("op"))) or set()
        if pg is None and len(known) == 1:
            pg = next(iter(known))
        by_seq[(pg, t.get("seq"), t.get("op"))].append(t["rank"] if t["rank"] is not None else -1)
    return [_d("collective_timeout", "error",
               f"collective #{seq} ({op or 'unknown op'}) on PG {pg if pg is not None else '?'} timed out on ranks "
               f"{_ranks(sorted(ranks))}; these ranks are victims - the culprit is a rank that never joined it "
               "(see `traceread hang`)", _ev(s, "watchdog"),
               "Run `traceread hang` on the run folder (Flight Recorder dumps name the rank that never joined).")
            for (pg, seq, op), ranks in by_seq.items()]


def flight_recorder_disabled(s: dict[str, Any]) -> list[Diagnosis]:
    if any(m.get("kind") == "flight_recorder_disabled" for m in s.get("torch_messages") or []):
        return [_d("flight_recorder_disabled", "info",
                   "Flight Recorder was disabled: set TORCH_FR_BUFFER_SIZE=20000 to record collectives",
                   _ev(s, "fr_disabled"))]
    return []


# ---- communicator init --------------------------------------------------------------------------

def slow_init(s: dict[str, Any]) -> list[Diagnosis]:
    """The slowest communicator init when it takes >= SLOW_INIT_S: which communicator, which phase
    dominates, on which rank, and whether the job's other communicators were fast (a one-off wait)."""
    worst = s.get("init_slowest")
    if not worst or (worst.get("total_s") or 0.0) < SLOW_INIT_S:
        return []
    comms = s.get("comms") or []
    comm = next((c for c in comms if c.get("index") == worst.get("comm_index")), None)
    total = float(worst["total_s"])
    n = len(comms)
    where = f"communicator {worst['comm_index'] + 1} of {n}" if n > 1 else "the communicator"
    ident = f", commId {worst['comm_id']}" if worst.get("comm_id") else ""
    size = f"{worst.get('nranks') or '?'} ranks"
    if comm and comm.get("nnodes"):
        size += f" on {comm['nnodes']} node(s)"
    msg = f"communicator init took {total:.1f} s on rank {worst['rank']} ({where}{ident}, {size})"
    phases: dict[str, float] = worst.get("phases") or {}
    if phases:
        phase, secs = max(phases.items(), key=lambda kv: kv[1])
        msg += f"; {phase} {secs:.1f} s = {100 * secs / total:.0f}% of it: {PHASE_ADVICE.get(phase, phase)}"
        least = (comm or {}).get("init") or {}
        late = least.get("bootstrap_least")
        if phase == "bootstrap" and late and late.get("rank") is not None:
            msg += (f". Rank {late['rank']} waited least in bootstrap ({late['bootstrap_s']:.1f} s): the others "
                    "waited for it")
    others = [c for c in comms if c.get("index") != worst.get("comm_index") and (c.get("init") or {}).get("slowest_s")
              is not None]
    if others:
        rest = max(float(c["init"]["slowest_s"]) for c in others)
        if rest < SLOW_INIT_S / 10:
            msg += (f". The other {len(others)} communicator(s) took at most {rest:.2f} s: the cost is paid once, "
                    "at start-up, not by NCCL's setup")
    ev = list(((comm or {}).get("init") or {}).get("evidence") or [])
    return [_d("slow_init", "warning", msg, ev, _slow_init_suggestion(phases))]


def _slow_init_suggestion(phases: dict[str, float]) -> str:
    if not phases:
        return "Set NCCL_DEBUG=INFO on NCCL >= 2.22 to see which init phase takes the time (Init timings)."
    phase = max(phases.items(), key=lambda kv: kv[1])[0]
    return {
        "bootstrap": "Find the rank that arrives last at init (named above) and why it starts late: imports, data "
                     "loading or a container pull before init_process_group.",
        "topo": "Give NCCL an NCCL_TOPO_FILE for this machine type, or fix /sys visibility in the container.",
        "graphs": "Save the search once with NCCL_GRAPH_DUMP_FILE and reuse it with NCCL_GRAPH_FILE.",
        "connections": "Use NCCL_RUNTIME_CONNECT=1 (lazy connections) or fewer channels (NCCL_MAX_NCHANNELS).",
        "kernels": "Set CUDA_MODULE_LOADING=LAZY.",
    }.get(phase, "Compare the phases across ranks: the slow one points at the node to look at.")


def slow_init_total(s: dict[str, Any]) -> list[Diagnosis]:
    """Many communicators that are each quick but add up (every split pays its own init)."""
    totals: dict[str, float] = s.get("init_total_s") or {}
    worst = s.get("init_slowest") or {}
    if not totals or (worst.get("total_s") or 0.0) >= SLOW_INIT_S:
        return []
    rank, total = max(totals.items(), key=lambda kv: kv[1])
    n = sum(1 for c in s.get("comms") or [] if (c.get("init") or {}).get("ranks_timed"))
    if total < SLOW_INIT_S or n < 2:
        return []
    slowest: dict[str, Any] = next((c for c in s.get("comms") or [] if c.get("index") == worst.get("comm_index")), {})
    return [_d("slow_init_total", "warning",
               f"communicator inits add up to {total:.1f} s on rank {rank} over {n} communicators (the slowest "
               f"{worst.get('total_s') or 0:.1f} s): every new process group pays its own init",
               list((slowest.get("init") or {}).get("evidence") or []),
               "Create fewer process groups, create them once at start-up, or split from an existing one "
               "(ncclCommSplit / torch new_group(use_local_synchronization=True)).")]


def _ranks(ranks: Sequence[int]) -> str:
    return ", ".join(str(r) for r in ranks)


# ---- NCCL Inspector -----------------------------------------------------------------------------

def _size(n: int | None) -> str:
    if not n:
        return "?"
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f:
            return f"{n / f:.0f} {unit}"
    return f"{n} B"


def _comm_label(c: dict[str, Any]) -> str:
    name = f" ({c['comm_name']})" if c.get("comm_name") and c["comm_name"] != "unknown" else ""
    return f"communicator {c.get('comm_id')}{name}, {c.get('nranks')} ranks on {c.get('nnodes') or '?'} node(s)"


def inspector_late_rank(s: dict[str, Any]) -> list[Diagnosis]:
    out = []
    for c in (s.get("inspector") or {}).get("comms") or []:
        for r in c.get("late_ranks") or []:
            if not r.get("slow"):
                continue
            where = ", ".join(str(x) for x in (r.get("host"), r.get("pid") and f"pid {r['pid']}") if x)
            out.append(_d("inspector_late_rank", "warning",
                          f"rank {r['rank']}{f' ({where})' if where else ''} arrived last at {r['times_last']} of "
                          f"{r['of']} collectives on {_comm_label(c)}: the others waited {r['wait_caused_us'] / 1e3:.1f} "
                          f"ms for it ({100 * r['wait_share']:.0f}% of the communicator's waiting)",
                          [f"NCCL Inspector: rank {r['rank']} had the shortest coll_exec_time_us (it waited for nobody) "
                           f"in {r['times_last']} of {r['of']} collectives"],
                          "Look at what that rank does before its collectives (data loading, host work, a slower GPU "
                          "or node); `traceread report` on its profiler trace shows the step."))
    return out


def inspector_low_busbw(s: dict[str, Any]) -> list[Diagnosis]:
    out = []
    for c in (s.get("inspector") or {}).get("comms") or []:
        low = [k for k in c.get("collectives") or [] if k.get("pct_of_peak") is not None
               and (k.get("msg_bytes") or 0) >= MIN_BW_BYTES and k["pct_of_peak"] < 100 * LOW_BW_SHARE]
        if not low:
            continue
        k = min(low, key=lambda x: x["pct_of_peak"])
        out.append(_d("inspector_low_busbw", "warning",
                      f"{k['coll']} of {_size(k['msg_bytes'])} on {_comm_label(c)}: median bus bandwidth "
                      f"{k['median_busbw_gbs']:.1f} GB/s = {k['pct_of_peak']:.0f}% of the link's peak "
                      f"({c['peak_link']}, {c['peak_gbps']:.0f} GB/s per direction)",
                      [f"NCCL Inspector: {k['count']} {k['coll']} records of {k['msg_bytes']} bytes, median "
                       f"coll_busbw_gbs {k['median_busbw_gbs']:.2f} (the last-arriving rank's)"],
                      "Compare with nccl-tests on the same nodes; read the NCCL log's transports (SHM instead of "
                      "P2P, sockets, no GPUDirect RDMA) for the cause."))
    return out


def inspector_slow_collectives(s: dict[str, Any]) -> list[Diagnosis]:
    ins = s.get("inspector") or {}
    slow = ins.get("slow_collectives") or []
    if not slow:
        return []
    w = slow[0]
    return [_d("inspector_slow_collectives", "warning",
               f"{ins.get('slow_collectives_total', len(slow))} collective(s) took more than 2x the usual time for "
               f"their size; the worst: {w['coll']} #{w['coll_sn']} of {_size(w['msg_bytes'])} on communicator "
               f"{w['comm_id']} took {w['transfer_us'] / 1e3:.1f} ms against a median of "
               f"{w['median_transfer_us'] / 1e3:.1f} ms on every rank (a network or link slowdown, not a late rank)",
               [f"NCCL Inspector: {x['coll']} coll_sn {x['coll_sn']}: shortest rank time {x['transfer_us']:.0f} us vs "
                f"median {x['median_transfer_us']:.0f} us" for x in slow[:3]],
               "Check the fabric at those times (link flaps, congestion from other jobs); if it repeats on the same "
               "nodes, test them with nccl-tests.")]


RULES: tuple[Callable[[dict[str, Any]], list[Diagnosis]], ...] = (
    net_plugin_failed, socket_fallback, net_plugin_missing, ib_not_found, no_gdrdma, shm_instead_of_p2p,
    nvls_unavailable, init_incomplete, nvml_not_found, collective_timeout, slow_init, slow_init_total,
    flight_recorder_disabled, inspector_late_rank, inspector_low_busbw, inspector_slow_collectives,
)


#: The cause family (docs/hang-and-nccl.md) of each rule's diagnosis; the catalogue's carry their own.
FAMILY = {
    "net_plugin_failed": "ofi_efa", "socket_fallback": "interface", "net_plugin_missing": "interface",
    "ib_not_found": "ib_fabric", "no_gdrdma": "gdr", "shm_instead_of_p2p": "p2p_acs", "nvls_unavailable": "nvls",
    "init_incomplete": "timeout", "nvml_not_found": "topology", "collective_timeout": "timeout",
    "slow_init": "slow_init", "slow_init_total": "slow_init", "flight_recorder_disabled": "timeout",
}


def diagnose(s: dict[str, Any]) -> list[Diagnosis]:
    """Every rule on the summary, then the failure catalogue on its problem lines; duplicates dropped;
    errors first (the catalogue's, which name the first error line, before the others), then warnings,
    then info."""
    out: list[Diagnosis] = []
    seen: set[tuple[str, str]] = set()
    for rule in RULES:
        for d in rule(s):
            key = (d["id"], d["message"])
            if key not in seen:
                seen.add(key)
                if d["id"] in FAMILY:
                    d.setdefault("family", FAMILY[d["id"]])
                out.append(d)
    if _plugin(s).get("kind") == "ofi" or _plugin(s).get("failed"):
        for d in out:
            if d["id"] == "socket_fallback" and _plugin(s).get("failed"):
                d["family"] = "ofi_efa"
    catalogue = diagnose_problems(s, {d["id"] for d in out})
    out = catalogue + out
    out.sort(key=lambda d: SEVERITY_ORDER.get(d["severity"], 3))
    return out
