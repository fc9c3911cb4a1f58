"""What a GPU can do at most: dense datasheet peaks per precision, HBM bandwidth, and link speeds.

A Kineto trace names its GPU (``deviceProperties[].name``) and counts its SMs (``numSms``; compute
units on AMD) but records no clock and no bandwidth, so every roofline ceiling and every MFU
denominator comes from this table (``shared/notes/roofline_occupancy.md`` §5).

Conventions, fixed for every entry:

* **Dense** peaks. NVIDIA datasheets print tensor-core numbers *with 2:4 sparsity* (marked ``*``,
  "1/2 lower without sparsity"); the table holds half of those. B200 material prints both.
* ``peak_flops[p]`` is the rate a matrix multiply in precision ``p`` can reach: tensor/matrix cores
  for bf16, fp16, tf32, fp8, int8 (and fp64 where the GPU has FP64 tensor cores); for ``fp32`` it is
  the rate an FP32 GEMM gets *without* TF32 (NVIDIA: CUDA cores; AMD CDNA: the FP32 matrix rate).
* ``vector_flops`` is the plain FP32 rate (CUDA cores / SIMD lanes). It is the compute ceiling of
  elementwise, reduction, normalisation and softmax ops, because PyTorch computes those in FP32 even
  for bf16/fp16 tensors (``at::opmath_type``).
* Per *device PyTorch sees*: an MI250X is two GCDs and PyTorch shows each as its own device with
  110 CUs, so the MI250X row is one GCD (half the per-package datasheet numbers).
* Units: FLOP/s and bytes/s (1 GB = 1e9 B). TFLOP/s in prose = 1e12 FLOP/s.

``resolve_device`` picks the row from the trace's name and SM count (``NVIDIA H100 80GB HBM3`` with
132 SMs is the SXM part, ``NVIDIA H100 PCIe`` has 114); a ``--device-spec`` file (JSON or TOML)
overrides or extends the table. ``LINKS`` lists interconnect peaks for bus-bandwidth comparisons.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import tomllib

from traceread.errors import TraceReadError

#: Precisions the table knows, in the order reports list them.
PRECISIONS: tuple[str, ...] = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8")

T = 1e12  # TFLOP/s -> FLOP/s
G = 1e9  # GB/s -> B/s


@dataclass(frozen=True)
class DeviceSpec:
    """One GPU model (one PyTorch device) and its dense datasheet ceilings.

    ``peak_flops`` maps a precision (:data:`PRECISIONS`) to the dense matrix-multiply peak in FLOP/s;
    a precision the hardware lacks is absent. ``vector_flops`` is the plain FP32 rate (ceiling for
    elementwise/reduction/norm ops). ``hbm_bytes_per_s`` is the datasheet memory bandwidth.
    """

    name: str  # family, e.g. "NVIDIA H100"
    variant: str  # the exact part, e.g. "H100 SXM5 80GB"
    num_sms: int | None
    peak_flops: dict[str, float]
    hbm_bytes_per_s: float
    vector_flops: float | None = None
    vendor: str = "nvidia"  # "nvidia" | "amd" | "other"
    link: str | None = None  # key in LINKS of the intra-node GPU link
    memory_bytes: float | None = None  # nominal HBM capacity, used only to tell variants apart
    source: str = ""  # where the numbers come from
    confidence: str = "datasheet"  # "datasheet" | "derived" | "low" | "user"

    def peak(self, precision: str) -> float | None:
        """Dense peak FLOP/s for ``precision``, or None when the GPU has no such unit."""
        return self.peak_flops.get(precision)

    @property
    def label(self) -> str:
        """Short name for reports, e.g. ``H100 SXM5 80GB``."""
        return self.variant or self.name

    def unit_name(self, precision: str) -> str:
        """Which unit delivers ``precision`` in words ("tensor core" / "matrix core" / "CUDA cores")."""
        if precision == "fp32" and self.vendor == "nvidia":
            return "CUDA cores"
        if self.vendor == "amd":
            return "matrix core"
        return "tensor core"


def _spec(
    name: str,
    variant: str,
    sms: int | None,
    tflops: dict[str, float],
    hbm_gbps: float,
    *,
    vector_tflops: float | None = None,
    vendor: str = "nvidia",
    link: str | None = None,
    memory_gb: float | None = None,
    source: str,
    confidence: str = "datasheet",
) -> DeviceSpec:
    peaks = {p: v * T for p, v in tflops.items()}
    vec = (vector_tflops if vector_tflops is not None else tflops.get("fp32"))
    return DeviceSpec(
        name=name,
        variant=variant,
        num_sms=sms,
        peak_flops=peaks,
        hbm_bytes_per_s=hbm_gbps * G,
        vector_flops=vec * T if vec is not None else None,
        vendor=vendor,
        link=link,
        memory_bytes=memory_gb * 1e9 if memory_gb is not None else None,
        source=source,
        confidence=confidence,
    )


_H100_SXM = {"fp64": 66.9, "fp32": 66.9, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4, "fp8": 1978.9,
             "int8": 1978.9}
_H100_NVL = {"fp64": 60.0, "fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5, "fp8": 1670.5,
             "int8": 1670.5}
_A100 = {"fp64": 19.5, "fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0, "int8": 624.0}
_CDNA2_104 = {"fp64": 45.3, "fp32": 45.3, "bf16": 181.0, "fp16": 181.0, "int8": 181.0}
_CDNA3 = {"fp64": 163.4, "fp32": 163.4, "tf32": 653.7, "bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9,
          "int8": 2614.9}

_HOPPER_SRC = "NVIDIA H100 datasheet/Hopper whitepaper (sparse figures halved)"

#: Every built-in GPU, keyed by a stable id (also accepted as ``base`` in a ``--device-spec`` file).
DEVICES: dict[str, DeviceSpec] = {
    "v100-sxm2": _spec("NVIDIA V100", "V100 SXM2", 80, {"fp64": 7.8, "fp32": 15.7, "fp16": 125.0}, 900,
                       link="nvlink2", memory_gb=32,
                       source="Volta whitepaper; 125 TFLOP/s FP16 tensor at 1530 MHz"),
    "v100-pcie": _spec("NVIDIA V100", "V100 PCIe", 80, {"fp64": 7.0, "fp32": 14.0, "fp16": 112.0}, 900,
                       link="pcie3", memory_gb=32, source="Volta whitepaper (1380 MHz PCIe part)"),
    "v100s-pcie": _spec("NVIDIA V100S", "V100S PCIe", 80, {"fp64": 8.2, "fp32": 16.4, "fp16": 130.0}, 1134,
                        link="pcie3", memory_gb=32, source="NVIDIA V100S datasheet"),
    "a100-sxm-40gb": _spec("NVIDIA A100", "A100 SXM4 40GB", 108, _A100, 1555, link="nvlink3", memory_gb=40,
                           source="NVIDIA A100 datasheet r4 (sparse figures halved)"),
    "a100-sxm-80gb": _spec("NVIDIA A100", "A100 SXM4 80GB", 108, _A100, 2039, link="nvlink3", memory_gb=80,
                           source="NVIDIA A100 datasheet r4 (sparse figures halved)"),
    "a100-pcie-40gb": _spec("NVIDIA A100", "A100 PCIe 40GB", 108, _A100, 1555, link="pcie4", memory_gb=40,
                            source="NVIDIA A100 datasheet r4 (sparse figures halved)"),
    "a100-pcie-80gb": _spec("NVIDIA A100", "A100 PCIe 80GB", 108, _A100, 1935, link="pcie4", memory_gb=80,
                            source="NVIDIA A100 datasheet r4 (sparse figures halved)"),
    "a10": _spec("NVIDIA A10", "A10", 72, {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0,
                                           "int8": 250.0}, 600, link="pcie4", memory_gb=24,
                 source="NVIDIA A10 datasheet (sparse figures halved)"),
    "a10g": _spec("NVIDIA A10G", "A10G (AWS)", 80, {"fp32": 35.0, "tf32": 35.0, "bf16": 70.0, "fp16": 70.0,
                                                     "int8": 140.0}, 600, link="pcie4", memory_gb=24,
                  source="no NVIDIA datasheet; 80 SMs x 512 FLOP/SM/clk x ~1.71 GHz (GA10x); AWS G5: 600 GB/s",
                  confidence="low"),
    "l4": _spec("NVIDIA L4", "L4", 58, {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0,
                                        "fp8": 242.5, "int8": 242.5}, 300, link="pcie4", memory_gb=24,
                source="NVIDIA L4 datasheet (sparse figures halved)"),
    "l40s": _spec("NVIDIA L40S", "L40S", 142, {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05,
                                               "fp8": 733.0, "int8": 733.0}, 864, link="pcie4", memory_gb=48,
                  source="NVIDIA L40S datasheet (dense columns)"),
    "h100-sxm": _spec("NVIDIA H100", "H100 SXM5 80GB", 132, _H100_SXM, 3350, link="nvlink4", memory_gb=80,
                      source=_HOPPER_SRC),
    "h100-pcie": _spec("NVIDIA H100", "H100 PCIe 80GB", 114,
                       {"fp64": 51.0, "fp32": 51.0, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0,
                        "fp8": 1513.0, "int8": 1513.0}, 2000, link="pcie5", memory_gb=80, source=_HOPPER_SRC),
    "h100-nvl": _spec("NVIDIA H100", "H100 NVL 94GB", 132, _H100_NVL, 3900, link="nvlink-bridge-600",
                      memory_gb=94, source="NVIDIA H100 NVL datasheet (sparse figures halved)"),
    "h200-sxm": _spec("NVIDIA H200", "H200 SXM 141GB", 132, _H100_SXM, 4800, link="nvlink4", memory_gb=141,
                      source="NVIDIA H200 datasheet: H100 SXM compute, 4.8 TB/s HBM3e"),
    "h200-nvl": _spec("NVIDIA H200", "H200 NVL 141GB", 132, _H100_NVL, 4800, link="nvlink-bridge-900",
                      memory_gb=141, source="NVIDIA H200 NVL datasheet (sparse figures halved)"),
    "gh200-96gb": _spec("NVIDIA GH200", "GH200 96GB HBM3", 132, _H100_SXM, 4000, link="nvlink4", memory_gb=96,
                        source="NVIDIA GH200 datasheet: H100 SXM compute, 4 TB/s HBM3"),
    "gh200-144gb": _spec("NVIDIA GH200", "GH200 144GB HBM3e", 132, _H100_SXM, 4900, link="nvlink4", memory_gb=144,
                         source="NVIDIA GH200 datasheet: H100 SXM compute, 4.9 TB/s HBM3e"),
    "h800-sxm": _spec("NVIDIA H800", "H800 SXM5 80GB", 132, _H100_SXM, 3350, link="nvlink-h800", memory_gb=80,
                      source="H100 SXM compute; export part with 400 GB/s NVLink"),
    "b200": _spec("NVIDIA B200", "B200 (HGX, 1000 W)", 148,
                  {"fp64": 40.0, "fp32": 80.0, "tf32": 1100.0, "bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0,
                   "int8": 4500.0}, 8000, link="nvlink5", memory_gb=180,
                  source="NVIDIA Blackwell datasheet, HGX B200 dense column"),
    "gb200": _spec("NVIDIA GB200", "GB200 (per GPU, 1200 W)", None,
                   {"fp64": 45.0, "fp32": 90.0, "tf32": 1250.0, "bf16": 2500.0, "fp16": 2500.0, "fp8": 5000.0,
                    "int8": 5000.0}, 8000, link="nvlink5", memory_gb=186,
                   source="NVIDIA Blackwell datasheet, GB200 dense column halved per GPU"),
    "rtx-2080-ti": _spec("NVIDIA GeForce RTX 2080 Ti", "RTX 2080 Ti", 68,
                         {"fp64": 0.42, "fp32": 13.4, "fp16": 53.8, "int8": 215.2}, 616, link="pcie3",
                         memory_gb=11,
                         source="Turing whitepaper (1545 MHz): FP16 tensor with FP32 accumulate (what "
                                "PyTorch uses) is half rate on GeForce"),
    "quadro-gp100": _spec("NVIDIA Quadro GP100", "Quadro GP100", 56,
                          {"fp64": 5.2, "fp32": 10.3, "fp16": 20.7}, 717, link="pcie3", memory_gb=16,
                          source="NVIDIA Quadro GP100 datasheet (Pascal, no tensor cores; FP16 at 2x FP32)"),
    "mi210": _spec("AMD Instinct MI210", "MI210", 104, _CDNA2_104, 1638.4, vector_tflops=22.6, vendor="amd",
                   link="xgmi-mi200", memory_gb=64, source="AMD MI210 datasheet (1.7 GHz)"),
    "mi250-gcd": _spec("AMD Instinct MI250", "MI250 (one GCD)", 104, _CDNA2_104, 1638.4, vector_tflops=22.6,
                       vendor="amd", link="xgmi-mi200", memory_gb=64,
                       source="AMD MI250 datasheet halved per GCD (PyTorch sees each GCD as a device)"),
    "mi250x-gcd": _spec("AMD Instinct MI250X", "MI250X (one GCD)", 110,
                        {"fp64": 47.9, "fp32": 47.9, "bf16": 191.5, "fp16": 191.5, "int8": 191.5}, 1638.4,
                        vector_tflops=23.9, vendor="amd", link="xgmi-mi200", memory_gb=64,
                        source="AMD MI250X datasheet halved per GCD (PyTorch sees each GCD as a device)"),
    "mi300a": _spec("AMD Instinct MI300A", "MI300A", 228,
                    {"fp64": 122.6, "fp32": 122.6, "tf32": 490.3, "bf16": 980.6, "fp16": 980.6, "fp8": 1961.2,
                     "int8": 1961.2}, 5300, vendor="amd", link="infinity-fabric-mi300", memory_gb=128,
                    source="AMD MI300A datasheet (dense)"),
    "mi300x": _spec("AMD Instinct MI300X", "MI300X", 304, _CDNA3, 5300, vendor="amd",
                    link="infinity-fabric-mi300", memory_gb=192,
                    source="ROCm docs gpu-arch/mi300: 2048 FLOP/clk/CU x 304 CUs x 2.1 GHz"),
    "mi325x": _spec("AMD Instinct MI325X", "MI325X", 304, _CDNA3, 6000, vendor="amd",
                    link="infinity-fabric-mi300", memory_gb=256,
                    source="AMD MI325X datasheet: MI300X compute, 6 TB/s HBM3e"),
}


@dataclass(frozen=True)
class LinkSpec:
    """Peak of one interconnect, per GPU. NCCL bus bandwidth is compared with ``per_direction``."""

    name: str
    per_direction_bytes_per_s: float
    bidirectional_bytes_per_s: float
    note: str


def _link(name: str, per_dir_gbps: float, note: str) -> LinkSpec:
    return LinkSpec(name, per_dir_gbps * G, 2 * per_dir_gbps * G, note)


#: Interconnect peaks per GPU (GB = 1e9 B). nccl-tests busbw measures the bottleneck link in one
#: direction, so compare it with ``per_direction_bytes_per_s``; datasheets quote bidirectional sums.
LINKS: dict[str, LinkSpec] = {
    "nvlink2": _link("NVLink 2 (V100)", 150.0, "6 links x 25 GB/s/dir; datasheet 300 GB/s bidirectional"),
    "nvlink3": _link("NVLink 3 (A100)", 300.0, "12 links x 25 GB/s/dir; datasheet 600 GB/s bidirectional"),
    "nvlink4": _link("NVLink 4 (H100/H200)", 450.0, "18 links x 25 GB/s/dir; datasheet 900 GB/s bidirectional"),
    "nvlink5": _link("NVLink 5 (B200/GB200)", 900.0, "18 links x 50 GB/s/dir; datasheet 1.8 TB/s bidirectional"),
    "nvlink-h800": _link("NVLink (H800 export part)", 200.0, "8 links; datasheet 400 GB/s bidirectional"),
    "nvlink-bridge-600": _link("NVLink bridge (H100 NVL, A100 PCIe)", 300.0, "600 GB/s bidirectional bridge"),
    "nvlink-bridge-900": _link("NVLink bridge (H200 NVL)", 450.0, "900 GB/s bidirectional bridge"),
    "pcie3": _link("PCIe 3.0 x16", 15.75, "8 GT/s x 16 lanes, 128b/130b"),
    "pcie4": _link("PCIe 4.0 x16", 31.5, "16 GT/s x 16 lanes"),
    "pcie5": _link("PCIe 5.0 x16", 63.0, "32 GT/s x 16 lanes"),
    "xgmi-mi200": _link("Infinity Fabric (MI200)", 50.0, "per xGMI link 50 GB/s/dir; topology-dependent"),
    "infinity-fabric-mi300": _link("Infinity Fabric (MI300)", 448.0,
                                   "7 links x 64 GB/s/dir to the 7 peers (896 GB/s aggregate bidirectional)"),
    "ib-hdr": _link("InfiniBand HDR 200 Gb/s NIC", 25.0, "one NIC per GPU in DGX A100"),
    "ib-ndr": _link("InfiniBand NDR 400 Gb/s NIC", 50.0, "one ConnectX-7 per GPU in DGX/HGX H100, H200, B200"),
    "ib-xdr": _link("InfiniBand XDR 800 Gb/s NIC", 100.0, "ConnectX-8"),
    "roce-400g": _link("RoCE 400 GbE NIC", 50.0, "Ethernet at the same line rate as NDR"),
    "efa-p4d": _link("AWS EFA p4d (4 x 100 Gb/s per 8 GPUs)", 6.25, "per GPU share of 400 Gb/s"),
    "efa-p5": _link("AWS EFA p5 (3200 Gb/s per 8 GPUs)", 50.0, "per GPU share of 3.2 Tb/s"),
}

#: Typical inter-node NIC per GPU generation (one NIC per GPU), for a best guess when the run does
#: not say. Inter-node allreduce busbw usually tops out near 90 % of this line rate.
TYPICAL_NIC: dict[str, str] = {
    "NVIDIA A100": "ib-hdr",
    "NVIDIA H100": "ib-ndr",
    "NVIDIA H200": "ib-ndr",
    "NVIDIA B200": "ib-ndr",
    "NVIDIA GB200": "ib-xdr",
    "AMD Instinct MI300X": "roce-400g",
}


@dataclass(frozen=True)
class DeviceMatch:
    """Result of :func:`lookup_device`: the spec (or None) and one line saying why."""

    spec: DeviceSpec | None
    reason: str


# Names that say nothing about the part ("AMD Radeon Graphics" is what ROCm reports for some
# CDNA2 boards): resolved from the SM/CU count alone.
_GENERIC_NAMES = re.compile(r"^(amd radeon graphics|amd radeon|radeon graphics|gpu|cuda gpu)$")

_UNKNOWN_ACCELERATORS = re.compile(r"artemis|mtia|tpu|gaudi|hpu|xpu", re.IGNORECASE)


def _by_name(name: str, num_sms: int | None, mem: float | None) -> tuple[str | None, str]:
    """Built-in key for a ``deviceProperties`` name, using SM count and memory for variants."""
    n = name.lower()

    def big(threshold_gb: float, in_name: str) -> bool:
        if in_name in n:
            return True
        return mem is not None and mem > threshold_gb * 2**30

    if "gb200" in n:
        return "gb200", "name says GB200"
    if "b200" in n:
        return "b200", "name says B200"
    if "gh200" in n:
        return ("gh200-144gb", "GH200 with 144 GB HBM3e") if big(120, "144gb") else ("gh200-96gb", "GH200 96GB")
    if "h800" in n:
        return "h800-sxm", "name says H800"
    if "h200" in n:
        return ("h200-nvl", "name says H200 NVL") if "nvl" in n else ("h200-sxm", "name says H200")
    if "h100" in n:
        if "pcie" in n or num_sms == 114:
            return "h100-pcie", "H100 with PCIe in the name or 114 SMs"
        if "nvl" in n:
            return "h100-nvl", "name says H100 NVL"
        return "h100-sxm", f"H100 with {num_sms or 'unknown'} SMs and no PCIe/NVL in the name is the SXM5 part"
    if "a100" in n:
        pcie = "pcie" in n
        eighty = big(60, "80gb")
        key = f"a100-{'pcie' if pcie else 'sxm'}-{'80gb' if eighty else '40gb'}"
        return key, f"A100 {'PCIe' if pcie else 'SXM4'} {'80' if eighty else '40'}GB from name/memory"
    if "v100s" in n:
        return "v100s-pcie", "name says V100S"
    if "v100" in n:
        if "pcie" in n:
            return "v100-pcie", "name says V100 PCIe"
        return "v100-sxm2", "V100 SXM2/SXM3/DGXS (NVLink parts, 1530 MHz class)"
    if re.search(r"\ba10g\b", n):
        return "a10g", "name says A10G"
    if re.search(r"\ba10\b", n):
        return "a10", "name says A10"
    if "l40s" in n:
        return "l40s", "name says L40S"
    if re.search(r"\bl4\b", n):
        return "l4", "name says L4"
    if "2080 ti" in n:
        return "rtx-2080-ti", "name says RTX 2080 Ti"
    if "gp100" in n:
        return "quadro-gp100", "name says Quadro GP100"
    if "mi325" in n:
        return "mi325x", "name says MI325X"
    if "mi300a" in n:
        return "mi300a", "name says MI300A"
    if "mi300" in n:
        return "mi300x", "name says MI300X"
    if "mi250x" in n:
        return "mi250x-gcd", "name says MI250X (one GCD per PyTorch device)"
    if "mi250" in n:
        return "mi250-gcd", "name says MI250 (one GCD per PyTorch device)"
    if "mi210" in n:
        return "mi210", "name says MI210"
    return None, f"no table entry for device name {name!r}"


def _same_numbers(a: DeviceSpec, b: DeviceSpec) -> bool:
    return (a.peak_flops == b.peak_flops and a.hbm_bytes_per_s == b.hbm_bytes_per_s
            and a.vector_flops == b.vector_flops)


def _by_sms(num_sms: int, mem: float | None, table: dict[str, DeviceSpec]) -> tuple[str | None, str]:
    """Guess from the SM count alone: only when every candidate has the same ceilings."""
    cands = [k for k, s in table.items() if s.num_sms == num_sms]
    if mem is not None and len(cands) > 1:
        # Nominal capacities are GB; totalGlobalMem is a little under them (GiB vs GB, reserved).
        # The closest nominal capacity wins (within 25 %).
        ratios = {k: abs(mem / table[k].memory_bytes - 1.0) for k in cands  # type: ignore[operator]
                  if table[k].memory_bytes}
        fits = sorted((r, k) for k, r in ratios.items() if r <= 0.25)
        if fits:
            best = fits[0][0]
            cands = [k for r, k in fits if r == best]
    if not cands:
        return None, f"no GPU in the table has {num_sms} SMs"
    first = table[cands[0]]
    if all(_same_numbers(first, table[k]) for k in cands[1:]):
        how = f"{num_sms} SMs" + (f" and {mem / 2**30:.0f} GiB memory" if mem is not None else "")
        return cands[0], f"guessed from {how} (all candidates have the same ceilings: {', '.join(cands)})"
    return None, f"{num_sms} SMs fit several GPUs with different ceilings ({', '.join(cands)}); pass --device-spec"


def lookup_device(
    name: str | None,
    num_sms: int | None,
    spec_file: Path | None = None,
    *,
    total_mem_bytes: float | None = None,
) -> DeviceMatch:
    """Find the spec of the GPU a trace ran on, with the reason for the choice.

    Order: a ``spec_file`` entry whose ``match`` patterns fit the name; a ``spec_file`` entry without
    ``match`` (applies to every device; fields it omits come from the built-in row, or from its
    ``base``); the built-in table by name (variant by SM count and memory); for an empty or generic
    name, the SM count alone when every GPU with that count has the same ceilings.
    """
    user = load_spec_file(spec_file) if spec_file is not None else []
    clean = (name or "").strip()
    lowered = clean.lower()
    for entry in user:
        pats = entry.get("match") or []
        if any(p.lower() in lowered for p in pats) and clean:
            return DeviceMatch(_build_user_spec(entry, None, spec_file), f"matched {spec_file} entry {entry['name']!r}")

    builtin: DeviceSpec | None = None
    reason: str
    if clean and _UNKNOWN_ACCELERATORS.search(clean):
        reason = f"{clean!r} is not a GPU with a known datasheet (MTIA/TPU/other accelerator)"
    elif clean and not _GENERIC_NAMES.match(lowered):
        key, reason = _by_name(clean, num_sms, total_mem_bytes)
        builtin = DEVICES[key] if key else None
    elif num_sms:
        key, reason = _by_sms(int(num_sms), total_mem_bytes, DEVICES)
        builtin = DEVICES[key] if key else None
        if not clean:
            reason = "empty device name; " + reason
    else:
        reason = "the trace names no device and records no SM count"

    unconditional = [e for e in user if not e.get("match")]
    if unconditional:
        entry = unconditional[-1]
        spec = _build_user_spec(entry, builtin, spec_file)
        return DeviceMatch(spec, f"{spec_file} overrides the table" + (f" ({reason})" if builtin else ""))
    return DeviceMatch(builtin, reason)


def resolve_device(
    name: str | None,
    num_sms: int | None,
    spec_file: Path | None = None,
    *,
    total_mem_bytes: float | None = None,
) -> DeviceSpec | None:
    """The :class:`DeviceSpec` for a trace's device, or None (see :func:`lookup_device` for why)."""
    return lookup_device(name, num_sms, spec_file, total_mem_bytes=total_mem_bytes).spec


def device_for_meta(meta: Any, spec_file: Path | None = None) -> DeviceMatch:
    """Resolve the device of a :class:`traceread.model.RankMeta` (name, numSms, totalGlobalMem)."""
    mem = None
    entry: dict[str, Any] | None = None
    devices = [d for d in (getattr(meta, "devices", None) or []) if isinstance(d, dict)]
    for dev in devices:
        if meta.device_id is None or dev.get("id") == meta.device_id:
            entry = dev
            break
    if entry is not None:
        m = entry.get("totalGlobalMem")
        mem = float(m) if isinstance(m, (int, float)) and not isinstance(m, bool) else None
    name = meta.device_name
    num_sms = meta.num_sms
    if name is None and devices:
        # The reader turns "" into None; a generic/empty name still resolves by SM count, and a
        # trace whose kernels name no device (MTIA) still names its one accelerator.
        raw = entry.get("name") if entry is not None else None
        name = raw if isinstance(raw, str) else ""
        if num_sms is None and entry is not None and isinstance(entry.get("numSms"), int):
            num_sms = entry["numSms"]
    return lookup_device(name, num_sms, spec_file, total_mem_bytes=mem)


# ------------------------------------------------------------------------------------------------
# --device-spec files


def load_spec_file(path: Path) -> list[dict[str, Any]]:
    """Read a ``--device-spec`` file (JSON or TOML) into a list of device entries.

    Accepted shapes: one device table; ``{"devices": [...]}`` (TOML ``[[devices]]``); or the
    TraceLens arch format ``{"mem_bw_gbps": ..., "max_achievable_tflops": {"matrix_bf16": ...}}``.
    Entry fields: ``name``, ``match`` (str or list of name substrings), ``base`` (a built-in key),
    ``num_sms``, ``hbm_gbps``, ``peak_tflops`` ({precision: TFLOP/s}), ``vector_tflops``, ``link``.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise TraceReadError(f"cannot read device spec: {exc.strerror or exc}", str(path)) from None
    try:
        if path.suffix.lower() == ".toml":
            doc: Any = tomllib.loads(text)
        else:
            try:
                doc = json.loads(text)
            except json.JSONDecodeError:
                doc = tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise TraceReadError(f"device spec is neither valid JSON nor TOML ({exc})", str(path)) from None
    if not isinstance(doc, dict):
        raise TraceReadError("device spec must be a table/object", str(path))
    entries = doc.get("devices", doc.get("device", [doc]))
    if isinstance(entries, dict):
        entries = [entries]
    if not isinstance(entries, list) or not entries:
        raise TraceReadError("device spec has no device entries", str(path))
    out = [_normalise_entry(e, path, i) for i, e in enumerate(entries)]
    return out


def _normalise_entry(entry: Any, path: Path, index: int) -> dict[str, Any]:
    if not isinstance(entry, dict):
        raise TraceReadError(f"device entry {index} is not a table", str(path))
    e = dict(entry)
    if "max_achievable_tflops" in e or "mem_bw_gbps" in e:  # TraceLens arch JSON
        tl = e.get("max_achievable_tflops") or {}
        if not isinstance(tl, dict):
            raise TraceReadError("max_achievable_tflops must be a table", str(path))
        peaks = {k.split("_", 1)[1]: v for k, v in tl.items() if k.startswith("matrix_") and "_" in k}
        vec = tl.get("vector_fp32")
        e.setdefault("peak_tflops", peaks)
        if vec is not None:
            e.setdefault("vector_tflops", vec)
        if "mem_bw_gbps" in e:
            e.setdefault("hbm_gbps", e["mem_bw_gbps"])
        e.setdefault("name", path.stem)
    match = e.get("match")
    if isinstance(match, str):
        e["match"] = [match]
    elif match is not None and not (isinstance(match, list) and all(isinstance(m, str) for m in match)):
        raise TraceReadError(f"device entry {index}: match must be a string or list of strings", str(path))
    base = e.get("base")
    if base is not None and base not in DEVICES:
        raise TraceReadError(f"device entry {index}: unknown base {base!r} (known: {', '.join(DEVICES)})", str(path))
    peaks = e.get("peak_tflops", {})
    if not isinstance(peaks, dict):
        raise TraceReadError(f"device entry {index}: peak_tflops must be a table", str(path))
    for k, v in peaks.items():
        if k not in PRECISIONS:
            raise TraceReadError(f"device entry {index}: unknown precision {k!r} (known: {', '.join(PRECISIONS)})",
                                 str(path))
        if not isinstance(v, (int, float)) or v <= 0:
            raise TraceReadError(f"device entry {index}: peak_tflops.{k} must be a positive number", str(path))
    for k in ("hbm_gbps", "vector_tflops", "num_sms"):
        v = e.get(k)
        if v is not None and (not isinstance(v, (int, float)) or v <= 0):
            raise TraceReadError(f"device entry {index}: {k} must be a positive number", str(path))
    e.setdefault("name", e.get("base") or f"device {index}")
    return e


def _build_user_spec(entry: dict[str, Any], fallback: DeviceSpec | None, path: Path | None) -> DeviceSpec:
    base = DEVICES[entry["base"]] if entry.get("base") else fallback
    peaks = dict(base.peak_flops) if base else {}
    peaks.update({k: float(v) * T for k, v in entry.get("peak_tflops", {}).items()})
    hbm = entry.get("hbm_gbps")
    if hbm is None and base is None:
        raise TraceReadError(f"device {entry['name']!r} needs hbm_gbps (or a base)", str(path) if path else None)
    if not peaks:
        raise TraceReadError(f"device {entry['name']!r} needs peak_tflops (or a base)", str(path) if path else None)
    vec = entry.get("vector_tflops")
    spec = DeviceSpec(
        name=str(entry.get("name")),
        variant=str(entry.get("variant", entry.get("name"))),
        num_sms=int(entry["num_sms"]) if entry.get("num_sms") else (base.num_sms if base else None),
        peak_flops=peaks,
        hbm_bytes_per_s=float(hbm) * G if hbm is not None else base.hbm_bytes_per_s,  # type: ignore[union-attr]
        vector_flops=float(vec) * T if vec is not None else (base.vector_flops if base else peaks.get("fp32")),
        vendor=str(entry.get("vendor", base.vendor if base else "other")),
        link=entry.get("link", base.link if base else None),
        memory_bytes=base.memory_bytes if base else None,
        source=f"user device spec {path}" + (f" over {base.variant}" if base else ""),
        confidence="user",
    )
    return spec


def with_overrides(spec: DeviceSpec, **changes: Any) -> DeviceSpec:
    """A copy of ``spec`` with fields replaced (tests and what-if analyses)."""
    return replace(spec, **changes)


# ------------------------------------------------------------------------------------------------
# the link a transfer used


@dataclass(frozen=True)
class LinkChoice:
    """The link one group's transfers crossed and its per-direction peak (busbw is compared with it).

    ``kind``: ``nvlink`` (NVLink / NVSwitch inside a node), ``xgmi`` (AMD Infinity Fabric), ``pcie``
    (GPUs without a GPU-to-GPU link), ``network`` (the NIC, across nodes), ``host`` (gloo: CPU memory
    and TCP, no GPU link at all); None when unknown. ``source`` says what decided it."""

    kind: str | None
    key: str | None
    peak_gbps: float | None
    name: str
    source: str


def _link_kind(key: str) -> str:
    if key.startswith("nvlink"):
        return "nvlink"
    if key.startswith("pcie"):
        return "pcie"
    return "xgmi" if key.startswith(("xgmi", "infinity")) else "network"


def intra_node_choice(device_name: str | None, num_sms: int | None = None) -> LinkChoice:
    """The GPU-to-GPU link inside one node, from the device table (``DeviceSpec.link``)."""
    spec = lookup_device(device_name, num_sms).spec if device_name else None
    key = getattr(spec, "link", None)
    if not key or key not in LINKS:
        return LinkChoice(None, None, None, "unknown intra-node link", f"device {device_name or '?'} not in the table")
    return LinkChoice(_link_kind(key), key, LINKS[key].per_direction_bytes_per_s / G, LINKS[key].name,
                      f"{spec.variant if spec else device_name}: {LINKS[key].note}")


def network_choice(device_name: str | None, nccl: dict[str, Any] | None = None) -> LinkChoice:
    """The NIC the group's inter-node transfers used: what the NCCL log says (``Using network``,
    ``NET/IB`` devices, the OFI provider), else the usual NIC of the GPU generation (one per GPU)."""
    net = str((nccl or {}).get("network") or "").lower()
    devs = " ".join(str(d) for d in (nccl or {}).get("ib_devices") or []).lower()
    provider = str((nccl or {}).get("ofi_provider") or (nccl or {}).get("net_plugin") or "").lower()
    spec = resolve_device(device_name, None) if device_name else None
    family = spec.name if spec else None
    if "socket" in net:
        return LinkChoice("network", None, None, "TCP sockets (NET/Socket)",
                          "NCCL log: inter-node traffic over sockets; no meaningful line rate")
    if "efa" in net or "efa" in provider or "libfabric" in net or "ofi" in net:
        key = "efa-p4d" if family == "NVIDIA A100" else "efa-p5"
        return LinkChoice("network", key, LINKS[key].per_direction_bytes_per_s / G, LINKS[key].name,
                          "NCCL log: AWS EFA (libfabric)")
    if "ib" in net or devs:
        if "roce" in devs:
            key = "roce-400g"
        else:
            key = TYPICAL_NIC.get(family or "", "ib-ndr")
            key = key if key.startswith("ib") else "ib-ndr"
        return LinkChoice("network", key, LINKS[key].per_direction_bytes_per_s / G, LINKS[key].name,
                          "NCCL log: " + ("RoCE" if "roce" in devs else "InfiniBand") + " (NET/IB)"
                          + (f"; rate of the usual NIC of {family}" if family else ""))
    usual = TYPICAL_NIC.get(family or "")
    if usual:
        return LinkChoice("network", usual, LINKS[usual].per_direction_bytes_per_s / G, LINKS[usual].name,
                          f"the usual NIC of {family} (no NCCL log says which)")
    return LinkChoice("network", None, None, "network", "no NCCL log and no usual NIC for this device")


def transfer_link(*, spans_nodes: bool | None, backend: str | None, device_name: str | None,
                  num_sms: int | None = None, nccl: dict[str, Any] | None = None,
                  network_gbps: float | None = None) -> LinkChoice:
    """The link a group's collectives or point-to-point transfers used: gloo moves tensors through
    host memory and TCP (no GPU link, no peak), a group over several nodes crosses the NIC, a group
    inside one node the GPUs' own link. ``network_gbps`` overrides the NIC's peak when the caller
    knows it better."""
    if backend == "gloo":
        where = "TCP between hosts" if spans_nodes else "host memory and loopback TCP"
        return LinkChoice("host", None, None, f"gloo ({where})", "gloo runs collectives on the CPU")
    if spans_nodes:
        nic = network_choice(device_name, nccl)
        if network_gbps is not None:
            return replace(nic, peak_gbps=network_gbps)
        return nic
    return intra_node_choice(device_name, num_sms)


__all__ = [
    "DEVICES",
    "LINKS",
    "LinkChoice",
    "intra_node_choice",
    "network_choice",
    "transfer_link",
    "PRECISIONS",
    "TYPICAL_NIC",
    "DeviceMatch",
    "DeviceSpec",
    "LinkSpec",
    "device_for_meta",
    "load_spec_file",
    "lookup_device",
    "resolve_device",
    "with_overrides",
]
