"""Reader benchmark against the decode floor, in one run: floor, reader, whole cold report, HTA.

For one folder of traces, each row in a fresh process, its whole process tree sampled with psutil
every 20 ms for peak RSS (the largest single process = "per worker", and the largest sum over the
tree = "in all"):

* ``floor``: ``bench/floor.py`` on every file, one after the other in one process (gunzip +
  msgspec typed decode of every event's fields, args left raw; see that file);
* ``reader``: ``read_traces(folder, use_cache=False)`` (worker processes, default count);
* ``report``: ``traceread report folder --format json`` with an empty cache directory (cold);
* ``HTA``: ``TraceAnalysis(trace_dir=folder)`` load only (``--hta``; never on 1 GB+ ranks).

The machine is shared, so every traceread row runs ``--repeat`` times (default 2) and the best
wall time is kept (with its own RSS and CPU time). CPU time (user + system of the whole process
tree, from ``RUSAGE_CHILDREN``) is printed beside wall time: on a loaded box it is the steadier
measure of the work done, and its ratio to the floor's the steadier ratio. Prints one markdown row per
measurement and a JSON line.

    python bench/make_large.py --set a100 --ranks 8 --mb 31
    python bench/bench_stream.py bench/data/a100_8x31 --hta
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]

_READER = """
import sys
from traceread.read import read_traces
if __name__ == "__main__":
    ts = read_traces(sys.argv[1], use_cache=False)
    assert ts.ranks and not ts.failures, ts.failures
"""

_HTA = """
import logging, sys
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
if __name__ == "__main__":
    TraceAnalysis(trace_dir=sys.argv[1])
"""


def measure(cmd: list[str], env: dict[str, str] | None = None) -> dict:
    """Wall time and peak RSS (largest process, largest tree sum) of ``cmd``, sampled."""
    t = time.perf_counter()
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    root = psutil.Process(proc.pid)
    worker = total = 0
    while proc.poll() is None:
        try:
            procs = [root, *root.children(recursive=True)]
            rss = []
            for p in procs:
                try:
                    rss.append(p.memory_info().rss)
                except psutil.Error:
                    pass
            worker = max(worker, *rss) if rss else worker
            total = max(total, sum(rss))
        except psutil.Error:
            pass
        time.sleep(0.02)
    wall = time.perf_counter() - t
    out, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{err.decode()[-2000:]}")
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # the whole tree, workers included
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    return {"wall": wall, "cpu": cpu, "rss_worker_mib": worker / 2**20, "rss_all_mib": total / 2**20}


def _script(code: str) -> str:
    fh = tempfile.NamedTemporaryFile("w", suffix=".py", delete=False)
    fh.write(code)
    fh.close()
    return fh.name


def best(label: str, repeat: int, run) -> dict:  # type: ignore[no-untyped-def]
    runs = [run() for _ in range(repeat)]
    r = min(runs, key=lambda x: x["wall"])
    r["label"], r["walls"] = label, [round(x["wall"], 2) for x in runs]
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--hta", action="store_true", help="also time HTA's load (small ranks only)")
    ap.add_argument("--skip-reader", action="store_true", help="floor and report only")
    args = ap.parse_args()
    files = sorted(str(f) for f in args.folder.iterdir() if ".json" in f.name)
    py = sys.executable
    floor_py = str(REPO / "bench" / "floor.py")
    rows = [best("floor (gunzip + typed decode)", args.repeat, lambda: measure([py, floor_py, *files]))]
    if not args.skip_reader:
        reader = _script(_READER)
        rows.append(best("reader: read_traces, no cache", args.repeat,
                         lambda: measure([py, reader, str(args.folder)])))

    def report() -> dict:
        with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as out:
            env = {**os.environ, "TRACEREAD_CACHE_DIR": cache}
            return measure([py, "-c", "from traceread.cli import main; main()", "report",
                            str(args.folder), "--format", "json", "-o", f"{out}/r.json"], env)

    rows.append(best("whole cold `traceread report`", args.repeat, report))
    if args.hta:
        hta = _script(_HTA)
        rows.append(best("HTA 0.6.1 TraceAnalysis load", 1, lambda: measure([py, hta, str(args.folder)])))
    floor = rows[0]["wall"]
    hta_wall = rows[-1]["wall"] if args.hta else None
    mib = sum(_uncompressed(Path(f)) for f in files) / 2**20
    print(f"\n{args.folder} ({len(files)} files, {mib:.0f} MiB uncompressed; best of "
          f"{args.repeat}, load {os.getloadavg()[0]:.1f})\n")
    floor_cpu = rows[0]["cpu"]
    hta_cpu = rows[-1]["cpu"] if args.hta else None
    print("| what | wall s (runs) | wall / floor | CPU s | CPU / floor | HTA / this (wall, CPU) "
          "| peak RSS per worker MiB | in all MiB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        is_hta = r["label"][:3] == "HTA"
        vs_hta = (f"{hta_wall / r['wall']:.1f}x, {hta_cpu / r['cpu']:.1f}x"
                  if hta_wall and not is_hta else "-")
        print(f"| {r['label']} | {r['wall']:.2f} ({', '.join(map(str, r['walls']))}) | "
              f"{r['wall'] / floor:.2f} | {r['cpu']:.2f} | {r['cpu'] / floor_cpu:.2f} | {vs_hta} | "
              f"{r['rss_worker_mib']:.0f} | {r['rss_all_mib']:.0f} |")
    print(json.dumps({"folder": str(args.folder), "mib": mib, "rows": rows}))


def _uncompressed(f: Path) -> int:
    sys.path.insert(0, str(REPO / "bench"))
    from floor import _chunks  # the floor's own inflater

    return sum(len(c) for c in _chunks(f))


if __name__ == "__main__":
    main()
