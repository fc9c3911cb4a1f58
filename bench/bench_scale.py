"""Scale-out benchmark: a simulated N-rank DDP job reported locally and through Ray (not a test).

For each executor, one fresh process runs ``build_report`` cold (empty cache folder, so the summary
cache is written and its size measured) and prints: wall time, the map's time (every rank read and
summarised), the driver's time after the map (rank assignment, cross-rank reduce, findings), the
driver's peak RSS (``ru_maxrss`` of the driver process alone: Ray's workers and daemons are
separate processes), the whole process tree's sampled peak RSS, and summary bytes per rank (the
msgpack files of the summary cache: exactly the bytes a worker sends back). Then a warm re-render
(document cache). From the map time it derives the per-rank cost on one worker and the estimated
wall time for 1,024 and 16,384 ranks on N workers.

    python bench/bench_scale.py [--ranks 4096] [--workers 2] [--executors local,ray]

The simulated job: 1 layer, hidden 1024, 2 steps, one straggler (bench_report.py's scale job).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "bench" / "data"
sys.path.insert(0, str(REPO / "bench"))

CHILD = r"""
import json, resource, sys, time
from pathlib import Path
t_start = time.perf_counter()
from traceread.assemble.report import ReportOptions, build_report
from traceread.assemble import run_map
folder, cache, executor, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
if executor == "ray":
    import os, ray
    for attempt in range(3):  # Ray gives its raylet 30 s to start: not always enough on a loaded box
        try:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                     runtime_env={"env_vars": {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}})
            break
        except Exception:
            ray.shutdown()
            if attempt == 2:
                raise
t_ready = time.perf_counter()
phase = {}
real = run_map.summarise_files
def timed(files, opts):
    t = time.perf_counter()
    out = real(files, opts)
    phase["map_s"] = time.perf_counter() - t
    return out
run_map.summarise_files = timed
t0 = time.perf_counter()
doc = build_report([folder], ReportOptions(cache_dir=Path(cache), workers=workers, executor=executor))
t1 = time.perf_counter()
summaries = list((Path(cache) / "summaries").glob("*.msgpack"))
print(json.dumps({"build_s": round(t1 - t0, 2), "map_s": round(phase.get("map_s", 0.0), 2),
                  "driver_after_map_s": round(t1 - t0 - phase.get("map_s", 0.0), 2),
                  "startup_s": round(t_ready - t_start, 2), "ranks": len(doc["ranks"]),
                  "driver_peak_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3),
                  "summary_bytes_per_rank": round(sum(p.stat().st_size for p in summaries) / max(1, len(summaries))),
                  "stragglers": [s["rank"] for s in doc["stragglers"][:3]]}))
"""

WARM = r"""
import json, resource, sys, time
t0 = time.perf_counter()
from pathlib import Path
from traceread.assemble.report import ReportOptions, build_report
from traceread.render import json_report
doc = build_report([sys.argv[1]], ReportOptions(cache_dir=Path(sys.argv[2])))
text = json_report.to_json(doc)
print(json.dumps({"rerender_s": round(time.perf_counter() - t0, 3), "ranks": len(doc["ranks"])}))
"""


def simulated(ranks: int) -> Path:
    folder = DATA / f"sim_ddp_{ranks}"
    if not (folder / "truth.json").is_file():
        # In its own process: a child forked from a process that had simulated the job would inherit
        # that process's peak in ru_maxrss (Linux keeps it across exec) and misreport the driver.
        t0 = time.perf_counter()
        code = ("import sys; from traceread.simulate import simulate; "
                "simulate('ddp', sys.argv[1], ranks=int(sys.argv[2]), steps=2, layers=1, hidden=1024, "
                "seq_len=512, heads=8, stragglers=[(int(sys.argv[2]) // 3, 2000.0, 'gpu')])")
        subprocess.run([sys.executable, "-c", code, str(folder), str(ranks)], check=True, cwd=REPO)
        print(json.dumps({"simulated_ranks": ranks, "simulate_s": round(time.perf_counter() - t0, 1)}), flush=True)
    return folder


def estimate(per_rank_s: float, driver_per_rank_s: float, fixed_s: float) -> dict[str, float]:
    """Wall time ≈ fixed + ranks × per-rank cost ÷ workers + ranks × driver cost per rank."""
    out = {}
    for ranks in (1024, 16384):
        for workers in (2, 64, 512):
            out[f"{ranks}_ranks_{workers}_workers_s"] = round(
                fixed_s + ranks * per_rank_s / workers + ranks * driver_per_rank_s, 1)
    return out


def main() -> None:
    from bench_report import measure

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4096)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--executors", default="local,ray")
    args = ap.parse_args()
    folder = simulated(args.ranks)
    env_path = str(REPO)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (env_path, os.environ.get("PYTHONPATH")) if p)
    for executor in args.executors.split(","):
        cache = Path(tempfile.mkdtemp(prefix=f"traceread-scale-{executor}-"))
        try:
            res = measure([sys.executable, "-c", CHILD, str(folder), str(cache), executor, str(args.workers)])
            line = {"executor": executor, "workers": args.workers, **res}
            if res.get("map_s"):
                per_rank = float(res["map_s"]) * args.workers / args.ranks
                driver = float(res["driver_after_map_s"]) / args.ranks
                line["per_rank_cost_s"] = round(per_rank, 4)
                line["driver_cost_per_rank_ms"] = round(driver * 1e3, 3)
                line["estimate"] = estimate(per_rank, driver, float(res.get("startup_s", 0.0)))
            print(json.dumps(line), flush=True)
            warm = measure([sys.executable, "-c", WARM, str(folder), str(cache)])
            print(json.dumps({"executor": executor, "what": "re-render, document cached", **warm}), flush=True)
        finally:
            shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main()
