"""What the log says about the network and the node: plugin, provider, NICs, GPUDirect RDMA, the
environment NCCL read, and hints about NVLink/NVSwitch.

Formats, from the sources that print them:

* NCCL's plugin loader (``src/net.cc``, later ``src/plugin/``): ``NET/Plugin : No plugin found,
  using internal implementation`` (<= 2.18), ``NET/Plugin: No plugin found (libnccl-net.so)``
  (2.19-2.22), ``NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.``
  (2.23+), ``NET/Plugin: Loaded net plugin <name> (v<N>)``, ``Successfully loaded external
  [network ]plugin <path>``, ``Initialized NET plugin <name>``, ``Failed to initialize NET plugin
  <name>`` (2.27+), ``Using network <name>``.
* NCCL's transports: ``NET/IB : Using [0]mlx5_0:1/IB ... ; OOB eth0:...``, ``NET/IB : No device
  found.``, ``NET/Socket : Using [0]eth0:10.0.0.1<0> ...``, ``GPU Direct RDMA Disabled for GPU <g> /
  HCA <h> (distance <d> > <level>)``, ``NET/<net> : GPU Direct RDMA Disabled for HCA <n> '<name>'``.
* ``<NAME> set by environment to <value>`` (``misc/param.cc`` adds a ``.`` after numbers).
* aws-ofi-nccl (every line starts ``NET/OFI``): ``Initializing aws-ofi-nccl <version>``, ``Using
  Libfabric version <v>``, ``Selected Provider is <p> (found <n> nics)`` (1.x up to 1.13; older
  without the count), ``Selected provider is <p>, fabric is <f> (found <n> nics)`` (1.14+),
  ``Running on <instance type> platform, ...``, ``Using transport protocol <RDMA|SENDRECV>``,
  ``Need to force simple protocol: GDR not supported`` (1.16+), ``Could not disable CUDA API usage
  for HMEM, disabling GDR``, ``GDR disabled on GDR-supported instance type <t>`` (WARN), and on
  failure ``Unable to find a protocol that worked.  Failing initialization.``, ``aws-ofi-nccl
  initialization failed``, ``Initializing plugin failed`` (WARN).
* nccl-tests: ``#  Rank  0 Group  0 Pid 123 on host device  0 [0x1a] NVIDIA H100 80GB HBM3``.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

from traceread.analysis.comm.nccl.lines import LogLine

_NO_PLUGIN = re.compile(r"NET/Plugin ?: (?:No plugin found|Could not find:|Using internal network plugin)")
_LOADED_PLUGIN = re.compile(r"Loaded (net|collnet|coll) plugin (.+?)(?: \(v(\d+)\))?\s*$")
_EXTERNAL = re.compile(r"Successfully loaded external (?:network )?plugin (\S+)")
_INITIALIZED = re.compile(r"Initialized NET plugin (.+?)\s*$")
_INIT_FAILED = re.compile(r"Failed to initialize (?:NET|any NET) plugin ?(.*?)\s*$")
_P2P_PLUGIN = re.compile(r"P2P plugin (\S+)")
_USING_NETWORK = re.compile(r"Using network (.+?)\s*$")
_IB_USING = re.compile(r"NET/IB ?: Using (.+?)(?:; OOB (\S+))?\s*$")
_IB_NODEV = re.compile(r"NET/IB ?: No device found")
_SOCKET_USING = re.compile(r"NET/Socket ?: Using (.+?)\s*$")
_GDR_DISTANCE = re.compile(r"GPU Direct RDMA (Disabled|Enabled) for GPU (\S+) / HCA (\S+) \(distance (\d+) (?:>|<=) (\d+)\)")
_GDR_HCA = re.compile(r"NET/(\S+) ?: GPU Direct RDMA (Disabled|Enabled) for HCA (\d+) '([^']*)'")
_ENV = re.compile(r"\b(NCCL_\w+|CUDA_\w+|FI_\w+|OFI_NCCL_\w+) set by environment to (.*?)\.?\s*$")
_BOOTSTRAP = re.compile(r"Bootstrap ?: Using (\S+?):([0-9A-Fa-f.:%\w]+?)<")
_BOOTSTRAP_ITEM = re.compile(r"(?:\[\d+\])?([^\s:\[\]<>]+):([0-9A-Fa-f.:%\w-]+?)<\d+>")

_OFI_VERSION = re.compile(r"NET/OFI Initializing ([\w-]+ \d[\w.+-]*)\s*$")
_OFI_LIBFABRIC = re.compile(r"NET/OFI Using Libfabric version (\S+)")
_OFI_PROVIDER = re.compile(
    r"NET/OFI Selected [Pp]rovider is ([^\s,]+)(?:, fabric is ([^\s(]+))?(?: \(found (\d+) nics?\))?")
_OFI_PLATFORM = re.compile(r"NET/OFI Running on (\S+?),? platform")
_OFI_PROTOCOL = re.compile(r"NET/OFI Using transport protocol (\w+)")
_OFI_NO_GDR = re.compile(r"NET/OFI (?:Need to force simple protocol: GDR not supported|"
                         r"Could not disable CUDA API usage for HMEM, disabling GDR)")
_OFI_GDR_OFF_ON_CAPABLE = re.compile(r"NET/OFI GDR disabled on GDR-supported instance type (\S+)")
_OFI_SIMPLE = re.compile(r"NET/OFI (?:Need to force simple protocol|Setting NCCL_PROTO to \"?simple)")
_OFI_FAILED = re.compile(r"NET/OFI .*(?:initialization failed|Initializing plugin failed|Failing initialization|"
                         r"fi_getinfo\(\) call failed|Caught exception in plugin init|Failed to initialize \w+ protocol)",
                         re.I)
_OFI_NO_PROVIDER = re.compile(r"NET/OFI (?:No eligible providers were found|Couldn't find any optimal provider)")

_TESTS_DEVICE = re.compile(
    r"#\s+Rank\s+(\d+)(?:\s+Group\s+\d+)?\s+Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)\s+\[[^\]]*\]\s+(.+?)\s*$")
_PATTERN = re.compile(r"Pattern \d+, crossNic \d+, nChannels \d+, bw [\d.]+/[\d.]+, type (\w+)/(\w+)")
_P2P_DISABLED_NVL = re.compile(r"P2P is disabled between (NVLINK )?connected GPUs")
_P2P_ENABLE_FAILED = re.compile(r"Could not enable P2P between dev|peer query failed between dev")
_NVLS_AVAIL = re.compile(r"NVLS multicast support is (not )?available on dev (\d+)")
_NVLS_COMM = re.compile(r"NVLS comm 0x[0-9a-fA-F]+ headRank")

#: NCCL's built-in transports, which 2.27+ loads and reports like plugins.
INTERNAL_NETS = frozenset({"IB", "Socket"})
#: Evidence lines kept per topic (the first few are enough to cite).
KEEP = 4


class NetTracker:
    """Feed it lines; :meth:`finish` fills the summary's network, plugin, env and hint fields."""

    def __init__(self) -> None:
        self.networks: Counter[str] = Counter()
        self.plugins: list[str] = []
        self.no_plugin = False
        self.ib_nodev = False
        self.ib_devices: list[str] = []
        self.socket_ifaces: list[str] = []
        self.bootstrap: list[str] = []
        self.env: dict[str, Counter[str]] = {}
        self.ofi: dict[str, Any] = {}
        self.gpus: dict[str, str] = {}  # "host:device" -> name (nccl-tests)
        self.nvls_avail: list[bool] = []
        self.nvls_comms = 0
        self.intra_types: Counter[str] = Counter()
        self.nvlink_hint = False
        self.nvswitch_hint = False
        self.evidence: dict[str, list[LogLine]] = {}

    def cite(self, topic: str, ln: LogLine) -> None:
        lst = self.evidence.setdefault(topic, [])
        if len(lst) < KEEP:
            lst.append(ln)

    def feed(self, ln: LogLine) -> bool:  # one flat dispatch on the message
        msg = ln.msg
        if "set by environment" in msg and (m := _ENV.search(msg)):
            self.env.setdefault(m.group(1), Counter())[m.group(2).strip()] += 1
            self.cite("env:" + m.group(1), ln)
            return True
        if "NET/OFI" in msg:
            self._ofi(ln)
            return True
        if "Bootstrap" in msg and _BOOTSTRAP.search(msg):
            # one interface (2.19+: "Using eth0:10.0.0.1<0>") or a list ("Using [0]eno1:… [1]veth…:fe80::…%veth…<0>")
            for name, addr in _BOOTSTRAP_ITEM.findall(msg.split("Using", 1)[1]):
                iface = f"{name}:{addr}"
                if iface not in self.bootstrap:
                    self.bootstrap.append(iface)
            return False  # the same line may carry nothing else, but let others look
        if "Plugin" in msg or "plugin" in msg:
            return self._plugin(ln)
        if "Using network" in msg and (m := _USING_NETWORK.search(msg)):
            self.networks[m.group(1)] += 1
            self.cite("network:" + m.group(1), ln)
            return True
        if "NET/IB" in msg:
            if (m := _IB_USING.search(msg)):
                for dev in re.findall(r"\[\d+\](\S+)", m.group(1)):
                    if dev not in self.ib_devices and dev != "[RO]":
                        self.ib_devices.append(dev)
                return True
            if _IB_NODEV.search(msg):
                self.ib_nodev = True
                self.cite("ib_nodev", ln)
                return True
        if "NET/Socket" in msg and (m := _SOCKET_USING.search(msg)):
            for dev in re.findall(r"\[\d+\](\S+)", m.group(1)):
                if dev not in self.socket_ifaces:
                    self.socket_ifaces.append(dev)
            self.cite("socket_using", ln)
            return True
        if "GPU Direct RDMA" in msg:
            if (m := _GDR_DISTANCE.search(msg)):
                self.cite("gdr_distance_" + m.group(1).lower(), ln)
                return True
            if (m := _GDR_HCA.search(msg)):
                if m.group(1) != "Socket":  # sockets never do GPUDirect RDMA
                    self.cite("gdr_hca_" + m.group(2).lower(), ln)
                return True
        if "NVLS" in msg:
            if (m := _NVLS_AVAIL.search(msg)):
                self.nvls_avail.append(m.group(1) is None)
                self.cite("nvls_available" if m.group(1) is None else "nvls_unavailable", ln)
                return True
            if _NVLS_COMM.search(msg):
                self.nvls_comms += 1
                return True
        if "Rank" in msg and "device" in msg and (m := _TESTS_DEVICE.search(ln.raw)):
            self.gpus[f"{m.group(3)}:{m.group(4)}"] = m.group(5)
            self.cite("gpu_name", ln)
            return True
        if "Pattern" in msg and (m := _PATTERN.search(msg)):
            self.intra_types[m.group(1)] += 1
            if m.group(1) in ("NVL", "NVB"):
                self.nvlink_hint = True
                self.cite("nvlink", ln)
            return True
        if "P2P" in msg:
            if (m := _P2P_DISABLED_NVL.search(msg)):
                self.nvlink_hint = True
                self.cite("p2p_disabled", ln)
                return True
            if _P2P_ENABLE_FAILED.search(msg):
                self.cite("p2p_enable_failed", ln)
                return True
            if (m := _P2P_PLUGIN.search(msg)):
                self.plugins.append(f"p2p: {m.group(1)}")
                return True
        if ("NVL[" in msg or "NVS/" in msg) and ("+ " in msg or "GPU/" in msg):  # ncclTopoPrint (GRAPH)
            self.nvlink_hint = True
            if "NVS/" in msg:
                self.nvswitch_hint = True
            self.cite("nvlink", ln)
            return True
        return False

    def _plugin(self, ln: LogLine) -> bool:
        msg = ln.msg
        if _NO_PLUGIN.search(msg):
            self.no_plugin = True
            self.cite("no_plugin", ln)
            return True
        if (m := _LOADED_PLUGIN.search(msg)):
            kind = "collnet" if m.group(1) in ("collnet", "coll") else "net"
            self.plugins.append(f"{kind}: {m.group(2).strip()}")
            self.cite("plugin_loaded", ln)
            return True
        if (m := _EXTERNAL.search(msg)):
            self.ofi.setdefault("external_path", m.group(1))
            self.cite("plugin_loaded", ln)
            return True
        if (m := _INITIALIZED.search(msg)):
            self.ofi.setdefault("initialized", set()).add(m.group(1))
            return True
        if (m := _INIT_FAILED.search(msg)):
            name = m.group(1) or "?"
            self.ofi.setdefault("init_failed", set()).add(name)
            if name not in INTERNAL_NETS:
                self.cite("plugin_failed", ln)
            return True
        if (m := _P2P_PLUGIN.search(msg)):
            self.plugins.append(f"p2p: {m.group(1)}")
            return True
        return False

    def _ofi(self, ln: LogLine) -> None:
        msg, o = ln.msg, self.ofi
        o["seen"] = True
        if (m := _OFI_VERSION.search(msg)):
            o["version"] = m.group(1)
        elif (m := _OFI_LIBFABRIC.search(msg)):
            o["libfabric"] = m.group(1)
        elif (m := _OFI_PROVIDER.search(msg)):
            o["provider"], o["fabric"] = m.group(1), m.group(2) or o.get("fabric")
            if m.group(3):
                o["nics"] = max(int(m.group(3)), o.get("nics") or 0)
            self.cite("ofi_provider", ln)
        elif (m := _OFI_PLATFORM.search(msg)):
            o["platform"] = m.group(1)
            self.cite("ofi_platform", ln)
        elif (m := _OFI_PROTOCOL.search(msg)):
            o["protocol"] = m.group(1)
        elif (m := _OFI_GDR_OFF_ON_CAPABLE.search(msg)):
            o["gdr"] = False
            o["gdr_off_on_capable"] = m.group(1)
            self.cite("ofi_no_gdr", ln)
        elif _OFI_NO_GDR.search(msg):
            o["gdr"] = False
            self.cite("ofi_no_gdr", ln)
        elif _OFI_NO_PROVIDER.search(msg):
            o["no_provider"] = True
            self.cite("ofi_failed", ln)
        if _OFI_SIMPLE.search(msg):
            o["forced_simple"] = True
        if ln.level == "WARN" or _OFI_FAILED.search(msg):
            if _OFI_FAILED.search(msg):
                o["failed"] = True
            self.cite("ofi_failed" if _OFI_FAILED.search(msg) else "ofi_warn", ln)

    # ---- the summary ---------------------------------------------------------------------------

    def env_values(self) -> dict[str, str]:
        """Each variable's most common value (several values: all, most common first, joined by ``|``)."""
        return {k: " | ".join(v for v, _n in c.most_common()) for k, c in sorted(self.env.items())}

    def plugin_summary(self, network: str | None) -> dict[str, Any]:
        o = self.ofi
        kind: str | None = None
        if o.get("seen") or (network and "libfabric" in network.lower()):
            kind = "ofi"
        elif network and network.lower().startswith("ib"):
            kind = "ib"
        elif network and network.lower() == "socket":
            kind = "socket"
        elif network:
            kind = "external"
        nics = o.get("nics")
        if nics is None and kind == "ib" and self.ib_devices:
            nics = len(self.ib_devices)
        if nics is None and kind == "socket" and self.socket_ifaces:
            nics = len(self.socket_ifaces)
        gdr = o.get("gdr")  # what the plugin itself said; the channel lines say it in summary["gdrdma"]
        if gdr is None and kind in ("ib", "external"):  # NET/<net> : GPU Direct RDMA Enabled/Disabled for HCA n
            gdr = False if "gdr_hca_disabled" in self.evidence else (True if "gdr_hca_enabled" in self.evidence else None)
        # NCCL >= 2.27 lists its internal IB and Socket transports as NET plugins too: "Failed to initialize
        # NET plugin IB" on a machine without InfiniBand is normal, an external plugin failing is not
        failed = bool(o.get("failed")) or any(n not in INTERNAL_NETS for n in o.get("init_failed") or ())
        return {
            "kind": kind,
            "name": network,
            "version": o.get("version"),
            "libfabric": o.get("libfabric"),
            "provider": o.get("provider"),
            "fabric": o.get("fabric"),
            "nics": nics,
            "platform": o.get("platform"),
            "protocol": o.get("protocol"),
            "gdr": gdr,
            "forced_simple": bool(o.get("forced_simple")),
            "failed": failed,
            "external_path": o.get("external_path"),
        }
