"""Benchmarks of the whole ``traceread report`` (not timed in the unit tests).

Two measurements, each run in a fresh process whose whole process tree (the report's worker
processes included) is sampled from /proc every 0.2 s for peak resident memory:

``large``  the 8-rank folder from ``bench/make_large.py`` (real DLRM job tiled to >= 40 MB per
           rank), traceread's whole report (cold: no cache; warm: parse and summary caches filled;
           parse cache only: summary cache removed) against HTA's
           ``TraceAnalysis`` load + temporal breakdown + comm/comp overlap + idle-time breakdown.
``scale``  a simulated 1024-rank DDP job with small steps, reported end to end; the target is to
           stay within 24 GiB on the whole tree.

    python bench/bench_report.py large [--dir bench/data/large8] [--no-hta] [--workers N]
    python bench/bench_report.py scale [--ranks 1024] [--steps 2] [--workers N]

Prints one JSON object per measurement (seconds, peak GiB of the process tree).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "bench" / "data"
PAGE = os.sysconf("SC_PAGE_SIZE")

# HTA imports psutil only for free memory; when it is missing, a stand-in reads /proc/meminfo so the
# comparison can run (HTA's own results do not depend on it).
PSUTIL_SHIM = r"""
import sys, types
try:
    import psutil  # noqa: F401 - only whether it is there
except ImportError:
    m = types.ModuleType("psutil")
    class _VM:
        @property
        def available(self):
            for line in open("/proc/meminfo"):
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
            return 8 << 30
    m.virtual_memory = lambda: _VM()
    sys.modules["psutil"] = m
"""

HTA_CODE = PSUTIL_SHIM + r"""
import logging, time, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
t0 = time.perf_counter()
ta = TraceAnalysis(trace_dir=sys.argv[1])
t1 = time.perf_counter()
ta.get_temporal_breakdown(visualize=False)
ta.get_comm_comp_overlap(visualize=False)
ta.get_idle_time_breakdown(visualize=False)
t2 = time.perf_counter()
print({"load_s": t1 - t0, "analyses_s": t2 - t1})
"""

TRACEREAD_CODE = r"""
import sys, time, json
from pathlib import Path
from traceread.assemble.report import ReportOptions, build_report
from traceread.render import html, json_report
folder, use_cache, workers = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3])
t0 = time.perf_counter()
doc = build_report([folder], ReportOptions(use_cache=use_cache, workers=workers))
t1 = time.perf_counter()
page = html.render_html(doc)
t2 = time.perf_counter()
errors = json_report.validate(json.loads(json_report.to_json(doc)))
print({"build_s": t1 - t0, "html_s": t2 - t1, "html_mb": len(page) / 1e6, "ranks": len(doc["ranks"]),
       "findings": [f["id"] for f in doc["findings"]], "valid": not errors})
"""


def _tree_rss(root: int) -> int:
    """Resident bytes of ``root`` and all its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as fh:
                parts = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid, ppid = int(d), int(parts[1])
        children.setdefault(ppid, []).append(pid)
        rss[pid] = int(parts[21]) * PAGE
    total, todo = 0, [root]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        todo.extend(children.get(p, []))
    return total


def measure(argv: list[str]) -> dict[str, object]:
    """Run ``argv``; wall seconds, peak RSS of its process tree, and the dict it printed last."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _tree_rss(proc.pid))
            time.sleep(0.2)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out, err = proc.communicate()
    done.set()
    th.join()
    wall = time.perf_counter() - t0
    result: dict[str, object] = {"wall_s": round(wall, 2), "peak_gib": round(peak[0] / 2**30, 3), "rc": proc.returncode}
    lines = [ln for ln in out.splitlines() if ln.startswith("{")]
    if lines:
        result.update(eval(lines[-1], {}))  # our own child's repr of a dict of numbers/strings
    if proc.returncode:
        result["stderr"] = err[-1500:]
    return result


def bench_large(folder: Path, workers: int, hta: bool) -> None:
    if not folder.is_dir() or len(list(folder.glob("rank*.pt.trace.json.gz"))) < 8:
        subprocess.run([sys.executable, str(REPO / "bench" / "make_large.py"), "--out", str(folder)], check=True)
    sizes = [f.stat().st_size for f in folder.glob("rank*.pt.trace.json.gz")]
    print(json.dumps({"folder": str(folder), "ranks": len(sizes), "gz_mb_per_rank": round(sum(sizes) / len(sizes) / 1e6, 1)}))
    cold = measure([sys.executable, "-c", TRACEREAD_CODE, str(folder), "0", str(workers)])
    print(json.dumps({"tool": "traceread report (no cache)", **cold}))
    measure([sys.executable, "-c", TRACEREAD_CODE, str(folder), "1", str(workers)])  # fill the caches
    rerender = measure([sys.executable, "-c", TRACEREAD_CODE, str(folder), "1", str(workers)])
    print(json.dumps({"tool": "traceread report (document cache warm: render only)", **rerender}))
    _drop_summaries(keep_summaries=True)
    warm = measure([sys.executable, "-c", TRACEREAD_CODE, str(folder), "1", str(workers)])
    print(json.dumps({"tool": "traceread report (parse + summary cache warm)", **warm}))
    _drop_summaries()
    parse_only = measure([sys.executable, "-c", TRACEREAD_CODE, str(folder), "1", str(workers)])
    print(json.dumps({"tool": "traceread report (parse cache warm, no summary cache)", **parse_only}))
    if hta:
        res = measure([sys.executable, "-c", HTA_CODE, str(folder)])
        print(json.dumps({"tool": "HTA load + temporal + overlap + idle", **res}))


def _drop_summaries(*, keep_summaries: bool = False) -> None:
    """Remove the document cache and (unless ``keep_summaries``) the per-rank summary cache
    (traceread.engine.caches), keeping the parse cache."""
    import shutil

    from traceread.engine.caches import DOCUMENT_FOLDER, SUMMARY_FOLDER, cache_root

    shutil.rmtree(cache_root() / DOCUMENT_FOLDER, ignore_errors=True)
    if not keep_summaries:
        shutil.rmtree(cache_root() / SUMMARY_FOLDER, ignore_errors=True)


def bench_scale(ranks: int, steps: int, workers: int) -> None:
    folder = DATA / f"sim_ddp_{ranks}"
    if not (folder / "truth.json").is_file():
        t0 = time.perf_counter()
        from traceread.simulate import simulate

        simulate("ddp", folder, ranks=ranks, steps=steps, layers=1, hidden=1024, seq_len=512, heads=8,
                 stragglers=[(ranks // 3, 2000.0, "gpu")])
        print(json.dumps({"simulated_ranks": ranks, "simulate_s": round(time.perf_counter() - t0, 1)}))
    res = measure([sys.executable, "-c", TRACEREAD_CODE, str(folder), "0", str(workers)])
    res["within_24_gib"] = bool(res["peak_gib"] < 24)
    print(json.dumps({"tool": f"traceread report, {ranks} simulated ranks", **res}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    a = sub.add_parser("large")
    a.add_argument("--dir", type=Path, default=DATA / "large8")
    a.add_argument("--no-hta", action="store_true")
    a.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    b = sub.add_parser("scale")
    b.add_argument("--ranks", type=int, default=1024)
    b.add_argument("--steps", type=int, default=2)
    b.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    if args.what == "large":
        bench_large(args.dir, args.workers, not args.no_hta)
    else:
        bench_scale(args.ranks, args.steps, args.workers)


if __name__ == "__main__":
    main()
