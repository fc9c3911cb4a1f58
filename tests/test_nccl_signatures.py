"""One test per signature of the NCCL failure catalogue, from the message formats in NCCL's and
aws-ofi-nccl's sources (the ``WARN("...")`` format strings with values filled in), and the log
shapes users paste: foreign prefixes, interleaved processes, tails, several files.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from traceread.analysis.comm.nccl import parse_nccl_logs
from traceread.analysis.comm.nccl.problems import find_problem
from traceread.analysis.comm.nccl.signatures import CATALOGUE, FAMILIES
from traceread.cli import cli

P = "node-a:4242:4300 [3] "

#: (signature id, family, the line as NCCL prints it: src/<file> format string with values)
SOURCE_LINES = [
    ("no_socket_interface", "interface", P + "bootstrap.cc:1290 NCCL WARN Bootstrap : no socket interface found"),
    ("no_socket_interface", "interface", P + "misc/socket.cc:600 NCCL WARN NET/Socket : No usable listening interface found"),
    ("socket_address_family", "version_mismatch", P + "misc/socket.cc:717 NCCL WARN ncclSocketInit: connecting to "
     "address  with family 0 is neither AF_INET(2) nor AF_INET6(10)"),
    ("connect_failed", "interface", P + "misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 10.0.0.7<41235> "
     "failed : Software caused connection abort"),
    ("connect_failed", "interface", P + "misc/socket.cc:533 NCCL WARN socketPollConnect: Connect to 10.0.0.4<56849> "
     "returned 113(No route to host) errno 115(Operation now in progress)"),
    ("peer_closed", "peer_died", P + "misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by remote peer "
     "node-b<51159>"),
    ("shm_full", "shm", P + "misc/shmutils.cc:88 NCCL WARN Error: failed to extend /dev/shm/nccl-WU88OE to 9637892 "
     "bytes, error: No space left on device (28)"),
    ("p2p_unsupported", "p2p_acs", P + "transport/p2p.cc:238 NCCL WARN failed to open CUDA IPC handle : 217 peer "
     "access is not supported between these two devices"),
    ("nvls_failed", "nvls", P + "transport/nvls.cc:154 NCCL WARN Failed to bind NVLink SHARP (NVLS) Multicast memory "
     "of size 2097152 : CUDA error 401 'the operation cannot be performed in the present state'."),
    ("nvls_failed", "nvls", P + "transport/nvls.cc:598 NCCL WARN Cuda failure 1 'invalid argument'"),
    ("arch_unsupported", "nccl_too_old", P + "enqueue.cc:58 NCCL WARN Cuda failure 'named symbol not found'"),
    ("driver_too_old", "cuda_driver", P + "init.cc:1600 NCCL WARN Cuda failure 'CUDA driver version is insufficient "
     "for CUDA runtime version'"),
    ("gpu_oom", "gpu_oom", P + "include/alloc.h:178 NCCL WARN Cuda failure 'out of memory'"),
    ("cuda_fault", "cuda_fault", P + "enqueue.cc:1200 NCCL WARN Cuda failure 'an illegal memory access was "
     "encountered'"),
    ("ib_completion", "ib_fabric", P + "transport/net_ib.cc:1700 NCCL WARN NET/IB: Got completion from peer "
     "10.1.0.2<43001> with status=IBV_WC_RETRY_EXC_ERR(12) opcode=IBV_WC_SEND(0) vendor_err=129  hca mlx5_0"),
    ("ib_completion", "p2p_acs", P + "transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer "
     "10.1.0.2<33397> with error 4, opcode 32611, len 32611, vendor err 81 (Send)"),
    ("ib_completion", "gid_roce", P + "ib_plugin.c:1615 NCCL WARN NET/IB : Got completion from peer 10.216.0.9<54862> "
     "with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:10.0.0.1 remoteGids::ffff:10.0.0.2"),
    ("ib_gid", "gid_roce", P + "transport/net_ib.cc:900 NCCL WARN Call to ibv_modify_qp failed with 110 Connection "
     "timed out, on dev mlx5_0:1, curr state INIT, next state RTR, local GID index 3"),
    ("ib_reg_failed", "gdr", P + "transport/net_ib.cc:1100 NCCL WARN NET/IB : ibv_reg_mr failed in ncclIbRegMr "
     "(errno 14 Bad address)"),
    ("ib_reg_failed", "gdr", P + "misc/ibvwrap.cc:278 NCCL WARN Call to ibv_reg_mr_iova2 failed with error Cannot "
     "allocate memory"),
    ("ib_reg_failed", "gdr", P + "misc/ibvwrap.cc:290 NCCL WARN Call to ibv_reg_dmabuf_mr failed with error "
     "Bad address"),
    ("ib_async_event", "ib_fabric", P + "transport/net_ib.cc:120 NCCL WARN NET/IB : mlx5_2:1 async fatal event: "
     "local catastrophic error"),
    ("ib_incompatible", "ib_fabric", P + "transport/net_ib.cc:700 NCCL WARN NET/IB : Attempted to merge incompatible "
     "devices: [0]mlx5_0:1/IB and [1]mlx5_2:1/RoCE. Try selecting NICs of only one link type"),
    ("ib_device_unusable", "ib_fabric", P + "transport/net_ib.cc:300 NCCL WARN NET/IB : Unable to open device mlx5_0"),
    ("ofi_unreachable", "ofi_efa", P + "int nccl_net_ofi_rdma_connect(void*, nccl_net_ofi_conn_handle_t*, "
     "nccl_net_ofi_send_comm_t**):4127 NCCL WARN NET/OFI Unable to insert remote address into address vector for "
     "device 1. RC: -22"),
    ("ofi_libfabric_old", "ofi_efa", P + "nccl_net_ofi_init:700 NCCL WARN NET/OFI EFA provider requires at least "
     "libfabric version 1.22.0."),
    ("ofi_mr_failed", "gdr", P + "reg_mr:300 NCCL WARN NET/OFI Could not register memory on data rail 0 with flag 0"),
    ("ofi_no_provider", "ofi_efa", P + "get_ofi_provider:312 NCCL WARN NET/OFI Could not find any optimal provider"),
    ("ofi_error", "ofi_efa", P + "foo:1 NCCL WARN NET/OFI Call to fi_getname() failed with RC: -5, ERROR: I/O error"),
    ("version_mismatch", "version_mismatch", P + "init.cc:500 NCCL WARN Mismatched NCCL version detected : rank 0 "
     "version 22105 rank 9 version 21903"),
    ("topology_failed", "topology", P + "graph/xml.cc:332 NCCL WARN Could not find real path of "
     "/sys/class/pci_bus/0000:1e/../../0000:1e:00.0"),
    ("nvml_not_found", "topology", P + "misc/nvmlwrap.cc:181 NCCL WARN nvmlDeviceGetHandleByPciBusId() failed: Not Found"),
    ("cuda_failure", "cuda_fault", P + "transport.cc:154 NCCL WARN Cuda failure 'invalid argument'"),
    ("p2p_unsupported", "p2p_acs", P + "graph/paths.cc:300 NCCL WARN P2P is disabled between NVLINK connected GPUs 1 "
     "and 2. This should not be the case given their connectivity, and is probably due to a hardware issue."),
    ("net_count_differs", "version_mismatch", P + "init.cc:900 NCCL WARN Detected mixed local Net device counts across "
     "ranks (min 7, max 8). Set NCCL_IGNORE_NET_MISMATCH=1 to ignore"),
    ("duplicate_gpu", "rank_layout", P + "init.cc:748 NCCL WARN Duplicate GPU detected : rank 1 and rank 0 both on "
     "CUDA device 1a000"),
    ("no_path_to_nic", "topology", P + "graph/paths.cc:700 NCCL WARN Could not find any local path from gpu 3 to net."),
    ("driver_too_old", "cuda_driver", P + "enqueue.cc:3000 NCCL WARN One-sided RMA requires CUDA driver 12.5 or later "
     "(found 12.2)."),
    ("arch_unsupported", "nccl_too_old", P + "enqueue.cc:80 NCCL WARN cudaArch 1000 dynamic smem 82240 exceeds "
     "device/fn maxSharedMem 79856"),
]


@pytest.mark.parametrize(("sid", "family", "line"), SOURCE_LINES, ids=[f"{s}-{i}" for i, (s, _f, _l) in
                                                                        enumerate(SOURCE_LINES)])
def test_each_signature_from_its_source_format(tmp_path: Path, sid: str, family: str, line: str) -> None:
    f = tmp_path / "job.log"
    f.write_text(line + "\n")
    s = parse_nccl_logs([f])
    d = next((x for x in s["diagnoses"] if x["id"] == sid), None)
    assert d is not None, [x["id"] for x in s["diagnoses"]]
    assert d["family"] == family
    assert d["evidence"][0] == "job.log:1: " + line.strip()
    if sid == "nvml_not_found":  # the older rule says it (the catalogue's nvml_failed then adds nothing)
        return
    assert d["severity"] == "error"
    assert d["suggestion"] and d["confidence"] in ("high", "medium", "low")
    assert "First error:" in d["message"]


def test_every_signature_has_a_source_line_test_and_a_known_family() -> None:
    tested = {sid for sid, _f, _l in SOURCE_LINES} | {"ibverbs_missing", "proxy_failed", "nvml_failed",
                                                       "comm_aborted"}
    assert {sig.id for sig in CATALOGUE} <= tested
    for sig in CATALOGUE:
        assert sig.family in FAMILIES, sig.id
        assert sig.cause and sig.fix and sig.subsystem


def test_status_names_and_vendor_error_are_spelt_out(tmp_path: Path) -> None:
    f = tmp_path / "ib.log"
    f.write_text(P + "transport/net_ib.cc:839 NCCL WARN NET/IB : Got completion with error 12, opcode 1, len 0, "
                 "vendor err 129\n")
    d = next(x for x in parse_nccl_logs([f])["diagnoses"] if x["id"] == "ib_completion")
    assert "IBV_WC_RETRY_EXC_ERR" in d["message"] and "vendor error 129" in d["message"]


# ---- the whole log sharpens the words -------------------------------------------------------------

BRIDGED = [
    "gpu1:100:100 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>",
    "gpu1:100:100 [0] NCCL INFO NET/IB : No device found.",
    "gpu1:100:100 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0> [1]docker0:172.17.0.1<0> "
    "[2]br-5f3a:172.18.0.1<0> [3]veth12ab:fe80::1%veth12ab<0>",
    "gpu1:100:100 [0] NCCL INFO Using network Socket",
    "gpu1:100:140 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/1",
    "gpu2:200:200 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/1",
    "gpu1:100:140 [0] misc/socket.cc:484 NCCL WARN socketStartConnect: Connect to 172.18.0.1<41235> failed : "
    "Connection timed out",
]


def test_bridge_interfaces_turn_the_advice_into_nccl_socket_ifname(tmp_path: Path) -> None:
    """defect: traffic went through unroutable bridges and the advice said NCCL_SOCKET_IFNAME "only picks which
    Ethernet interface sockets use" — the setting that fixed it."""
    f = tmp_path / "job.log"
    f.write_text("\n".join(BRIDGED) + "\n")
    s = parse_nccl_logs([f])
    d = {x["id"]: x for x in s["diagnoses"]}
    top = s["diagnoses"][0]
    assert top["id"] == "connect_failed" and top["confidence"] == "high"
    assert "docker0:172.17.0.1" in top["message"] and "br-5f3a:172.18.0.1" in top["message"]
    assert "NCCL_SOCKET_IFNAME=eth0" in top["suggestion"]
    fallback = d["socket_fallback"]
    assert "docker0" in fallback["message"] and "NCCL_SOCKET_IFNAME=eth0" in fallback["suggestion"]
    assert all("only picks" not in (x.get("suggestion") or "") for x in s["diagnoses"])


def test_versions_and_plugins_compared_across_files(tmp_path: Path) -> None:
    a, b = tmp_path / "node-a.log", tmp_path / "node-b.log"
    a.write_text("node-a:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n"
                 "node-a:1:1 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal net plugin.\n")
    b.write_text("node-b:2:2 [0] NCCL INFO NCCL version 2.19.3+cuda12.3\n"
                 "node-b:2:2 [0] NCCL INFO Plugin Path : /opt/hpcx/nccl_rdma_sharp_plugin/lib/libnccl-net.so\n")
    s = parse_nccl_logs([a, b])
    assert s["versions_by_host"] == {"node-a": "2.21.5+cuda12.4", "node-b": "2.19.3+cuda12.3"}
    d = {x["id"]: x for x in s["diagnoses"]}
    assert "2.19.3+cuda12.3 on node-b" in d["version_differs"]["message"]
    assert d["version_differs"]["family"] == "version_mismatch" and d["version_differs"]["evidence"]
    assert "node-b" in d["plugin_differs"]["message"] and "node-a" in d["plugin_differs"]["message"]


# ---- no blind answer ------------------------------------------------------------------------------

def test_an_unknown_warn_is_named_with_its_subsystem_and_usual_causes(tmp_path: Path) -> None:
    f = tmp_path / "job.log"
    f.write_text(P + "proxy.cc:1400 NCCL WARN [Service thread] Accept failed Resource temporarily unavailable\n"
                 + P + "NCCL INFO misc/socket.cc:46 -> 3\n")
    (d,) = [x for x in parse_nccl_logs([f])["diagnoses"] if x["severity"] != "info"]
    assert d["id"] == "unexplained_error"
    assert d["message"].startswith("NCCL reported an error it does not explain: \"[Service thread] Accept failed")
    assert "it came from proxy (proxy.cc:1400)" in d["message"] and "the usual causes are" in d["message"]


def test_an_error_return_alone_is_named_with_its_code(tmp_path: Path) -> None:
    f = tmp_path / "tail.log"
    f.write_text(P + "NCCL INFO transport/net.cc:1298 -> 6\n" + P + "NCCL INFO proxy.cc:694 -> 6\n")
    (d,) = parse_nccl_logs([f])["diagnoses"]
    assert d["id"] == "unexplained_error" and "ncclRemoteError" in d["message"]
    assert "net transport (transport/net.cc:1298)" in d["message"]


def test_a_harmless_warn_is_info_and_the_healthy_answer_says_what_was_checked(tmp_path: Path) -> None:
    f = tmp_path / "ok.log"
    f.write_text("h:1:1 [0] NCCL INFO NCCL version 2.3.7+cuda9.2\n"
                 "h:1:1 [0] misc/ibvwrap.cu:63 NCCL WARN Failed to open libibverbs.so[.1]\n"
                 "h:1:1 [0] NCCL INFO Using internal Network Socket\n")
    s = parse_nccl_logs([f])
    assert [(d["id"], d["severity"]) for d in s["diagnoses"]] == [("ibverbs_missing", "info")]
    res = CliRunner().invoke(cli, ["report", str(f), "--no-html"])
    answer = next(line for line in res.output.replace("\n", " ").split("ANSWER: ")[1:2])
    assert answer.startswith("No problem found in NCCL's own records: 3 line(s) of 1 file(s) read")
    assert "healthy machines" in answer


def test_a_benign_warn_before_the_real_one_is_not_the_answer(tmp_path: Path) -> None:
    """nccl-tests#14: sjeaugey — the libibverbs WARN is to be ignored; the socket one is the error."""
    f = tmp_path / "job.log"
    f.write_text("e66a:1:1 [0] misc/ibvwrap.cu:61 WARN Failed to open libibverbs.so[.1]\n"
                 "e66a:1:1 [0] include/socket.h:311 WARN Socket creation failed : Address family not supported by "
                 "protocol\n")
    s = parse_nccl_logs([f])
    assert s["diagnoses"][0]["id"] == "no_socket_interface"


# ---- any paste, any prefix ------------------------------------------------------------------------

WARN = "misc/shmutils.cc:132 NCCL WARN Error while creating shared memory segment /dev/shm/nccl-x (size 9637888)"
PREFIXES = [
    "gpu7:123:456 [2] ",  # NCCL's own
    "[rank3]:gpu7:123:456 [2] ",  # torchrun
    "[default3]:gpu7:123:456 [2] ",
    "[1,13]<stdout>:gpu7:123:456 [2] ",  # mpirun
    "0: gpu7:123:456 [2] ",  # srun --label
    "[2025-04-22 21:34:20] gpu7:123:456 [2] ",  # NCCL_DEBUG_TIMESTAMP_LEVELS
    "2025-04-22T21:34:20.123Z train-pod-7f9c gpu7:123:456 [2] ",  # kubectl logs --timestamps, pod name
    "(WorkerDict pid=30332) gpu7:123:456 [2] ",  # Ray actor prefix
    "[2] ",  # host stripped
    "",  # everything stripped
]


@pytest.mark.parametrize("prefix", PREFIXES)
def test_problem_lines_are_found_under_any_prefix(prefix: str) -> None:
    p = find_problem("x.log", 7, prefix + WARN)
    assert p is not None and p["kind"] == "warn"
    assert p["src"] == "misc/shmutils.cc:132" and p["text"].startswith("Error while creating shared memory")
    if "gpu7" in prefix:
        assert p["host"] == "gpu7"


def test_interleaved_processes_and_a_tail(tmp_path: Path) -> None:
    """Two hosts interleaved, MPI-prefixed, only the tail of the run: the first error is the root WARN of the
    first process that failed, and each diagnosis cites lines from the file."""
    lines = [
        "[1,0]<stdout>:a:1:10 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0",
        "[1,8]<stdout>:b:2:20 [0] NCCL INFO transport/net.cc:1298 -> 6",
        "[1,0]<stdout>:a:1:10 [0] transport/net_ib.cc:1295 NCCL WARN NET/IB : Got completion from peer 10.0.0.2<1> "
        "with error 12, opcode 0, len 0, vendor err 129 (Send)",
        "[1,8]<stdout>:b:2:20 [0] misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by remote peer a<5>",
        "[1,0]<stdout>:a:1:10 [0] NCCL INFO proxy.cc:694 -> 6",
    ]
    f = tmp_path / "mpi.out"
    f.write_text("\n".join(lines) + "\n")
    s = parse_nccl_logs([f])
    assert set(s["hosts"]) == {"a", "b"} and s["problems_total"] == 4
    ids = [d["id"] for d in s["diagnoses"] if d["severity"] == "error"]
    assert ids[0] == "ib_completion" and "peer_closed" in ids
    assert s["diagnoses"][0]["evidence"][0].startswith("mpi.out:3: ")


def test_nccl_older_than_the_gpu(tmp_path: Path) -> None:
    """NCCL's default build has native sm_90 kernels from 2.15 and sm_100/sm_120 from 2.25 (makefiles/common.mk)."""
    f = tmp_path / "old.log"
    f.write_text("h:1:1 [0] NCCL INFO NCCL version 2.14.3+cuda11.7\n"
                 "h:1:1 [0] enqueue.cc:58 NCCL WARN Cuda failure 'named symbol not found'\n")
    d = {x["id"]: x for x in parse_nccl_logs([f], ["NVIDIA H100 80GB HBM3"])["diagnoses"]}
    assert d["nccl_older_than_gpu"]["severity"] == "error" and "sm_90 (Hopper)" in d["nccl_older_than_gpu"]["message"]
    assert d["arch_unsupported"]["family"] == "nccl_too_old"
    assert "nccl_older_than_gpu" not in {x["id"] for x in parse_nccl_logs([f], ["NVIDIA A100-SXM4-80GB"])["diagnoses"]}
    f.write_text("h:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n")
    d = {x["id"]: x for x in parse_nccl_logs([f], ["NVIDIA B200"])["diagnoses"]}
    assert d["nccl_older_than_gpu"]["severity"] == "warning" and "2.25" in d["nccl_older_than_gpu"]["suggestion"]


def test_a_timeout_without_its_pg_line_joins_its_collective(tmp_path: Path) -> None:
    corpus = Path(__file__).parent / "data" / "nccl_corpus" / "basicsr_737.log"
    (d,) = [x for x in parse_nccl_logs([corpus])["diagnoses"] if x["id"] == "collective_timeout"]
    assert "collective #808 (ALLREDUCE) on PG 0 timed out on ranks 0, 1, 2" in d["message"]


def test_unreadable_nccl_lines_are_counted_once(tmp_path: Path) -> None:
    f = tmp_path / "x.log"
    f.write_text("h:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\nNCCL half a line\nNCCL another\n")
    s = parse_nccl_logs([f])
    assert s["unread"] == {"count": 2, "first": "x.log:2: NCCL half a line"}


def test_no_interface_with_nccl_socket_ifname_set_names_the_setting(tmp_path: Path) -> None:
    f = tmp_path / "job.log"
    f.write_text("h:1:1 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to =enp90s0np0\n"
                 "h:1:1 [0] bootstrap.cc:1290 NCCL WARN Bootstrap : no socket interface found\n")
    d = parse_nccl_logs([f])["diagnoses"][0]
    assert d["id"] == "no_socket_interface" and "NCCL_SOCKET_IFNAME==enp90s0np0 matches no interface" in d["message"]
    assert "NCCL_SOCKET_IFNAME set by environment" in " ".join(d["evidence"])


def test_a_consequence_is_not_the_headline(tmp_path: Path) -> None:
    f = tmp_path / "job.log"
    f.write_text(P + "enqueue.cc:2000 NCCL WARN ncclAllReduce: communicator was revoked\n")
    (d,) = [x for x in parse_nccl_logs([f])["diagnoses"] if x["severity"] != "info"]
    assert d["id"] == "comm_aborted" and d.get("secondary")  # alone, it is still named
    f.write_text(P + "include/alloc.h:178 NCCL WARN Cuda failure 'out of memory'\n"
                 + P + "enqueue.cc:2000 NCCL WARN ncclAllReduce: communicator was revoked\n")
    ids = [x["id"] for x in parse_nccl_logs([f])["diagnoses"]]
    assert ids == ["gpu_oom"]


def test_a_timeout_nothing_explains_is_still_named(tmp_path: Path) -> None:
    f = tmp_path / "store.log"
    f.write_text("  File \"torch/distributed/elastic/utils/store.py\", line 31, in get_all\n"
                 "RuntimeError: Socket Timeout\n")
    (d,) = parse_nccl_logs([f])["diagnoses"]
    assert d["id"] == "timeout_logged" and d["family"] == "timeout" and "Socket Timeout" in d["message"]


def test_old_bootstrap_list_with_a_veth_pair(tmp_path: Path) -> None:
    """NCCL <= 2.18 lists every bootstrap interface (`Bootstrap : Using [0]eno1:… [1]veth…:fe80::…`): a veth pair
    with a link-local address beside the real NIC is named, and the fix is NCCL_SOCKET_IFNAME=eno1."""
    f = tmp_path / "w.log"
    f.write_text("w:1:1 [0] NCCL INFO Bootstrap : Using [0]eno1:172.18.40.41<0> [1]veth25f2:fe80::38%veth25f2<0>\n"
                 "w:1:1 [0] NCCL INFO Call to connect returned Connection timed out, retrying\n"
                 "w:1:9 [0] include/socket.h:403 NCCL WARN Connect to fe80::12%veth25f2<40405> failed : Connection "
                 "timed out\n")
    d = parse_nccl_logs([f])["diagnoses"][0]
    assert d["id"] == "connect_failed" and "veth25f2" in d["message"]
    assert "NCCL_SOCKET_IFNAME=eno1" in d["suggestion"]


def test_the_line_after_pytorchs_last_error_is_nccls_warn(tmp_path: Path) -> None:
    f = tmp_path / "trace.txt"
    f.write_text("[rank1]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1691, invalid usage "
                 "(run with NCCL_DEBUG=WARN for details), NCCL version 2.19.3\n"
                 "[rank1]: ncclInvalidUsage: This usually reflects invalid usage of NCCL library.\n"
                 "[rank1]: Last error:\n"
                 "[rank1]: Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 2000\n")
    s = parse_nccl_logs([f])
    assert s["diagnoses"][0]["id"] == "duplicate_gpu"
    assert s["problems"][-1]["text"] == "Duplicate GPU detected : rank 1 and rank 0 both on CUDA device 2000"


def test_shm_words_follow_the_error(tmp_path: Path) -> None:
    """"No space left" is /dev/shm too small; "attaching ... No such file" is processes that do not share it."""
    f = tmp_path / "a.log"
    f.write_text(P + "misc/shmutils.cc:129 NCCL WARN Error while attaching to shared memory segment /dev/shm/nccl-x "
                 "(size 14156128), error: No such file or directory (2)\n")
    d = parse_nccl_logs([f])["diagnoses"][0]
    assert d["id"] == "shm_full" and "do not share /dev/shm" in d["message"] and "--ipc=host" in d["suggestion"]
    f.write_text(P + "misc/shmutils.cc:132 NCCL WARN Error while creating shared memory segment /dev/shm/nccl-x "
                 "(size 9637888), error: No space left on device (28)\n")
    d = parse_nccl_logs([f])["diagnoses"][0]
    assert "64 MB by default" in d["message"] and "(this segment: 9.2 MiB)" in d["message"]
