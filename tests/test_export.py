"""``traceread export``: the merged timeline of every multi-rank sample is valid Chrome-trace JSON,
one process per rank, one clock (matched collectives end together after the report's offsets),
and a findings track whose slices carry the finding id, title, rank and ms."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

import pytest
from click.testing import CliRunner

from traceread.assemble.report import ReportOptions, build_report
from traceread.cli import cli
from traceread.export import ExportOptions, export_trace
from traceread.export.marks import FINDINGS_PID
from traceread.export.rank_events import rank_pid
from traceread.export.selection import parse_ranks, parse_steps

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_traces"
MULTI_RANK = ["ddp_straggler_h100", "tp_dp_h100", "pp_1f1b_h100", "pp_gpipe_h100", "slow_steps_a100",
              "skewed_2host_h100", "cpu_ddp_gloo", "cpu_straggler_gloo", "cpu_hang_gloo", "h100_ddp_gloo_2proc_1gpu"]


def load(path: Path) -> dict:
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if path.name.endswith(".gz") else raw)


def check_chrome_trace(doc: dict) -> None:
    """What chrome://tracing and Perfetto's JSON importer require of every event."""
    assert isinstance(doc["traceEvents"], list) and doc["traceEvents"]
    for e in doc["traceEvents"]:
        assert isinstance(e.get("ph"), str) and isinstance(e.get("pid"), int) and isinstance(e.get("tid"), int), e
        if e["ph"] == "X":
            assert isinstance(e["ts"], (int, float)) and e["dur"] >= 0 and isinstance(e.get("name"), str), e
        if e["ph"] in ("s", "f", "t"):
            assert "id" in e


def names(doc: dict, what: str) -> dict[tuple[int, int], str]:
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == what}


def exported(reports: dict[str, dict], sample: str, out: Path, options: ExportOptions | None = None) -> tuple[dict, dict]:
    """(report, merged trace) of a sample."""
    rep = reports[sample]
    export_trace(rep, out, options)
    return rep, load(out)


@pytest.fixture(scope="module")
def reports() -> dict[str, dict]:
    return {name: build_report([SAMPLES / name], ReportOptions(workers=1)) for name in MULTI_RANK}


@pytest.mark.parametrize("sample", MULTI_RANK)
def test_every_multi_rank_sample_exports(sample: str, reports: dict[str, dict], tmp_path: Path) -> None:
    rep = reports[sample]
    out = tmp_path / "merged.json.gz"
    res = export_trace(rep, out)
    doc = load(out)
    check_chrome_trace(doc)
    assert res.bytes_written == out.stat().st_size
    procs = {pid: n for (pid, _), n in names(doc, "process_name").items()}
    ranks = sorted(e["rank"] for e in rep["ranks"])
    assert len(ranks) >= 2
    for e in rep["ranks"]:
        assert procs[rank_pid(e["rank"])].startswith(f"rank {e['rank']}")
        if e.get("device"):
            assert e["device"] in procs[rank_pid(e["rank"])]
    assert procs[FINDINGS_PID] == "traceread findings"
    # every event sits in a named thread of its rank's process (streams and threads kept)
    threads = names(doc, "thread_name")
    used = {(e["pid"], e["tid"]) for e in doc["traceEvents"] if e["ph"] != "M"}
    assert used <= set(threads) | {(p, 0) for p in procs}
    for r in ranks:
        own = [n for (p, _), n in threads.items() if p == rank_pid(r)]
        assert any("thread" in n for n in own)
        if rep["ranks"][0].get("device"):
            assert any("stream" in n for n in own), own
    # one event count per rank equals the source file's non-metadata events
    src = next(e for e in rep["ranks"] if e["rank"] == ranks[0])
    raw = load(Path(src["file"]))
    n_src = sum(1 for e in raw["traceEvents"] if e.get("ph") != "M")
    assert sum(1 for e in doc["traceEvents"] if e["pid"] == rank_pid(ranks[0]) and e["ph"] != "M") == n_src
    # findings slices never partially overlap on one thread (Perfetto drops improperly nested slices)
    by_thread: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for ev in doc["traceEvents"]:
        if ev["pid"] == FINDINGS_PID and ev["ph"] == "X":
            by_thread[ev["tid"]].append((ev["ts"], ev["ts"] + ev["dur"]))
    for spans in by_thread.values():
        spans.sort()
        assert all(b[0] >= a[1] - 1e-6 or b[1] <= a[1] + 1e-6 for a, b in zip(spans, spans[1:]))
    assert doc["otherData"]["clock"]["method"] == (rep["source"].get("clock") or {}).get("method", "none")


def _collective_ends(doc: dict) -> dict[tuple[str, int], dict[int, float]]:
    ends: dict[tuple[str, int], dict[int, float]] = defaultdict(dict)
    for e in doc["traceEvents"]:
        a = e.get("args") or {}
        if e["ph"] == "X" and e.get("cat") == "kernel" and a.get("Seq") is not None and e["pid"] != FINDINGS_PID:
            ends[(str(a.get("Process Group Name")), int(a["Seq"]))][e["pid"] - 1] = e["ts"] + e["dur"]
    return ends


def test_skewed_clocks_are_aligned(reports: dict[str, dict], tmp_path: Path) -> None:
    rep, doc = exported(reports, "skewed_2host_h100", tmp_path / "skewed.json")
    clock = rep["source"]["clock"]
    eps = float(clock["epsilon_us"])
    truth = json.loads((SAMPLES / "skewed_2host_h100" / "truth.json").read_text())["clock_offsets_us"]
    assert max(truth.values()) - min(truth.values()) > 10 * eps  # the sample really is skewed
    ends = _collective_ends(doc)
    assert len(ends) >= 4
    raw_ends: dict[tuple[str, int], dict[int, float]] = defaultdict(dict)
    for e in rep["ranks"]:
        for ev in load(Path(e["file"]))["traceEvents"]:
            a = ev.get("args") or {}
            if ev.get("cat") == "kernel" and a.get("Seq") is not None:
                raw_ends[(str(a.get("Process Group Name")), int(a["Seq"]))][e["rank"]] = ev["ts"] + ev["dur"]
    for key, per_rank in ends.items():
        assert len(per_rank) == 8
        assert max(per_rank.values()) - min(per_rank.values()) <= 3 * eps, key  # one clock now
        raw = raw_ends[key]
        assert max(raw.values()) - min(raw.values()) > 500.0  # ... and not before the export


def test_findings_track_marks_the_straggler(reports: dict[str, dict], tmp_path: Path) -> None:
    rep, doc = exported(reports, "ddp_straggler_h100", tmp_path / "straggler.json")
    marks = [e for e in doc["traceEvents"] if e["pid"] == FINDINGS_PID and e["ph"] == "X"]
    finding = next(f for f in rep["findings"] if f["id"] == "straggler")
    late = [m for m in marks if m["args"]["finding_id"] == "straggler" and "late to" in m["name"]]
    assert late and all(m["args"]["rank"] == finding["rank"] == 5 for m in late)
    assert all(m["args"]["title"] == finding["title"] and m["args"]["ms"] > 0 for m in late)
    waits = [m for m in marks if "wait_ms_by_rank" in m["args"]]
    assert waits and all(set(m["args"]["wait_ms_by_rank"]) <= {str(r) for r in range(8)} - {"5"} for m in waits)
    # a late slice ends where rank 5's collective kernel starts on the merged clock
    starts = {round(e["ts"], 3) for e in doc["traceEvents"] if e["pid"] == rank_pid(5) and e.get("cat") == "kernel"
              and "nccl" in e["name"].lower()}
    assert all(round(m["ts"] + m["dur"], 3) in starts for m in late)


def test_straggler_marks_are_the_simulated_arrivals(reports: dict[str, dict], tmp_path: Path) -> None:
    """Against the simulator's schedule (truth.json ``collectives``: each member's arrival): one "late"
    slice per collective rank 5 joined last, from the previous arrival to its own, and one "waits
    caused" slice from the first arrival, with every other rank's wait, to the µs."""
    _, doc = exported(reports, "ddp_straggler_h100", tmp_path / "straggler.json")
    truth = json.loads((SAMPLES / "ddp_straggler_h100" / "truth.json").read_text())
    assert set(truth["clock_offsets_us"].values()) == {0.0}  # the truth's clock is the export's clock
    late_colls = sorted((c for c in truth["collectives"] if c["last_rank"] == 5), key=lambda c: c["arrivals_us"]["5"])
    assert len(late_colls) == len(truth["collectives"])  # a GPU straggler is last to every all-reduce
    marks = [e for e in doc["traceEvents"] if e["pid"] == FINDINGS_PID and e["ph"] == "X"
             and e["args"]["finding_id"] == "straggler"]
    late = sorted((m for m in marks if "late to" in m["name"]), key=lambda m: m["ts"])
    caused = sorted((m for m in marks if "wait_ms_by_rank" in m["args"]), key=lambda m: m["ts"])
    assert len(late) == len(caused) == len(late_colls)
    for m, w, c in zip(late, caused, late_colls):
        arr = {int(r): t for r, t in c["arrivals_us"].items()}
        own = arr.pop(5)
        assert m["ts"] + m["dur"] == pytest.approx(own, abs=1e-3)
        assert m["dur"] == pytest.approx(own - max(arr.values()), abs=1e-3)
        assert w["ts"] == pytest.approx(min(arr.values()), abs=1e-3) and w["ts"] + w["dur"] == pytest.approx(own, abs=1e-3)
        assert m["args"]["step"] == w["args"]["step"] == c["step"]
        assert w["args"]["wait_ms_by_rank"] == {r: pytest.approx(us / 1000.0, abs=1e-3)  # ms to 3 decimals
                                                 for r, us in c["waits_us"].items() if r != "5"}


@pytest.mark.parametrize("sample,finding", [("pp_1f1b_h100", "pipeline_bubble"), ("slow_steps_a100", "slow_steps"),
                                            ("cpu_hang_gloo", "hang")])
def test_findings_track_places_other_findings(sample: str, finding: str, reports: dict[str, dict],
                                              tmp_path: Path) -> None:
    rep = reports[sample]
    assert any(f["id"] == finding for f in rep["findings"]), f"{sample} has no {finding} finding"
    out = tmp_path / "m.json"
    export_trace(rep, out)
    marks = [e for e in load(out)["traceEvents"] if e["pid"] == FINDINGS_PID and e["ph"] == "X"]
    mine = [m for m in marks if m["args"]["finding_id"] == finding]
    assert mine and all(m["name"].startswith("#") and finding in m["name"] for m in mine)


def test_host_bound_marks_are_the_simulated_launch_gaps(tmp_path: Path) -> None:
    """The simulated host-bound job (a slow data loader before each step's launches): every rank's
    host_bound marks are its GPU idle gaps before late launches, which the simulator's ledger counts as
    host-bound, in every step but the first (its loader wait opens the trace: no GPU work before it,
    so no gap). A mark spans the whole gap from the last kernel, the ledger splits it at the step
    boundary and the launch: equal within 1 %."""
    from traceread.simulate import simulate

    truth = simulate("host_bound", tmp_path / "run")
    rep = build_report([tmp_path / "run"], ReportOptions(workers=1, use_cache=False))
    assert any(f["id"] == "host_bound" for f in rep["findings"])
    export_trace(rep, tmp_path / "m.json")
    marks = [e for e in load(tmp_path / "m.json")["traceEvents"] if e["pid"] == FINDINGS_PID and e["ph"] == "X"
             and e["args"]["finding_id"] == "host_bound"]
    assert all(m["name"].startswith("#") and "host_bound" in m["name"] for m in marks)
    ours: dict[int, float] = defaultdict(float)
    for m in marks:
        ours[m["args"]["rank"]] += m["dur"]
    assert sorted(ours) == list(range(truth["world_size"]))
    for r in rep["ranks"]:
        after_first = {str(s["step"]) for s in r["steps"][1:]}
        want = sum(v["host_bound"] for k, v in truth["ranks"][str(r["rank"])]["ledger_local"].items()
                   if k in after_first)
        assert want > 0 and ours[r["rank"]] == pytest.approx(want, rel=0.01), r["rank"]


def test_selection_steps_ranks_and_gpu_only(reports: dict[str, dict], tmp_path: Path) -> None:
    rep, a = exported(reports, "ddp_straggler_h100", tmp_path / "full.json")
    step = rep["ranks"][0]["steps"][1]["step"]
    _, b = exported(reports, "ddp_straggler_h100", tmp_path / "part.json",
                    ExportOptions(ranks={0, 5}, steps=(step, step), gpu_only=True))
    pids = {e["pid"] for e in b["traceEvents"]}
    assert pids == {rank_pid(0), rank_pid(5), FINDINGS_PID}
    gpu_threads = {k for k, n in names(b, "thread_name").items() if n.startswith("GPU")}
    assert {(e["pid"], e["tid"]) for e in b["traceEvents"] if e["ph"] not in ("M",) and e["pid"] != FINDINGS_PID} <= gpu_threads
    assert not any(e["ph"] in ("s", "f") for e in b["traceEvents"])
    assert len(b["traceEvents"]) < len(a["traceEvents"]) / 4
    assert {m["args"]["step"] for m in b["traceEvents"] if m["pid"] == FINDINGS_PID and m["ph"] == "X"} == {step}


def test_cli_reports_size_and_rejects_bad_selection(tmp_path: Path) -> None:
    out = tmp_path / "x.json.gz"
    res = CliRunner().invoke(cli, ["export", str(SAMPLES / "pp_gpipe_h100"), "-o", str(out), "--ranks", "0-1"])
    assert res.exit_code == 0, res.output
    assert f"{out}:" in res.output and "kB" in res.output
    check_chrome_trace(load(out))
    bad = CliRunner().invoke(cli, ["export", str(SAMPLES / "pp_gpipe_h100"), "-o", str(out), "--ranks", "x"])
    assert bad.exit_code == 2 and "--ranks" in bad.output
    none = CliRunner().invoke(cli, ["export", str(SAMPLES / "pp_gpipe_h100"), "-o", str(out), "--ranks", "99"])
    assert none.exit_code == 2
    hang_only = tmp_path / "hang_only"  # a hang dump without traces: nothing to draw
    hang_only.mkdir()
    (hang_only / "run.json").write_text("{}")
    empty = CliRunner().invoke(cli, ["export", str(hang_only), "-o", str(tmp_path / "e.json")])
    assert empty.exit_code == 3 and not (tmp_path / "e.json").exists()


def test_selection_parsing() -> None:
    assert parse_ranks("0,3-5") == {0, 3, 4, 5}
    assert parse_ranks(None) is None
    assert parse_steps("10:12") == (10, 12) and parse_steps("7") == (7, 7) and parse_steps(":3") == (None, 3)
    with pytest.raises(ValueError):
        parse_steps("5:2")
    with pytest.raises(ValueError):
        parse_ranks("3-1")


def test_real_8_rank_dlrm_job(shared_traces: Path, tmp_path: Path) -> None:
    """A real recorded 8-rank NCCL job (../shared): valid, one process per rank, findings marked."""
    folder = shared_traces / "param_dlrm_8rank"
    rep = build_report([folder], ReportOptions(workers=1))
    out = tmp_path / "dlrm.json.gz"
    res = export_trace(rep, out)
    doc = load(out)
    check_chrome_trace(doc)
    procs = {n for (_, _), n in names(doc, "process_name").items()}
    assert {f"rank {r} (Tesla V100-SXM2-32GB)" for r in range(8)} <= procs
    marks = [e for e in doc["traceEvents"] if e["pid"] == FINDINGS_PID and e["ph"] == "X"]
    assert res.findings_slices == len(marks) > 0
    assert {m["args"]["finding_id"] for m in marks} <= {f["id"] for f in rep["findings"]}
