"""NCCL_DEBUG / c10d watchdog log parsing on the real excerpts in ../shared/nccl_logs."""

from __future__ import annotations

from pathlib import Path

import pytest

from traceread.analysis.hang.nccl_log import find_nccl_logs, parse_nccl_logs


@pytest.fixture(scope="module")
def logs(shared_dir: Path) -> Path:
    return shared_dir / "nccl_logs"


def _ids(s: dict) -> set[str]:
    return {d["id"] for d in s["diagnoses"]}


def test_every_shared_file_gives_a_meaningful_summary(logs: Path) -> None:
    files = sorted(logs.glob("*.log"))
    assert len(files) >= 8
    for f in files:
        s = parse_nccl_logs([f])
        facts = [s["version"], s["nranks"], s["transports"], s["timeouts"], s["warnings"], s["network"],
                 s["diagnoses"]]
        assert any(facts), f.name
        assert s["lines_parsed"] > 0


def test_efa_nccl_tests_mpirun(logs: Path) -> None:
    s = parse_nccl_logs([logs / "README_nccl-tests-efa-16_allreduce.log"])  # mpirun "[1,3]<stdout>:" prefixes
    assert s["version"] == "2.9.9+cuda11.2"
    assert s["nranks"] == 16 and s["nodes"] == 2
    assert s["hosts"] == ["nccl-tests-efa-16-worker-0", "nccl-tests-efa-16-worker-1"]
    assert s["network"] == "AWS Libfabric" and s["ofi_provider"] == "efa"
    assert set(s["transports"]) == {"P2P/IPC", "NET/AWS Libfabric"}
    assert s["gdrdma"] is True
    assert s["comms"][0]["init_complete"] == list(range(16))
    assert s["channels"]["coll"] == 8
    assert len(s["rings"]) == 8 and s["rings"]["0"][:3] == [0, 7, 6]
    assert s["nccl_tests_busbw_gbps"] == pytest.approx(11.2432)
    assert not {"socket_fallback", "no_gdrdma"} & _ids(s)  # a healthy EFA run


def test_1066_nvml_warning(logs: Path) -> None:
    s = parse_nccl_logs([logs / "nccl_1066_ib_warn.log"])
    assert s["version"] == "2.12.12+cuda11.7"
    assert s["network"] == "IB"
    assert s["ib_devices"] == ["mlx5_0:1/IB", "mlx5_1:1/IB", "mlx5_2:1/RoCE"]
    assert s["net_plugin"] == "none (internal)"
    assert len(s["warnings"]) == 2 and s["warnings"][0]["src"] == "misc/nvmlwrap.cc:181"
    assert "nvml_not_found" in _ids(s)
    assert s["nranks"] == 2  # from the ring "0 1"


def test_1412_two_node_ib_without_gdrdma(logs: Path) -> None:
    s = parse_nccl_logs([logs / "nccl_1412_2node_ib.log"])
    assert s["nranks"] == 16 and s["nodes"] == 2 and s["local_ranks"] == 8
    assert s["transports"]["NET/IB"] == 4 and s["transports"]["P2P/direct"] == 10
    assert s["gdrdma"] is False
    assert "no_gdrdma" in _ids(s)
    assert s["init_time_s"] == pytest.approx(1.08)
    (comm,) = s["comms"]
    assert comm["comm_id"] == "0x49bbd7790311d5eb" and comm["nnodes"] == 2
    assert comm["init_complete"] == [0, 1, 4, 5, 6]
    assert s["rings"]["0"] == [0, 5, 4, 7, 6, 3, 2, 1, 8, 13, 12, 15, 14, 11, 10, 9]


def test_1584_no_prefix_plugin_and_nvls(logs: Path) -> None:
    s = parse_nccl_logs([logs / "nccl_1584_init_no_prefix.log"])  # reporter stripped every prefix
    assert s["version"] == "2.24.3+cuda12.2"
    assert s["cuda_driver"] == 12040
    assert s["network"] == "IBext_v8"
    assert "NCCL RDMA Plugin v8" in s["net_plugin"] and "SHARP" in s["net_plugin"]
    assert len(s["ib_devices"]) == 8 and s["ib_devices"][0] == "ibp0:1/IB/SHARP"
    assert s["nvls"]["available"] is True
    assert s["nranks"] == 8
    assert s["bootstrap_interfaces"] == ["eth0:10.7.147.73"]
    assert "init_incomplete" in _ids(s)  # the excerpt ends after Init START


def test_1609_single_node_shm_and_nvls(logs: Path) -> None:
    s = parse_nccl_logs([logs / "nccl_1609_socket_shm_nvls.log"])
    assert s["nranks"] == 4 and s["nodes"] == 1
    assert s["network"] == "Socket"
    assert s["transports"] == {"SHM": 5}
    assert s["nvls"] == {"available": True, "channels": 16, "comms": 4}
    ids = _ids(s)
    assert "shm_instead_of_p2p" in ids
    assert "socket_fallback" not in ids  # one node: sockets carry no collective traffic
    (comm,) = s["comms"]
    assert comm["ranks_seen"] == [0, 1, 2, 3]  # bootstrapSplit lines of the 4 processes, one commId


def test_226_old_format_socket_between_nodes(logs: Path) -> None:
    s = parse_nccl_logs([logs / "nccl_226_socket_64rank_old.log"])
    assert s["nranks"] == 64
    assert s["nodes"] > 1
    assert set(s["transports"]) == {"NET/Socket"}
    assert s["network"] == "Socket"
    assert "socket_fallback" in _ids(s)
    msg = next(d["message"] for d in s["diagnoses"] if d["id"] == "socket_fallback")
    assert "inter-node traffic fell back to TCP sockets" in msg


def test_warn_socket_proxy_errors(logs: Path) -> None:
    s = parse_nccl_logs([logs / "nccl_warn_socket_proxy.log"])
    assert len(s["warnings"]) == 8 and len(s["errors"]) == 8
    assert s["error_codes"] == {"2": 6, "6": 1, "3": 4}
    ids = _ids(s)
    assert {"connect_failed", "peer_closed", "cuda_failure"} <= ids
    peer = next(d["message"] for d in s["diagnoses"] if d["id"] == "peer_closed")
    assert "node1<57557>" in peer
    assert {"ubuntu", "tomte401"} <= set(s["hosts"])  # mpirun-prefixed line parsed too


def test_torch_watchdog_timeouts(logs: Path) -> None:
    s = parse_nccl_logs([logs / "torch_c10d_watchdog.log"])
    by = {(t["rank"], t["seq"]): t for t in s["timeouts"]}
    t = by[(1, 808)]
    assert (t["op"], t["pg"], t["numel_in"], t["timeout_ms"], t["ran_for_ms"]) == \
           ("ALLREDUCE", "0", 9801523, 600000, 600020)
    assert (t["last_enqueued"], t["last_completed"]) == (811, 807)
    assert by[(4, 7753)]["op"] == "_REDUCE_SCATTER_BASE" and by[(4, 7753)]["pg"] == "1"
    assert by[(4, 9141)]["last_completed"] == 9140
    assert by[(5, 120049)]["last_enqueued"] == 120051  # newer "PG status:" wording
    kinds = {m["kind"] for m in s["torch_messages"]}
    assert {"flight_recorder_disabled", "dump_signal", "dump_signal_observed"} <= kinds
    ids = _ids(s)
    assert "collective_timeout" in ids and "flight_recorder_disabled" in ids


def test_torchrun_prefix_and_garbage(tmp_path: Path, logs: Path) -> None:
    src = (logs / "nccl_1412_2node_ib.log").read_text().splitlines()
    noisy = []
    for i, line in enumerate(src):
        noisy.append(f"[default{i % 8}]:{line}")
        noisy.append("\x00\xff garbled NCCL INFO comm 0xZZ rank x nranks")
        noisy.append("NCCL INFO Channel 99/0 : a[b] -> c via")
    f = tmp_path / "torchrun.log"
    f.write_text("\n".join(noisy), errors="replace")
    s = parse_nccl_logs([f, tmp_path / "does_not_exist.log"])
    assert s["nranks"] == 16 and s["gdrdma"] is False
    assert s["transports"]["NET/IB"] == 4
    assert "no_gdrdma" in _ids(s)


def test_binary_file_never_crashes(tmp_path: Path) -> None:
    f = tmp_path / "nccl.bin.log"
    f.write_bytes(bytes(range(256)) * 50)
    s = parse_nccl_logs([f])
    assert s["version"] is None and s["diagnoses"] == []


def test_find_logs_in_run_folder(tmp_path: Path) -> None:
    (tmp_path / "nccl").mkdir()
    (tmp_path / "nccl" / "nccl.host.1.log").write_text("x")
    (tmp_path / "launcher.log").write_text("y")
    found = find_nccl_logs(tmp_path)
    assert [p.name for p in found] == ["nccl.host.1.log", "launcher.log"]
