"""Memory (docs/memory.md): the reader keeps [memory] events, the per-rank summary and the job's memory
section match the simulator's exact truth (allocations per layer, a leak, imbalanced ranks, ZeRO-3),
the guide's model matches the simulated training state, snapshots are read as data only, and the
section is absent without memory events. Real CPU profiles (torch.profiler, profile_memory=True) and
the real traces in ../shared are read too.
"""

from __future__ import annotations

import gzip
import json
import pickle
import statistics
from pathlib import Path
from typing import Any

import needs
import pytest

from traceread.analysis.memory import estimate
from traceread.analysis.memory.snapshot import read_snapshot
from traceread.assemble.report import ReportOptions, build_report
from traceread.errors import TraceFileError
from traceread.read.parse import parse_file
from traceread.render import html, json_report, terminal
from traceread.simulate import simulate

MIB = 1 << 20


def _report(path: Path, **opts: Any) -> dict[str, Any]:
    return build_report([str(path)], ReportOptions(use_cache=False, workers=1, **opts))  # type: ignore[return-value]


def _sim(root: Path, name: str, **knobs: Any) -> tuple[Path, dict[str, Any]]:
    out = root / name
    truth = simulate("ddp", out, **{"ranks": 2, "steps": 3, "layers": 2, "hidden": 2048, "heads": 16,
                                    "seq_len": 1024, **knobs})
    return out, truth


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict[str, Any]]]:
    root = tmp_path_factory.mktemp("mem")
    return {
        # allocations per layer, a leak on every rank, rank 1's activations 3x larger
        "ddp": _sim(root, "ddp", memory=True, leak_bytes=24 * MIB, act_factors=[(1, 3.0)]),
        "zero3": _sim(root, "zero3", ranks=4, comm="fsdp", memory=True),
        "plain": _sim(root, "plain"),
    }


@pytest.fixture(scope="module")
def reports(sims: dict[str, tuple[Path, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    params = {"ddp": 2 * 2048 * (12 * 2048 + 10), "zero3": 2 * 2048 * (12 * 2048 + 10)}
    return {k: _report(p, params=params.get(k)) for k, (p, _) in sims.items()}


def _close(a: float | None, b: float | None, tol: float = 1e-3) -> bool:
    return a is not None and b is not None and abs(a - b) <= tol


# ---- the simulator's exact truth -----------------------------------------------------------------------


RANK_FIELDS = ("peak_allocated_bytes", "peak_step", "peak_phase", "peak_operator", "peak_op_innermost",
               "reserved_at_peak_bytes", "fragmentation_bytes", "peak_reserved_bytes", "floor_allocated_bytes",
               "window_start_allocated_bytes", "growth_per_step_bytes", "leak", "live_before_window_bytes")


@pytest.mark.parametrize("case", ["ddp", "zero3"])
def test_rank_memory_matches_truth(case: str, sims: dict, reports: dict) -> None:
    truth = sims[case][1]["memory"]
    rows = {r["rank"]: r for r in reports[case]["memory"]["ranks"]}
    assert sorted(rows) == sorted(int(r) for r in truth["ranks"])
    for r, t in truth["ranks"].items():
        got = rows[int(r)]
        assert got["device"] == f"cuda:{int(r) % 8}" and got["events"] == t["events"]
        for f in RANK_FIELDS:
            assert got[f] == t[f], (r, f, got[f], t[f])
        assert _close(got["peak_offset_us"], t["peak_offset_us"])
        assert got["steps"][0].keys() >= {"step", "start_allocated_bytes", "peak_allocated_bytes"}
        for gs, ts in zip(got["steps"], t["steps"], strict=True):
            assert {k: gs[k] for k in ts if k != "peak_offset_us"} == {k: ts[k] for k in ts if k != "peak_offset_us"}
            assert _close(gs["peak_offset_us"], ts["peak_offset_us"])
        live = {x["operator"]: {"bytes": x["bytes"], "allocations": x["allocations"]} for x in got["live_at_peak"]}
        assert len(t["live_at_peak"]) <= 8 and live == t["live_at_peak"]
        assert got["capacity_source"] == "deviceProperties"
        assert got["headroom_bytes"] == got["capacity_bytes"] - t["peak_reserved_bytes"]


@pytest.mark.parametrize("case", ["ddp", "zero3"])
def test_job_memory_and_timeline_match_truth(case: str, sims: dict, reports: dict) -> None:
    truth = sims[case][1]["memory"]
    m = reports[case]["memory"]
    for f in ("peak_rank", "peak_allocated_bytes", "median_peak_allocated_bytes", "imbalance_bytes", "leak_ranks"):
        assert m[f] == truth[f], f
    t = truth["ranks"][str(truth["peak_rank"])]
    tl = m["timeline"]
    assert tl["rank"] == truth["peak_rank"] and tl["step"] == t["peak_step"]
    # fewer events than the chart's limit: every allocator event of the step, exactly (plus both ends)
    assert len(tl["t_us"]) == len(t["timeline"]) + 2
    for x, a, r, (tx, ta, tr) in zip(tl["t_us"][1:-1], tl["allocated"][1:-1], tl["reserved"][1:-1], t["timeline"]):
        assert _close(x, tx) and a == ta and r == tr
    assert [p["name"] for p in tl["phases"]] == ["forward", "backward", "optimizer"]


def test_leak_and_imbalance_scenario(sims: dict, reports: dict) -> None:
    truth = sims["ddp"][1]["memory"]
    assert truth["leak_ranks"] == [0, 1] and truth["peak_rank"] == 1
    for r in ("0", "1"):
        levels = [s["start_allocated_bytes"] for s in truth["ranks"][r]["steps"]]
        assert [b - a for a, b in zip(levels, levels[1:])] == [24 * MIB, 24 * MIB]  # the injected leak
    found = {f["id"]: f for f in reports["ddp"]["findings"] if f.get("category") == "memory"}
    assert found["memory_leak"]["rank"] == 0 and found["memory_leak"]["memory_bytes"] == 24 * MIB
    imb = found["memory_imbalance"]
    assert imb["rank"] == 1 and imb["memory_bytes"] == truth["imbalance_bytes"]
    assert all(f["impact_us_per_step"] == 0.0 and f["impact_pct"] == 0.0 and f["impact_us_total"] == 0.0 for f in found.values())
    time_findings = [f for f in reports["ddp"]["findings"] if f.get("category") != "memory"]
    assert reports["ddp"]["findings"][: len(time_findings)] == time_findings  # memory findings come after


@pytest.mark.parametrize("case,stage,shard", [("ddp", 0, 2), ("zero3", 3, 4)])
def test_model_estimate_matches_simulated_training_state(case: str, stage: int, shard: int, sims: dict,
                                                          reports: dict) -> None:
    truth = sims[case][1]["memory"]
    model = reports[case]["memory"]["model"]
    est = model["estimate"]
    assert est["zero_stage"] == stage and est["shard_degree"] == shard and "inferred" in model["zero_stage_source"]
    for r, t in truth["ranks"].items():  # every rank holds the same training state
        state = t["training_state"]
        assert (est["weights_bytes"], est["gradients_bytes"], est["optimizer_bytes"]) == (
            state["weights"], state["gradients"], state["optimizer_state"]), r
        assert est["total_bytes"] == t["training_state_bytes"] == t["window_start_allocated_bytes"]
    peak = truth["ranks"][str(truth["peak_rank"])]
    assert model["activations_and_buffers_bytes"] == peak["peak_allocated_bytes"] - peak["training_state_bytes"]
    saves = {w["change"]: w["saving_bytes"] for w in model["what_if"]}
    if stage == 0:  # ZeRO-1 shards the optimizer state over the 2 ranks: half of it is saved
        assert saves["ZeRO-1"] == est["optimizer_bytes"] / 2
        assert saves["ZeRO-3 (FSDP full shard)"] == est["total_bytes"] / 2
    else:
        assert not any(k.startswith("ZeRO") for k in saves)
    assert saves["activation recomputation (checkpointing)"] == model["activations_and_buffers_bytes"]


def test_zero_stage_option_overrides_the_layout(sims: dict) -> None:
    rep = _report(sims["ddp"][0], params=4e6, zero_stage=2, optimizer="sgd-momentum", param_dtype="fp32",
                  master_weights=False)
    est = rep["memory"]["model"]["estimate"]
    assert est["zero_stage"] == 2 and rep["memory"]["model"]["zero_stage_source"] == "--zero-stage"
    assert (est["weights_bytes"], est["gradients_bytes"], est["optimizer_bytes"]) == (16e6, 8e6, 8e6)


def test_guide_formulas() -> None:
    """The guide's table: stage 1 P(2+2+8/N), stage 2 P(2+10/N), stage 3 12P/N; its Llama 3 405B example."""
    p, n = 405e9, 1024
    totals = {s: estimate.training_state(p, zero_stage=s, shard_degree=n).total_bytes for s in range(4)}
    assert totals[0] == p * 12
    assert totals[1] == p * (2 + 2 + 8 / n)
    assert totals[2] == p * (2 + 10 / n)
    assert totals[3] == 12 * p / n and round(totals[3] / 1e9, 2) == 4.75  # "4.86 TB / 1,024 = 4.75 GB"
    s1 = estimate.training_state(p, zero_stage=1, shard_degree=n)
    assert s1.weights_bytes == 810e9 and round(s1.optimizer_bytes / 1e9, 2) == 3.16  # 810 GB + 810 GB + 3.16 GB
    master = estimate.training_state(p, master_weights=True)
    assert master.total_bytes == 16 * p  # "about 16 bytes when the master FP32 weight copy is included"
    tp = estimate.training_state(8e9, model_parallel=8)
    assert tp.params_per_gpu == 1e9 and tp.total_bytes == 12e9
    with pytest.raises(ValueError):
        estimate.training_state(p, zero_stage=4)


def test_near_oom_finding(tmp_path: Path) -> None:
    path, truth = _sim(tmp_path, "big", layers=7, hidden=8192, heads=64, seq_len=4096, memory=True)
    rep = _report(path)
    t = truth["memory"]["ranks"]["0"]
    cap = rep["memory"]["ranks"][0]["capacity_bytes"]
    assert cap == json.loads(gzip.open(path / "rank0.pt.trace.json.gz").read())["deviceProperties"][0]["totalGlobalMem"]
    assert (cap - t["peak_reserved_bytes"]) / cap < 0.10
    f = next(f for f in rep["findings"] if f["id"] == "memory_near_oom")
    assert f["memory_bytes"] == cap - max(x["peak_reserved_bytes"] for x in truth["memory"]["ranks"].values())
    assert terminal.answer(rep)[0].startswith("Rank") or rep["findings"][0]["category"] != "memory"


# ---- snapshots -----------------------------------------------------------------------------------------


def test_simulated_snapshot_matches_truth(sims: dict) -> None:
    path, truth = sims["ddp"]
    for r, t in truth["memory"]["ranks"].items():
        snap = read_snapshot(path / f"rank{r}.memory_snapshot.pickle")
        assert snap["rank"] == int(r) and not snap["oom"]
        (d,) = snap["devices"]
        st = t["snapshot"]
        assert d["device"] == st["device"] and d["peak_allocated_bytes"] == st["peak_allocated_bytes"]
        assert d["allocated_at_snapshot_bytes"] == st["allocated_at_snapshot_bytes"]
        assert {f["frame"]: {"bytes": f["bytes"], "blocks": f["blocks"]} for f in d["top_frames"]} == st["frames"]
        assert d["live_at_peak_bytes"] == d["peak_allocated_bytes"]


def test_snapshots_in_the_report(sims: dict, reports: dict) -> None:
    snaps = reports["ddp"]["memory"]["snapshots"]
    assert sorted(s["rank"] for s in snaps) == [0, 1]
    assert snaps[0]["rank"] == reports["ddp"]["memory"]["peak_rank"]  # the peak rank's first


def test_unsafe_snapshot_is_refused_never_run(tmp_path: Path, sims: dict) -> None:
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self) -> tuple[Any, ...]:
            return (open, (str(marker), "w"))

    folder = tmp_path / "run"
    folder.mkdir()
    for f in sims["plain"][0].glob("rank*.pt.trace.json.gz"):
        (folder / f.name).write_bytes(f.read_bytes())
    bad = folder / "rank0.memory_snapshot.pickle"
    bad.write_bytes(pickle.dumps({"segments": [], "device_traces": [[Evil()]]}))
    with pytest.raises(TraceFileError, match="refusing to load"):
        read_snapshot(bad)
    (folder / "rank1.memory_snapshot.pickle").write_bytes(pickle.dumps({"segments": []})[:-3])  # truncated
    rep = _report(folder)
    assert not marker.exists()
    assert any(w.startswith(str(bad)) and "refusing to load" in w for w in rep["warnings"])
    assert any("rank1.memory_snapshot.pickle" in w and "truncated" in w for w in rep["warnings"])
    assert rep["memory"] is None  # nothing readable: no section
    (folder / "rank1.memory_snapshot.pickle").write_bytes(pickle.dumps({"blocks": []}))
    with pytest.raises(TraceFileError, match="no 'segments' list"):
        read_snapshot(folder / "rank1.memory_snapshot.pickle")


# ---- real CPU profiles (torch.profiler, profile_memory=True) ------------------------------------------


@pytest.fixture(scope="module")
def cpu_profile(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A real torch.profiler trace of 3 CPU training steps (profile_memory, with_stack) and the snapshot
    torch builds from that profile (``_memory_viz._profile_to_snapshot``), pickled as _dump_snapshot does."""
    torch = needs.module("torch")
    from torch.cuda._memory_viz import _profile_to_snapshot
    from torch.profiler import ProfilerActivity, profile, schedule

    out = tmp_path_factory.mktemp("cpu")
    trace = out / "cpu.pt.trace.json"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 512), torch.nn.ReLU(), torch.nn.Linear(512, 8))
    opt = torch.optim.AdamW(model.parameters())
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True,
                   schedule=schedule(wait=0, warmup=1, active=3, repeat=1),
                   on_trace_ready=lambda p: p.export_chrome_trace(str(trace)))
    kept = []
    with prof:
        for _ in range(5):
            loss = model(torch.randn(32, 128)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            kept.append(torch.ones(1 << 16))  # 256 kB kept every step
            prof.step()
    snap = out / "cpu_memory_snapshot.pickle"
    snap.write_bytes(pickle.dumps(_profile_to_snapshot(prof)))
    return trace, snap


def test_reader_keeps_real_cpu_memory_events(cpu_profile: tuple[Path, Path]) -> None:
    trace, _ = cpu_profile
    raw = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("name") == "[memory]"]
    assert len(raw) > 50
    mem = parse_file(trace).memory
    raw.sort(key=lambda e: e["ts"])
    assert mem.height == len(raw)
    assert mem["bytes"].to_list() == [e["args"]["Bytes"] for e in raw]
    assert mem["total_allocated"].to_list() == [e["args"]["Total Allocated"] for e in raw]
    assert mem["addr"].to_list() == [e["args"]["Addr"] for e in raw]
    assert set(mem["device_type"].to_list()) == {0} and set(mem["device_id"].to_list()) == {-1}
    assert mem["ts"].to_list() == [float(e["ts"]) for e in raw]


def test_real_cpu_trace_memory_section(cpu_profile: tuple[Path, Path]) -> None:
    trace, snap = cpu_profile
    rep = _report(trace, snapshots=[snap])
    (r,) = rep["memory"]["ranks"]
    raw = [e["args"] for e in json.loads(trace.read_text())["traceEvents"] if e.get("name") == "[memory]"]
    assert r["device"] == "cpu" and r["peak_allocated_bytes"] == max(a["Total Allocated"] for a in raw)
    assert not r["baseline_known"] and r["headroom_bytes"] is None and r["peak_reserved_bytes"] is None
    assert r["peak_phase"] in ("forward", "backward", "optimizer", "other") and r["peak_operator"]
    assert [s["step"] for s in r["steps"]] == [1, 2, 3]
    (s,) = rep["memory"]["snapshots"]
    (d,) = s["devices"]
    assert d["history_entries"] > 0 and d["live_at_peak_bytes"] == d["peak_allocated_bytes"]
    assert d["top_frames"][0]["frame"].startswith("test_memory.py:")  # the user's line, not torch's
    line = terminal_line_of(rep)
    assert line.startswith("Memory: peak") and "(counted from the window start)" in line
    assert json_report.validate(json.loads(json_report.to_json(rep))) == []


def terminal_line_of(rep: dict[str, Any]) -> str:
    text = terminal.render_text(rep, width=400)
    return next(ln for ln in text.splitlines() if ln.startswith("Memory:"))


# ---- absent without memory events ------------------------------------------------------------------


def test_no_memory_events_no_section(sims: dict, reports: dict) -> None:
    rep = reports["plain"]
    assert rep["memory"] is None and not any(f.get("category") == "memory" for f in rep["findings"])
    assert parse_file(sims["plain"][0] / "rank0.pt.trace.json.gz").memory.height == 0
    assert "Memory:" not in terminal.render_text(rep, width=300)
    page = html.render_html(rep)
    assert 'id="memory"' not in page and 'data-nodata="memory"' not in page
    assert json.loads(json_report.to_json(rep))["memory"] is None


def test_memory_section_in_every_format(reports: dict) -> None:
    rep = reports["ddp"]
    assert json_report.validate(json.loads(json_report.to_json(rep))) == []
    page = html.render_html(rep)
    assert 'id="memory"' in page and 'id="chart-memory"' in page and 'data-table="memory-ranks"' in page
    assert 'data-table="memory-model"' in page and 'data-table="memory-snapshot"' in page
    line = terminal_line_of(rep)
    m = rep["memory"]
    assert f"on rank {m['peak_rank']}" in line and "leak" in line and "ZeRO-0" in line


# ---- real traces in ../shared ---------------------------------------------------------------------------


def _raw_memory(path: Path) -> list[dict[str, Any]]:
    with gzip.open(path) as fh:
        return [e for e in json.load(fh)["traceEvents"] if e.get("name") == "[memory]"]


@pytest.mark.shared
def test_real_v100_training_trace(shared_traces: Path) -> None:
    """hta_df_index_resolver: a real V100 training rank recorded with profile_memory (5 steps)."""
    path = shared_traces / "hta_df_index_resolver" / "df_index_resolver.json.gz"
    cuda = [e for e in _raw_memory(path) if e["args"]["Device Type"] == 1]
    rep = _report(path)
    (r,) = rep["memory"]["ranks"]
    assert r["device"] == "cuda:1" and r["events"] == len(cuda)
    assert r["peak_allocated_bytes"] == max(e["args"]["Total Allocated"] for e in cuda)
    assert r["peak_reserved_bytes"] == max(e["args"]["Total Reserved"] for e in cuda)
    first = min(cuda, key=lambda e: e["ts"])["args"]
    assert r["window_start_allocated_bytes"] == first["Total Allocated"] - first["Bytes"]
    assert r["capacity_bytes"] == 34089730048 and r["headroom_bytes"] == 34089730048 - r["peak_reserved_bytes"]
    assert r["peak_phase"] == "backward" and [s["step"] for s in r["steps"]] == [2, 3, 4, 5, 6]
    assert r["growth_per_step_bytes"] == 0.0 and not r["leak"]
    assert r["other_devices"] == [{"device": "cpu", "peak_allocated_bytes": 8}]
    assert "Memory: peak 6.6 GB allocated" in terminal_line_of(rep)


@pytest.mark.shared
@pytest.mark.parametrize("name,device", [("tracelens_mi300/gaunernst_bert-small-uncased__1016001.json.gz", "hip:0"),
                                         ("kineto_tb_resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz",
                                          "cuda:0")])
def test_real_traces_other_vendors_and_eras(shared_traces: Path, name: str, device: str) -> None:
    path = shared_traces / name
    acc = [e["args"] for e in _raw_memory(path) if e["args"]["Device Type"] != 0]
    rep = _report(path)
    (r,) = rep["memory"]["ranks"]
    assert r["device"] == device
    if "Total Allocated" in acc[0]:  # torch 2.x
        assert r["baseline_known"] and r["peak_allocated_bytes"] == max(a["Total Allocated"] for a in acc)
    else:  # 2021: only Bytes; allocated is their running sum from the window start
        running = [sum(a["Bytes"] for a in acc[: i + 1]) for i in range(len(acc))]
        assert not r["baseline_known"] and r["peak_allocated_bytes"] == max(running)
        assert r["headroom_bytes"] is None and r["peak_phase"] == "backward"


@pytest.mark.shared
def test_real_trace_without_memory_events(shared_traces: Path) -> None:
    rep = _report(shared_traces / "param_dlrm_8rank" / "worker0_step_12.1694128201545.pt.trace.json")
    assert rep["memory"] is None


def test_median_is_of_primary_devices(reports: dict) -> None:
    m = reports["zero3"]["memory"]
    assert m["median_peak_allocated_bytes"] == statistics.median(r["peak_allocated_bytes"] for r in m["ranks"])


def test_snapshot_blocks_are_named_where_they_were_allocated(tmp_path: Path) -> None:
    """Rewinding to the peak puts freed blocks back under the frames of their *allocation*: a block allocated
    before the history began is said so (not blamed on the DDP hook that freed it), and a block allocated on
    autograd's thread (C++ frames only) is named by its backward node. Layout written here, truth by construction."""
    from traceread.analysis.memory.snapshot import read_snapshot

    py = [{"filename": "train.py", "line": 7, "name": "main"}]
    freer = [{"filename": "", "line": 0, "name": "c10d::Reducer::autograd_hook(unsigned long)"}]
    node = [{"filename": "", "line": 0, "name": "at::_ops::nll_loss_backward::call(at::Tensor const&)"},
            {"filename": "", "line": 0, "name": "torch::autograd::generated::NllLossBackward0::apply(std::vector&&)"}]
    op_only = [{"filename": "", "line": 0, "name": "at::_ops::empty_strided::call(long)"},
               {"filename": "", "line": 0, "name": "at::_ops::copy_::call(at::Tensor&)"}]
    history = [
        {"action": "alloc", "addr": 0x1000, "size": 300, "frames": node},          # backward output
        {"action": "alloc", "addr": 0x2000, "size": 50, "frames": py},
        {"action": "alloc", "addr": 0x3000, "size": 20, "frames": op_only},
        {"action": "free_requested", "addr": 0x9000, "size": 1000, "frames": freer},
        {"action": "free_completed", "addr": 0x9000, "size": 1000, "frames": freer},  # allocated before history
        {"action": "free_requested", "addr": 0x1000, "size": 300, "frames": freer},
        {"action": "free_completed", "addr": 0x1000, "size": 300, "frames": freer},
    ]
    snap = tmp_path / "rank0.pickle"
    segments = [{"device": 0, "address": 0x2000, "total_size": 4096,
                 "blocks": [{"address": 0x2000, "size": 50, "state": "active_allocated", "frames": py},
                            {"address": 0x3000, "size": 20, "state": "active_allocated", "frames": op_only}]}]
    snap.write_bytes(pickle.dumps({"segments": segments, "device_traces": [history]}))
    (dev,) = read_snapshot(snap)["devices"]
    assert dev["peak_allocated_bytes"] == 1000 + 300 + 50 + 20  # after the third alloc, before any free
    frames = {f["frame"]: f["bytes"] for f in dev["top_frames"]}
    assert frames == {"(allocated before memory history recording began)": 1000,
                      "backward: NllLossBackward0 (autograd thread, no Python frame)": 300,
                      "train.py:7 main": 50, "aten::copy_ (no Python frame)": 20}
