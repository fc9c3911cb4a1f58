"""GPU telemetry while the job runs: clocks, temperature, power, throttle reasons, Xid and error counters.

A thread of the launcher samples every local GPU about once a second into ``RUN/telemetry/gpu{i}.jsonl``
through NVML (``nvidia-ml-py``: ``import pynvml``) or AMD SMI (``amdsmi``). Neither is a dependency:
without one, or without a GPU (the library's init fails), the sampler is off and run.json says why
in one line. It never touches the job: it reads the driver's counters from its own process, and any
error stops the sampler, never the launcher. Record format and field definitions: docs/watch-report.md.

Lines (one JSON object each, ``t_ns`` = wall clock, ns):

* ``{"kind": "gpu", ...}`` once per GPU: name, uuid, PCI bus id, host, maximum SM/memory clock, power limit,
  library and version;
* ``{"kind": "sample", ...}`` each second: ``sm_clock_mhz``, ``mem_clock_mhz``, ``temp_c``, ``power_w``,
  ``power_limit_w``, ``util_pct``, ``throttle`` (decoded reason names, :data:`THROTTLE_BITS`),
  ``throttle_mask``, and where the GPU exposes them ``ecc_corrected``, ``ecc_uncorrected``,
  ``retired_pages``, ``pcie_replay``, ``nvlink_errors`` (cumulative counters);
* ``{"kind": "xid", "xid": N}`` when the driver reports an Xid (NVML critical-error event);
* ``{"kind": "stopped", "why": ...}`` when sampling stops early.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

#: NVML clock-event ("throttle") reason bits → names (nvml.h ``nvmlClocksEventReason*``).
THROTTLE_BITS: dict[int, str] = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting",
}
#: The reasons that lower the clock of a busy GPU below what it could run (idle and settings are not).
SLOWING = ("sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
DEFAULT_INTERVAL_S = 1.0


def decode_throttle(mask: int) -> list[str]:
    """Names of the reason bits set in ``mask`` (unknown bits as ``bit0x...``)."""
    out = [name for bit, name in THROTTLE_BITS.items() if mask & bit]
    rest = mask & ~sum(THROTTLE_BITS)
    bit = 1
    while rest:
        if rest & bit:
            out.append(f"bit{bit:#x}")
            rest &= ~bit
        bit <<= 1
    return out



def _quiet(fn: Callable[..., Any], *args: Any) -> Any:
    """A sensor read that a GPU or driver does not support is None, never an error (the sampler goes on)."""
    try:
        return fn(*args)
    except Exception:
        return None

class _Nvml:
    """NVML through nvidia-ml-py; every optional counter guarded (a GPU that lacks it gives None)."""

    vendor = "nvidia"

    def __init__(self) -> None:
        import pynvml  # type: ignore[import-untyped]

        self.nv = pynvml
        pynvml.nvmlInit()
        try:
            from importlib.metadata import version

            self.library = f"nvidia-ml-py {version('nvidia-ml-py')}"
        except Exception:
            self.library = "nvidia-ml-py"
        self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        self.events: Any = None
        try:
            self.events = pynvml.nvmlEventSetCreate()
            for h in self.handles:
                try:
                    pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, self.events)
                except Exception:
                    pass
        except Exception:
            self.events = None

    def describe(self, i: int) -> dict[str, Any]:
        nv, h = self.nv, self.handles[i]
        limit = _quiet(nv.nvmlDeviceGetEnforcedPowerLimit, h)
        name = _quiet(nv.nvmlDeviceGetName, h)
        pci = _quiet(nv.nvmlDeviceGetPciInfo, h)
        bus = getattr(pci, "busId", None) if pci is not None else None
        return {"name": name.decode() if isinstance(name, bytes) else name,
                "uuid": _text(_quiet(nv.nvmlDeviceGetUUID, h)), "pci_bus_id": _text(bus),
                "max_sm_clock_mhz": _quiet(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM),
                "max_mem_clock_mhz": _quiet(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_MEM),
                "power_limit_w": limit / 1000.0 if limit else None}

    def sample(self, i: int) -> dict[str, Any]:
        nv, h, t = self.nv, self.handles[i], _quiet
        mask = t(nv.nvmlDeviceGetCurrentClocksEventReasons, h)
        if mask is None:
            mask = t(nv.nvmlDeviceGetCurrentClocksThrottleReasons, h)
        power = t(nv.nvmlDeviceGetPowerUsage, h)
        limit = t(nv.nvmlDeviceGetEnforcedPowerLimit, h)
        util = t(nv.nvmlDeviceGetUtilizationRates, h)
        ecc_c = t(nv.nvmlDeviceGetTotalEccErrors, h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC)
        ecc_u = t(nv.nvmlDeviceGetTotalEccErrors, h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)
        retired = None
        for cause in (nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
                      nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR):
            pages = t(nv.nvmlDeviceGetRetiredPages, h, cause)
            if pages is not None:
                retired = (retired or 0) + len(pages)
        return {"sm_clock_mhz": t(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
                "mem_clock_mhz": t(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
                "temp_c": t(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
                "power_w": power / 1000.0 if power is not None else None,
                "power_limit_w": limit / 1000.0 if limit else None,
                "util_pct": getattr(util, "gpu", None),
                "throttle": decode_throttle(int(mask)) if mask is not None else None,
                "throttle_mask": int(mask) if mask is not None else None,
                "ecc_corrected": ecc_c, "ecc_uncorrected": ecc_u, "retired_pages": retired,
                "pcie_replay": t(nv.nvmlDeviceGetPcieReplayCounter, h),
                "nvlink_errors": self._nvlink_errors(h)}

    def _nvlink_errors(self, h: Any) -> int | None:
        nv = self.nv
        total = None
        for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
            for counter in (nv.NVML_NVLINK_ERROR_DL_REPLAY, nv.NVML_NVLINK_ERROR_DL_RECOVERY,
                            nv.NVML_NVLINK_ERROR_DL_CRC_FLIT, nv.NVML_NVLINK_ERROR_DL_CRC_DATA):
                v = _quiet(nv.nvmlDeviceGetNvLinkErrorCounter, h, link, counter)
                if v is None:
                    if counter == nv.NVML_NVLINK_ERROR_DL_REPLAY:
                        break  # no such link
                    continue
                total = (total or 0) + int(v)
        return total

    def wait_xid(self, timeout_s: float) -> list[tuple[int, int]]:
        """(gpu index, xid) events within ``timeout_s`` (sleeps when events are not supported)."""
        if self.events is None:
            time.sleep(timeout_s)
            return []
        out: list[tuple[int, int]] = []
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return out
            try:
                ev = self.nv.nvmlEventSetWait_v2(self.events, max(1, int(left * 1000)))
            except self.nv.NVMLError as exc:
                if getattr(exc, "value", None) != getattr(self.nv, "NVML_ERROR_TIMEOUT", 10):
                    time.sleep(max(0.0, deadline - time.monotonic()))
                return out
            idx = next((i for i, h in enumerate(self.handles) if _same(h, ev.device)), -1)
            out.append((idx, int(ev.eventData)))

    def close(self) -> None:
        try:
            if self.events is not None:
                self.nv.nvmlEventSetFree(self.events)
            self.nv.nvmlShutdown()
        except Exception:
            pass


class _AmdSmi:
    """AMD SMI (``amdsmi``): clocks, temperature, power and throttle status; no Xid events."""

    vendor = "amd"

    def __init__(self) -> None:
        import amdsmi  # type: ignore[import-not-found]

        self.a = amdsmi
        amdsmi.amdsmi_init()
        self.library = "amdsmi"
        self.handles = list(amdsmi.amdsmi_get_processor_handles())
        if not self.handles:
            raise RuntimeError("no AMD GPU")

    def describe(self, i: int) -> dict[str, Any]:
        a, h = self.a, self.handles[i]
        asic = _quiet(a.amdsmi_get_gpu_asic_info, h) or {}
        power = _quiet(a.amdsmi_get_power_info, h) or {}
        clk = _quiet(a.amdsmi_get_clk_freq, h, a.AmdSmiClkType.GFX) or {}
        freqs = clk.get("frequency") or []
        return {"name": asic.get("market_name"), "uuid": _quiet(a.amdsmi_get_gpu_device_uuid, h),
                "pci_bus_id": _quiet(a.amdsmi_get_gpu_device_bdf, h),
                "max_sm_clock_mhz": max(freqs) // 1_000_000 if freqs else None, "max_mem_clock_mhz": None,
                "power_limit_w": _num(power.get("power_limit"))}

    def sample(self, i: int) -> dict[str, Any]:
        a, h, t = self.a, self.handles[i], _quiet
        m = t(a.amdsmi_get_gpu_metrics_info, h) or {}
        power = t(a.amdsmi_get_power_info, h) or {}
        status = m.get("indep_throttle_status") or m.get("throttle_status")
        return {"sm_clock_mhz": _num(m.get("current_gfxclk")), "mem_clock_mhz": _num(m.get("current_uclk")),
                "temp_c": _num(m.get("temperature_hotspot") or m.get("temperature_edge")),
                "power_w": _num(power.get("current_socket_power") or power.get("average_socket_power")),
                "power_limit_w": _num(power.get("power_limit")), "util_pct": _num(m.get("average_gfx_activity")),
                "throttle": None, "throttle_mask": _num(status),
                "ecc_corrected": None, "ecc_uncorrected": None, "retired_pages": None,
                "pcie_replay": _num(m.get("pcie_replay_count_acc")), "nvlink_errors": None}

    def wait_xid(self, timeout_s: float) -> list[tuple[int, int]]:
        time.sleep(timeout_s)
        return []

    def close(self) -> None:
        try:
            self.a.amdsmi_shut_down()
        except Exception:
            pass


def _num(v: Any) -> Any:
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) and v not in (0xFFFF, 0xFFFFFFFF) else None


def _text(v: Any) -> Any:
    return v.decode(errors="replace") if isinstance(v, bytes) else v


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a.value == b.value) if hasattr(a, "value") else a == b
    except Exception:
        return False


def open_backend() -> tuple[Any, str | None]:
    """(backend, None) or (None, why telemetry is off): NVML first, then AMD SMI."""
    why = []
    for name, cls in (("nvidia-ml-py", _Nvml), ("amdsmi", _AmdSmi)):
        try:
            backend = cls()
        except ImportError:
            why.append(f"{name} not installed")
            continue
        except Exception as exc:  # no driver, no GPU: the library's init fails
            why.append(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": "))
            continue
        if not backend.handles:
            backend.close()
            why.append(f"{name}: no GPU")
            continue
        return backend, None
    return None, "; ".join(why)


class TelemetrySampler:
    """The launcher's sampler thread (module docstring). ``start`` never raises; ``status`` is run.json's line."""

    def __init__(self, host_dir: Path, interval_s: float = DEFAULT_INTERVAL_S,
                 backend_factory: Callable[[], tuple[Any, str | None]] = open_backend) -> None:
        self.dir = host_dir / "telemetry"
        self.interval_s = interval_s
        self.factory = backend_factory
        self.backend: Any = None
        self.thread: threading.Thread | None = None
        self.stop_event = threading.Event()
        self.files: list[IO[str]] = []
        self.samples = 0
        self.why_off: str | None = None

    def start(self) -> dict[str, Any]:
        try:
            self.backend, why = self.factory()
        except Exception as exc:
            self.backend, why = None, f"{type(exc).__name__}: {exc}"
        if self.backend is None:
            self.why_off = why or "no GPU library"
            return self.status()
        try:
            self.dir.mkdir(exist_ok=True)
            host = socket.gethostname()
            for i in range(len(self.backend.handles)):
                fh = open(self.dir / f"gpu{i}.jsonl", "a", encoding="utf-8", buffering=1)
                self.files.append(fh)
                head = {"kind": "gpu", "t_ns": time.time_ns(), "gpu": i, "vendor": self.backend.vendor,
                        "host": host, "library": self.backend.library, **self.backend.describe(i)}
                fh.write(json.dumps(head) + "\n")
        except OSError as exc:
            self.why_off = f"{self.dir}: {exc.strerror or exc}"
            self._close()
            return self.status()
        self.thread = threading.Thread(target=self._run, name="traceread-telemetry", daemon=True)
        self.thread.start()
        return self.status()

    def _run(self) -> None:
        try:
            import signal

            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1})
        except (AttributeError, ValueError, OSError):
            pass
        try:
            os.nice(5)  # below the launcher's own work; the job's processes are not ours to slow
        except OSError:
            pass
        try:
            while not self.stop_event.is_set():
                t0 = time.monotonic()
                for i, fh in enumerate(self.files):
                    rec = {"kind": "sample", "t_ns": time.time_ns(), "gpu": i, **self.backend.sample(i)}
                    fh.write(json.dumps(rec) + "\n")
                self.samples += 1
                left = self.interval_s - (time.monotonic() - t0)
                for gpu, xid in self.backend.wait_xid(max(0.05, left)):
                    if 0 <= gpu < len(self.files):
                        self.files[gpu].write(json.dumps({"kind": "xid", "t_ns": time.time_ns(), "gpu": gpu,
                                                          "xid": xid}) + "\n")
        except Exception as exc:  # a full disk, a driver error: stop sampling, never the launcher
            self.why_off = f"stopped: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            for fh in self.files:
                try:
                    fh.write(json.dumps({"kind": "stopped", "t_ns": time.time_ns(), "why": self.why_off}) + "\n")
                except Exception:
                    pass

    def stop(self) -> dict[str, Any]:
        self.stop_event.set()
        if self.thread is not None:
            self.thread.join(timeout=5.0)
        self._close()
        return self.status()

    def _close(self) -> None:
        for fh in self.files:
            try:
                fh.close()
            except OSError:
                pass
        if self.backend is not None:
            self.backend.close()

    def status(self) -> dict[str, Any]:
        """run.json's ``telemetry``: on (library, GPUs, samples) or off and why, in one line."""
        if self.backend is None:
            return {"state": "off", "why": self.why_off}
        return {"state": "on" if not self.why_off else "stopped", "library": self.backend.library,
                "vendor": self.backend.vendor, "gpus": len(self.files), "interval_s": self.interval_s,
                "samples": self.samples, "dir": "telemetry", "why": self.why_off}


def start_telemetry(host_dir: Path) -> TelemetrySampler:
    """The launcher's one call: a started sampler (off, with its reason, when no library or GPU, when
    ``TRACEREAD_TELEMETRY=0``, or in a launcher that is not its host's local task 0)."""
    sampler = TelemetrySampler(host_dir)
    if os.environ.get("TRACEREAD_TELEMETRY", "1").strip().lower() in ("0", "off", "no", "false"):
        sampler.why_off = "TRACEREAD_TELEMETRY=0"
        return sampler
    local = os.environ.get("SLURM_LOCALID", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0")).strip()
    if local.isdigit() and int(local) > 0:  # several launchers on this host: one samples its GPUs
        sampler.why_off = f"local task {local}: local task 0's launcher samples this host's GPUs"
        return sampler
    sampler.start()
    return sampler
