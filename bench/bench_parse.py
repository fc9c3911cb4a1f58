"""Parse CPU time of one trace file: ``traceread.read.parse.parse_file`` only, best and median of N.

    PYTHONPATH=<checkout> python bench/bench_parse.py FILE [N]

Run it for two checkouts back to back to compare them (process CPU time, so other jobs on the machine
disturb it less than wall time).
"""

from __future__ import annotations

import gc
import json
import resource
import sys
import time

from traceread.read.parse import parse_file


def main() -> None:
    path, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 7
    times = []
    rows = {}
    for _ in range(n):
        gc.collect()
        t = time.process_time()
        rt = parse_file(path)
        times.append(time.process_time() - t)
        rows = {"host": rt.host.height, "gpu": rt.gpu.height, "memory": getattr(rt, "memory", None) is not None
                and rt.memory.height}
        del rt
    times.sort()
    print(json.dumps({"file": path, "best_s": round(times[0], 3), "median_s": round(times[len(times) // 2], 3),
                      "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024, **rows}))


if __name__ == "__main__":
    main()
