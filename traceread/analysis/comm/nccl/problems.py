"""Every line of a log that says something went wrong, whatever wrote it and however it was pasted.

A user's log is rarely NCCL's clean ``host:pid:tid [dev] file:line NCCL WARN msg``: pastes lose the
prefix (``[3] include/shm.h:28 NCCL WARN ...``), old NCCL (<= 2.3) printed ``file:line WARN msg``
without the NCCL token, aws-ofi-nccl 0.x printed ``WARN: Function: f Line: n: NET/OFI ...``, Markdown
adds ``**``, launchers add ``[rank3]:``, ``[1,13]<stdout>:``, ``0: ``, dates and pod names. So the
problem lines are found by what NCCL itself writes in the middle of the line, not by the prefix:

* ``WARN``  — a warning NCCL (or a plugin through NCCL's logger) printed; ``src`` is where.
* ``return`` — NCCL's error unwinding, ``file.cc:123 -> 6`` (``NCCLCHECK`` in src/include/checks.h
  prints one line per frame, with the ``ncclResult_t`` code).
* ``test``  — nccl-tests' ``Test NCCL failure common.cu:777 'unhandled system error'``.
* ``torch`` — PyTorch's ``NCCL error in: ..., <reason>``, ``ncclSystemError``/``ncclRemoteError`` text,
  ``DistBackendError``.
* ``timeout`` — the c10d watchdog's ``Watchdog caught collective operation timeout`` and gloo's
  ``Timed out waiting``.
* ``libfabric`` — libfabric's own ``<warn>`` lines (evidence for the OFI diagnosis, never the first
  error by themselves: libfabric warns about every provider it skips).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traceread.analysis.comm.nccl.lines import QUOTE_CHARS

#: ``ncclResult_t`` (src/include/nccl.h): what the number after ``->`` means.
RESULT_CODES = {
    1: ("ncclUnhandledCudaError", "a CUDA call failed"),
    2: ("ncclSystemError", "a system call or external library failed (socket, shared memory, malloc, verbs)"),
    3: ("ncclInternalError", "NCCL's own consistency check failed (often the consequence of an earlier error)"),
    4: ("ncclInvalidArgument", "an invalid argument was passed to NCCL"),
    5: ("ncclInvalidUsage", "NCCL was called the wrong way (e.g. mismatched ranks or a destroyed communicator)"),
    6: ("ncclRemoteError", "a remote peer failed or went away (network error or a process that exited)"),
    7: ("ncclInProgress", "an operation is still in progress"),
}

_HOST_PREFIX = re.compile(r"(?P<host>[^\s:\[\]<>]{1,255}):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] ")
_WARN = re.compile(r"(?:^|[\s\]>*|])(?:(?P<src>[^\s*]{1,300}?:\d+) +)?\**(?:NCCL )?WARN\b\**:? *(?P<msg>.*)$")
_WARN_SIG = re.compile(r"\[\d+\] (?P<src>[^\n]{1,400}?:\d+) NCCL WARN ")  # C++ signatures with spaces (plugins)
_OFI_OLD = re.compile(r"WARN: Function: (?P<fn>\w+) Line: (?P<ln>\d+): (?P<msg>.*)$")
_RETURN = re.compile(r"(?P<src>[\w./-]+\.(?:cc|cu|h|c|cpp|hpp)):(?P<ln>\d+) -> (?P<code>\d+)\b")
_TEST = re.compile(r"(?:Test )?(?P<what>NCCL|CUDA) failure (?P<src>\S+:\d+) '(?P<msg>[^']*)'")
_TORCH = re.compile(
    r"NCCL error in: (?P<src>\S+?),? (?P<msg>.+?)(?:, NCCL version (?P<ver>[\w.+]+))?\s*$"
    r"|(?P<res>ncclSystemError|ncclInternalError|ncclRemoteError|ncclUnhandledCudaError|ncclInvalidUsage|"
    r"ncclInvalidArgument)\b:? ?(?P<rmsg>.*)$"
    r"|(?P<cuda>Cuda failure (?:\d+ )?'[^']*')"
)
_TIMEOUT = re.compile(r"Watchdog caught collective operation timeout|Timed out waiting \d+ms for|"
                      r"watchdog got stuck for \d+ seconds|Socket Timeout\b")
#: NCCL's own failure wording, for pastes that lost the ``WARN`` token (an issue title, a quoted line)
_BARE = re.compile(r"ncclSocketInit: connecting|Cuda failure (?:\d+ )?'|NET/OFI .*(?:fail|Unable|Couldn't|Could not)|"
                   r"NET/IB ?: Got completion|Error while (?:creating|attaching to) shared memory segment|"
                   r"posix_fallocate failed|Failed to bind NVLink SHARP|Mismatched NCCL version|socketStartConnect:|"
                   r"socketPollConnect:|socketProgress: Connection closed")
_LIBFABRIC = re.compile(r"libfabric:\d+:\d+:(?P<prov>[\w;]*):(?P<sub>\w+):(?P<where>\S+)<warn> (?P<msg>.*)$")
#: A WARN token that is not NCCL's (a Python ``warnings`` line, a logger's "WARN" level) must carry an
#: NCCL-ish location or message to count.
_NCCLISH = re.compile(r"NCCL|NET/|\.(?:cc|cu|h|c):\d+|nccl|OFI|Cuda failure")
MAX_PROBLEMS = 400


@dataclass(slots=True)
class Problem:
    """One line that says something is wrong."""

    kind: str  # warn | return | test | torch | timeout | libfabric
    file: str
    line: int
    text: str  # what it says (the message after the location)
    src: str | None = None  # where it came from (file:line or function:line)
    code: int | None = None  # ncclResult_t of a return trace / the torch error
    host: str | None = None

    def quote(self, raw: str) -> str:
        t = raw.strip()
        if len(t) > QUOTE_CHARS:
            t = t[: QUOTE_CHARS - 1] + "…"
        return f"{Path(self.file).name}:{self.line}: {t}"


def find_problem(file: str, lineno: int, raw: str, level: str | None = None) -> dict[str, Any] | None:
    """The problem ``raw`` reports, as a JSON-ready dict (None for a line that says nothing is wrong).

    ``level``: NCCL's level when the line was already split (an ``INFO`` line can only be an error
    return, ``file.cc:12 -> 2``: the common case stays one substring test)."""
    if level == "INFO":
        if " -> " not in raw or (m := _RETURN.search(raw)) is None:
            return None
        found: Problem | None = Problem("return", file, lineno, raw[m.start():].strip(),
                                        f"{m.group('src')}:{m.group('ln')}", int(m.group("code")))
    elif not any(k in raw for k in ("WARN", " -> ", "failure", "NCCL error", "nccl", "atchdog", "Timed out",
                                  "<warn>", "Timeout", "NET/", "socket", "shared memory", "posix_fallocate",
                                  "NVLink SHARP", "Mismatched")):
        return None
    else:
        found = _classify(file, lineno, raw)
    if found is None:
        return None
    p = found
    hm = _HOST_PREFIX.search(raw)
    if hm:
        p.host = hm.group("host")
    return {"kind": p.kind, "file": p.file, "line": p.line, "text": p.text.strip()[:600], "src": p.src,
            "code": p.code, "host": p.host, "quote": p.quote(raw)}


def _classify(file: str, lineno: int, raw: str) -> Problem | None:
    if "WARN" in raw:
        if (m := _OFI_OLD.search(raw)):
            return Problem("warn", file, lineno, m.group("msg"), f"{m.group('fn')}:{m.group('ln')}")
        if (m := _WARN_SIG.search(raw)):
            return Problem("warn", file, lineno, raw[m.end():].strip(" *"), m.group("src"))
        if (m := _WARN.search(raw)) and (m.group("src") or "NCCL WARN" in raw or _NCCLISH.search(m.group("msg"))):
            src = m.group("src")
            if src is not None and not re.search(r"\.(?:cc|cu|h|c|cpp|hpp):\d+$|^[\w:]+:\d+$|\):\d+$", src):
                src = None  # a timestamp or host prefix, not a source location
            return Problem("warn", file, lineno, m.group("msg").strip(" *"), src)
    if " -> " in raw and (m := _RETURN.search(raw)):
        return Problem("return", file, lineno, raw[m.start():].strip(), f"{m.group('src')}:{m.group('ln')}",
                       int(m.group("code")))
    if "failure" in raw and (m := _TEST.search(raw)):
        return Problem("test", file, lineno, m.group("msg"), m.group("src"))
    if (m := _TORCH.search(raw)):
        if m.group("cuda"):
            return Problem("torch", file, lineno, m.group("cuda"))
        if m.group("res"):
            code = next((k for k, (name, _w) in RESULT_CODES.items() if name == m.group("res")), None)
            return Problem("torch", file, lineno, f"{m.group('res')}: {m.group('rmsg')}".rstrip(": "), None, code)
        return Problem("torch", file, lineno, m.group("msg"), m.group("src"))
    if (m := _TIMEOUT.search(raw)):
        return Problem("timeout", file, lineno, raw[m.start():].strip())
    if "<warn>" in raw and (m := _LIBFABRIC.search(raw)):
        return Problem("libfabric", file, lineno, m.group("msg"), m.group("where"))
    if "NCCL INFO" not in raw and (m := _BARE.search(raw)):
        return Problem("warn", file, lineno, raw[m.start():].strip(" *`"))
    return None


def last_error(file: str, lineno: int, raw: str) -> dict[str, Any] | None:
    """The line after PyTorch's ``Last error:``: NCCL's last WARN text, without its prefix or WARN token
    (``Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 2000``)."""
    text = re.sub(r"^\s*(?:\[rank\d+\]:\s*)?", "", raw).strip()
    if not text:
        return None
    p = Problem("warn", file, lineno, text)
    return {"kind": p.kind, "file": p.file, "line": p.line, "text": text[:600], "src": None, "code": None,
            "host": None, "quote": p.quote(raw)}


def subsystem(src: str | None, text: str = "") -> str:
    """Which part of NCCL a source location (or, without one, the message) belongs to."""
    s = (src or "").lower()
    t = text
    table = (
        (("nvls",), "NVLS/multicast"),
        (("net_ib", "ib_plugin", "ibvwrap", "ibvcore", "net/ib"), "net/IB"),
        (("net_socket",), "net/socket"),
        (("ofi", "libfabric"), "the aws-ofi-nccl plugin"),
        (("shm",), "shared memory"),
        (("p2p",), "P2P/CUMEM"),
        (("socket", "bootstrap"), "bootstrap/socket"),
        (("proxy",), "proxy"),
        (("graph/", "topo", "xml", "nvmlwrap"), "init/topology"),
        (("enqueue", "group.cc", "collectives"), "enqueue/kernel launch"),
        (("alloc",), "memory allocation"),
        (("transport/net.cc", "include/net.h"), "net transport"),
        (("init.cc",), "init"),
        (("common.cu",), "nccl-tests"),
        (("processgroupnccl", "ncclutils"), "PyTorch ProcessGroupNCCL"),
    )
    for keys, name in table:
        if any(k in s for k in keys):
            return name
    for key, name in (("NET/OFI", "the aws-ofi-nccl plugin"), ("NET/IB", "net/IB"), ("NVLS", "NVLS/multicast"),
                      ("NET/Socket", "net/socket"), ("Bootstrap", "bootstrap/socket"), ("Proxy", "proxy")):
        if key in t:
            return name
    return "NCCL"


#: What usually causes an error in each part of NCCL (NCCL's troubleshooting guide), for the answer to an
#: error no signature explains.
USUAL_CAUSES = {
    "bootstrap/socket": "no route between the nodes on the interface NCCL picked (NCCL_SOCKET_IFNAME, container "
                        "bridges such as docker0), a firewall, or a peer process that died",
    "net/socket": "no route between the nodes on the interface NCCL picked (NCCL_SOCKET_IFNAME), a firewall, or a "
                  "peer process that died",
    "net/IB": "a link, cable or switch problem, the wrong GID index on RoCE (NCCL_IB_GID_INDEX), or GPUDirect RDMA "
              "memory registration (nvidia-peermem, PCIe ACS/IOMMU)",
    "the aws-ofi-nccl plugin": "the EFA device not visible in the container, an old libfabric/EFA installer, or a "
                                 "security group that does not allow all traffic to and from itself",
    "shared memory": "/dev/shm too small in a container (Docker's default is 64 MB: --shm-size or --ipc=host)",
    "P2P/CUMEM": "GPUs that cannot map each other's memory: PCIe ACS/IOMMU, a VM without P2P, or consumer GPUs",
    "NVLS/multicast": "the Fabric Manager / NVSwitch state (nvidia-fabricmanager not running, restarted without a "
                      "GPU reset)",
    "proxy": "an error on a peer: the proxy thread passes on what failed elsewhere",
    "init/topology": "a partial /sys in a VM or container, or GPUs hidden from NVML",
    "enqueue/kernel launch": "an NCCL build without kernels for this GPU, or a CUDA error from earlier work",
    "memory allocation": "GPU memory exhausted when NCCL allocated its buffers",
    "net transport": "the network plugin or transport beneath it failed",
    "init": "an earlier error on this or another rank",
    "nccl-tests": "see the NCCL WARN lines (rerun with NCCL_DEBUG=WARN if there are none)",
    "PyTorch ProcessGroupNCCL": "see the NCCL WARN lines (rerun with NCCL_DEBUG=WARN if there are none)",
    "NCCL": "rerun with NCCL_DEBUG=INFO to see where it came from",
}
