"""`traceread report` on NCCL logs without traces, and the slow-communicator-init diagnosis.

The ``Init timings`` lines follow NCCL's own format string (src/init.cc, 2.19+: "Init timings - %s: rank
%d nranks %d total %.2f (kernels %.2f, alloc %.2f, bootstrap %.2f, allgathers %.2f, topo %.2f, graphs
%.2f, connections %.2f, rest %.2f)"; older releases print "Init timings: rank ..." without alloc).
"""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from traceread.analysis.hang.nccl_log import SLOW_INIT_S, parse_nccl_logs
from traceread.cli import cli


def init_line(host: str, rank: int, total: float, boot: float, topo: float, conn: float) -> str:
    rest = round(total - boot - topo - conn - 0.41, 2)
    return (f"{host}:{100 + rank}:{200 + rank} [{rank % 8}] NCCL INFO Init timings - ncclCommInitRankConfig: rank {rank} "
            f"nranks 16 total {total:.2f} (kernels 0.30, alloc 0.01, bootstrap {boot:.2f}, allgathers 0.05, "
            f"topo {topo:.2f}, graphs 0.05, connections {conn:.2f}, rest {rest:.2f})")


SLOW_BOOTSTRAP = "\n".join([
    "node-a:100:200 [0] NCCL INFO NCCL version 2.21.5+cuda12.4",
    "node-a:100:200 [0] NCCL INFO comm 0x1 rank 0 nranks 16 cudaDev 0 nvmlDev 0 busId 1a000 commId 0xfeed - Init START",
    init_line("node-a", 0, 47.9, 46.1, 0.4, 0.6),
    init_line("node-a", 1, 47.8, 46.0, 0.4, 0.6),
    init_line("node-b", 9, 2.1, 0.3, 0.4, 0.6),  # arrived last: waited least
])


def test_slow_init_names_the_dominant_phase_and_the_late_rank(tmp_path: Path) -> None:
    f = tmp_path / "train.log"
    f.write_text(SLOW_BOOTSTRAP)
    s = parse_nccl_logs([f])
    assert s["init_phases"]["0"]["bootstrap"] == 46.1 and s["init_phases"]["0"]["alloc"] == 0.01
    assert s["init_time_s"] == 47.9
    d = {x["id"]: x for x in s["diagnoses"]}["slow_init"]
    assert "47.9 s on rank 0" in d["message"] and "bootstrap 46.1 s = 96%" in d["message"]
    assert "Rank 9 waited least" in d["message"] and "rendezvous" in d["message"]


def test_slow_connections_phase(tmp_path: Path) -> None:
    f = tmp_path / "train.log"
    f.write_text(init_line("n", 3, 30.0, 1.0, 2.0, 25.0))
    d = {x["id"]: x for x in parse_nccl_logs([f])["diagnoses"]}["slow_init"]
    assert "connections 25.0 s = 83%" in d["message"] and "NCCL_RUNTIME_CONNECT" in d["message"]


def test_fast_init_is_not_diagnosed(tmp_path: Path) -> None:
    f = tmp_path / "train.log"
    f.write_text(init_line("n", 0, SLOW_INIT_S - 0.5, 1.0, 2.0, 3.0))
    assert "slow_init" not in {x["id"] for x in parse_nccl_logs([f])["diagnoses"]}


def test_real_init_timings_old_format(shared_dir: Path) -> None:
    log = shared_dir / "nccl_logs" / "nccl_1412_2node_ib.log"
    s = parse_nccl_logs([log])
    assert s["init_phases"]["2"] == {"kernels": 0.51, "bootstrap": 0.22, "allgathers": 0.01, "topo": 0.28,
                                     "graphs": 0.04, "connections": 0.02, "rest": 0.01}
    assert "slow_init" not in {x["id"] for x in s["diagnoses"]}  # 1.08 s is healthy


def test_report_on_logs_alone(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "job-1234.out").write_text(SLOW_BOOTSTRAP + "\n" + "\n".join([
        "node-a:100:200 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] via NET/Socket/0",
        "node-b:108:208 [0] NCCL INFO Channel 00/0 : 8[0] -> 0[0] via NET/Socket/0",
    ]))
    (tmp_path / "logs" / "notes.txt").write_text("nothing to see")
    runner = CliRunner()
    res = runner.invoke(cli, ["report", str(tmp_path / "logs"), "--no-html"])
    assert res.exit_code == 0, res.output
    assert "NCCL logs (1 file)" in res.output and "no trace" in res.output
    assert "fell back to TCP sockets" in res.output and "communicator init took 47.9 s" in res.output
    res = runner.invoke(cli, ["report", str(tmp_path / "logs" / "job-1234.out"), "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["ranks"] == [] and doc["nccl"]["init_time_s"] == 47.9
    assert {"nccl_slow_init", "nccl_socket_fallback"} <= {f["id"] for f in doc["findings"]}
    assert not doc["warnings"]  # the log named explicitly is not reported as a broken trace


def test_no_logs_no_traces_is_still_exit_3(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("nothing to see")
    res = CliRunner().invoke(cli, ["report", str(tmp_path), "--no-html"])
    assert res.exit_code == 3 and "no trace files" in res.output
