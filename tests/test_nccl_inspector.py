"""NCCL Inspector files: the format from NCCL's plugins/profiler/inspector README, and a job written from
a known schedule (arrival times and transfer times), so every number has an exact truth."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from traceread.analysis.comm.nccl import inspector_files_under, read_inspector, refit
from traceread.analysis.comm.nccl.logs import empty_summary
from traceread.cli import cli

EXAMPLE = Path(__file__).parent / "data" / "nccl" / "inspector" / "example-hostname-pid1639453.log"
MIB = 1 << 20

# The schedule: an 8-rank world communicator on 2 nodes (AllReduce 256 MiB, 12 times) and a 4-rank TP
# communicator on node-a (AllGather 64 MiB per rank, 6 times). Transfer 20 ms, except #7 (60 ms on
# every rank); rank 5 arrives 5 ms late at #1-#10; the others arrive within 200 us.
WORLD, TP = "0xaaaa0001", "0xbbbb0002"
SIZE_AR, SIZE_AG = 256 * MIB, 64 * MIB
T_AR, T_SLOW, T_AG = 20_000, 60_000, 700
LATE, LATE_US = 5, 5_000


def arrival(rank: int, sn: int) -> int:
    return LATE_US if (rank == LATE and sn <= 10) else (rank * 37 + sn * 11) % 200


def _record(comm: str, name: str | None, rank: int, n: int, nnodes: int, coll: str, sn: int, size: int, us: float,
            host: str, pid: int) -> str:
    # busbw as the Inspector computes it (inspectorComputeOpBw): traffic / time x the nccl-tests factor
    traffic, factor = (size, 2 * (n - 1) / n) if coll == "AllReduce" else (size * n, (n - 1) / n)
    algbw = traffic / 1e9 / (us / 1e6)
    header = {"id": comm, "rank": rank, "n_ranks": n, "nnodes": nnodes}
    if name:
        header["comm_name"] = name
    rec = {"header": header,
           "metadata": {"inspector_output_format_version": "v4.0", "git_rev": "", "rec_mechanism": "nccl_profiler_interface",
                        "dump_timestamp_us": 1_750_000_000_000_000 + sn, "hostname": host, "pid": pid},
           "coll_perf": {"coll": coll, "coll_sn": sn, "coll_msg_size_bytes": size, "coll_exec_time_us": int(us),
                         "coll_timing_source": "kernel_gpu", "coll_algobw_gbs": round(algbw, 6),
                         "coll_busbw_gbs": round(algbw * factor, 6)}}
    return json.dumps(rec, separators=(",", ":"))


def write_job(out: Path) -> dict:
    """One ``<host>-pid<pid>.log`` per rank; returns the truth of the schedule."""
    out.mkdir(parents=True, exist_ok=True)
    truth = {"late": {}, "wait": {}, "transfer": {}}
    lines: dict[int, list[str]] = {r: [] for r in range(8)}
    for sn in range(1, 13):
        t = T_SLOW if sn == 7 else T_AR
        arr = {r: arrival(r, sn) for r in range(8)}
        last = max(arr.values())
        for r in range(8):
            lines[r].append(_record(WORLD, None, r, 8, 2, "AllReduce", sn, SIZE_AR, last - arr[r] + t,
                                    "node-a" if r < 4 else "node-b", 100 + r))
        truth["late"][sn] = max(arr, key=lambda r: arr[r])
        truth["wait"][sn] = last - min(arr.values())
        truth["transfer"][sn] = t
    for sn in range(1, 7):
        for r in range(4):
            lines[r].append(_record(TP, "tp", r, 4, 1, "AllGather", sn, SIZE_AG, T_AG, "node-a", 100 + r))
    for r, ls in lines.items():
        (out / f"{'node-a' if r < 4 else 'node-b'}-pid{100 + r}.log").write_text("\n".join(ls) + "\n")
    return truth


def test_readme_format_verbose_p2p_nan_and_a_cut_record() -> None:
    assert inspector_files_under([EXAMPLE.parent]) == [EXAMPLE]
    ins = read_inspector([EXAMPLE])
    assert (ins["records"], ins["p2p_records"], ins["bad_lines"], ins["truncated"]) == (3, 1, 1, False)
    assert ins["format_versions"] == ["v4.0"]
    assert ins["p2p"] == [{"comm_id": "0xe62dedaa97644a", "op": "Send", "count": 1, "median_busbw_gbs": 26.2144}]
    a, b = ins["comms"]
    assert (a["comm_id"], a["comm_name"], a["nranks"], a["nnodes"], a["ranks_seen"], a["hosts"]) == \
        ("0x7f8c496ae9f661", None, 8, 1, 1, ["example-hostname"])
    assert a["collectives"] == [{"coll": "AllReduce", "msg_bytes": 17179869184, "count": 1, "median_transfer_us": 61974.0,
                                 "median_busbw_gbs": 485.119099, "best_busbw_gbs": 485.119099, "wait_us": 0.0}]
    assert a["late_ranks"] == []  # one rank's records: nobody to wait for
    assert b["comm_name"] == "tp_group"
    assert [(k["coll"], k["median_busbw_gbs"]) for k in b["collectives"]] == [("AllGather", None),
                                                                             ("ReduceScatter", 366.134533)]
    assert ins["slow_collectives"] == [] and ins["slow_collectives_total"] == 0


def test_job_from_a_schedule_exact_truth(tmp_path: Path) -> None:
    truth = write_job(tmp_path / "nccl-inspector-1234")
    files = inspector_files_under([tmp_path])
    assert len(files) == 8
    ins = read_inspector(files)
    assert ins["records"] == 8 * 12 + 4 * 6 and ins["bad_lines"] == 0
    world = next(c for c in ins["comms"] if c["comm_id"] == WORLD)
    (ar,) = world["collectives"]
    assert (ar["coll"], ar["msg_bytes"], ar["count"]) == ("AllReduce", SIZE_AR, 12)
    assert ar["median_transfer_us"] == T_AR
    busbw = SIZE_AR / 1e9 / (T_AR / 1e6) * 2 * 7 / 8
    assert ar["median_busbw_gbs"] == pytest.approx(busbw, abs=1e-5)
    assert ar["best_busbw_gbs"] == pytest.approx(busbw, abs=1e-5)
    assert ar["wait_us"] == sum(truth["wait"].values())
    late = world["late_ranks"][0]
    assert (late["rank"], late["host"], late["pid"], late["of"]) == (LATE, "node-b", 105, 12)
    assert late["times_last"] == sum(1 for sn in truth["late"] if truth["late"][sn] == LATE) == 10
    assert late["wait_caused_us"] == sum(truth["wait"][sn] for sn in range(1, 11))
    assert late["slow"] is True and late["wait_share"] > 0.9
    assert all(not r["slow"] for r in world["late_ranks"][1:])
    assert ins["slow_collectives_total"] == 1
    (slow,) = ins["slow_collectives"]
    assert (slow["comm_id"], slow["coll"], slow["coll_sn"], slow["msg_bytes"]) == (WORLD, "AllReduce", 7, SIZE_AR)
    assert (slow["transfer_us"], slow["median_transfer_us"], slow["late_rank"]) == (T_SLOW, T_AR, truth["late"][7])
    tp = next(c for c in ins["comms"] if c["comm_id"] == TP)
    assert (tp["comm_name"], tp["nranks"], tp["nnodes"], tp["ranks_seen"]) == ("tp", 4, 1, 4)
    assert tp["collectives"][0]["median_busbw_gbs"] == pytest.approx(SIZE_AG * 4 / 1e9 / (T_AG / 1e6) * 3 / 4, abs=1e-5)
    assert tp["late_ranks"][0]["wait_caused_us"] == 0 and not tp["late_ranks"][0]["slow"]

    s = empty_summary()
    s["inspector"] = ins
    refit(s)
    ids = [d["id"] for d in s["diagnoses"]]
    assert ids == ["inspector_late_rank", "inspector_slow_collectives"]  # no peak without knowing the GPU
    d = {x["id"]: x for x in s["diagnoses"]}
    assert d["inspector_late_rank"]["message"] == (
        f"rank 5 (node-b, pid 105) arrived last at 10 of 12 collectives on communicator {WORLD}, 8 ranks on 2 node(s): "
        f"the others waited {late['wait_caused_us'] / 1e3:.1f} ms for it ({100 * late['wait_share']:.0f}% of the "
        "communicator's waiting)")
    assert d["inspector_slow_collectives"]["message"].startswith(
        f"1 collective(s) took more than 2x the usual time for their size; the worst: AllReduce #7 of 256 MiB on "
        f"communicator {WORLD} took 60.0 ms against a median of 20.0 ms")
    refit(s, ["NVIDIA H100 80GB HBM3"])  # the traces name the GPU: the peaks are known
    assert world["peak_link"] == "InfiniBand NDR 400 Gb/s NIC" and world["peak_gbps"] == 50.0
    assert ar["pct_of_peak"] == pytest.approx(100 * busbw / 50.0)
    assert tp["peak_link"] == "NVLink 4 (H100/H200)" and tp["collectives"][0]["pct_of_peak"] > 50
    low = {x["id"]: x for x in s["diagnoses"]}["inspector_low_busbw"]
    assert low["message"] == (f"AllReduce of 256 MiB on communicator {WORLD}, 8 ranks on 2 node(s): median bus bandwidth "
                              f"{busbw:.1f} GB/s = {100 * busbw / 50:.0f}% of the link's peak (InfiniBand NDR 400 Gb/s "
                              "NIC, 50 GB/s per direction)")


def test_report_on_inspector_files_alone(tmp_path: Path) -> None:
    write_job(tmp_path / "nccl-inspector-1234")
    res = CliRunner().invoke(cli, ["report", str(tmp_path), "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["ranks"] == [] and doc["nccl"]["files"] == [] and len(doc["nccl"]["inspector"]["files"]) == 8
    assert [f["id"] for f in doc["findings"]] == ["nccl_inspector_late_rank", "nccl_inspector_slow_collectives"]
    assert not doc["warnings"]
    res = CliRunner().invoke(cli, ["report", str(tmp_path), "--no-html"])
    said = " ".join(res.output.split())  # the terminal folds long lines to its width
    assert "NCCL Inspector (8 file(s)): 120 collective record(s) on 2 communicator(s) · 1 slow collective(s)" in said
    assert "ANSWER: NCCL: rank 5 (node-b, pid 105) arrived last" in said
    one = sorted((tmp_path / "nccl-inspector-1234").glob("*.log"))[0]
    res = CliRunner().invoke(cli, ["report", str(one), "--format", "json"])  # a file named explicitly is not a trace
    assert res.exit_code == 0 and json.loads(res.stdout)["nccl"]["inspector"]["records"] == 18
