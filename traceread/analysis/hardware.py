"""Which catalogue row a trace's GPU is, and ``--device-spec`` files that override or extend the catalogue.

A Kineto trace names its GPU (``deviceProperties[].name``) and counts its SMs (``numSms``; compute
units on AMD) but records no clock and no bandwidth, so every roofline ceiling and every MFU
denominator comes from the device catalogue, :mod:`traceread.devices` (its conventions: dense
peaks, per device PyTorch sees, FLOP/s and bytes/s), which the simulator reads too.

``resolve_device`` picks the row from the trace's name and SM count (``NVIDIA H100 80GB HBM3`` with
132 SMs is the SXM part, ``NVIDIA H100 PCIe`` has 114); a ``--device-spec`` file (JSON or TOML)
overrides or extends the table.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, published as tomli before it joined the standard library
    import tomli as tomllib

from traceread.devices import DEVICES, LINKS, PRECISIONS, TYPICAL_NIC, DeviceSpec, G, LinkSpec, T
from traceread.errors import TraceReadError


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
        ratios = {k: abs(mem / capacity - 1.0) for k in cands if (capacity := table[k].memory_bytes)}
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
    if hbm is not None:
        hbm_bytes_per_s = float(hbm) * G
    elif base is not None:
        hbm_bytes_per_s = base.hbm_bytes_per_s
    else:
        raise TraceReadError(f"device {entry['name']!r} needs hbm_gbps (or a base)", str(path) if path else None)
    if not peaks:
        raise TraceReadError(f"device {entry['name']!r} needs peak_tflops (or a base)", str(path) if path else None)
    vec = entry.get("vector_tflops")
    spec = DeviceSpec(
        name=str(entry.get("name")),
        variant=str(entry.get("variant", entry.get("name"))),
        num_sms=int(entry["num_sms"]) if entry.get("num_sms") else (base.num_sms if base else None),
        peak_flops=peaks,
        hbm_bytes_per_s=hbm_bytes_per_s,
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
