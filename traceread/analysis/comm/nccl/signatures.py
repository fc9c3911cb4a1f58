"""The catalogue of NCCL failures: which log lines mean which known cause, and what fixes it.

Each :class:`Signature` is data: the problem lines it matches (a regex over what the line says, from
the message formats in NCCL's and aws-ofi-nccl's sources), the cause family, the subsystem, the cause
and the fix in plain words, and a confidence. :func:`diagnose_problems` runs the catalogue over the
summary's problem lines (:mod:`.problems`) in log order and turns the first match of each signature
into a diagnosis that cites the lines; the whole log's context (interfaces, versions per host, the
network, the environment NCCL printed) sharpens the words. An error that no signature explains is
still named — its first line, the subsystem it came from, what the error code means and the usual
causes — so a log with an error line never reads as healthy. docs/hang-and-nccl.md lists the catalogue.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from traceread.analysis.comm.nccl.problems import RESULT_CODES, USUAL_CAUSES, subsystem

Diagnosis = dict[str, Any]

#: Interfaces that exist on one host only and route nowhere else: container bridges and veth pairs,
#: libvirt/CNI bridges, tunnels, loopback. NCCL's default (``^docker,lo``) skips only docker* and lo.
VIRTUAL_IFACE = re.compile(r"^(?:docker\d*|br-[\w]+|veth\w*|virbr\d*|cni\d*|flannel[.\w]*|cali\w+|tun\d*|tap\w*|lo|"
                           r"vxlan[.\w]*|kube-\w+|weave|podman\d*|lxcbr\d*|lxdbr\d*|tailscale\d*|wg\d*|zt\w+|"
                           r"genev_sys\w*|ovs-\w+|nodelocaldns)$")
UNROUTABLE_ADDR = re.compile(r"^(?:fe80:|169\.254\.|127\.|::1$)")
#: ibv_wc_status (libibverbs verbs.h): the number NCCL prints after "with error"/"status=".
IBV_WC_STATUS = {
    1: "IBV_WC_LOC_LEN_ERR", 2: "IBV_WC_LOC_QP_OP_ERR", 3: "IBV_WC_LOC_EEC_OP_ERR", 4: "IBV_WC_LOC_PROT_ERR",
    5: "IBV_WC_WR_FLUSH_ERR", 6: "IBV_WC_MW_BIND_ERR", 7: "IBV_WC_BAD_RESP_ERR", 8: "IBV_WC_LOC_ACCESS_ERR",
    9: "IBV_WC_REM_INV_REQ_ERR", 10: "IBV_WC_REM_ACCESS_ERR", 11: "IBV_WC_REM_OP_ERR", 12: "IBV_WC_RETRY_EXC_ERR",
    13: "IBV_WC_RNR_RETRY_EXC_ERR", 14: "IBV_WC_LOC_RDD_VIOL_ERR", 15: "IBV_WC_REM_INV_RD_REQ_ERR",
    16: "IBV_WC_REM_ABORT_ERR", 17: "IBV_WC_INV_EECN_ERR", 18: "IBV_WC_INV_EEC_STATE_ERR", 19: "IBV_WC_FATAL_ERR",
    20: "IBV_WC_RESP_TIMEOUT_ERR", 21: "IBV_WC_GENERAL_ERR",
}

#: Families the catalogue names (docs/hang-and-nccl.md): the corpus scores against these.
FAMILIES = ("interface", "shm", "p2p_acs", "gdr", "ib_fabric", "gid_roce", "ofi_efa", "nvls", "nccl_too_old",
            "version_mismatch", "topology", "timeout", "peer_died", "gpu_oom", "cuda_driver", "cuda_fault",
            "rank_layout", "aborted")


@dataclass(frozen=True)
class Signature:
    """One known cause: the lines that show it and what to do."""

    id: str
    family: str
    subsystem: str
    pattern: re.Pattern[str]
    cause: str
    fix: str
    confidence: str = "high"  # high | medium | low
    severity: str = "error"  # info: a line NCCL prints on healthy machines too
    source: str = ""  # where NCCL/the plugin prints it
    kinds: tuple[str, ...] = ("warn", "test", "torch", "return")
    #: the source files whose errors are this cause whatever the message says (a CUDA error in nvls.cc)
    src_pattern: re.Pattern[str] | None = None
    #: older diagnose rules that already say this (the catalogue then adds nothing)
    said_by: tuple[str, ...] = ()
    #: a consequence of an earlier failure (proxy/flush errors): never the headline when another matched
    secondary: bool = False
    refine: Callable[[re.Match[str], dict[str, Any], Signature], dict[str, Any]] | None = field(
        default=None, compare=False)


def _r(p: str) -> re.Pattern[str]:
    return re.compile(p, re.I)


# ---- context the refinements read -----------------------------------------------------------------

def interfaces(s: dict[str, Any]) -> list[str]:
    """Every ``name:address`` NCCL said it uses (sockets, bootstrap, IB out-of-band), in order."""
    out: list[str] = []
    for x in list(s.get("socket_interfaces") or []) + list(s.get("bootstrap_interfaces") or []) + \
            list(s.get("interfaces_seen") or []):
        x = re.sub(r"^\[\d+\]|<\d+>$", "", str(x))
        if x not in out:
            out.append(x)
    return out


def split_iface(x: str) -> tuple[str, str]:
    name, _, addr = x.partition(":")
    return name, addr


def bad_interfaces(s: dict[str, Any]) -> list[str]:
    """Interfaces in NCCL's list that other hosts cannot reach: bridges, veths, loopback, link-local."""
    return [x for x in interfaces(s)
            if VIRTUAL_IFACE.match(split_iface(x)[0]) or UNROUTABLE_ADDR.match(split_iface(x)[1] or "x")]


def good_interfaces(s: dict[str, Any]) -> list[str]:
    bad = set(bad_interfaces(s))
    return [x for x in interfaces(s) if x not in bad]


def ifname_advice(s: dict[str, Any]) -> str:
    good = sorted({split_iface(x)[0] for x in good_interfaces(s)})
    env = (s.get("env") or {}).get("NCCL_SOCKET_IFNAME")
    pick = f"NCCL_SOCKET_IFNAME={','.join(good)}" if good else "NCCL_SOCKET_IFNAME=<the interface the nodes route to>"
    was = f" (it is set to {env} now)" if env else ""
    return f"set {pick}{was} on every node"


def _iface_note(s: dict[str, Any]) -> str:
    bad = bad_interfaces(s)
    if not bad:
        return ""
    return (f"; NCCL's interface list holds {', '.join(bad[:4])}, which route nowhere outside this host (container "
            "bridge, veth, loopback or link-local address)")


# ---- refinements: the whole log sharpens the words ------------------------------------------------

def _connect(m: re.Match[str], s: dict[str, Any], sig: Signature) -> dict[str, Any]:
    note = _iface_note(s)
    target = re.search(r"(?:Connect to|connect to|Call to connect .*?to) \[?([0-9A-Fa-f.:]+)(?:%(\w+))?", m.string)
    if target and (UNROUTABLE_ADDR.match(target.group(1)) or VIRTUAL_IFACE.match(target.group(2) or "-")):
        via = f" through {target.group(2)}" if target.group(2) else ""
        note += (f"; the address it dialled, {target.group(1)}{via}, is link-local or loopback and routes nowhere "
                 "outside its host")
    out: dict[str, Any] = {}
    if note:
        out["cause"] = ("NCCL could not open a TCP connection to a peer because it used an interface the other "
                        "host cannot reach" + note)
        out["fix"] = (f"Restrict NCCL to the routable interface: {ifname_advice(s)} (and NCCL_SOCKET_IFNAME "
                      "excludes the bridges NCCL's default ^docker,lo does not).")
        out["confidence"] = "high"
    return out


def _no_interface(m: re.Match[str], s: dict[str, Any], sig: Signature) -> dict[str, Any]:
    env = (s.get("env") or {}).get("NCCL_SOCKET_IFNAME") or (s.get("env") or {}).get("NCCL_OOB_NET_IFNAME")
    if not env:
        return {}
    return {"cause": (f"NCCL_SOCKET_IFNAME={env} matches no interface with an address on this host: a typo, an "
                      "interface name that differs between hosts, or the exact-match prefix '=' that this NCCL "
                      "does not honour"),
            "fix": ("Check `ip -br addr` on every host; use a prefix list that matches each host's name (e.g. "
                    "NCCL_SOCKET_IFNAME=eth,en,bond) or set it per node in /etc/nccl.conf; drop a leading '='.")}


def _shm(m: re.Match[str], s: dict[str, Any], sig: Signature) -> dict[str, Any]:
    text = m.string
    if "attaching" in text or "No such file" in text:
        return {"cause": ("a process could not open the shared-memory segment its peer created in /dev/shm: the "
                          "processes do not share /dev/shm (separate containers or IPC namespaces), the segment was "
                          "removed while in use (systemd RemoveIPC, a /dev/shm cleaner), or an NCCL bug in this release"),
                "fix": ("Run every process of a node in one IPC namespace (--ipc=host, or one pod), keep RemoveIPC=no; "
                        "if that holds, try another NCCL release. NCCL_SHM_DISABLE=1 avoids it at a bandwidth cost."),
                "confidence": "medium"}
    size = re.search(r"\(size (\d+)\)|to (\d+) bytes", text)
    asked = f" (this segment: {int(size.group(1) or size.group(2)) / 2**20:.1f} MiB)" if size else ""
    return {"cause": ("NCCL could not create its shared-memory segment in /dev/shm: it is full or too small; in a "
                      f"container /dev/shm is 64 MB by default (Docker), less than NCCL's segments need{asked}")}


def _ib_completion(m: re.Match[str], s: dict[str, Any], sig: Signature) -> dict[str, Any]:
    st = m.group("st") or ""
    num = st if st.isdigit() else (re.search(r"\((\d+)\)", m.string[m.end("st"):m.end("st") + 8]) or [None, ""])[1]
    status = int(num) if num else None
    name = IBV_WC_STATUS.get(status or -1, st or "?")
    vm = re.search(r"vendor[ _]err(?:or)?[ =]?(\d+)", m.string)
    vendor = f", vendor error {vm.group(1)}" if vm else ""
    roce = _roce(s, m.string)
    if status in (12, 13):
        what = f"status {status} = {name}: the NIC gave up retransmitting to the peer (no ACK){vendor}"
        if roce:
            return {"family": "gid_roce", "cause": (
                f"RoCE {what}. Right after start this usually means the NICs cannot talk RoCE to each other: the "
                "wrong GID index (RoCE v1 vs v2, IPv4 vs link-local GID) or a switch that drops/does not route the "
                "traffic (PFC/ECN, VLAN, MTU)"),
                "fix": ("Let NCCL pick the GID (unset NCCL_IB_GID_INDEX, NCCL >= 2.21 detects it) or set it to the "
                        "RoCE v2 IPv4 entry `show_gids` lists (often 3); check ib_write_bw between the same pair with "
                        "that GID, and the MTU/traffic class on both ends."),
                "confidence": "medium"}
        return {"cause": (f"InfiniBand {what}: a link, cable, port or subnet-manager problem between these two "
                          "nodes (on RoCE: the GID index or switch configuration)"),
                "fix": ("Test the pair with ib_write_bw/ibdiagnet, check the port counters (symbol/link-downed "
                        "errors) and `ibstat`; on RoCE check NCCL_IB_GID_INDEX against `show_gids`. Drain the node "
                        "whose link errors.")}
    if status == 4:
        return {"family": "p2p_acs", "cause": (
            f"status 4 = {name}{vendor}: the NIC was refused access to GPU memory registered for GPUDirect RDMA. "
            "Usually PCIe ACS is enabled on the switches between NIC and GPU (or the IOMMU is on), which redirects the "
            "peer-to-peer traffic GPUDirect RDMA needs"),
            "fix": ("Confirm with NCCL_NET_GDR_LEVEL=LOC (GPUDirect RDMA off: the error should go, bandwidth drops); "
                    "then disable PCIe ACS (BIOS, or setpci on the PLX/Broadcom switches at boot) and set the IOMMU "
                    "off or to passthrough (iommu=pt) on bare metal."), "confidence": "medium"}
    if status == 5:
        return {"cause": f"status 5 = {name}: requests flushed after an earlier error on this queue pair",
                "secondary": True}
    return {"cause": f"InfiniBand/RoCE completion error status {status} = {name}{vendor}"}


def _roce(s: dict[str, Any], text: str) -> bool:
    if "RoCE" in " ".join(s.get("ib_devices") or []) or (s.get("env") or {}).get("NCCL_IB_GID_INDEX"):
        return True
    return bool(re.search(r"Gids?\s*:?\s*:*ffff:|localGid|remoteGid", text))


def _socket_family(m: re.Match[str], s: dict[str, Any], sig: Signature) -> dict[str, Any]:
    fam = int(m.group("fam"))
    if fam in (0,) or fam > 10:
        return {}
    return {"family": "other", "confidence": "low",
            "cause": (f"NCCL's socket transport was handed an address of family {fam} (not IPv4/IPv6): a local "
                      "address reached the network path, seen with P2P and SHM both disabled on one node"),
            "fix": "Do not disable both P2P and SHM on one node (NCCL_P2P_DISABLE / NCCL_SHM_DISABLE)."}


def _peer(m: re.Match[str], s: dict[str, Any], sig: Signature) -> dict[str, Any]:
    peer = m.groupdict().get("peer")
    return {"cause": (f"the connection to {peer} was lost: " if peer else "a connection to a peer was lost: ")
            + sig.cause}


def _p2p(m: re.Match[str], s: dict[str, Any], sig: Signature) -> dict[str, Any]:
    if "peer mapping resources exhausted" in m.string:
        return {"cause": ("CUDA ran out of peer mappings: each GPU supports at most eight peer connections "
                          "(cudaDeviceEnablePeerAccess), so more than 8 GPUs in one process, or other libraries "
                          "enabling peer access too, exhaust them"),
                "fix": ("Use one process per GPU (torchrun) instead of one process driving more than 8 GPUs, or "
                        "NCCL_P2P_DISABLE=1 for that job.")}
    if "shm" in (s.get("_src") or ""):
        return {"cause": ("NCCL's shared-memory transport maps host memory through the CUDA cuMem API, which needs "
                          "P2P access these GPUs do not have (NCCL 2.27 transport/shm.cc)"),
                "fix": ("Set NCCL_CUMEM_HOST_ENABLE=0 (or upgrade NCCL past the release that fixed it); "
                        "`nvidia-smi topo -p2p r` shows which pairs lack P2P.")}
    return {}


# ---- the catalogue ---------------------------------------------------------------------------------

CATALOGUE: tuple[Signature, ...] = (
    # bootstrap / sockets -------------------------------------------------------------------------
    Signature("no_socket_interface", "interface", "bootstrap/socket",
              _r(r"Bootstrap ?: no socket interface found|No usable listening interface found|"
                 r"no device found (?:matching|after excluding)|Socket creation failed\s*:\s*Address family not "
                 r"supported|NET/Socket ?: No interface found|no usable (?:IP )?interface"),
              "NCCL found no IP interface it may use: none matches NCCL_SOCKET_IFNAME, or the container has no "
              "network of its own (only loopback)",
              "Run the container with the host network (docker --net=host / hostNetwork) or set NCCL_SOCKET_IFNAME "
              "to an interface that exists and has an address on every node (`ip -br addr`).",
              source="src/misc/socket.cc, src/bootstrap.cc", refine=_no_interface),
    Signature("socket_address_family", "version_mismatch", "bootstrap/socket",
              _r(r"ncclSocketInit: connecting to address .*with family (?P<fam>\d+) is neither"),
              "a peer sent a connection address NCCL cannot read (garbage address family): the ranks exchange "
              "structures whose layout differs, which is what different NCCL versions on different hosts do",
              "Make every host load the same libnccl (torch.cuda.nccl.version(), `pip list | grep nccl`, "
              "LD_LIBRARY_PATH and /usr/local/nccl*); a system NCCL may shadow the wheel's.",
              confidence="medium", source="src/misc/socket.cc (ncclSocketInit)", refine=_socket_family),
    # shared memory ---------------------------------------------------------------------------------
    Signature("shm_full", "shm", "shared memory",
              _r(r"posix_fallocate failed|No space left on device|Error while creating shared memory segment|"
                 r"failed to extend /dev/shm|Error while attaching to shared memory segment|shm_open|"
                 r"Unable to allocate shared memory"),
              "NCCL could not create its shared-memory segment in /dev/shm: in a container /dev/shm is 64 MB by "
              "default (Docker), far less than NCCL needs for 8 GPUs",
              "Give the container more /dev/shm: docker --shm-size=16g or --ipc=host; in Kubernetes mount an "
              "emptyDir with medium: Memory at /dev/shm. NCCL_SHM_DISABLE=1 avoids it at a bandwidth cost.",
              source="src/misc/shmutils.cc (older: src/include/shm.h)", refine=_shm),
    # P2P / CUMEM / ACS -----------------------------------------------------------------------------
    Signature("p2p_unsupported", "p2p_acs", "P2P/CUMEM",
              _r(r"peer access is not supported|failed to open CUDA IPC handle|cudaIpcOpenMemHandle|"
                 r"Could not enable P2P|failed to peer with device|cudaErrorPeerAccessUnsupported|"
                 r"peer mapping resources exhausted|cuMemImportFromShareableHandle|"
                 r"P2P is disabled between NVLINK connected GPUs"),
              "these GPUs cannot map each other's memory: P2P is not supported between them (PCIe ACS or the IOMMU "
              "redirecting peer traffic, a VM without P2P passthrough, or GPUs without P2P support)",
              "Check `nvidia-smi topo -p2p r`; on bare metal disable PCIe ACS and set the IOMMU to passthrough "
              "(iommu=pt); otherwise NCCL_P2P_DISABLE=1 makes NCCL use shared memory instead.",
              source="src/transport/p2p.cc, src/transport/shm.cc", refine=_p2p),
    # NVLS / Fabric Manager --------------------------------------------------------------------------
    Signature("nvls_failed", "nvls", "NVLS/multicast",
              _r(r"Failed to bind NVLink SHARP|NVLS.*(?:fail|error)|cuMulticast\w*.*fail|multicast.*(?:fail|error)|"
                 r"system not yet initialized"),
              "NVLink SHARP (NVLS) multicast setup failed in the CUDA driver: the Fabric Manager / NVSwitch state "
              "is bad (nvidia-fabricmanager not running, or restarted without resetting the GPUs)",
              "Check `nvidia-smi -q | grep -A2 Fabric` (State Completed, Status Success) and `systemctl status "
              "nvidia-fabricmanager`; after an FM restart reset the GPUs or reboot. NCCL_NVLS_ENABLE=0 avoids it "
              "meanwhile (slower all-reduce).", source="src/transport/nvls.cc", src_pattern=_r(r"nvls\.cc")),
    # CUDA ------------------------------------------------------------------------------------------
    Signature("arch_unsupported", "nccl_too_old", "enqueue/kernel launch",
              _r(r"no kernel image is available|named symbol not found|invalid device function|"
                 r"NoKernelImageForDevice|device kernel image is invalid|unsupported GPU architecture|"
                 r"dynamic smem \d+ exceeds device/fn maxSharedMem"),
              "this NCCL (or the program) has no kernels for this GPU's architecture: it was built without the GPU's "
              "compute capability (NVCC_GENCODE) or is a release older than the GPU",
              "Use an NCCL release that supports the GPU, built for its compute capability (e.g. sm_90 for H100, "
              "sm_100 for B200); `cuobjdump --list-elf libnccl.so` lists what a build holds.",
              source="src/enqueue.cc (CUDACHECK)"),
    Signature("driver_too_old", "cuda_driver", "enqueue/kernel launch",
              _r(r"driver version is insufficient|forward compatibility was attempted|InsufficientDriver|"
                 r"CUDA driver is a stub|requires CUDA driver [\d.]+ or later"),
              "the GPU driver is older than the CUDA runtime this NCCL/PyTorch was built with",
              "Install a driver that supports the CUDA version (nvidia-smi shows the highest it supports), or use "
              "a build for an older CUDA."),
    Signature("gpu_oom", "gpu_oom", "memory allocation",
              _r(r"Cuda failure (?:\d+ )?'out of memory'|Failed to CUDA (?:calloc|malloc)|cuMemCreate.*(?:2|out of)|"
                 r"out of memory"),
              "GPU memory ran out when NCCL allocated its buffers (each communicator and channel needs its own)",
              "Leave memory for NCCL (create communicators before the model fills the GPU, fewer process groups), "
              "or shrink its buffers: NCCL_BUFFSIZE, NCCL_MAX_NCHANNELS, NCCL_NVLS_ENABLE=0.",
              source="src/include/alloc.h"),
    Signature("cuda_fault", "cuda_fault", "enqueue/kernel launch",
              _r(r"illegal memory access|unspecified launch failure|illegal instruction|misaligned address|"
                 r"uncorrectable ECC|fallen off the bus|Xid"),
              "a GPU kernel faulted (an out-of-bounds access in the program, a corrupted tensor, or a hardware "
              "error the kernel log names as an Xid)",
              "Check `dmesg | grep -i xid` on that node; rerun with CUDA_LAUNCH_BLOCKING=1 to find the kernel.",
              confidence="medium"),
    # InfiniBand / RoCE -----------------------------------------------------------------------------
    Signature("ib_completion", "ib_fabric", "net/IB",
              _r(r"Got completion (?:from peer \S+ )?with (?:error |status=)(?P<st>\w+)"),
              "an InfiniBand/RoCE work request failed on the network",
              "Test the pair with ib_write_bw and check the port counters.", source="src/transport/net_ib.cc",
              refine=_ib_completion),
    Signature("ib_gid", "gid_roce", "net/IB",
              _r(r"GID table changed|ibv_modify_qp failed|ncclIbGetGidIndex|Failed to (?:find|query) GID|"
                 r"incorrect GID index|RoceVersion|NCCL_IB_GID_INDEX"),
              "the RoCE GID index NCCL used does not match what the NIC and the peer use (RoCE v1/v2, IPv4/IPv6 "
              "GID), so queue pairs cannot connect",
              "Unset NCCL_IB_GID_INDEX to let NCCL pick (>= 2.21), or set it to the RoCE v2 IPv4 entry `show_gids` "
              "lists on every node.", source="src/transport/net_ib.cc"),
    Signature("ofi_mr_failed", "gdr", "the aws-ofi-nccl plugin",
              _r(r"NET/OFI .*(?:register memory|registration|MR key allocation failed|Couldn't register memory)"),
              "EFA could not register a buffer: GPU memory needs GPUDirect RDMA support (an EFA driver with "
              "GPUDirect, DMA-BUF or nvidia-peermem) and host memory a large enough locked-memory limit",
              "Check the EFA driver supports GPUDirect on this instance type, `ulimit -l unlimited` in the container, "
              "and FI_EFA_USE_DEVICE_RDMA.", confidence="medium", source="aws-ofi-nccl nccl_ofi_rdma.cpp"),
    Signature("ib_reg_failed", "gdr", "net/IB",
              # ibv_reg_mr, ibv_reg_mr_iova2 (NCCL >= 2.19 on recent rdma-core), ibv_reg_dmabuf_mr: misc/ibvwrap.cc
              _r(r"ibv_reg_(?:dmabuf_)?mr(?:_iova2?)?\b.*fail|Failed to register memory|Unable to register memory|"
                 r"ibv_reg_mr failed|reg_mr failed"),
              "the NIC could not register memory: GPU buffers need nvidia-peermem or DMA-BUF for GPUDirect RDMA, "
              "and host buffers need a large enough locked-memory limit",
              "Load nvidia-peermem (or NCCL_DMABUF_ENABLE=1 on Linux >= 5.12), and raise `ulimit -l` (containers: "
              "--ulimit memlock=-1).", source="src/transport/net_ib.cc"),
    Signature("ib_async_event", "ib_fabric", "net/IB",
              _r(r"async fatal event|Got non-fatal async event|IBV_EVENT_(?:PORT_ERR|DEVICE_FATAL|QP_FATAL|CQ_ERR)|"
                 r"Fatal error\. Detected \d+ failed devices"),
              "the NIC reported an asynchronous error (port down, device or queue-pair fatal): a link or NIC failed "
              "while the job ran",
              "Check `ibstat`/`ibv_devinfo` and dmesg (mlx5 errors) on that node, the cable and switch port; drain the "
              "node if its port flaps.", source="src/transport/net_ib (async event thread)"),
    Signature("ib_incompatible", "ib_fabric", "net/IB",
              _r(r"Attempted to (?:connect|merge) incompatible devices|device is incompatible with the local"),
              "NCCL was given NICs of different link layers or speeds (InfiniBand and RoCE/Ethernet ports) to use "
              "together",
              "Select NICs of one link layer with NCCL_IB_HCA (e.g. =mlx5_0,mlx5_1 or ^mlx5_bond_0).",
              source="src/transport/net_ib"),
    Signature("ib_device_unusable", "ib_fabric", "net/IB",
              _r(r"NET/IB ?: Unable to (?:open|query) device|Unable to query port_num|NET/IB ?: No IP interface found"),
              "NCCL saw an InfiniBand device it cannot open or query (in a container: /dev/infiniband not passed in "
              "or no IPC_LOCK; on the host: a driver problem), or found no IP interface for its out-of-band traffic",
              "Pass the devices into the container (--device /dev/infiniband, --cap-add IPC_LOCK, --ulimit "
              "memlock=-1); check `ibv_devinfo` in the same container.", confidence="medium",
              source="src/transport/net_ib"),
    Signature("ibverbs_missing", "ib_fabric", "net/IB",
              _r(r"Failed to open libibverbs|ibvwrap.*(?:Failed|failed)|libibverbs.*not found"),
              "NCCL looked for InfiniBand and did not find libibverbs: harmless on a machine without InfiniBand/RoCE "
              "(NCCL then uses sockets), a problem only if the job should use RDMA",
              "Ignore it without InfiniBand; otherwise install rdma-core/OFED in the image and pass /dev/infiniband "
              "into the container.", severity="info", source="src/misc/ibvwrap.cc"),
    # OFI / EFA -------------------------------------------------------------------------------------
    Signature("ofi_unreachable", "ofi_efa", "the aws-ofi-nccl plugin",
              _r(r"Unable to insert remote address|Couldn't open AV|Unresponsive receiver|handshake failed|"
                 r"fi_av_insert|Operation with NULL context completed with error|process_err_completion|"
                 r"Error 4126"),
              "EFA could not reach the peer: the EFA security group must allow all inbound AND outbound traffic to "
              "and from itself (a 0.0.0.0/0 rule does not cover EFA), or the peer's EFA address is stale",
              "Add self-referencing inbound and outbound all-traffic rules to the instances' security group; check "
              "with fi_pingpong -p efa between the two nodes.", confidence="medium",
              source="aws-ofi-nccl nccl_ofi_rdma.cpp/nccl_ofi_sendrecv.cpp"),
    Signature("ofi_libfabric_old", "ofi_efa", "the aws-ofi-nccl plugin",
              _r(r"requires at least libfabric version|libfabric version .* (?:is )?(?:too old|not supported)"),
              "the libfabric on this machine is older than aws-ofi-nccl needs for EFA",
              "Install a current EFA installer (it brings libfabric), or use the container's own libfabric "
              "(/opt/amazon/efa) first on LD_LIBRARY_PATH.", source="aws-ofi-nccl nccl_ofi_net.cpp"),
    Signature("ofi_no_provider", "ofi_efa", "the aws-ofi-nccl plugin",
              _r(r"Could not find any optimal provider|No eligible providers|Couldn't find any optimal provider|"
                 r"Couldn't open a fabric (?:provider|access domain)|"
                 r"fi_getinfo.*(?:fail|empty list)|Unable to find a protocol that worked|aws-ofi-nccl "
                 r"initialization failed|Initializing plugin failed"),
              "aws-ofi-nccl found no usable libfabric provider: the EFA device is not visible to the job (no EFA on "
              "the instance, container without /dev/infiniband, EFA installer/libfabric missing or too old)",
              "Run `fi_info -p efa` inside the job's container: empty output means no EFA there (pass the devices, "
              "install the EFA software, use an EFA instance type).", source="aws-ofi-nccl nccl_ofi_net.cpp",
              kinds=("warn", "libfabric"), said_by=("net_plugin_failed",)),
    Signature("ofi_error", "ofi_efa", "the aws-ofi-nccl plugin",
              _r(r"NET/OFI .*(?:fail|error|Unable|Couldn't|Could not)"),
              "the aws-ofi-nccl plugin reported an error from libfabric/EFA",
              "Run `fi_info -p efa` and fi_pingpong between the nodes; check the EFA security group and the "
              "aws-ofi-nccl/libfabric versions.", confidence="low", said_by=("net_plugin_failed",)),
    # sockets last among the network signatures: "Connection timed out" also ends IB and OFI messages
    Signature("connect_failed", "interface", "bootstrap/socket",
              _r(r"Connect to \S+ failed|Call to connect (?:failed|timeout|returned)|socketStartConnect|"
                 r"connect\(\) .*(?:refused|timed out)|No route to host|Connection refused|Connection timed out|"
                 r"Network is unreachable"),
              "NCCL could not open a TCP connection to a peer: no route on the interface it uses, a firewall, or "
              "the peer was not listening (not started yet, or already dead)",
              "Check that every node reaches the address and port NCCL names (ping, nc -zv, firewall/security "
              "group); pin NCCL_SOCKET_IFNAME to the interface the nodes route to.",
              source="src/misc/socket.cc", refine=_connect),
    Signature("peer_closed", "peer_died", "bootstrap/socket",
              _r(r"Connection closed by (?:remote )?peer ?(?P<peer>\S+)?|closed by remote peer|Call to recv from "
                 r"\S+ failed|Broken pipe|Connection reset by peer|Socket recv failed|remote process exit|"
                 r"exiting prematurely|Message truncated"),
              "that peer process likely died first (crashed, killed, out of memory, its node rebooted): this rank "
              "is a victim and its own log is not where the cause is",
              "Find the earliest error across all ranks' logs (the peer's own traceback, an OOM kill in dmesg, a "
              "segfault); fix that, not this rank.", source="src/misc/socket.cc, src/proxy.cc", refine=_peer),
    Signature("proxy_failed", "peer_died", "proxy",
              _r(r"\[Proxy Service \d+\] Failed to execute operation (?P<op>\w+) from rank (?P<rank>\d+), retcode 6|"
                 r"\[Proxy Service \d+\] Failed to execute operation"),
              "NCCL's proxy thread failed an operation for another rank; it passes on an error that happened "
              "elsewhere",
              "Read the first WARN before it, or the named rank's log.", confidence="low",
              source="src/proxy.cc", secondary=True),
    # versions / topology ---------------------------------------------------------------------------
    Signature("version_mismatch", "version_mismatch", "init",
              _r(r"Mismatched NCCL version|version mismatch|NCCL version mismatch"),
              "the ranks run different NCCL versions, which cannot talk to each other",
              "Load one libnccl everywhere (same wheel/container on every host).", source="src/init.cc"),
    Signature("net_count_differs", "version_mismatch", "init",
              _r(r"Detected mixed local (?:Coll)?Net device counts across ranks"),
              "the hosts see different numbers of NICs (a NIC down or missing on some host, or NCCL_IB_HCA set "
              "differently), so NCCL cannot pair them rail to rail",
              "Compare `ibv_devinfo`/`ibstat` across the hosts and fix or drain the one with a NIC missing; keep "
              "NCCL_IB_HCA the same everywhere.", source="src/init.cc"),
    Signature("duplicate_gpu", "rank_layout", "init",
              _r(r"Duplicate GPU detected"),
              "two ranks of one communicator use the same GPU: each process must drive its own GPU",
              "Select the GPU by LOCAL_RANK (torch.cuda.set_device(local_rank)) before init_process_group, and check "
              "CUDA_VISIBLE_DEVICES per process.", source="src/init.cc"),
    Signature("comm_aborted", "aborted", "init",
              _r(r"communicator was revoked|is in abort state|Attempt to use communicator before the previous "
                 r"operation returned ncclSuccess|Comm \S+ is in abort state"),
              "the communicator had already failed or been aborted (by an earlier error or by the watchdog)",
              "Read the earlier error of this rank: this line is its consequence.", confidence="low",
              source="src/init.cc, src/enqueue.cc, src/proxy.cc", secondary=True),
    Signature("no_path_to_nic", "topology", "init/topology",
              _r(r"Could not find any local path from gpu \d+ to net|Could not find NIC for rank|"
                 r"localHostHash = \S+ not found|Could not find intermediate GPU"),
              "NCCL could not place the NICs or this host in its topology (a NIC it cannot reach from the GPU, or "
              "hosts that look identical to it: same hostname / NCCL_HOSTID)",
              "Give every host a distinct hostname (or NCCL_HOSTID), check NCCL_IB_HCA/NCCL_NET selects NICs this "
              "host has; NCCL_TOPO_FILE for VMs.", confidence="medium",
              source="src/graph/paths.cc, src/graph/search.cc, src/graph/topo.cc"),
    Signature("topology_failed", "topology", "init/topology",
              _r(r"Could not find real path|Topology detection|ncclTopo\w*.*fail|unable to find GPU|XML Mismatch|"
                 r"Could not find NET with id|Failed to find reverse path|Could not get GPU|topo.*fail|"
                 r"Attribute \w+ of node \w+ not found"),
              "NCCL could not build the machine's topology from /sys (a VM or container exposing a partial /sys, "
              "or GPUs/NICs it cannot place)",
              "Mount the host's /sys (or run privileged) so NCCL can read the PCI tree, or give it the machine's "
              "topology with NCCL_TOPO_FILE (dump it on a healthy node with NCCL_TOPO_DUMP_FILE).",
              confidence="medium", source="src/graph/topo.cc, src/graph/xml.cc"),
    Signature("nvml_failed", "topology", "init/topology",
              _r(r"nvmlDeviceGetHandleByPciBusId|nvml\w+\(\) failed|NVML"),
              "NVML cannot see the GPUs NCCL asks about (each process sees only its own GPU)",
              "Give every process all the node's GPUs and select one with LOCAL_RANK.", confidence="medium",
              source="src/misc/nvmlwrap.cc", said_by=("nvml_not_found",)),
    # generic CUDA last: a CUDA error with no more specific signature ---------------------------------
    Signature("cuda_failure", "cuda_fault", "NCCL",
              _r(r"Cuda failure|CUDA failure|unhandled cuda error|CUDA error"),
              "a CUDA call inside NCCL failed",
              "The CUDA error text says which; check the driver (nvidia-smi), dmesg for Xid errors, and the GPUs' "
              "health.", confidence="low"),
)

#: the test for a log that says only "unhandled system error" on one node: the usual container causes
_SYSTEM_ERROR = re.compile(r"unhandled system error|ncclSystemError", re.I)


def _match(sig: Signature, p: dict[str, Any]) -> re.Match[str] | None:
    if p.get("kind") not in sig.kinds:
        return None
    m = sig.pattern.search(p.get("text") or "")
    if m is None and sig.src_pattern is not None and p.get("kind") == "warn":
        m = sig.src_pattern.search(p.get("src") or "")
    return m


def diagnose_problems(s: dict[str, Any], said: set[str]) -> list[Diagnosis]:
    """Catalogue diagnoses for the summary's problem lines (``said``: ids older rules already gave)."""
    problems: list[dict[str, Any]] = list(s.get("problems") or [])
    out: list[Diagnosis] = []
    seen: dict[str, Diagnosis] = {}
    for p in problems:
        for sig in CATALOGUE:
            m = _match(sig, p)
            if m is None:
                continue
            d = seen.get(sig.id)
            if d is not None:
                if len(d["evidence"]) < 4 and p["quote"] not in d["evidence"]:
                    d["evidence"].append(p["quote"])
                break
            if said & set(sig.said_by):
                break
            s["_src"] = p.get("src") or ""
            extra = sig.refine(m, s, sig) if sig.refine else {}
            s.pop("_src", None)
            d = _diagnosis(sig, p, extra, s)
            seen[sig.id] = d
            out.append(d)
            break
    primary = [d for d in out if not d.get("secondary") and d["severity"] != "info"]
    if primary:
        out = [d for d in out if not d.get("secondary") or d["severity"] == "info"]
    out += _context_diagnoses(s, problems, bool(primary) or bool(said & _ERROR_IDS))
    real = [p for p in problems if p.get("kind") != "libfabric" and not _benign(p)]
    if real and not any(d["severity"] == "error" for d in out) and not (said & _ERROR_IDS):
        out.append(unexplained(s, real))
    return out


#: older rules whose diagnosis already explains an error line
_ERROR_IDS = {"net_plugin_failed", "nvml_not_found", "collective_timeout"}


def _benign(p: dict[str, Any]) -> bool:
    return any(sig.severity == "info" and _match(sig, p) for sig in CATALOGUE)


def _diagnosis(sig: Signature, p: dict[str, Any], extra: dict[str, Any], s: dict[str, Any]) -> Diagnosis:
    cause = extra.get("cause", sig.cause)
    sub = subsystem(p.get("src"), p.get("text") or "") if sig.subsystem == "NCCL" else sig.subsystem
    where = f" ({p['src']})" if p.get("src") else ""
    msg = f"{cause}. First error: {_kind_word(p)} from {sub}{where}: \"{_short(p.get('text') or '')}\""
    ev = [p["quote"]]
    if sig.family == "interface":
        ev += _quotes(s, "socket_using") + [q for q in _quotes(s, "env:NCCL_SOCKET_IFNAME") if q not in ev]
    d: Diagnosis = {"id": sig.id, "severity": sig.severity, "message": msg, "evidence": ev[:6],
                    "suggestion": extra.get("fix", sig.fix), "family": extra.get("family", sig.family),
                    "confidence": extra.get("confidence", sig.confidence), "subsystem": sig.subsystem,
                    "first_line": p["quote"]}
    if extra.get("secondary", sig.secondary):
        d["secondary"] = True
    return d


def _kind_word(p: dict[str, Any]) -> str:
    return {"warn": "NCCL WARN", "return": "NCCL error return", "test": "nccl-tests failure",
            "torch": "PyTorch NCCL error", "timeout": "timeout", "libfabric": "libfabric warning"}.get(
        str(p.get("kind")), "error")


def _short(text: str, n: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _quotes(s: dict[str, Any], topic: str) -> list[str]:
    return list((s.get("evidence") or {}).get(topic) or [])


def unexplained(s: dict[str, Any], real: list[dict[str, Any]]) -> Diagnosis:
    """The first error, named plainly, when no signature knows it."""
    p = _first(real)
    if p.get("kind") == "timeout":
        return {"id": "timeout_logged", "severity": "error", "family": "timeout", "confidence": "low",
                "message": f"a timeout was logged and no earlier line says why: \"{_short(p.get('text') or '')}\" — "
                           "a rank stopped answering (hung, died, or its host lost the network) or a rendezvous "
                           "never completed", "evidence": [x["quote"] for x in real[:4]], "subsystem": "PyTorch c10d",
                "first_line": p["quote"],
                "suggestion": "Run `traceread hang` on the run folder; check every rank's log for the earliest "
                              "error and MASTER_ADDR/MASTER_PORT reachability for a rendezvous timeout."}
    sub = subsystem(p.get("src"), p.get("text") or "")
    code = p.get("code")
    meaning = ""
    if code in RESULT_CODES:
        name, what = RESULT_CODES[code]
        meaning = f" ({name}: {what})"
    where = f"{sub} ({p['src']})" if p.get("src") else sub
    single = len(s.get("hosts") or []) <= 1
    usual = USUAL_CAUSES.get(sub, USUAL_CAUSES["NCCL"])
    family = None
    if _SYSTEM_ERROR.search(p.get("text") or "") or code == 2:
        usual = ("/dev/shm too small in a container (--shm-size / --ipc=host), no usable IP interface in the "
                 "container (--net=host, NCCL_SOCKET_IFNAME), or a file-descriptor/memlock limit; rerun with "
                 "NCCL_DEBUG=WARN to see which")
        family = "shm" if single else None
    msg = (f"NCCL reported an error it does not explain: \"{_short(p.get('text') or '')}\"{meaning}; it came from "
           f"{where}; the usual causes are {usual}")
    d: Diagnosis = {"id": "unexplained_error", "severity": "error", "message": msg,
                    "evidence": [x["quote"] for x in real[:4]],
                    "suggestion": "Rerun with NCCL_DEBUG=INFO (NCCL_DEBUG_SUBSYS=INIT,NET) and read the first WARN "
                                  "line of the rank that failed first.",
                    "confidence": "low", "subsystem": sub, "first_line": p["quote"]}
    if family:
        d["family"] = family
    return d


def _first(real: list[dict[str, Any]]) -> dict[str, Any]:
    """The root error: a WARN (NCCL prints it where the failure is) before the unwinding it causes."""
    for kind in ("warn", "test", "torch", "return", "timeout"):
        for p in real:
            if p.get("kind") == kind:
                return p
    return real[0]


#: The first NCCL release whose default build (makefiles/common.mk NVCC_GENCODE) has native kernels
#: for a GPU generation: sm_90 from 2.15, sm_100/sm_120 from 2.25. Older builds run there only through
#: PTX JIT of an older architecture, if at all ("no kernel image is available").
GPU_MIN_NCCL = (
    (re.compile(r"\b(?:GB[23]00|B[123]00|RTX 50\d0|RTX PRO \d+ Blackwell|Blackwell)\b", re.I), (2, 25),
     "sm_100/sm_120 (Blackwell)"),
    (re.compile(r"\b(?:GH200|H100|H200|H800|H20)\b", re.I), (2, 15), "sm_90 (Hopper)"),
)


def _nccl_older_than_gpu(s: dict[str, Any], problems: list[dict[str, Any]]) -> list[Diagnosis]:
    gpu = str((s.get("hardware") or {}).get("gpu") or "")
    m = re.match(r"(\d+)\.(\d+)", str(s.get("version") or ""))
    if not gpu or m is None:
        return []
    have = (int(m.group(1)), int(m.group(2)))
    for pat, need, arch in GPU_MIN_NCCL:
        if pat.search(gpu):
            if have >= need:
                return []
            failed = any(re.search(r"kernel image|named symbol|invalid device function", p.get("text") or "")
                         for p in problems)
            return [{"id": "nccl_older_than_gpu", "severity": "error" if failed else "warning",
                     "message": f"NCCL {s.get('version')} is older than this GPU ({gpu}): NCCL's builds have native "
                                f"{arch} kernels from {need[0]}.{need[1]}; older ones run there only through JIT of "
                                "an older architecture, or fail with 'no kernel image'", "family": "nccl_too_old",
                     "evidence": _quotes(s, "version")[:2], "confidence": "medium",
                     "suggestion": f"Use NCCL >= {need[0]}.{need[1]} (the PyTorch/container release that ships it)."}]
    return []


def _context_diagnoses(s: dict[str, Any], problems: list[dict[str, Any]], explained: bool) -> list[Diagnosis]:
    """What the whole log (all files) says besides its error lines: versions and plugins per host, and
    whether this NCCL knows the GPU."""
    out: list[Diagnosis] = _nccl_older_than_gpu(s, problems)
    by_host: dict[str, str] = s.get("versions_by_host") or {}
    versions = sorted(set(by_host.values()))
    if len(versions) > 1:
        hosts = {v: sorted(h for h, x in by_host.items() if x == v) for v in versions}
        listed = "; ".join(f"{v} on {', '.join(h[:3])}{'…' if len(h) > 3 else ''}" for v, h in hosts.items())
        out.append({"id": "version_differs", "severity": "error" if problems else "warning",
                    "message": f"the hosts run different NCCL versions ({listed}): ranks with different versions "
                               "cannot exchange NCCL's init structures reliably", "family": "version_mismatch",
                    "evidence": _quotes(s, "version")[:4], "confidence": "high",
                    "suggestion": "Load one libnccl on every host (same container/wheel); check LD_LIBRARY_PATH for "
                                  "a system NCCL shadowing the wheel's."})
    plugins: dict[str, str] = s.get("plugin_by_host") or {}
    kinds = sorted(set(plugins.values()))
    if len(kinds) > 1 and len(plugins) > 1:
        listed = "; ".join(f"{k} on {', '.join(sorted(h for h, x in plugins.items() if x == k)[:3])}" for k in kinds)
        out.append({"id": "plugin_differs", "severity": "error" if problems else "warning",
                    "message": f"the hosts load different NCCL network plugins ({listed}): their ranks pick "
                               "different transports and cannot connect", "family": "version_mismatch",
                    "evidence": _quotes(s, "plugin_host")[:4], "confidence": "medium",
                    "suggestion": "Install the same network plugin (libnccl-net.so) on every host, or set "
                                  "NCCL_NET_PLUGIN the same way everywhere."})
    return out
