"""The device catalogue: dense datasheet peaks per precision, HBM bandwidth and link speeds of every GPU.

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

A leaf (numbers only, no lookup): the analysis (:mod:`traceread.analysis.hardware`: which row a
trace's GPU is, ``--device-spec`` files) and the simulator (:mod:`traceread.simulate.devices`: the
GPUs it pretends to run on) read the same rows. ``LINKS`` lists interconnect peaks for
bus-bandwidth comparisons.
"""

from __future__ import annotations

from dataclasses import dataclass

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
_A100_SRC = "NVIDIA A100 datasheet r4 (sparse figures halved)"

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
                           source=_A100_SRC),
    "a100-sxm-80gb": _spec("NVIDIA A100", "A100 SXM4 80GB", 108, _A100, 2039, link="nvlink3", memory_gb=80,
                           source=_A100_SRC),
    "a100-pcie-40gb": _spec("NVIDIA A100", "A100 PCIe 40GB", 108, _A100, 1555, link="pcie4", memory_gb=40,
                            source=_A100_SRC),
    "a100-pcie-80gb": _spec("NVIDIA A100", "A100 PCIe 80GB", 108, _A100, 1935, link="pcie4", memory_gb=80,
                            source=_A100_SRC),
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
