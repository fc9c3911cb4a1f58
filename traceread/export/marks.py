"""The ``traceread findings`` process of the merged trace: where and when each finding happens.

One thread per finding and place (two for a straggler, one per rank for host-bound gaps, one per
stage for bubbles), so slices on one thread never overlap (Perfetto drops improperly nested
slices); times on the reference clock:

* ``straggler`` — each collective the rank joined last: a "late" slice from the previous arrival
  to its own (the delay it added; the gap of :mod:`traceread.analysis.comm.stragglers`' blame records),
  and a "waits caused" slice from the first arrival to its own, with every waiting rank's wait in
  the args;
* ``pipeline_bubble`` — per stage rank, each stretch inside a step with no compute kernel running
  (idle + p2p wait: the report's bubble definition);
* ``host_bound`` — each GPU idle gap whose next work was launched after the gap began
  (:mod:`traceread.analysis.time.idle`'s host_bound class), the longest :data:`MAX_GAPS_PER_RANK`;
* ``slow_steps`` — each slow step, first rank's start to last rank's end;
* ``hang`` — from the last event of the ranks that never joined to the last event of any rank.

Names say finding number, id, what and where; args carry ``finding_id``, ``title``, ``rank`` and
``ms``. Findings with no place in time (exposed communication, memory-bound operators, SM
efficiency, NCCL) are listed in the file's metadata instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl

from traceread import intervals as iv
from traceread.export.rank_events import TIDS_PER_PID, metadata_events
from traceread.export.selection import in_range
from traceread.model import RankTrace, as_float

if TYPE_CHECKING:
    from traceread.report_schema import Finding, Report

FINDINGS_PID = 100_000
MAX_GAPS_PER_RANK = 200
MAX_LATE_PER_STRAGGLER = 2000
MIN_GAP_US = 5.0

_encode = __import__("msgspec").json.Encoder().encode


def _ms(us: float) -> float:
    return round(us / 1000.0, 3)


class FindingMarks:
    """Collects the findings slices while ranks are written, emits them at the end."""

    def __init__(self, report: Report, steps: tuple[int | None, int | None] | None) -> None:
        clock = (report.get("source") or {}).get("clock") or {}
        self.report = report
        self.offsets = {int(k): float(v) for k, v in (clock.get("offsets_us") or {}).items()}
        self.epsilon_us = float(clock.get("epsilon_us") or 0.0)
        self.steps = steps
        self.findings = list(report.get("findings") or [])
        self.ids = {f["id"] for f in self.findings}
        p = report.get("pipeline") or {}
        self.stage_of = {int(s["rank"]): int(s["stage"]) for s in p.get("per_stage") or []
                         if s.get("rank") is not None and s.get("stage") is not None}
        self.slices: list[dict[str, Any]] = []
        self.extracts: list[pl.DataFrame] = []
        self.windows: dict[int, pl.DataFrame] = {}
        self.last_end: dict[int, float] = {}
        self._threads: dict[str, int] = {}

    # -- what needs the rank's tables ----------------------------------------------------------
    @property
    def needs_comm(self) -> bool:
        return "straggler" in self.ids

    def wants_tables(self, rank: int, exported: bool) -> bool:
        return self.needs_comm or (exported and ("host_bound" in self.ids or rank in self.stage_of))

    def observe(self, rt: RankTrace, rank: int, exported: bool) -> None:
        """Take what the findings need from one rank's tables (then the tables can go)."""
        from traceread.analysis.comm import collectives
        from traceread.analysis.time import steps as steps_mod

        wins = steps_mod.device_steps(rt).table
        if self.needs_comm:
            self.extracts.append(collectives.comm_events(rt, wins).with_columns(pl.lit(rank, pl.Int64).alias("rank")))
            self.windows[rank] = wins
        if not exported:
            return
        if "host_bound" in self.ids:
            self._host_bound(rt, rank, wins)
        if "pipeline_bubble" in self.ids and rank in self.stage_of:
            self._bubbles(rt, rank, wins)

    def note_end(self, rank: int, last_end: float | None) -> None:
        if last_end is not None:
            self.last_end[rank] = last_end

    # -- slices ---------------------------------------------------------------------------------
    def _finding(self, fid: str, rank: int | None = None) -> tuple[int, Finding] | None:
        for i, f in enumerate(self.findings, 1):
            if f["id"] == fid and (rank is None or f.get("rank") in (None, rank)):
                return i, f
        return None

    def _tid(self, thread: str) -> int:
        if thread not in self._threads:
            self._threads[thread] = FINDINGS_PID * TIDS_PER_PID + len(self._threads)
        return self._threads[thread]

    def _slice(self, thread: str, start: float, end: float, num: int, f: Finding, what: str,
               rank: int | None, us: float, **extra: Any) -> None:
        where = f"rank {rank}, " if rank is not None else ""
        args = {"finding_id": f["id"], "finding": num, "title": f["title"], "rank": rank, "ms": _ms(us), **extra}
        self.slices.append({"ph": "X", "pid": FINDINGS_PID, "tid": thread, "ts": start,
                            "dur": max(end - start, 0.001), "name": f"#{num} {f['id']}: {what} ({where}{_ms(us)} ms)",
                            "cat": "traceread.finding", "args": args})

    def _host_bound(self, rt: RankTrace, rank: int, wins: pl.DataFrame) -> None:
        from traceread.analysis.time.step_timeline import host_bound_gaps

        hit = self._finding("host_bound")
        if hit is None:
            return
        s, e = self._in_steps(*host_bound_gaps(rt), wins)
        num, f = hit
        off = self.offsets.get(rank, 0.0)
        for a, b in self._longest(s, e):
            self._slice(f"#{num} host_bound: rank {rank} GPU idle, next launch late", a - off, b - off, num, f,
                        "GPU idle waiting for a launch", rank, b - a)

    def _bubbles(self, rt: RankTrace, rank: int, wins: pl.DataFrame) -> None:
        from traceread.analysis.kinds import gpu_classes
        from traceread.analysis.time.breakdown import device_gpu_rows

        hit = self._finding("pipeline_bubble")
        if hit is None:
            return
        rows = device_gpu_rows(rt)
        comp = rows.with_columns(gpu_classes(rows, rt.host)).filter(pl.col("gpu_class") == "comp")
        busy = iv.merge(comp["ts"].to_numpy(), comp["end"].to_numpy())
        starts: list[np.ndarray] = []
        ends: list[np.ndarray] = []
        for step, lo, hi in wins.select("step", "start", "end").iter_rows():
            if in_range(int(step), self.steps):
                gs, ge = iv.complement(busy, float(lo), float(hi))
                starts.append(gs)
                ends.append(ge)
        if not starts:
            return
        num, f = hit
        off = self.offsets.get(rank, 0.0)
        stage = self.stage_of[rank]
        for a, b in self._longest(np.concatenate(starts), np.concatenate(ends)):
            self._slice(f"#{num} pipeline_bubble: stage {stage}", a - off, b - off, num, f,
                        f"bubble, stage {stage}", rank, b - a, stage=stage)

    def _in_steps(self, s: np.ndarray, e: np.ndarray, wins: pl.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        sel = wins.filter(pl.col("step").map_elements(lambda x: in_range(int(x), self.steps), return_dtype=pl.Boolean))
        if sel.height == 0:
            return s[:0], e[:0]
        lo, hi = as_float(sel["start"].min()), as_float(sel["end"].max())
        s2, e2 = np.clip(s, lo, hi), np.clip(e, lo, hi)
        ok = e2 > s2
        return s2[ok], e2[ok]

    @staticmethod
    def _longest(s: np.ndarray, e: np.ndarray) -> list[tuple[float, float]]:
        ok = (e - s) >= MIN_GAP_US
        s, e = s[ok], e[ok]
        order = np.argsort(-(e - s), kind="stable")[:MAX_GAPS_PER_RANK]
        return sorted((float(s[i]), float(e[i])) for i in order)

    def _stragglers(self) -> None:
        from traceread.analysis.comm import collectives, stragglers
        from traceread.analysis.comm.clocks import ClockModel
        from traceread.analysis.comm.perf import instance_timing

        frames = [x for x in self.extracts if x.height]
        if not frames:
            return
        matched = collectives.match_collectives(frames)
        clock = ClockModel(offsets_us=dict(self.offsets), epsilon_us=max(self.epsilon_us, 0.0) or 5.0, method="report")
        res = stragglers.attribute(matched, self.windows, clock)
        timing = instance_timing(matched, clock, stragglers.BLAME_OPS)
        for i, f in enumerate(self.findings, 1):
            if f["id"] != "straggler" or (r := f.get("rank")) is None:
                continue
            recs = res.records.filter((pl.col("rank") == r) & pl.col("step").map_elements(
                lambda x: in_range(int(x), self.steps), return_dtype=pl.Boolean)).head(MAX_LATE_PER_STRAGGLER)
            if recs.height == 0:
                continue
            arr = timing.filter(pl.col("instance").is_in(recs["instance"].to_list())).select("instance", "rank", "ts")
            by_inst: dict[int, list[tuple[int, float]]] = {}
            for inst, rk, ts in arr.iter_rows():
                by_inst.setdefault(int(inst), []).append((int(rk), float(ts)))
            for inst, step, gap, op, pg in recs.select("instance", "step", "gap_us", "op", "pg").iter_rows():
                rows = by_inst.get(int(inst)) or []
                mine = [t for rk, t in rows if rk == r]
                if not mine:
                    continue
                late = mine[0]
                coll = f"{op} pg {pg}" if pg is not None else str(op)
                self._slice(f"#{i} straggler rank {r}: late arrivals", late - gap, late, i, f,
                            f"rank {r} late to {coll}, step {step}", r, gap, step=int(step), collective=coll)
                waits = {str(rk): _ms(late - t) for rk, t in rows if rk != r and late - t > 0}
                first = min((t for rk, t in rows if rk != r), default=late)
                if waits:
                    self._slice(f"#{i} straggler rank {r}: waits it caused", first, late, i, f,
                                f"{len(waits)} rank(s) wait for rank {r} in {coll}", r, late - first,
                                step=int(step), collective=coll, wait_ms_by_rank=waits)

    def _slow_steps(self) -> None:
        hit = self._finding("slow_steps")
        if hit is None:
            return
        num, f = hit
        for s in self.report.get("slow_steps") or []:
            step = int(s["step"])
            if not in_range(step, self.steps):
                continue
            spans = [(float(x["start_us"]) - self.offsets.get(int(e["rank"]), 0.0), float(x["duration_us"]))
                     for e in self.report.get("ranks") or [] for x in e.get("steps") or [] if int(x["step"]) == step]
            if not spans:
                continue
            lo, hi = min(a for a, _ in spans), max(a + d for a, d in spans)
            self._slice(f"#{num} slow_steps", lo, hi, num, f, f"step {step} slow, +{_ms(float(s.get('excess_us') or 0))} ms"
                        f" ({s.get('cause')})", None, float(s.get("excess_us") or 0.0), step=step, cause=s.get("cause"))

    def _hang(self) -> None:
        hit = self._finding("hang")
        h = self.report.get("hang")
        if hit is None or not h or not self.last_end:
            return
        num, f = hit
        missing = [int(r) for r in h.get("missing_ranks") or [] if int(r) in self.last_end]
        end = max(self.last_end.values())
        start = min((self.last_end[r] for r in missing), default=end)
        absent = ", ".join(map(str, h.get("missing_ranks") or []))
        what = f"{h.get('op')} #{h.get('seq')} on pg {h.get('pg')}: rank(s) {absent} never joined"
        self._slice(f"#{num} hang", start, end, num, f, what, missing[0] if missing else None, end - start,
                    missing_ranks=h.get("missing_ranks"), waiting_ranks=h.get("waiting_ranks"))

    def events(self) -> Iterator[bytes]:
        """Every findings slice, then the process and thread names."""
        for fn in (self._stragglers, self._slow_steps, self._hang):
            fn()
        self._pack()
        for s in self.slices:
            yield _encode(s)
        threads = {tid: (name, k) for k, (name, tid) in enumerate(self._threads.items())}
        yield from metadata_events(FINDINGS_PID, "traceread findings", -1, threads)

    def _pack(self) -> None:
        """Give each slice a tid: its thread, or a numbered copy of it where it would partially
        overlap a slice already there (gloo runs collectives concurrently, for instance)."""
        lanes: dict[str, list[list[float]]] = {}  # thread -> per lane, the ends of the open (enclosing) slices
        self.slices.sort(key=lambda s: (str(s["tid"]), s["ts"], -s["dur"]))
        for s in self.slices:
            stacks = lanes.setdefault(str(s["tid"]), [])
            end = s["ts"] + s["dur"]
            k = len(stacks)
            for i, open_ends in enumerate(stacks):
                while open_ends and open_ends[-1] <= s["ts"]:
                    open_ends.pop()
                if not open_ends or end <= open_ends[-1]:
                    k = i
                    break
            if k == len(stacks):
                stacks.append([])
            stacks[k].append(end)
            s["tid"] = self._tid(str(s["tid"]) + (f" ({k + 1})" if k else ""))
        self.slices.sort(key=lambda s: s["ts"])

    def unplaced(self) -> list[str]:
        """Findings that have no slice (no time and place, or none in the selection)."""
        placed = {s["args"]["finding"] for s in self.slices}
        return [f"#{i} {f['id']}: {f['title']}" for i, f in enumerate(self.findings, 1) if i not in placed]
