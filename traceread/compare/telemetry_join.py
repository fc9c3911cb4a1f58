"""Join the GPUs' own sensors (``RUN/telemetry/``) to the report's findings, by time and device.

* A straggler finding whose rank's GPU was throttled over the analysed window (:func:`traceread.analysis.
  telemetry.gpu_state`) says so in its title and evidence, with the clock, the reason and the power or
  temperature, and carries the numbers in ``telemetry``.
* A hang finding names every Xid raised on any GPU of the run between the last step and the moment
  the hang was detected (from ``hang.json``), in its title and evidence.
* ``report["telemetry"]``: what was read (GPUs, per GPU its state over the window) — absent without
  telemetry. Missing or unreadable telemetry changes nothing else.

A rank's GPU: ``run.json``'s ``ranks[R].device.index`` (the ``torch.cuda.current_device()`` the rank
reported), else the device its kernels ran on in the trace, on the rank's host (the only one when the
telemetry has one host). The analysed window in wall time: each rank's first step start to last step
end, ``baseTimeNanoseconds`` + ts × 1000.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from statistics import median
from typing import TYPE_CHECKING, Any

from traceread.analysis.telemetry import describe, gpu_state
from traceread.read.jsonfile import load_json_object
from traceread.read.telemetry import GpuTelemetry, read_telemetry

if TYPE_CHECKING:
    from traceread.options import ReportOptions
    from traceread.report_schema import Report

#: Xids this long before the stall began still count as "at the moment of the hang".
XID_BEFORE_S = 60.0


def rank_facts(report: Report, options: ReportOptions) -> dict[int, dict[str, Any]]:
    """Per rank: ``device_id`` and ``base_time_ns`` from its summary (the summary cache makes this cheap)."""
    from traceread.assemble.run_map import summarise_files

    files = {Path(str(r["file"])): int(r["rank"]) for r in report.get("ranks") or [] if r.get("file")}
    if not files:
        return {}
    got = summarise_files(list(files), options)
    out: dict[int, dict[str, Any]] = {}
    for f, s in got.items():
        meta = getattr(s, "meta", None)
        if meta is not None and f in files:
            out[files[f]] = {"device_id": meta.device_id, "base_time_ns": meta.base_time_ns, "summary": s}
    return out


def window_ns(entry: Any, base_time_ns: int | None) -> tuple[int, int] | None:
    """The rank's analysed steps in wall time (ns), or None without ``baseTimeNanoseconds``."""
    steps = entry.get("steps") or []
    if base_time_ns is None or not steps:
        return None
    first = float(steps[0]["start_us"])
    last = float(steps[-1]["start_us"]) + float(steps[-1]["duration_us"])
    return base_time_ns + int(first * 1000), base_time_ns + int(last * 1000)


def gpu_of(rank: int, run_info: dict[str, Any] | None, facts: dict[str, Any], host: str | None,
           gpus: Sequence[GpuTelemetry]) -> GpuTelemetry | None:
    """The telemetry of ``rank``'s GPU (module docstring), or None."""
    info = ((run_info or {}).get("ranks") or {}).get(str(rank)) if isinstance((run_info or {}).get("ranks"), dict) else None
    dev = (info or {}).get("device") if isinstance(info, dict) else None
    index = dev.get("index") if isinstance(dev, dict) and isinstance(dev.get("index"), int) else facts.get("device_id")
    if index is None:
        return None
    hosts = {g.host for g in gpus}
    cands = [g for g in gpus if g.gpu == index and (len(hosts) <= 1 or host is None or g.host == host)]
    return cands[0] if len(cands) == 1 else None


def join(report: Report, run_dir: Path, options: ReportOptions, warn: Callable[[str], None]) -> list[GpuTelemetry]:
    """Add the telemetry to ``report`` in place (module docstring); returns what was read."""
    gpus = read_telemetry(run_dir, warn)
    run_info = load_json_object(run_dir / "run.json", None) if (run_dir / "run.json").is_file() else None
    if not gpus:
        tel = (run_info or {}).get("telemetry")
        if isinstance(tel, dict) and tel.get("state") == "off":
            report["telemetry"] = {"state": "off", "why": tel.get("why"), "gpus": []}
        return gpus
    facts = rank_facts(report, options) if report.get("ranks") else {}
    per_rank: dict[int, dict[str, Any]] = {}
    for entry in report.get("ranks") or []:
        r = int(entry["rank"])
        fact = facts.get(r, {})
        g = gpu_of(r, run_info, fact, entry.get("host"), gpus)
        win = window_ns(entry, fact.get("base_time_ns"))
        if g is None or win is None:
            continue
        state = gpu_state(g, *win)
        if state is not None:
            per_rank[r] = state
    clocks = {r: s["sm_clock_mhz"] for r, s in per_rank.items() if s.get("sm_clock_mhz") is not None}
    for f in report.get("findings") or []:
        who = f.get("rank")
        if f.get("id") != "straggler" or who is None or who not in per_rank or not per_rank[who]["throttled"]:
            continue
        r = who
        others = [c for q, c in clocks.items() if q != r]
        text = describe(per_rank[r], median(others) if others else None)
        f["title"] = f"{f['title']}; its {text}"
        f.setdefault("evidence", []).insert(0, f"GPU telemetry: {text}")
        f["telemetry"] = per_rank[r]
    hang_xids = xids_at_hang(run_dir, gpus)
    for f in report.get("findings") or []:
        if f.get("id") == "hang" and hang_xids:
            words = xid_words(hang_xids)
            f["title"] = f"{f['title']} — the driver reported {words}"
            f.setdefault("evidence", []).insert(0, f"GPU telemetry: {words}")
            f["xids"] = hang_xids
    report["telemetry"] = {
        "state": "on", "gpus": [{"host": g.host, "gpu": g.gpu, "name": g.info.get("name"), "samples": len(g.t_ns),
                                 "xids": len(g.xids)} for g in gpus],
        "ranks": {str(r): s for r, s in sorted(per_rank.items())},
        "hang_xids": hang_xids,
    }
    return gpus


def xid_words(xids: Sequence[dict[str, Any]]) -> str:
    """"Xid 79 on GPU 1 (node3) 40 s before the hang was detected; …" (the first three)."""
    return "; ".join(f"Xid {x['xid']} on GPU {x['gpu']}" + (f" ({x['host']})" if x.get("host") else "")
                     + f" {x['before_detection_s']:.0f} s before the hang was detected" for x in xids[:3])


def xids_at_hang(run_dir: Path, gpus: Sequence[GpuTelemetry]) -> list[dict[str, Any]]:
    """Xids from (stall start − :data:`XID_BEFORE_S`) to the hang's detection (``hang.json``)."""
    hang = load_json_object(run_dir / "hang.json", None) if (run_dir / "hang.json").is_file() else None
    if not hang or not isinstance(hang.get("detected_at_ns"), int):
        return []
    end = int(hang["detected_at_ns"])
    got = hang.get("stalled_for_s")
    stalled = float(got) if isinstance(got, (int, float)) else 0.0
    start = end - int((float(stalled) + XID_BEFORE_S) * 1e9)
    out = [{"host": g.host, "gpu": g.gpu, "xid": x, "t_ns": t, "before_detection_s": (end - t) / 1e9}
           for g in gpus for t, x in g.xids if start <= t <= end]
    return sorted(out, key=lambda x: x["t_ns"])
