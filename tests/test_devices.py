"""Device table and resolution: dense peaks, variants by SM count, --device-spec files."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from traceread.analysis.hardware import (
    DEVICES,
    LINKS,
    PRECISIONS,
    TYPICAL_NIC,
    device_for_meta,
    load_spec_file,
    lookup_device,
    resolve_device,
)
from traceread.errors import TraceReadError
from traceread.model import RankMeta

GiB = 2**30


def key_of(spec) -> str | None:
    if spec is None:
        return None
    return next(k for k, v in DEVICES.items() if v == spec)


# Dense figures of notes §5.1 (TFLOP/s, GB/s) that must be in the table exactly.
DENSE = {
    "v100-sxm2": {"fp16": 125.0, "fp32": 15.7, "hbm": 900},
    "a100-sxm-80gb": {"bf16": 312.0, "tf32": 156.0, "fp32": 19.5, "hbm": 2039},
    "a100-pcie-80gb": {"bf16": 312.0, "hbm": 1935},
    "h100-sxm": {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 66.9, "fp8": 1978.9, "hbm": 3350},
    "h100-pcie": {"bf16": 756.0, "tf32": 378.0, "fp8": 1513.0, "fp32": 51.0, "hbm": 2000},
    "h100-nvl": {"hbm": 3900},
    "h200-sxm": {"bf16": 989.4, "fp8": 1978.9, "hbm": 4800},
    "b200": {"bf16": 2250.0, "tf32": 1100.0, "fp8": 4500.0, "fp32": 80.0, "hbm": 8000},
    "l4": {"bf16": 121.0, "tf32": 60.0, "fp8": 242.5, "fp32": 30.3, "hbm": 300},
    "l40s": {"bf16": 362.05, "tf32": 183.0, "fp8": 733.0, "fp32": 91.6, "hbm": 864},
    "a10g": {"bf16": 70.0, "hbm": 600},
    "mi250x-gcd": {"bf16": 383.0 / 2, "hbm": 3276.8 / 2},
    "mi300x": {"bf16": 1307.4, "fp16": 1307.4, "fp8": 2614.9, "tf32": 653.7, "fp32": 163.4, "hbm": 5300},
}

# Sparse (2:4) datasheet figures that a dense table must never contain for these parts.
SPARSE = {"a100-sxm-80gb": {"bf16": 624.0}, "h100-sxm": {"bf16": 1979.0, "fp8": 3958.0},
          "h200-sxm": {"bf16": 1979.0}, "l4": {"bf16": 242.0}, "l40s": {"bf16": 733.0}, "b200": {"fp8": 9000.0}}


@pytest.mark.parametrize("key", sorted(DENSE))
def test_dense_datasheet_numbers(key: str) -> None:
    spec = DEVICES[key]
    for p, v in DENSE[key].items():
        if p == "hbm":
            assert spec.hbm_bytes_per_s == pytest.approx(v * 1e9, rel=1e-12)
        else:
            assert spec.peak(p) == pytest.approx(v * 1e12, rel=1e-12)
    for p, v in SPARSE.get(key, {}).items():
        assert spec.peak(p) < 0.6 * v * 1e12


def test_table_is_well_formed() -> None:
    for key, spec in DEVICES.items():
        assert set(spec.peak_flops) <= set(PRECISIONS), key
        assert all(v > 0 for v in spec.peak_flops.values()), key
        assert spec.hbm_bytes_per_s > 0 and spec.vector_flops and spec.source, key
        # 16-bit matrix rate is never below the FP32 rate where both exist
        if "bf16" in spec.peak_flops:
            assert spec.peak("bf16") >= spec.peak("fp32"), key
        assert spec.link is None or spec.link in LINKS, key
    # V100 has no bf16 tensor cores; Turing GeForce FP16 with FP32 accumulate is half rate
    assert DEVICES["v100-sxm2"].peak("bf16") is None
    assert DEVICES["rtx-2080-ti"].peak("fp16") == pytest.approx(53.8e12)


def test_links() -> None:
    for link in LINKS.values():
        assert link.bidirectional_bytes_per_s == 2 * link.per_direction_bytes_per_s
    assert LINKS["nvlink4"].bidirectional_bytes_per_s == 900e9
    assert LINKS["nvlink5"].per_direction_bytes_per_s == 900e9
    assert LINKS["ib-ndr"].per_direction_bytes_per_s == 50e9  # 400 Gb/s
    assert all(v in LINKS for v in TYPICAL_NIC.values())


@pytest.mark.parametrize(
    ("name", "sms", "mem", "key"),
    [
        ("NVIDIA H100 80GB HBM3", 132, None, "h100-sxm"),
        ("NVIDIA H100 PCIe", 114, None, "h100-pcie"),
        ("NVIDIA H100", 114, None, "h100-pcie"),  # no PCIe in the name but 114 SMs
        ("NVIDIA H100 NVL", 132, None, "h100-nvl"),
        ("NVIDIA H200", 132, None, "h200-sxm"),
        ("NVIDIA H200 NVL", 132, None, "h200-nvl"),
        ("NVIDIA B200", 148, None, "b200"),
        ("NVIDIA GH200 480GB", 132, 95 * GiB, "gh200-96gb"),  # not the H200
        ("NVIDIA H800", 132, None, "h800-sxm"),
        ("NVIDIA A100-SXM4-40GB", 108, None, "a100-sxm-40gb"),
        ("NVIDIA A100-SXM4-80GB", 108, None, "a100-sxm-80gb"),
        ("NVIDIA A100 80GB PCIe", 108, None, "a100-pcie-80gb"),
        ("NVIDIA A100-PCIE-40GB", 108, None, "a100-pcie-40gb"),
        ("Tesla V100-PCIE-32GB", 80, None, "v100-pcie"),
        ("NVIDIA L4", 58, None, "l4"),
        ("NVIDIA L40S", 142, None, "l40s"),
        ("NVIDIA A10G", 80, None, "a10g"),
        ("NVIDIA A10", 72, None, "a10"),
        ("AMD Instinct MI250X", 110, None, "mi250x-gcd"),
        ("AMD Instinct MI300X", 304, None, "mi300x"),
        ("AMD Instinct MI325X", 304, None, "mi325x"),
        ("", 304, 192 * GiB, "mi300x"),  # vLLM traces: empty name, memory tells MI300X from MI325X
        ("", 132, 80 * GiB, "h100-sxm"),
    ],
)
def test_resolve_variants(name: str, sms: int, mem: float | None, key: str) -> None:
    assert key_of(resolve_device(name, sms, total_mem_bytes=mem)) == key


def test_ambiguous_and_unknown_give_reasons() -> None:
    for name, sms in [("", 304), ("", 132), ("", 80), (None, None), ("ARTEMIS", None), ("Some New GPU", 96)]:
        m = lookup_device(name, sms)
        assert m.spec is None and m.reason
    assert "several GPUs" in lookup_device("", 132).reason
    assert "MTIA" in lookup_device("ARTEMIS", None).reason


# Every distinct deviceProperties (name, numSms) in ../shared/traces and the row it must resolve to.
SHARED_EXPECTED = {
    ("NVIDIA H100", 132): "h100-sxm",
    ("AMD Instinct MI210", 104): "mi210",
    ("AMD Instinct MI300X", 304): "mi300x",
    ("AMD Instinct MI300X VF", 304): "mi300x",
    ("", 304): "mi300x",  # 192 GiB totalGlobalMem
    ("NVIDIA A100-PG509-200", 108): "a100-sxm-40gb",
    ("NVIDIA GeForce RTX 2080 Ti", 68): "rtx-2080-ti",
    ("Tesla V100-SXM2-16GB", 80): "v100-sxm2",
    ("Tesla V100-SXM2-32GB", 80): "v100-sxm2",
    ("Tesla V100-DGXS-32GB", 80): "v100-sxm2",
    ("AMD Radeon Graphics", 104): "mi210",  # CDNA2 104-CU GCD: MI210 and MI250 have the same ceilings
    ("Quadro GP100", 56): "quadro-gp100",
    ("ARTEMIS", None): None,  # MTIA: no datasheet -> unknown
}

_DEV_RE = re.compile(r'"deviceProperties"\s*:\s*\[(.*?)\]\s*[,}]', re.S)


def _device_props(path: Path) -> list[dict]:
    """deviceProperties of a trace, read from the start of the file (libkineto writes it first)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as fh:  # type: ignore[operator]
        head = fh.read(1 << 20)
    m = _DEV_RE.search(head)
    if not m:
        return []
    try:
        return json.loads("[" + m.group(1) + "]")
    except json.JSONDecodeError:
        return []


def test_every_device_in_shared_traces_resolves(shared_traces: Path) -> None:
    seen: dict[tuple, float | None] = {}
    for path in sorted(shared_traces.rglob("*.json*")):
        for dev in _device_props(path):
            seen[(dev.get("name"), dev.get("numSms"))] = dev.get("totalGlobalMem")
    assert len(seen) >= 10, "the scan found too few devices"
    for (name, sms), mem in seen.items():
        assert (name, sms) in SHARED_EXPECTED, f"new device in shared traces: {name!r}/{sms}"
        got = resolve_device(name, sms, total_mem_bytes=mem)
        assert key_of(got) == SHARED_EXPECTED[(name, sms)], (name, sms)


def test_device_for_meta_uses_total_memory() -> None:
    meta = RankMeta(rank=0, devices=[{"id": 0, "name": "", "numSms": 304, "totalGlobalMem": 206141652992}],
                    device_id=0, device_name=None, num_sms=304)
    assert key_of(device_for_meta(meta).spec) == "mi300x"
    mtia = RankMeta(rank=0, devices=[{"id": 0, "name": "ARTEMIS"}], device_id=None, device_name=None, num_sms=None)
    m = device_for_meta(mtia)
    assert m.spec is None and "ARTEMIS" in m.reason


# ---------------------------------------------------------------- --device-spec


def test_spec_file_json_overrides_builtin(tmp_path: Path) -> None:
    f = tmp_path / "h100.json"
    f.write_text(json.dumps({"name": "throttled H100", "peak_tflops": {"bf16": 800}}))
    spec = resolve_device("NVIDIA H100 80GB HBM3", 132, f)
    assert spec.peak("bf16") == 800e12
    assert spec.peak("fp8") == DEVICES["h100-sxm"].peak("fp8")  # not given: from the table row
    assert spec.hbm_bytes_per_s == 3350e9 and spec.confidence == "user"


def test_spec_file_toml_extends_table(tmp_path: Path) -> None:
    f = tmp_path / "lab.toml"
    f.write_text(
        '[[devices]]\nname = "Lab GPU"\nmatch = ["LabGPU"]\nnum_sms = 96\nhbm_gbps = 1000\n'
        "[devices.peak_tflops]\nbf16 = 200\nfp32 = 25\n"
    )
    spec = resolve_device("Acme LabGPU X", 96, f)
    assert spec.name == "Lab GPU" and spec.peak("bf16") == 200e12 and spec.hbm_bytes_per_s == 1000e9
    assert spec.vector_flops == 25e12
    # entries with `match` do not touch other devices
    assert key_of(resolve_device("NVIDIA L4", 58, f)) == "l4"


def test_spec_file_tracelens_format_and_base(tmp_path: Path) -> None:
    f = tmp_path / "MI300X.json"
    f.write_text(json.dumps({"mem_bw_gbps": 5300, "max_achievable_tflops": {"matrix_bf16": 708, "matrix_fp8": 1273,
                                                                            "vector_fp32": 81.7}}))
    spec = resolve_device("AMD Instinct MI300X", 304, f)
    assert spec.peak("bf16") == 708e12 and spec.peak("fp8") == 1273e12 and spec.vector_flops == 81.7e12
    g = tmp_path / "base.json"
    g.write_text(json.dumps({"name": "mystery", "base": "a100-sxm-80gb", "hbm_gbps": 1800}))
    s2 = resolve_device("", None, g)
    assert s2.peak("bf16") == 312e12 and s2.hbm_bytes_per_s == 1800e9


@pytest.mark.parametrize(
    "content",
    ["{not json", json.dumps({"peak_tflops": {"bf17": 1}, "hbm_gbps": 1}), json.dumps({"peak_tflops": {"bf16": -1}}),
     json.dumps({"base": "nope"}), json.dumps([1, 2]), json.dumps({"name": "x"})],
)
def test_bad_spec_file_is_one_line_error(tmp_path: Path, content: str) -> None:
    f = tmp_path / "bad.json"
    f.write_text(content)
    with pytest.raises(TraceReadError) as err:
        resolve_device("", None, f)
    assert str(f) in str(err.value) and "\n" not in str(err.value)


def test_missing_spec_file(tmp_path: Path) -> None:
    with pytest.raises(TraceReadError, match="cannot read device spec"):
        load_spec_file(tmp_path / "absent.toml")


def test_agrees_with_simulator_device_table() -> None:
    """The simulator keeps its own copy of notes §5.1; both tables must give the same ceilings."""
    from traceread.simulate.devices import DEVICES as SIM

    for d in SIM.values():
        spec = resolve_device(d.name, d.num_sms, total_mem_bytes=d.total_global_mem)
        assert spec is not None, d.name
        assert spec.peak("bf16") == pytest.approx(d.peak_bf16_tflops * 1e12, rel=1e-12), d.name
        assert spec.hbm_bytes_per_s == pytest.approx(d.mem_bw_gbs * 1e9, rel=1e-12), d.name
