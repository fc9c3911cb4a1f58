"""GPUs the simulator can pretend to run on, with the numbers a real Kineto trace would carry.

``deviceProperties`` fields mirror what libkineto writes (``DeviceProperties.cpp``); SM counts,
peaks and HBM bandwidth are the device catalogue's rows (:mod:`traceread.devices`, dense datasheet
numbers, never the 2:4-sparse ones), the same the analysis divides by. Launch statistics
(``blocks per SM``, ``warps per SM``, ``est. achieved occupancy %``) follow libkineto's formulas so a
simulated kernel looks exactly like one CUPTI recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from traceread.devices import DEVICES as CATALOGUE
from traceread.devices import DeviceSpec, G, T


@dataclass(frozen=True)
class Device:
    """One GPU model: what ``deviceProperties`` says plus the peaks the simulator times kernels with."""

    key: str
    name: str  # as torch.cuda.get_device_name() reports it
    spec: DeviceSpec  # the catalogue row: SMs, dense peaks, HBM bandwidth
    compute_major: int
    compute_minor: int
    total_global_mem: int  # bytes
    shared_mem_per_sm: int
    shared_mem_per_block_optin: int
    nvlink_busbw_gbs: float  # achievable NCCL bus bandwidth inside one node
    arch: str  # "ampere" | "hopper" | "blackwell": picks realistic GEMM kernel names
    max_threads_per_sm: int = 2048
    regs_per_sm: int = 65536
    max_blocks_per_sm: int = 32

    def properties(self, device_id: int) -> dict[str, object]:
        """One ``deviceProperties`` entry, field names and order as libkineto writes them."""
        return {
            "id": device_id,
            "name": self.name,
            "totalGlobalMem": self.total_global_mem,
            "computeMajor": self.compute_major,
            "computeMinor": self.compute_minor,
            "maxThreadsPerBlock": 1024,
            "maxThreadsPerMultiprocessor": self.max_threads_per_sm,
            "regsPerBlock": 65536,
            "warpSize": 32,
            "sharedMemPerBlock": 49152,
            "numSms": self.num_sms,
            "regsPerMultiprocessor": self.regs_per_sm,
            "sharedMemPerBlockOptin": self.shared_mem_per_block_optin,
            "sharedMemPerMultiprocessor": self.shared_mem_per_sm,
        }

    def ridge(self, matmul: bool) -> float:
        """Roofline ridge point (FLOP/byte): matrix ops against the bf16 tensor peak, others the FP32 rate."""
        peak = self.peak_flops if matmul else (self.spec.vector_flops or 0.0)
        return peak / self.spec.hbm_bytes_per_s

    @property
    def num_sms(self) -> int:
        assert self.spec.num_sms is not None, f"{self.key}: the catalogue row has no SM count"
        return self.spec.num_sms

    @property
    def peak_flops(self) -> float:
        """Dense bf16 peak in FLOP/s (the MFU denominator)."""
        return self.spec.peak_flops["bf16"]

    @property
    def peak_bf16_tflops(self) -> float:
        return self.peak_flops / T

    @property
    def mem_bw_gbs(self) -> float:
        """HBM bandwidth, GB/s (1e9 B/s)."""
        return self.spec.hbm_bytes_per_s / G


DEVICES: dict[str, Device] = {
    "H100": Device(
        key="H100",
        name="NVIDIA H100 80GB HBM3",
        spec=CATALOGUE["h100-sxm"],
        compute_major=9,
        compute_minor=0,
        total_global_mem=85_045_477_376,
        shared_mem_per_sm=233_472,
        shared_mem_per_block_optin=232_448,
        nvlink_busbw_gbs=360.0,
        arch="hopper",
    ),
    "A100": Device(
        key="A100",
        name="NVIDIA A100-SXM4-80GB",
        spec=CATALOGUE["a100-sxm-80gb"],
        compute_major=8,
        compute_minor=0,
        total_global_mem=85_097_971_712,
        shared_mem_per_sm=167_936,
        shared_mem_per_block_optin=166_912,
        nvlink_busbw_gbs=230.0,
        arch="ampere",
    ),
    "B200": Device(
        key="B200",
        name="NVIDIA B200",
        spec=CATALOGUE["b200"],
        compute_major=10,
        compute_minor=0,
        total_global_mem=191_514_247_168,
        shared_mem_per_sm=233_472,
        shared_mem_per_block_optin=232_448,
        nvlink_busbw_gbs=720.0,
        arch="blackwell",
    ),
}

#: Achievable per-GPU bus bandwidth of an inter-node NCCL ring (NDR InfiniBand, one NIC per GPU).
INTER_NODE_BUSBW_GBS = 40.0


def get_device(key: str) -> Device:
    """Look a device up by key (case-insensitive: ``h100``, ``A100``, ``b200``)."""
    try:
        return DEVICES[key.upper()]
    except KeyError:
        raise ValueError(f"unknown device {key!r}; choose one of {', '.join(DEVICES)}") from None


@dataclass(frozen=True)
class LaunchStats:
    """The occupancy fields CUPTI/libkineto attach to a kernel."""

    blocks_per_sm: float  # rounded to 6 decimals, as written in the trace
    warps_per_sm: float
    occupancy_pct: int  # "est. achieved occupancy %"


def launch_stats(dev: Device, grid: tuple[int, int, int], block: tuple[int, int, int], regs: int, smem: int) -> LaunchStats:
    """libkineto's numbers for one launch.

    blocks/SM = grid blocks / numSms; warps/SM = blocks/SM x threads / 32;
    occupancy = round(100 x min(active blocks per SM, blocks/SM) x threads / maxThreadsPerSM),
    where active blocks per SM is the CUDA occupancy calculator's limit from threads, registers and
    shared memory (allocation granularities ignored).
    """
    blocks = prod(grid)
    threads = prod(block)
    bps = round(blocks / dev.num_sms, 6)
    warps = round(bps * threads / 32, 6)
    limit = min(dev.max_threads_per_sm // threads, dev.max_blocks_per_sm)
    if regs > 0:
        limit = min(limit, dev.regs_per_sm // (regs * threads))
    if smem > 0:
        limit = min(limit, dev.shared_mem_per_sm // smem)
    occ = round(100 * min(float(limit), blocks / dev.num_sms) * threads / dev.max_threads_per_sm)
    return LaunchStats(bps, warps, int(occ))
