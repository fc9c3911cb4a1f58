"""Reader benchmark: traceread cold / cached read vs HTA's TraceAnalysis load on one folder.

Every measurement runs in a fresh Python process so peak RSS (``ru_maxrss``) belongs to it alone;
traceread rows are the median of ``--repeat`` runs, HTA runs once. Prints markdown tables.

    python bench/make_large.py            # once: bench/data/large8 (8 ranks x ~46 MB)
    python bench/bench_read.py [FOLDER] [--skip-hta]
"""

from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT = REPO / "bench" / "data" / "large8"

_TRACEREAD = """
import json, resource, sys, time
t = time.perf_counter()
from traceread.read import read_traces
ts = read_traces(sys.argv[1], cache_dir=sys.argv[2], use_cache=sys.argv[3] == "1",
                 workers=int(sys.argv[4]) or None)
wall = time.perf_counter() - t
rows = sum(r.host.height + r.gpu.height for r in ts.ranks)
print(json.dumps({"wall": wall, "ranks": len(ts.ranks), "rows": rows,
    "rss_self": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "rss_children": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""

_HTA = """
import json, resource, sys, time, logging
logging.disable(logging.WARNING)
t = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
wall = time.perf_counter() - t
print(json.dumps({"wall": wall, "ranks": len(a.t.traces),
    "rss_self": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "rss_children": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}))
"""

_DECODERS = """
import gzip, json, sys, time
import msgspec, orjson
from traceread.read.decode import Event, decode_all, decode_top, split_events
from traceread.read.inflate import uncompressed_chunks
from pathlib import Path
p = Path(sys.argv[1])
data = b"".join(uncompressed_chunks(p))
def best(fn, n=3):
    times = []
    for _ in range(n):
        t = time.perf_counter(); fn(); times.append(time.perf_counter() - t)
    return min(times)
typed = msgspec.json.Decoder(Event)
def msgspec_typed_per_event():
    top = decode_top(data, p)
    return [typed.decode(r) for r in split_events(top["traceEvents"], p)]
def msgspec_typed():
    return decode_all(decode_top(data, p)["traceEvents"], p)
print(json.dumps({
    "orjson.loads (dicts)": best(lambda: orjson.loads(data)),
    "json.loads (dicts)": best(lambda: json.loads(data), 1),
    "msgspec untyped (dicts)": best(lambda: msgspec.json.decode(data)),
    "msgspec typed Struct per event (slices)": best(msgspec_typed_per_event),
    "msgspec typed Structs, one call (used)": best(msgspec_typed),
}))
"""

_BASELINE = """
import json, resource
import polars, numpy, msgspec, traceread.read
print(json.dumps({"rss_self": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def _run(code: str, *args: str) -> dict:
    """Run ``code`` as a fresh script (guarded main, so spawn-based pools work)."""
    body = "\n".join("    " + line for line in code.strip().splitlines())
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as fh:
        fh.write(f"def _main():\n{body}\n\nif __name__ == '__main__':\n    _main()\n")
    proc = subprocess.run([sys.executable, fh.name, *args], capture_output=True, text=True)
    Path(fh.name).unlink()
    if proc.returncode != 0:
        raise SystemExit(f"benchmark step failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _median(runs: list[dict]) -> dict:
    """The run with the median wall time (shared machines are noisy)."""
    return sorted(runs, key=lambda r: r["wall"])[len(runs) // 2]


def largest_uncompressed_mb(folder: Path) -> float:
    sizes = []
    for f in folder.iterdir():
        if f.name.endswith(".gz"):
            with gzip.open(f, "rb") as fh:
                sizes.append(sum(len(c) for c in iter(lambda: fh.read(1 << 24), b"")))
        elif f.name.endswith(".json"):
            sizes.append(f.stat().st_size)
    return max(sizes) / 2**20


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("folder", type=Path, nargs="?", default=DEFAULT)
    ap.add_argument("--skip-hta", action="store_true")
    ap.add_argument("--hta-only", action="store_true", help="measure HTA only, print its JSON")
    ap.add_argument("--hta-json", type=Path, help="reuse an HTA measurement (from --hta-only)")
    ap.add_argument("--workers", type=int, default=0, help="0 = default min(cpu, files)")
    ap.add_argument("--repeat", type=int, default=3, help="traceread runs per row (median)")
    args = ap.parse_args()
    folder = args.folder.resolve()
    if args.hta_only:
        print(json.dumps(_run(_HTA, str(folder))))
        return
    big = largest_uncompressed_mb(folder)
    base = _run(_BASELINE)["rss_self"]
    rows = []
    w = str(args.workers)
    colds, warms, ones = [], [], []
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as cache_dir:
            colds.append(_run(_TRACEREAD, str(folder), cache_dir, "1", w))
            warms.append(_run(_TRACEREAD, str(folder), cache_dir, "1", w))
            ones.append(_run(_TRACEREAD, str(folder), cache_dir, "0", "1"))
    cold, warm, one = _median(colds), _median(warms), _median(ones)
    rows.append(("traceread cold (parse + write cache)", cold))
    rows.append(("traceread cached", warm))
    rows.append(("traceread no cache, 1 process", one))
    if args.hta_json:
        hta = json.loads(args.hta_json.read_text().strip().splitlines()[-1])
    else:
        hta = None if args.skip_hta else _run(_HTA, str(folder))
    if hta:
        rows.append(("HTA TraceAnalysis(trace_dir=...)", hta))
    biggest = max(folder.iterdir(), key=lambda f: f.stat().st_size)
    dec = _run(_DECODERS, str(biggest))

    print(f"folder: {folder} ({cold['ranks']} ranks, largest rank file {big:.1f} MiB "
          f"uncompressed, {cold['rows']:,} table rows); import baseline RSS {base:.0f} MiB\n")
    print("| read | wall s | vs HTA | peak RSS main MiB | peak RSS worker MiB |")
    print("|---|---:|---:|---:|---:|")
    for label, r in rows:
        speed = f"{hta['wall'] / r['wall']:.0f}x" if hta and r is not hta else "-"
        print(f"| {label} | {r['wall']:.2f} | {speed} | {r['rss_self']:.0f} | "
              f"{r['rss_children']:.0f} |")
    print(f"\nJSON decode of {biggest.name} ({big:.1f} MiB), best of 3:\n")
    print("| decoder | s |")
    print("|---|---:|")
    for name, secs in dec.items():
        print(f"| {name} | {secs:.2f} |")


if __name__ == "__main__":
    main()
