"""Build a large 8-rank trace folder for the reader benchmark from a real 8-rank job.

Each rank's own real trace (``../shared/traces/param_dlrm_8rank/worker{r}_*.json``, one DLRM
step on 8 V100s) is tiled: copy k of every event is shifted by k step-spans in time, its
``ProfilerStep#N`` renumbered, and its correlation / External id / flow ids offset so they stay
unique. The result looks like a long profiling window of the same job: same kernels, same
collectives, same per-rank skew. Output: ``bench/data/large8/rank{r}.pt.trace.json.gz``.

    python bench/make_large.py [--mb 45] [--out bench/data/large8]
"""

from __future__ import annotations

import argparse
import copy
import gzip
import json
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO.parent / "shared" / "traces" / "param_dlrm_8rank"
ID_STRIDE = 10_000_000  # larger than any id in the source, so tiles never collide
_STEP = re.compile(r"^ProfilerStep#(\d+)$")


def tile(doc: dict, copies: int) -> dict:
    """``copies`` back-to-back repetitions of the trace's events, with fresh ids and steps."""
    events = doc["traceEvents"]
    timed = [e for e in events if e.get("ph") in ("X", "s", "f", "i") and "ts" in e]
    t0 = min(e["ts"] for e in timed)
    t1 = max(e["ts"] + e.get("dur", 0) for e in timed)
    span = (t1 - t0) + 100  # 100 µs gap between tiles
    out = [e for e in events if e.get("ph") == "M"]
    for k in range(copies):
        shift = k * span
        off = k * ID_STRIDE
        for e in events:
            if e.get("ph") == "M":
                continue
            c = copy.copy(e)
            if "ts" in c:
                c["ts"] = c["ts"] + shift
            if "id" in c and isinstance(c["id"], int):
                c["id"] = c["id"] + off
            args = c.get("args")
            if args:
                args = dict(args)
                for key in ("correlation", "External id", "external id"):
                    if isinstance(args.get(key), int) and args[key] > 0:
                        args[key] += off
                c["args"] = args
            m = _STEP.match(str(c.get("name", "")))
            if m:
                c["name"] = f"ProfilerStep#{int(m.group(1)) + k}"
            out.append(c)
    result = dict(doc)
    result["traceEvents"] = out
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=45.0, help="uncompressed MB per rank (>= 40)")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "data" / "large8")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for src in sorted(SOURCE.glob("worker*.json")):
        doc = json.loads(src.read_text())
        rank = doc["distributedInfo"]["rank"]
        one = len(json.dumps(doc).encode())
        copies = max(1, int(args.mb * 1e6 / one) + 1)
        text = json.dumps(tile(doc, copies)).encode()
        dest = args.out / f"rank{rank}.pt.trace.json.gz"
        with gzip.open(dest, "wb", compresslevel=3) as fh:
            fh.write(text)
        print(f"{dest}: {copies} steps, {len(text) / 1e6:.1f} MB uncompressed")


if __name__ == "__main__":
    main()
