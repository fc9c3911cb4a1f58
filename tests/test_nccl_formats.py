"""NCCL logs as real clusters write them, one fixture per NCCL / aws-ofi-nccl format (tests/data/nccl/README.md
says which source format string each line follows). Every field and diagnosis is asserted; the tests
marked "defect" failed on the reader before issue 25 (values in their docstrings)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from traceread.analysis.comm.nccl import parse_nccl_logs, refit
from traceread.cli import cli

DATA = Path(__file__).parent / "data" / "nccl"
A100 = DATA / "a100_cumem_split_nccl2.23.log"
L40S = DATA / "l40s_shm_p2p_level_nccl2.26.log"
EFA = sorted((DATA / "efa_4x1").glob("*.log"))
OFI_FAILED = DATA / "ofi_failed_ec2_nccl2.21_ofi1.16.log"
IB_218 = DATA / "ib_gdr_distance_nccl2.18.log"
H100_228 = DATA / "h100_ibext_nvls_off_nccl2.28.log"
P4D = DATA / "p4d_ofi1.7_nccl2.18.log"


def _diags(s: dict) -> dict[str, dict]:
    return {d["id"]: d for d in s["diagnoses"]}


# ---- every communicator ---------------------------------------------------------------------------

def test_defect_init_time_is_the_slowest_communicator_not_the_last() -> None:
    """defect: init_timings was keyed by rank, so the split communicators (0.04-0.06 s) overwrote the
    world communicator (1.28 s); 2.23's split lines (no commId, `key 0- Init`) were not read at all."""
    s = parse_nccl_logs([A100])
    assert s["version"] == "2.23.4+cuda12.4" and s["cuda_driver"] == 12040
    assert s["init_time_s"] == 1.28
    assert s["init_timings"] == {"0": 1.28, "1": 1.27, "2": 1.26, "3": 1.28}  # global ranks, slowest init each
    assert s["init_total_s"] == {"0": 1.32, "1": 1.32, "2": 1.32, "3": 1.33}
    assert s["init_phases"]["2"] == {"kernels": 0.21, "alloc": 0.0, "bootstrap": 0.69, "allgathers": 0.01,
                                     "topo": 0.26, "graphs": 0.02, "connections": 0.06, "rest": 0.01}
    assert s["init_slowest"] == {"comm_index": 0, "comm_id": "0x5e3d1c0a9b8f7e21", "nranks": 4, "rank": 0,
                                 "comm_rank": 0, "host": "a100-node-7", "total_s": 1.28,
                                 "phases": s["init_phases"]["0"]}
    world, split_a, split_b = s["comms"]
    assert (world["comm_id"], world["kind"], world["parent"], world["nranks"], world["nnodes"], world["local_ranks"]) == \
        ("0x5e3d1c0a9b8f7e21", "init", None, 4, 1, 4)
    assert world["ranks_seen"] == world["init_started"] == world["init_complete"] == [0, 1, 2, 3]
    assert world["hosts"] == ["a100-node-7"]
    assert world["init"] == {"slowest_s": 1.28, "slowest_rank": 0, "fastest_s": 1.26, "fastest_rank": 2,
                             "median_s": 1.275, "ranks_timed": 4, "phases": s["init_phases"]["0"],
                             "bootstrap_least": {"rank": 2, "bootstrap_s": 0.69}, "evidence": world["init"]["evidence"]}
    assert world["init"]["evidence"][0].startswith("a100_cumem_split_nccl2.23.log:")
    assert "Init timings - ncclCommInitRank: rank 0 nranks 4 total 1.28" in world["init"]["evidence"][0]
    for split, colour, slowest in ((split_a, 1977, 0.05), (split_b, 1978, 0.06)):
        assert (split["comm_id"], split["kind"], split["parent"], split["color"], split["nranks"]) == \
            (None, "split", "0x5e3d1c0a9b8f7e21", colour, 2)
        assert split["ranks_seen"] == split["init_complete"] == [0, 1]
        assert split["init"]["slowest_s"] == slowest and split["init"]["ranks_timed"] == 2
    assert s["transports"] == {"P2P/CUMEM": 12} and s["nodes"] == 1 and s["nranks"] == 4
    assert s["network"] == "Socket" and s["net_plugin"] == "none (internal)" and s["socket_interfaces"] == ["eth0:10.0.0.5<0>"]
    assert s["nvls"] == {"available": False, "channels": None, "comms": 0}
    assert s["diagnoses"] == []  # healthy: and no NVLS remark on an unknown GPU


def test_defect_a_slow_first_init_followed_by_a_fast_one_is_diagnosed() -> None:
    """defect: the 25 s first init was overwritten by the 0.05 s second one (init_time_s 0.05, no slow_init)."""
    s = parse_nccl_logs(EFA)
    assert s["init_time_s"] == 25.31
    assert s["init_timings"] == {"0": 25.31, "1": 25.29, "2": 25.27, "3": 0.85}
    assert [c["init"]["slowest_s"] for c in s["comms"]] == [25.31, 0.05]
    assert [c["comm_id"] for c in s["comms"]] == ["0x8d2f5a61c3b7e904", "0x1b9e4d7f20a6c5d3"]
    assert [c["nnodes"] for c in s["comms"]] == [4, 4] and s["nodes"] == 4 and s["local_ranks"] == 1
    d = _diags(s)["slow_init"]
    assert d["severity"] == "warning"
    assert d["message"] == (
        "communicator init took 25.3 s on rank 0 (communicator 1 of 2, commId 0x8d2f5a61c3b7e904, 4 ranks on 4 node(s)); "
        "bootstrap 24.9 s = 98% of it: " + "the TCP rendezvous of all ranks: it waits for the last rank to call init, so "
        "a rank that started late (slow imports, container start, data loading before init) or a slow/wrong "
        "NCCL_SOCKET_IFNAME interface shows here. Rank 3 waited least in bootstrap (0.4 s): the others waited for it. "
        "The other 1 communicator(s) took at most 0.05 s: the cost is paid once, at start-up, not by NCCL's setup")
    assert d["evidence"][0].startswith("node0.nccl.log:") and "rank 0 nranks 4 total 25.31" in d["evidence"][0]
    assert d["evidence"][1].startswith("node3.nccl.log:") and "bootstrap 0.42" in d["evidence"][1]
    assert "arrives last" in d["suggestion"]


def test_many_quick_inits_that_add_up(tmp_path: Path) -> None:
    lines = []
    for i in range(12):
        lines += [f"h:1:{10 + i} [0] NCCL INFO ncclCommInitRankConfig comm 0x{i + 1:x}0 rank 0 nranks 2 cudaDev 0 nvmlDev 0 "
                  f"busId 1000 commId 0x{i + 100:x} - Init COMPLETE",
                  f"h:1:{10 + i} [0] NCCL INFO Init timings - ncclCommInitRankConfig: rank 0 nranks 2 total 1.50 "
                  "(kernels 0.10, alloc 0.00, bootstrap 1.20, allgathers 0.00, topo 0.10, graphs 0.05, connections 0.05, "
                  "rest 0.00)"]
    s = parse_nccl_logs([_write(tmp_path, lines)])
    assert len(s["comms"]) == 12 and s["init_total_s"] == {"0": 18.0} and s["init_time_s"] == 1.5
    d = _diags(s)
    assert "slow_init" not in d
    assert d["slow_init_total"]["message"] == ("communicator inits add up to 18.0 s on rank 0 over 12 communicators "
                                               "(the slowest 1.5 s): every new process group pays its own init")


def test_pointer_reuse_and_multi_gpu_process(tmp_path: Path) -> None:
    """One process driving two GPUs (one pointer each), and a pointer reused after a destroy: three views."""
    lines = [
        "h:7:70 [0] NCCL INFO comm 0xa rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 1000 commId 0x111 - Init START",
        "h:7:71 [1] NCCL INFO comm 0xb rank 1 nranks 2 cudaDev 1 nvmlDev 1 busId 2000 commId 0x111 - Init START",
        "h:7:70 [0] NCCL INFO comm 0xa rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 1000 commId 0x111 - Init COMPLETE",
        "h:7:71 [1] NCCL INFO comm 0xb rank 1 nranks 2 cudaDev 1 nvmlDev 1 busId 2000 commId 0x111 - Init COMPLETE",
        "h:7:70 [0] NCCL INFO comm 0xa rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 1000 commId 0x222 - Init START",
        "h:7:70 [0] NCCL INFO comm 0xa rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 1000 commId 0x222 - Init COMPLETE",
    ]
    s = parse_nccl_logs([_write(tmp_path, lines)])
    assert [(c["comm_id"], c["init_complete"]) for c in s["comms"]] == [("0x111", [0, 1]), ("0x222", [0])]


# ---- the network plugin, in its own words ----------------------------------------------------------

def test_defect_ofi_plugin_warnings_with_cpp_signatures_are_read() -> None:
    """defect: WARN lines whose source location is a C++ signature were dropped (warnings == [])."""
    s = parse_nccl_logs([OFI_FAILED])
    assert len(s["warnings"]) == 12 and len(s["errors"]) == 12
    first = s["warnings"][0]
    assert first["src"] == "int nccl_net_ofi_create_plugin(nccl_net_ofi_plugin_t**):208"
    assert first["message"] == "NET/OFI Unable to find a protocol that worked.  Failing initialization."
    assert first["host"] == "ip-172-31-8-20" and first["line"] == 12
    assert first["quote"].startswith("ofi_failed_ec2_nccl2.21_ofi1.16.log:12: ip-172-31-8-20:4410:4410 [0] int ")
    assert s["warnings"][2]["src"] == "ncclResult_t nccl_net_ofi_init_v6(ncclDebugLogger_t):166"
    assert s["plugin"] == {"kind": "ofi", "name": "Socket", "version": "aws-ofi-nccl 1.16.0", "libfabric": "1.22",
                           "provider": None, "fabric": None, "nics": None, "platform": None, "protocol": None,
                           "gdr": None, "forced_simple": False, "failed": True, "external_path": None,
                           "gdr_off_on_capable": None}
    assert s["network"] == "Socket" and s["nodes"] == 2 and s["nranks"] == 8 and s["local_ranks"] == 4
    assert s["transports"] == {"P2P/CUMEM": 4, "NET/Socket": 4}
    d = _diags(s)
    assert list(d) == ["net_plugin_failed", "socket_fallback"]  # net_plugin_missing/ib_not_found would be wrong here
    assert d["net_plugin_failed"]["severity"] == "error"
    assert d["net_plugin_failed"]["message"] == ("the network plugin (aws-ofi-nccl 1.16.0) failed to initialise, so NCCL "
                                                 "fell back to its internal Socket transport")
    assert any("No eligible providers were found" in e for e in d["net_plugin_failed"]["evidence"])
    assert any("Failing initialization" in e for e in d["net_plugin_failed"]["evidence"])
    assert "fi_info -p efa" in d["net_plugin_failed"]["suggestion"]
    assert d["socket_fallback"]["message"] == (
        "inter-node traffic fell back to TCP sockets (NET/Socket) because the network plugin (aws-ofi-nccl 1.16.0) "
        "failed to initialise: expect 10-100x lower bandwidth than InfiniBand/EFA")
    assert any("via NET/Socket/0" in e for e in d["socket_fallback"]["evidence"])


def test_defect_ofi_provider_in_aws_ofi_nccl_1_14_and_later_wording() -> None:
    """defect: `Selected provider is efa, fabric is efa (found 1 nics)` (aws-ofi-nccl >= 1.14) left ofi_provider null."""
    s = parse_nccl_logs(EFA)
    assert s["ofi_provider"] == "efa" and s["nics"] == 1
    assert s["plugin"] == {"kind": "ofi", "name": "Libfabric", "version": "aws-ofi-nccl 1.17.0", "libfabric": "2.1",
                           "provider": "efa", "fabric": "efa", "nics": 1, "platform": None, "protocol": "SENDRECV",
                           "gdr": False, "forced_simple": True, "failed": False,
                           "external_path": "/opt/amazon/ofi-nccl/lib/libnccl-net.so", "gdr_off_on_capable": None}
    assert s["net_plugin"] == "net: Libfabric" and s["network"] == "Libfabric"
    assert s["transports"] == {"NET/Libfabric": 8} and s["gdrdma"] is False
    assert s["bootstrap_interfaces"] == [f"ens5:10.1.0.{11 + r}" for r in range(4)]


def test_old_ofi_wording_and_platform() -> None:
    s = parse_nccl_logs([P4D])
    assert s["plugin"]["version"] == "aws-ofi-nccl 1.7.4-aws" and s["plugin"]["platform"] == "p4d.24xlarge"
    assert (s["ofi_provider"], s["nics"], s["plugin"]["fabric"]) == ("efa", 4, None)
    assert s["gdrdma"] is True and s["transports"] == {"NET/AWS Libfabric": 1, "P2P/IPC": 1}
    assert s["hardware"] == {"gpu": "NVIDIA A100-SXM4-40GB", "source": "aws-ofi-nccl platform p4d.24xlarge",
                             "nvlink": True, "nvswitch": True, "nvls_possible": False,
                             "log_hints": s["hardware"]["log_hints"]}
    assert s["diagnoses"] == []  # GDRDMA on, and no NVLS remark on an A100


def test_oldest_ofi_wording_on_the_shared_efa_log(shared_dir: Path) -> None:
    """aws-ofi-nccl before 1.7 printed `NET/OFI Selected Provider is efa` without a NIC count and `Running on P4d platform`."""
    s = parse_nccl_logs([shared_dir / "nccl_logs" / "README_nccl-tests-efa-16_allreduce.log"])
    assert s["ofi_provider"] == "efa" and s["plugin"]["platform"] == "P4d" and s["nics"] is None
    assert s["hardware"]["gpu"] == "A100-SXM4-40GB" and s["hardware"]["source"] == "nccl-tests device list"
    assert s["hardware"]["nvls_possible"] is False


def test_nccl_2_28_external_plugin_timestamped_warn_and_env() -> None:
    s = parse_nccl_logs([H100_228])
    assert s["version"] == "2.28.9+cuda13.0" and s["nodes"] == 2 and s["nranks"] == 16 and s["local_ranks"] == 8
    assert s["env"] == {"NCCL_NVLS_ENABLE": "0", "NCCL_SOCKET_IFNAME": "eth0"}
    assert s["plugin"]["kind"] == "ib" and s["plugin"]["nics"] == 8 and s["nics"] == 8
    assert s["plugin"]["external_path"] == "/opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so"
    assert s["ib_devices"] == [f"mlx5_{i}:1/IB" for i in range(8)]
    assert s["gdrdma"] is True and s["transports"] == {"P2P/CUMEM": 2, "NET/IBext_v10": 2}
    (w,) = s["warnings"]
    assert w["src"] == "misc/socket.cc:484" and w["host"] == "h100-a"  # after the "[date time]" stamp
    assert s["error_codes"] == {"2": 1}
    d = _diags(s)
    assert d["connect_failed"]["severity"] == "error"
    assert any("NCCL_SOCKET_IFNAME set by environment to eth0" in e for e in d["connect_failed"]["evidence"])
    assert "nvls_unavailable" not in d  # the log alone does not say what the GPUs are


def test_real_nccl_2_28_log_without_infiniband(samples_dir: Path) -> None:
    """A real 2.28.9 log (sample_traces, one H100 VM): 2.27+ lists its internal transports as NET plugins, so
    `Failed to initialize NET plugin IB` is what a machine without InfiniBand prints, not a plugin failure."""
    log = samples_dir / "h100_compiled_1gpu" / "nccl" / "nccl.vm.887.log"
    assert "Failed to initialize NET plugin IB" in log.read_text()
    s = parse_nccl_logs([log], ["NVIDIA H100 80GB HBM3"])
    assert (s["version"], s["cuda_driver"], s["nodes"], s["nranks"], s["network"]) == ("2.28.9+cuda13.0", 13000, 1, 1, "Socket")
    assert s["plugin"]["kind"] == "socket" and s["plugin"]["failed"] is False and s["nics"] == 1
    assert s["init_time_s"] == 0.48 and s["init_phases"]["0"]["kernels"] == 0.46
    assert s["channels"] == {"coll": 64, "collnet": 64, "nvls": 0, "p2p": 64}
    assert s["nvls"]["available"] is None  # one GPU: NCCL does not try NVLS, so no remark either
    assert s["diagnoses"] == [] and s["warnings"] == []


def test_nccl_2_18_ib_gdr_off_by_distance() -> None:
    s = parse_nccl_logs([IB_218])
    assert s["version"] == "2.18.3+cuda12.2" and s["net_plugin"] == "none (internal)" and s["network"] == "IB"
    assert s["ib_devices"] == ["mlx5_0:1/IB", "mlx5_1:1/IB"] and s["nics"] == 2
    (comm,) = s["comms"]
    assert comm["comm_id"] == "0x7a11c0ffee00d00d" and comm["init_complete"] == [0, 1] and comm["nnodes"] == 2
    assert comm["hosts"] == ["dgx-a", "dgx-b"] and comm["init"] is None and s["init_time_s"] is None
    d = _diags(s)["no_gdrdma"]
    assert d["message"] == ("network transfers (NET/IB) do not use GPUDirect RDMA: the GPU and the NIC are further apart "
                            "on PCIe than NCCL's default NCCL_NET_GDR_LEVEL allows, so data is staged through host memory")
    assert any("GPU Direct RDMA Disabled for GPU 18000 / HCA 0 (distance 7 > 4)" in e for e in d["evidence"])
    assert "NCCL_NET_GDR_LEVEL" in d["suggestion"] and "nvidia-peermem" not in d["suggestion"]


# ---- advice that fits the hardware and the log -----------------------------------------------------

def test_defect_gdr_advice_follows_what_the_plugin_said() -> None:
    """defect: the advice was "load nvidia-peermem / check NCCL_NET_GDR_LEVEL" while aws-ofi-nccl said
    `Need to force simple protocol: GDR not supported`."""
    d = _diags(parse_nccl_logs(EFA))["no_gdrdma"]
    assert d["severity"] == "warning"
    assert d["message"] == (
        "network transfers (NET/Libfabric) do not use GPUDirect RDMA: the network plugin (aws-ofi-nccl 1.17.0) says the "
        "efa provider does not support it here, so data is staged through host memory; the plugin also forces "
        "NCCL_PROTO=simple. Loading nvidia-peermem or changing NCCL_NET_GDR_LEVEL cannot change that: it is what this "
        "instance type and provider offer")
    assert any("NET/OFI Need to force simple protocol: GDR not supported" in e for e in d["evidence"])
    assert any("Selected provider is efa, fabric is efa (found 1 nics)" in e for e in d["evidence"])
    assert "nvidia-peermem" not in d["suggestion"]


def test_ib_plugin_says_no_gpudirect(tmp_path: Path) -> None:
    """NCCL_DEBUG_SUBSYS=NET: `NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0'` (src/graph/topo.cc) is the
    NIC driver saying it cannot read GPU memory: nvidia-peermem / DMA-BUF is then the right advice."""
    lines = ["h:1:1 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.0.0.1<0>",
             "h:1:1 [0] NCCL INFO Using network IB",
             "h:1:1 [0] NCCL INFO NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0'",
             "h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0"]
    s = parse_nccl_logs([_write(tmp_path, lines)])
    assert s["plugin"]["kind"] == "ib" and s["plugin"]["gdr"] is False and s["plugin"]["nics"] == 1
    d = _diags(s)["no_gdrdma"]
    assert "NCCL found no GPUDirect kernel module" in d["message"] and "nvidia-peermem" in d["suggestion"]
    assert d["evidence"][0].endswith("GPU Direct RDMA Disabled for HCA 0 'mlx5_0'")


def test_old_nccl_does_not_see_nvidia_peermem(tmp_path: Path) -> None:
    """NCCL <= 2.22 (src/transport/net_ib.cc ncclIbGdrSupport) checks only /sys/kernel/mm/memory_peers/nv_mem*;
    2.23 added /sys/module/nvidia_peermem (nccl#1676): an old NCCL turns GPUDirect RDMA off with the module loaded."""
    lines = ["h:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4",
             "h:1:1 [0] NCCL INFO NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0'"]
    d = _diags(parse_nccl_logs([_write(tmp_path, lines)]))["no_gdrdma"]
    assert "NCCL <= 2.22 looks only for the old nv_peer_mem module" in d["message"]
    assert "this log's NCCL is 2.21.5+cuda12.4" in d["message"] and "NCCL version 2.21.5" in d["evidence"][1]
    new = _diags(parse_nccl_logs([_write(tmp_path, [lines[0].replace("2.21.5", "2.23.4"), lines[1]])]))["no_gdrdma"]
    assert "nvidia-peermem not loaded" in new["message"] and "<= 2.22 looks" not in new["message"]


def test_gdr_disabled_on_a_capable_instance_is_an_error(tmp_path: Path) -> None:
    lines = ["h:1:1 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.9.1-aws",
             "h:1:1 [0] NCCL INFO NET/OFI Running on p4d.24xlarge platform, topology file /x/p4d-24xl-topo.xml", "",
             "h:1:1 [0] int platform_init(const char**):754 NCCL WARN NET/OFI GDR disabled on GDR-supported instance "
             "type p4d.24xlarge",
             "h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/AWS Libfabric/0"]
    d = _diags(parse_nccl_logs([_write(tmp_path, lines)]))["no_gdrdma"]
    assert d["severity"] == "error" and "supports it" in d["message"] and "p4d.24xlarge" in d["message"]


def test_defect_shm_cause_is_the_env_setting_not_acs() -> None:
    """defect: SHM was blamed on PCIe ACS/IOMMU while the log said NCCL_P2P_LEVEL set by environment to NVL."""
    s = parse_nccl_logs([L40S])
    assert s["env"] == {"NCCL_P2P_LEVEL": "NVL"} and s["transports"] == {"SHM": 8}
    assert s["init_time_s"] == 2.1 and [c["init"]["slowest_s"] for c in s["comms"]] == [2.1, 0.05]
    d = _diags(s)
    assert list(d) == ["shm_instead_of_p2p"]  # and no NVLS remark
    shm = d["shm_instead_of_p2p"]
    assert shm["message"] == ("GPUs of one node exchange data through host shared memory (SHM, 8 channel connections) "
                              "instead of direct GPU-to-GPU copies (P2P): NCCL_P2P_LEVEL=NVL allows P2P only over "
                              "NVLink, and these GPU pairs have no NVLink path between them")
    assert "ACS" not in shm["message"] and "Unset NCCL_P2P_LEVEL" in shm["suggestion"]
    assert shm["evidence"][0].endswith("NCCL INFO NCCL_P2P_LEVEL set by environment to NVL")
    assert "via SHM/direct/direct" in shm["evidence"][-1]
    refit(s, ["NVIDIA L40S"])  # once the traces name the GPU
    assert s["hardware"] == {"gpu": "NVIDIA L40S", "source": "trace deviceProperties", "nvlink": False,
                             "nvswitch": False, "nvls_possible": False, "log_hints": s["hardware"]["log_hints"]}
    assert _diags(s)["shm_instead_of_p2p"]["message"].endswith(
        "NCCL_P2P_LEVEL=NVL allows P2P only over NVLink, and these GPUs (NVIDIA L40S) have no NVLink: every pair is "
        "joined by PCIe, so NCCL uses SHM")


def test_shm_without_env_on_pcie_gpus_names_the_host_bridge(tmp_path: Path) -> None:
    lines = [ln for ln in L40S.read_text().splitlines() if "set by environment" not in ln]
    s = parse_nccl_logs([_write(tmp_path, lines)], ["NVIDIA L40S"])
    msg = _diags(s)["shm_instead_of_p2p"]["message"]
    assert "no NVLink" in msg and "PXB" in msg and "host bridge" in msg


@pytest.mark.parametrize("line,cause", [
    ("h:1:1 [0] NCCL INFO NCCL_P2P_DISABLE set by environment to 1", "NCCL_P2P_DISABLE=1 turns P2P off"),
    ("h:1:1 [0] NCCL INFO Could not enable P2P between dev 1(=2000) and dev 0(=1000)", "could not enable peer access"),
    ("h:1:1 [0] NCCL INFO P2P is disabled between connected GPUs 1 and 0. You can repress this message with "
     "NCCL_IGNORE_DISABLED_P2P=1.", "connected but P2P disabled"),
])
def test_shm_cause_from_the_log(tmp_path: Path, line: str, cause: str) -> None:
    lines = [line, "h:1:1 [0] NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct/direct"]
    d = _diags(parse_nccl_logs([_write(tmp_path, lines)]))["shm_instead_of_p2p"]
    assert cause in d["message"] and d["evidence"][0].endswith(line)


def test_defect_nvls_remark_only_where_nvls_could_exist() -> None:
    """defect: "NVLS (NVLink SHARP) multicast is not available" was a diagnosis on A100 and L40S."""
    for log, gpu in ((A100, "NVIDIA A100-SXM4-80GB"), (L40S, "NVIDIA L40S"), (A100, None)):
        s = parse_nccl_logs([log], [gpu] if gpu else [])
        assert s["nvls"]["available"] is False and "nvls_unavailable" not in _diags(s), (log.name, gpu)
    s = parse_nccl_logs([H100_228], ["NVIDIA H100 80GB HBM3"])
    assert s["hardware"]["nvls_possible"] is True
    d = _diags(s)["nvls_unavailable"]
    assert d["severity"] == "info"
    assert d["message"] == ("NVLS (NVLink SHARP) is not available although these GPUs (NVIDIA H100 80GB HBM3) could use "
                            "it: NCCL_NVLS_ENABLE=0 turns it off; all-reduce inside the node uses rings/trees only")
    assert any("NVLS multicast support is not available on dev 0 (NVLS_NCHANNELS 0)" in e for e in d["evidence"])
    assert any("NCCL_NVLS_ENABLE set by environment to 0." in e for e in d["evidence"])
    assert parse_nccl_logs([H100_228], ["NVIDIA H100 PCIe"])["hardware"]["nvls_possible"] is False


def test_defect_info_is_never_the_answer(tmp_path: Path) -> None:
    """defect: the NVLS info line was the ANSWER of a report on an A100 log."""
    (tmp_path / "a.log").write_text(A100.read_text())
    res = CliRunner().invoke(cli, ["report", str(tmp_path / "a.log"), "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["findings"] == [] and doc["nccl"]["diagnoses"] == []
    (tmp_path / "h.log").write_text(H100_228.read_text())
    doc = json.loads(CliRunner().invoke(cli, ["report", str(tmp_path / "h.log"), "--format", "json"]).stdout)
    assert [f["id"] for f in doc["findings"]] == ["nccl_connect_failed"]
    assert doc["findings"][0]["severity"] == "error"
    res = CliRunner().invoke(cli, ["report", str(tmp_path / "a.log"), "--no-html"])
    assert "ANSWER: No problem found in NCCL's own records" in res.output and "NVLS" not in res.output


def test_every_diagnosis_cites_its_lines() -> None:
    for logs in ([A100], [L40S], EFA, [OFI_FAILED], [IB_218], [H100_228], [P4D]):
        s = parse_nccl_logs(logs, ["NVIDIA H100 80GB HBM3"] if logs == [H100_228] else [])
        for d in s["diagnoses"]:
            assert d["evidence"], d["id"]
            assert all(":" in e for e in d["evidence"]), d
            assert d["severity"] in ("error", "warning", "info")
        order = [{"error": 0, "warning": 1, "info": 2}[d["severity"]] for d in s["diagnoses"]]
        assert order == sorted(order)


def _write(tmp: Path, lines: list[str]) -> Path:
    f = tmp / "job.log"
    f.write_text("\n".join(lines) + "\n")
    return f


@pytest.mark.slow
def test_report_with_traces_fits_the_advice_to_their_gpus(tmp_path: Path) -> None:
    """Beside traces, the NCCL advice uses the GPUs the traces name: an H100 job whose log turns NVLS off
    gets the NVLS remark as a note (info), never as a finding; the A100 log gets none."""
    runner = CliRunner()
    for device, log in (("h100", H100_228), ("a100", A100)):
        run = tmp_path / device
        res = runner.invoke(cli, ["simulate", "ddp", "-o", str(run), "--ranks", "2", "--steps", "2", "--device", device])
        assert res.exit_code == 0, res.output
        (run / "train.log").write_text(log.read_text())
        res = runner.invoke(cli, ["report", str(run), "--format", "json", "--no-cache"])
        assert res.exit_code == 0, res.output
        doc = json.loads(res.stdout)
        n = doc["nccl"]
        assert n["hardware"]["source"] == "trace deviceProperties" and device.upper() in n["hardware"]["gpu"]
        ids = {d["id"]: d["severity"] for d in n["diagnoses"]}
        findings = {f["id"] for f in doc["findings"]}
        if device == "h100":
            assert ids == {"connect_failed": "error", "nvls_unavailable": "info"}
            assert "nccl_connect_failed" in findings and "nccl_nvls_unavailable" not in findings
            assert next(f for f in doc["findings"] if f["id"] == "nccl_connect_failed")["severity"] == "error"
        else:
            assert ids == {} and not any(f.startswith("nccl_") for f in findings)
