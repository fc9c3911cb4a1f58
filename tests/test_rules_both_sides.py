"""Documented rules tested on both sides: inputs where the rule and its plausible wrong variant disagree.

Each test takes one number or selection written in docs/*.md, builds an input (a hand-written trace, a
real log or dump edited in one place, a report document) where the two readings give different answers,
and checks the answer against a value worked out by hand in the test, never by the code under test.
The wrong variants are the issue #33 mutants in ``bench/mutants.json`` (ids ``defn.*``); each of these
tests fails on its mutant.
"""

from __future__ import annotations

import copy
import json
import os
import time
from pathlib import Path
from statistics import fmean, stdev
from typing import Any

import pytest
from cache_edits import cached_then_edited
from rank_factory import frame, host_rows

from traceread.analysis.comm.nccl.logs import parse_nccl_logs
from traceread.analysis.hang.dumps import collect
from traceread.analysis.hang.flight_recorder import read_dump
from traceread.analysis.hang.groups import build_groups
from traceread.analysis.memory.rank import rank_memory
from traceread.analysis.time.iterations import engine_iterations, iteration_kind
from traceread.assemble.findings.layout import fit_to_workload
from traceread.assemble.report import build_report
from traceread.compare.diff import diff_reports
from traceread.compare.drift import drift
from traceread.engine.jobs import read_rank
from traceread.model import HOST_SCHEMA
from traceread.options import ReportOptions
from traceread.read.parse import parse_file

MIB = 1 << 20
GIB = 1 << 30
FR_RUN = Path(__file__).parent / "data" / "fr" / "gloo_skip" / "fr"
CPU_RUN = Path(__file__).resolve().parents[1] / "sample_traces" / "cpu_ddp_gloo"


# ---- memory (docs/memory.md) ----------------------------------------------------------------------------


def _memory_trace(path: Path, steps: list[list[tuple[int, int, int]]]) -> Path:
    """A CUDA rank's trace: one 1 ms ``ProfilerStep#s`` window per step, 2 ms apart, holding its
    ``[memory]`` events ``(bytes, total allocated after, total reserved after)`` 10 µs apart."""
    ev: list[dict[str, Any]] = []
    for s, events in enumerate(steps):
        t0 = 2000.0 * s
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{s}", "pid": 1, "tid": 1,
                   "ts": t0, "dur": 1000.0})
        for k, (nbytes, alloc, reserved) in enumerate(events):
            ev.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1, "tid": 1,
                       "ts": t0 + 10.0 * (k + 1),
                       "args": {"Total Reserved": reserved, "Total Allocated": alloc, "Bytes": nbytes,
                                "Device Id": 0, "Device Type": 1, "Addr": 4096 * (100 * s + k + 1)}})
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": ev}))
    return path


def _cuda0(path: Path) -> dict[str, Any]:
    mem = rank_memory(parse_file(path))
    assert mem is not None
    (dev,) = mem["devices"]
    assert dev["device"] == "cuda:0"
    return dev


def test_fragmentation_is_a_share_of_reserved_not_of_allocated(tmp_path: Path) -> None:
    """docs/memory.md: fragmentation at the peak = reserved − allocated, as a share of *reserved* (cached
    but unused bytes of what the allocator holds: never over 100 %). Peak 2 MiB allocated of 8 MiB
    reserved: 6 MiB, 75 % (of allocated it would read 300 %)."""
    dev = _cuda0(_memory_trace(tmp_path / "rank0.json", [[(1 * MIB, 1 * MIB, 8 * MIB), (1 * MIB, 2 * MIB, 8 * MIB),
                                                          (-1 * MIB, 1 * MIB, 8 * MIB)]]))
    assert dev["peak_allocated_bytes"] == 2 * MIB and dev["reserved_at_peak_bytes"] == 8 * MIB
    assert dev["fragmentation_bytes"] == 6 * MIB
    assert dev["fragmentation_pct"] == pytest.approx(100.0 * 6 / 8)


@pytest.mark.parametrize(("allocated", "finding"), [(8, False), (7, True)])
def test_fragmentation_finding_threshold_on_reserved(tmp_path: Path, allocated: int, finding: bool) -> None:
    """The fragmentation finding fires at ≥ 25 % of reserved and ≥ 1 GiB. Reserved 10 GiB: 8 GiB
    allocated leaves 2 GiB = 20 % of reserved (no finding; 25 % of allocated would fire it); 7 GiB leaves
    3 GiB = 30 % (a finding, whichever denominator)."""
    run = tmp_path / "run"
    run.mkdir()
    _memory_trace(run / "rank0.pt.trace.json", [[(allocated * GIB, allocated * GIB, 10 * GIB)]])
    rep = build_report([run], ReportOptions(workers=1, use_cache=False))
    ids = {f["id"] for f in rep["findings"]}
    assert ("memory_fragmentation" in ids) is finding
    row = rep["memory"]["ranks"][0]
    assert row["fragmentation_pct"] == pytest.approx(100.0 * (10 - allocated) / 10)


@pytest.mark.parametrize(("starts_mib", "leak"), [
    ([10, 10, 30, 30], False),  # one rise between steps: growth, not a leak
    ([10, 10, 10, 30], False),  # the rise at the last boundary only
    ([10, 20, 30, 40], True),  # rises at every boundary by 10 MiB: a leak
    ([10, 10.25, 10.5, 10.75], False),  # rises every step, but 0.75 MiB in all: allocator noise (< 1 MiB)
])
def test_leak_needs_a_rise_at_every_step_boundary(tmp_path: Path, starts_mib: list[float], leak: bool) -> None:
    """docs/memory.md: a leak when the start level rises at *every* step boundary over at least three
    steps by more than 1 MiB in all. Each step frees what it allocated except the difference to the next
    start (the window starts at the first step's level); growth per step = (last start − first start) ÷ (steps − 1), by hand."""
    starts = [int(m * MIB) for m in starts_mib]
    steps = []
    for start, nxt in zip(starts, starts[1:] + starts[-1:]):
        evs = [(4 * MIB, start + 4 * MIB, 64 * MIB), (-4 * MIB, start, 64 * MIB)]  # the step's work, freed
        if nxt != start:  # what it keeps: the next step starts there
            evs.append((nxt - start, nxt, 64 * MIB))
        steps.append(evs)
    dev = _cuda0(_memory_trace(tmp_path / "rank0.json", steps))
    got = [s["start_allocated_bytes"] for s in dev["steps"]]
    assert got == starts
    assert dev["growth_per_step_bytes"] == pytest.approx((got[-1] - got[0]) / (len(got) - 1))
    assert dev["leak"] is leak


# ---- NCCL (docs/hang-and-nccl.md) ---------------------------------------------------------------------------


def test_gdrdma_is_on_only_when_every_network_link_uses_it(shared_dir: Path, tmp_path: Path) -> None:
    """``gdrdma``: every NET connection uses GPUDirect RDMA. The real EFA log with one link's ``/GDRDMA``
    removed (that transfer staged through host memory): not every link, so False and a ``no_gdrdma``
    diagnosis; the unedited log: True, no diagnosis."""
    text = (shared_dir / "nccl_logs" / "README_nccl-tests-efa-16_allreduce.log").read_text()
    links = [ln for ln in text.splitlines() if " via NET/" in ln]
    assert len(links) > 1 and all(ln.endswith("/GDRDMA") for ln in links)
    whole = parse_nccl_logs([shared_dir / "nccl_logs" / "README_nccl-tests-efa-16_allreduce.log"])
    assert whole["gdrdma"] is True and "no_gdrdma" not in {d["id"] for d in whole["diagnoses"]}
    one_staged = text.replace(links[0], links[0].removesuffix("/GDRDMA"), 1)
    edited = tmp_path / "efa-one-link-staged.log"
    edited.write_text(one_staged)
    s = parse_nccl_logs([edited])
    assert s["gdrdma"] is False
    assert "no_gdrdma" in {d["id"] for d in s["diagnoses"]}


#: Lines of the EFA log above (../shared/nccl_logs/README_nccl-tests-efa-16_allreduce.log), verbatim: a
#: healthy aws-ofi-nccl run whose three network links all use GPUDirect RDMA.
EFA_EXCERPT = (
    "[1,0]<stdout>:nccl-tests-efa-16-worker-0:25:25 [0] NCCL INFO Bootstrap : Using eth0:10.0.92.140<0>\n"
    "[1,0]<stdout>:nccl-tests-efa-16-worker-0:25:25 [0] NCCL INFO NET/OFI Running on P4d platform,"
        " Setting NCCL_TOPO_FILE environment variable to"
        " /opt/aws-ofi-nccl/install/share/aws-ofi-nccl/xml/p4d-24xl-topo.xml\n"
    "[1,0]<stdout>:nccl-tests-efa-16-worker-0:25:25 [0] NCCL INFO NET/OFI Selected Provider is efa\n"
    "[1,0]<stdout>:nccl-tests-efa-16-worker-0:25:25 [0] NCCL INFO NET/Plugin: Failed to find ncclCollNetPlugin_v4 symbol.\n"
    "[1,0]<stdout>:nccl-tests-efa-16-worker-0:25:25 [0] NCCL INFO Using network AWS Libfabric\n"
    "[1,0]<stdout>:NCCL version 2.9.9+cuda11.2\n"
    "[1,1]<stdout>:nccl-tests-efa-16-worker-0:26:68 [1] NCCL INFO Channel 00 : 1[101d0] -> 8[101c0]"
        " [send] via NET/AWS Libfabric/1/GDRDMA\n"
    "[1,9]<stdout>:nccl-tests-efa-16-worker-1:26:67 [1] NCCL INFO Channel 00 : 9[101d0] -> 0[101c0]"
        " [send] via NET/AWS Libfabric/1/GDRDMA\n"
    "[1,0]<stdout>:nccl-tests-efa-16-worker-0:25:66 [0] NCCL INFO Channel 00 : 9[101d0] -> 0[101c0]"
        " [receive] via NET/AWS Libfabric/1/GDRDMA\n"
    "[1,8]<stdout>:nccl-tests-efa-16-worker-1:25:71 [0] NCCL INFO Channel 00 : 8[101c0] -> 15[a01d0] via P2P/IPC/read\n"
    "[1,0]<stdout>:nccl-tests-efa-16-worker-0:25:66 [0] NCCL INFO Channel 00 : 0[101c0] -> 7[a01d0] via P2P/IPC/read\n"
)


@pytest.mark.parametrize(("staged", "gdrdma"), [(0, True), (1, False), (3, False)])
def test_gdrdma_any_versus_every_link(tmp_path: Path, staged: int, gdrdma: bool) -> None:
    """The same rule on the excerpt, so it runs without ../shared: of its three NET links, ``staged`` lose
    ``/GDRDMA``. GPUDirect RDMA is on only when none did; one staged link is enough for the diagnosis."""
    text = EFA_EXCERPT
    for _ in range(staged):
        text = text.replace("/GDRDMA\n", "\n", 1)
    log = tmp_path / "efa.log"
    log.write_text(text)
    s = parse_nccl_logs([log])
    assert s["transports"]["NET/AWS Libfabric"] == 3
    assert s["gdrdma"] is gdrdma
    assert ("no_gdrdma" in {d["id"] for d in s["diagnoses"]}) is (not gdrdma)


# ---- hang (docs/hang-and-nccl.md) ----------------------------------------------------------------------------


def _older_dump(raw: dict[str, Any]) -> dict[str, Any]:
    """The same recorder dumped one collective earlier: the last entry not yet enqueued, so nothing pending."""
    old = copy.deepcopy(raw)
    old["entries"] = old["entries"][:-1]
    old["pg_status"]["0"].update(last_enqueued_collective="11", last_completed_collective="11")
    return old


@pytest.mark.parametrize("older_first", [True, False])
def test_of_two_dumps_of_one_rank_the_newer_is_used(tmp_path: Path, older_first: bool) -> None:
    """docs/hang-and-nccl.md: of two dumps of one recorder of one rank, the later (newest enqueue time).
    Rank 0's real gloo dump has all-reduce #12 pending; a copy dumped before #12 was enqueued has nothing
    pending. Whichever is found first, rank 0 is in #12."""
    raw = json.loads((FR_RUN / "rank0.json").read_text())
    old = _older_dump(raw)
    assert max(e["time_created_ns"] for e in old["entries"]) < max(e["time_created_ns"] for e in raw["entries"])
    first, second = (old, raw) if older_first else (raw, old)
    for folder, doc in (("a", first), ("b", second)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "rank0.json").write_text(json.dumps(doc))
    ds = collect([tmp_path], workers=1)
    g = ds.dumps[0].groups["0"]
    assert (g.enqueued, g.completed, [o.seq for o in g.pending]) == (12, 11, [12])
    assert ds.dumps[0].path.endswith(("b" if older_first else "a") + "/rank0.json")


def _undescribed_group_dump(tmp_path: Path, ops: list[str]) -> Path:
    """Rank 0's real dump with group 1 (description ``undefined``) given completed ``ops``."""
    raw = json.loads((FR_RUN / "rank0.json").read_text())
    template = next(e for e in raw["entries"] if e["process_group"][0] == "0")
    entries = [e for e in raw["entries"] if e["process_group"][0] != "1"]
    t = max(e["time_created_ns"] for e in raw["entries"])
    for i, op in enumerate(ops, start=1):
        e = copy.deepcopy(template)
        e.update(collective_seq_id=i, pg_id=1, process_group=["1", "undefined"], profiling_name=f"gloo:{op}",
                 state="completed", retired=True, time_created_ns=t + i)
        entries.append(e)
    raw["entries"] = entries
    raw["pg_status"]["1"] = {"last_completed_collective": str(len(ops)), "last_enqueued_collective": str(len(ops)),
                             "last_started_collective": "-1"}
    out = tmp_path / "rank0.json"
    out.write_text(json.dumps(raw))
    return out


@pytest.mark.parametrize(("ops", "role"), [
    (["all_to_all"] * 3 + ["all_reduce"] * 3, "dp"),  # all-to-all *and* all-reduce: not expert parallel
    (["all_to_all"] * 6, "ep"),  # all-to-all alone: expert parallel
])
def test_undescribed_group_is_ep_only_without_all_reduce(tmp_path: Path, ops: list[str], role: str) -> None:
    """docs/hang-and-nccl.md (the rule of docs/layout.md): a group without a description that runs
    all-to-all and no all-reduce is ``ep``; one that also all-reduces (embeddings exchanged beside a dense
    gradient all-reduce, DLRM) is not expert parallel: it all-reduces, so ``dp``."""
    d = read_dump(_undescribed_group_dump(tmp_path, ops))
    assert sum(d.groups["1"].ops.values()) == len(ops)
    groups, _ = build_groups({0: d}, world=2)
    assert groups["1"].role == role


# ---- serving (docs/layout.md: iterations as steps; slow steps) --------------------------------------------


def test_overlapping_iteration_that_outlasts_the_previous_is_kept() -> None:
    """Iterations as steps are the outermost annotations: one nested inside the previous is dropped; one
    that starts inside the previous but ends after it (an async scheduler overlaps iterations) is its
    own iteration. By hand: [0, 100) kept, [20, 60) nested (dropped), [50, 200) kept, [300, 400) kept."""
    host = frame(host_rows([
        {"cat": "user_annotation", "name": "step[DECODE bs=8]", "ts": 0.0, "dur": 100.0},
        {"cat": "user_annotation", "name": "step[DECODE bs=8]", "ts": 20.0, "dur": 40.0, "tid": 2},
        {"cat": "user_annotation", "name": "step[EXTEND bs=2]", "ts": 50.0, "dur": 150.0, "tid": 2},
        {"cat": "user_annotation", "name": "step[DECODE bs=8]", "ts": 300.0, "dur": 100.0},
    ]), HOST_SCHEMA)
    it = engine_iterations(host)
    assert it is not None
    assert list(zip(it.steps["ts"].to_list(), it.steps["end"].to_list())) == [(0.0, 100.0), (50.0, 200.0),
                                                                              (300.0, 400.0)]
    assert it.kinds == {0: "decode", 1: "prefill", 2: "decode"}


@pytest.mark.parametrize(("name", "expected"), [
    ("execute_512_context_2(r1,r2)_generation_0()", ("vllm", "prefill")),  # only context requests
    ("execute_8_context_0()_generation_8(r3,r4)", ("vllm", "decode")),  # only generation requests
    ("execute_520_context_1(r1)_generation_8(r3)", ("vllm", "mixed")),  # both
    ("execute_0_context_0()_generation_0()", ("vllm", "idle")),  # neither
    ("step[DECODE bs=8]", ("sglang", "decode")),
    ("step[EXTEND bs=2]", ("sglang", "prefill")),
    ("step[PREFILL bs=1]", ("sglang", "prefill")),
    ("step[mixed bs=4]", ("sglang", "mixed")),  # the engines' case varies
    ("step[IDLE]", ("sglang", "idle")),
    ("step[TARGET_VERIFY bs=8]", ("sglang", "decode")),  # speculative decoding verifies decode tokens
    ("step[DRAFT_EXTEND bs=2]", ("sglang", "prefill")),  # the draft model's prefill
    ("ProfilerStep#3", (None, "")),
    ("xexecute_8_context_0()_generation_8()", (None, "")),  # anchored at the start
])
def test_iteration_kind_of_every_documented_name(name: str, expected: tuple[str | None, str]) -> None:
    """docs/layout.md: vLLM's ``execute_<tokens>_context_<prefill requests>(…)_generation_<decode requests>(…)``
    is prefill with only context requests, decode with only generation requests, else mixed; SGLang's
    ``step[MODE …]`` by its mode. Each form once, expected by hand from the name."""
    assert iteration_kind(name) == expected


def _serving_report(kinds: dict[int, str]) -> dict[str, Any]:
    return {"workload": {"kind": "serving", "engine": "vllm"},
            "ranks": [{"rank": 0, "steps": [{"step": s, "iteration": k} for s, k in kinds.items()]}]}


@pytest.mark.parametrize(("cited", "kept"), [
    ([4, 7], True),  # a slow decode (7) beside a prefill (4): the finding stands
    ([7, 4], True),
    ([4], False),  # only the prefill among decodes: its own kind of iteration, not slow
    ([4, 5], False),
])
def test_slow_step_finding_dropped_only_when_every_cited_step_is_of_another_kind(cited: list[int],
                                                                                   kept: bool) -> None:
    """docs/layout.md: in a serving job a prefill among decodes is not a "slow step". The finding is
    dropped only when *every* step it cites is of another kind than the common one; a slow decode cited
    beside a prefill is still slow. Steps 0–9 decode except 4 and 5 (prefill)."""
    kinds = {s: ("prefill" if s in (4, 5) else "decode") for s in range(10)}
    finding = {"id": "slow_steps", "category": "slow_steps", "title": "slow steps", "explanation": "",
               "suggestions": [], "evidence": [f"step {s}: 30.0 ms, +12.0 ms over the median" for s in cited]}
    out = fit_to_workload([finding], _serving_report(kinds))  # type: ignore[list-item, arg-type]
    assert (len(out) == 1) is kept


# ---- compare (docs/report.md: diff, cycles) ---------------------------------------------------------------


def _run(step_ms: list[float], stragglers: list[tuple[int, float]] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    """A one-rank report with these step times (ms) and stragglers (rank, blame ms/step)."""
    steps = [{"step": i, "duration_us": 1e3 * t, "window_us": 1e3 * t} for i, t in enumerate(step_ms)]
    return {"ranks": [{"rank": 0, "steps": steps}], "findings": [],
            "stragglers": [{"rank": r, "blame_us_per_step": 1e3 * b, "cause": "gpu"} for r, b in stragglers]}


#: 16 steps around 100 ms with a sample standard deviation of about 5.2 ms (by construction below).
_A_MS = [100.0 + (5.0 if i % 2 else -5.0) * (1.0 + 0.1 * (i % 3)) for i in range(16)]


@pytest.mark.parametrize(("shift_ms", "verdict"), [(6.0, "slower"), (2.0, "same")])
def test_diff_step_noise_is_the_standard_error(shift_ms: float, verdict: str) -> None:
    """docs/report.md (diff): the step changed when |Δ| > max(1 % of A, 2 × the standard error of the
    difference of the two mean step times). Standard error = sd ÷ √n, from each run's per-step times: with
    16 steps of sd ≈ 5.2 ms, 2·√(se_a² + se_b²) ≈ 3.7 ms (2·√(sd_a² + sd_b²) would be ≈ 14.7 ms). B = A
    shifted: +6 ms is slower (over the noise and 1 %), +2 ms is not (over 1 %, under the noise)."""
    b_ms = [t + shift_ms for t in _A_MS]
    se = (stdev(_A_MS) ** 2 / len(_A_MS) + stdev(b_ms) ** 2 / len(b_ms)) ** 0.5
    d = diff_reports(_run(_A_MS), _run(b_ms))  # type: ignore[arg-type]
    assert d["step_us"]["noise_us"] == pytest.approx(2e3 * se)
    assert d["step_us"]["delta"] == pytest.approx(1e3 * (fmean(b_ms) - fmean(_A_MS)))
    assert 2e3 * se < 6e3 < 2e3 * (2 * stdev(_A_MS) ** 2) ** 0.5  # the case tells the two noises apart
    assert d["verdict"] == verdict


@pytest.mark.parametrize("with_ranks", [True, False])
def test_diff_kernel_time_is_per_step_per_rank(with_ranks: bool) -> None:
    """docs/report.md (diff): a kernel's time per step per rank = total_us ÷ ranks ÷ steps; a kernel row
    without its own ``ranks`` count (older documents) divides by the report's ranks. Two ranks, four steps:
    A's 8,000 µs is 1,000 per step per rank, B's 16,000 is 2,000."""
    def rep(total: float) -> dict[str, Any]:
        ranks = [{"rank": r, "steps": [{"step": i, "duration_us": 1e5, "window_us": 1e5} for i in range(4)]}
                 for r in range(2)]
        kernel = {"name": "sm90_gemm", "total_us": total, **({"ranks": 2} if with_ranks else {})}
        return {"ranks": ranks, "findings": [], "stragglers": [], "kernels": [kernel]}

    d = diff_reports(rep(8000.0), rep(16000.0))  # type: ignore[arg-type]
    (k,) = d["kernels"]
    assert (k["name"], k["a"], k["b"], k["delta"]) == ("sm90_gemm", 1000.0, 2000.0, 1000.0)


@pytest.mark.parametrize("time_scale", [None, 0.125])
def test_diff_operator_time_is_per_step_by_name_and_shapes(time_scale: float | None) -> None:
    """docs/report.md (diff): each operator's (name + input shapes) kernel time per step on the detailed
    rank: the roofline's ``time_scale`` when it gives one, else 1 ÷ steps. Four steps; ``aten::mm`` and
    ``aten::bmm`` share shapes but are two rows. A: 4,000 and 8,000 µs; B twice that."""
    def rep(mm: float, bmm: float) -> dict[str, Any]:
        ranks = [{"rank": 0, "steps": [{"step": i, "duration_us": 1e5, "window_us": 1e5} for i in range(4)]}]
        ops = [{"name": "aten::mm", "shapes": "[[8, 8], [8, 8]]", "time_us": mm},
               {"name": "aten::bmm", "shapes": "[[8, 8], [8, 8]]", "time_us": bmm}]
        roof = {"ops": ops, **({"time_scale": time_scale} if time_scale else {})}
        return {"ranks": ranks, "findings": [], "stragglers": [], "roofline": roof}

    scale = time_scale or 1 / 4
    d = diff_reports(rep(4000.0, 8000.0), rep(8000.0, 16000.0))  # type: ignore[arg-type]
    got = {o["name"]: (o["a"], o["b"]) for o in d["operators"]}
    assert got == {"aten::mm [[8, 8], [8, 8]]": (4000.0 * scale, 8000.0 * scale),
                   "aten::bmm [[8, 8], [8, 8]]": (8000.0 * scale, 16000.0 * scale)}


def test_diff_appeared_findings_and_groups_by_their_keys() -> None:
    """docs/report.md (diff): what appeared is listed by key — a finding by id and role (impact ≥ the row
    floor, 0.5 % of A's 100 ms step = 500 µs), a process group by name, from the collectives when there is
    no layout. B adds an exposed-communication finding for dp (2 ms/step) and collectives on group 3."""
    a = _run([100.0] * 4)
    b = _run([100.0] * 4)
    a["collectives"] = [{"pg": "0", "name": "all_reduce", "count": 4}]
    b["collectives"] = [{"pg": "0", "name": "all_reduce", "count": 4}, {"pg": "3", "name": "all_to_all", "count": 4}]
    b["findings"] = [{"id": "exposed_comm", "role": "dp", "title": "exposed dp communication",
                      "impact_us_per_step": 2000.0}]
    d = diff_reports(a, b)  # type: ignore[arg-type]
    assert {(x["kind"], x["key"]) for x in d["appeared"]} == {("finding", "exposed_comm:dp"), ("group", "3")}
    assert next(x["text"] for x in d["appeared"] if x["kind"] == "group") == "process group 3"
    assert d["vanished"] == []


def test_diff_finding_without_impact_in_b_vanished() -> None:
    """A finding B still lists but without an impact counts as 0 µs/step: it vanished when A's was at
    least the row floor (1 µs here: 0.5 % of a 100 µs step is less)."""
    a = _run([0.1] * 4)
    b = _run([0.1] * 4)
    a["findings"] = [{"id": "host_bound", "title": "host bound", "impact_us_per_step": 50.0}]
    b["findings"] = [{"id": "host_bound", "title": "host bound", "impact_us_per_step": None}]
    d = diff_reports(a, b)  # type: ignore[arg-type]
    assert [(x["kind"], x["key"]) for x in d["vanished"]] == [("finding", "host_bound")]


def test_diff_collective_gone_in_b_is_listed_by_a_calls() -> None:
    """docs/report.md (diff): collectives matched by (name, bytes), calls per step = count ÷ steps (4 steps).
    A's 1 MiB all-gather (8 calls, 2 per step) is gone in B: listed, its calls 2 → none; the all-reduce is
    unchanged and not listed."""
    a, b = _run([100.0] * 4), _run([100.0] * 4)
    ar = {"pg": "0", "name": "all_reduce", "bytes": 4096, "count": 4, "latency_us": 50.0, "busbw_gbps": 10.0}
    ag = {"pg": "0", "name": "all_gather", "bytes": 1 << 20, "count": 8, "latency_us": 300.0, "busbw_gbps": 20.0}
    a["collectives"], b["collectives"] = [ar, ag], [ar]
    d = diff_reports(a, b)  # type: ignore[arg-type]
    (c,) = d["collectives"]
    assert (c["name"], c["bytes"], c["calls_per_step"]["a"], c["calls_per_step"]["b"]) == ("all_gather", 1 << 20, 2.0, None)
    assert d["collectives_unchanged"] == 1


def test_diff_answer_names_at_most_four_new_things() -> None:
    """The answer's "New in B" sentence names the first four of what appeared (stragglers, then findings,
    then groups); the rest are in ``appeared``. Five stragglers: four named."""
    from traceread.compare.diff import _answer

    step = {"a": 100.0, "b": 150.0, "delta": 50.0, "pct": 50.0, "significant": True, "threshold_us": 1.0,
            "noise_us": 0.0}
    appeared = [{"kind": "straggler", "key": f"rank{r}", "text": f"straggler rank {r}"} for r in range(5)]
    (_, new) = _answer(step, {}, appeared, [])[:2]
    assert new == "New in B: straggler rank 0; straggler rank 1; straggler rank 2; straggler rank 3."


def _cycle(stragglers: list[tuple[int, float]], step_ms: float) -> tuple[dict[str, Any], dict[str, Any]]:
    return {"cycle": 0, "label": "c"}, _run([step_ms] * 4, stragglers)


@pytest.mark.parametrize(("first", "last", "appeared"), [
    ((2, 10.0), (5, 12.0), True),  # moved from rank 2 to rank 5: a new straggler on rank 5
    ((2, 10.0), (2, 12.0), False),  # the same rank, blame up by 1.2x: not new
    ((2, 5.0), (2, 12.0), True),  # the same rank, blame more than doubled
])
def test_drift_straggler_that_moved_rank_appeared(first: tuple[int, float], last: tuple[int, float],
                                                 appeared: bool) -> None:
    """docs/cycles.md: ``straggler_appeared`` when the last cycle has a straggler blamed ≥ 5 % of the step
    that the first did not (the same rank blamed less than half as much). A straggler on another rank
    is new whatever the first cycle's straggler was blamed."""
    out = drift([_cycle([first], 100.0), _cycle([last], 100.0 + last[1])])  # the others wait for it
    got = out["growth"]["straggler_appeared"]
    assert (got is not None) is appeared
    if appeared:
        assert got["rank"] == last[0]
        assert got["first_blame_us_per_step"] == (1e3 * first[1] if first[0] == last[0] else 0.0)
        assert f"straggler rank {last[0]} appeared" in out["headline"]


def test_diff_names_a_straggler_that_moved_rank() -> None:
    """docs/report.md (diff): stragglers appear and vanish by rank: rank 2 in A, rank 5 in B."""
    d = diff_reports(_run([100.0] * 4, [(2, 10.0)]), _run([100.0] * 4, [(5, 10.0)]))  # type: ignore[arg-type]
    assert [x["key"] for x in d["appeared"] if x["kind"] == "straggler"] == ["rank5"]
    assert [x["key"] for x in d["vanished"] if x["kind"] == "straggler"] == ["rank2"]


# ---- cache (docs/report-speed.md, docs/reliability.md) --------------------------------------------------


def test_trace_rewritten_in_place_with_same_size_and_mtime_is_read_afresh(tmp_path: Path) -> None:
    """docs/report-speed.md: a trace's identity is path + size + mtime + inode + ctime. Rewritten *in place*
    (same inode) with other bytes of the same length and its mtime put back, only the change time
    differs: the parse cache must miss and the new content be read."""
    edit = cached_then_edited(CPU_RUN / "traces" / "rank0.pt.trace.json.gz", tmp_path)
    trace, st = edit.trace, edit.stat
    with open(trace, "r+b") as fh:  # in place: the same inode
        fh.write(edit.changed)
    os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns))
    while trace.stat().st_ctime_ns == st.st_ctime_ns:  # a coarse clock: wait for the change time to move
        time.sleep(0.01)
        os.utime(trace, ns=(st.st_atime_ns, st.st_mtime_ns))
    now = trace.stat()
    assert (now.st_ino, now.st_size, now.st_mtime_ns) == (st.st_ino, st.st_size, st.st_mtime_ns)
    after = read_rank(trace, cache_dir=edit.cache)
    assert edit.new_name in set(after.host["name"].to_list())
    assert edit.new_name not in set(edit.before.host["name"].to_list())


@pytest.mark.parametrize(("excess", "gpu_rank", "cause"), [
    ({"compute_bound": 5, "host_bound": 3}, True, "gpu"),
    ({"compute_bound": 5, "host_bound": 3}, False, "cpu_ops"),  # a CPU rank's compute is its operators
    ({"compute_other": 3, "idle_other": 5}, True, "host"),
    ({"compute_other": 3, "idle_other": 5}, False, "host"),  # time outside its operators (a loader, a sleep)
    ({"memory_bound": 4, "host_bound": 4}, False, "cpu_ops"),  # a tie goes to the operators
    ({}, False, "unknown"),
])
def test_late_rank_cause_on_gpu_and_cpu_ranks(excess: dict[str, int], gpu_rank: bool, cause: str) -> None:
    """A CPU-only rank late by its own operators (a larger batch) is ``cpu_ops``, never ``host`` with a
    data-loader explanation; late by time outside its operators it is ``host``; a GPU rank keeps gpu/host."""
    from traceread.analysis.ledger.job import _cause, _Late

    late = _Late(3)
    late.excess.update(excess)
    assert _cause(late, {3} if gpu_rank else {0}) == cause
