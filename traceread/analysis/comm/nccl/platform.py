"""Which hardware the job ran on, as far as the evidence goes: GPU model, NVLink, NVSwitch, and
whether NVLink SHARP (NVLS) could exist at all.

NVLS needs Hopper or newer GPUs joined by an NVSwitch; NCCL prints ``NVLS multicast support is not
available on dev N`` on every other GPU too (A100, L40S, H100 PCIe), where it means nothing. So the
remark is made only where NVLS could exist, and an unknown GPU is "unknown", never a guess.

Evidence, best first: the traces' ``deviceProperties`` names (passed in by the report), the GPU
names nccl-tests prints, the EC2 instance type aws-ofi-nccl names (``Running on p4d.24xlarge
platform``), and NCCL's own lines (NVLS available: Hopper+NVSwitch; a ``type NVL/`` search pattern
or ``NVL[...]``/``NVS/`` topology lines: NVLink/NVSwitch).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from traceread.analysis import hardware as hw

#: EC2 instance family -> a device name the hardware table resolves (aws-ofi-nccl names the instance).
EC2_GPUS: tuple[tuple[str, str], ...] = (
    ("p6e-gb200", "NVIDIA GB200"), ("p6-b200", "NVIDIA B200"), ("p5en", "NVIDIA H200"), ("p5e", "NVIDIA H200"),
    ("p5", "NVIDIA H100 80GB HBM3"), ("p4de", "NVIDIA A100-SXM4-80GB"), ("p4d", "NVIDIA A100-SXM4-40GB"),
    ("p3", "Tesla V100-SXM2-16GB"), ("g6e", "NVIDIA L40S"), ("g6", "NVIDIA L4"), ("g5", "NVIDIA A10G"),
)
#: Intra-node links of parts that sit on an NVSwitch baseboard (HGX/DGX SXM).
NVSWITCH_LINKS = frozenset({"nvlink3", "nvlink4", "nvlink5", "nvlink-h800"})
#: PCIe parts that take an NVLink bridge (whether one is fitted the name does not say).
BRIDGEABLE = frozenset({"NVIDIA A100", "NVIDIA H100", "NVIDIA H200"})
#: Of the NVSwitch parts, the ones on Hopper or newer, where NVLS exists.
NVLS_LINKS = frozenset({"nvlink4", "nvlink5", "nvlink-h800"})


def gpu_from_platform(platform: str | None) -> str | None:
    if not platform:
        return None
    p = platform.lower()
    return next((name for prefix, name in EC2_GPUS if p.startswith(prefix)), None)


def hardware(devices: Iterable[str], tests_gpus: Iterable[str], platform: str | None, *,
             nvls_available: bool | None, nvlink_hint: bool, nvswitch_hint: bool) -> dict[str, Any]:
    """``{"gpu", "source", "nvlink", "nvswitch", "nvls_possible"}``; each fact True/False/None (unknown)."""
    gpu, source = None, None
    for names, where in ((list(devices), "trace deviceProperties"), (list(tests_gpus), "nccl-tests device list")):
        named = [n for n in names if n]
        if named:
            gpu, source = named[0], where
            break
    if gpu is None and (g := gpu_from_platform(platform)):
        gpu, source = g, f"aws-ofi-nccl platform {platform}"
    spec = hw.resolve_device(gpu, None) if gpu else None
    link = spec.link if spec else None
    nvlink: bool | None = None
    nvswitch: bool | None = None
    nvls: bool | None = None
    if spec is not None and spec.vendor == "nvidia" and link:
        nvlink = True if link.startswith("nvlink") else (None if spec.name in BRIDGEABLE else False)
        nvswitch = link in NVSWITCH_LINKS
        nvls = link in NVLS_LINKS
        if "GH200" in spec.name:
            nvswitch = nvls = None  # one superchip has no NVSwitch; NVL32 racks do
    if nvlink_hint:
        nvlink = True
    if nvswitch_hint:
        nvswitch = True
    if nvls_available:
        nvlink, nvswitch, nvls = True, True, True
    return {"gpu": gpu, "source": source, "nvlink": nvlink, "nvswitch": nvswitch, "nvls_possible": nvls}
