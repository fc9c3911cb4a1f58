"""Build large trace folders for the reader benchmarks by tiling real traces.

Each rank's real trace is tiled: copy k of every event is shifted by k step-spans in time, its
``ProfilerStep#N`` renumbered, and its correlation / External id / flow ids offset so they stay
unique. The result looks like a long profiling window of the same job. The output is written
tile by tile into the gzip stream (never the whole document in memory), so a 5 GB rank can be
built on a small machine.

Sets (``--set``):

* ``dlrm8`` (default): the real 8-rank DLRM job (``param_dlrm_8rank``, 8x V100), each rank's own
  trace tiled to ``--mb`` (45) MB -> ``bench/data/large8/rank{r}.pt.trace.json.gz``.
* ``a100``: one real A100 rank with many CPU ops (``hta_nccl_parser_config/nccl_data.json.gz``:
  14k cpu_ops, 2.7k kernels per 9.8 MB) tiled to ``--mb`` MB for each of ``--ranks`` ranks
  (``distributedInfo`` rank/world size rewritten) -> ``bench/data/a100_{ranks}x{mb}``.

    python bench/make_large.py                                   # (a) 8 x 44 MiB DLRM
    python bench/make_large.py --set a100 --ranks 8 --mb 31      # (b) 8 x 31 MB
    python bench/make_large.py --set a100 --ranks 1 --mb 1000    # (b) 1 x 1 GB
    python bench/make_large.py --set a100 --ranks 1 --mb 5000    # (c) 1 x 5 GB
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "traces"
DLRM = "param_dlrm_8rank"
A100 = "hta_nccl_parser_config/nccl_data.json.gz"
ID_STRIDE = 10_000_000  # larger than any id in the sources, so tiles never collide
_STEP = re.compile(r"^ProfilerStep#(\d+)$")


def _load(path: Path) -> dict:
    data = path.read_bytes()
    return json.loads(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)


def tiles(events: list[dict], copies: int) -> Iterator[list[dict]]:
    """``copies`` back-to-back repetitions of the events (metadata once), fresh ids and steps."""
    timed = [e for e in events if e.get("ph") in ("X", "s", "f", "i") and "ts" in e]
    t0 = min(e["ts"] for e in timed)
    t1 = max(e["ts"] + e.get("dur", 0) for e in timed)
    span = (t1 - t0) + 100  # 100 µs gap between tiles
    yield [e for e in events if e.get("ph") == "M"]
    body = [e for e in events if e.get("ph") != "M"]
    for k in range(copies):
        shift, off = k * span, k * ID_STRIDE
        out = []
        for e in body:
            c = dict(e)
            if "ts" in c:
                c["ts"] = c["ts"] + shift
            if isinstance(c.get("id"), int):
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
        yield out


@dataclass
class EventsMember:
    """The gzip member holding a rank's tiled events, and its uncompressed length (-1: not yet
    written). Ranks that differ only in their header (``a100``) share one: compressed once."""

    path: Path
    text_bytes: int = -1


def write_tiled(doc: dict, mb: float, dest: Path, shared: EventsMember | None = None) -> tuple[int, int]:
    """Write ``doc`` with its events tiled to ~``mb`` MB of JSON; returns (copies, bytes).

    The file is three gzip members (header, events, trailing keys), which any gzip reader takes
    as one stream.
    """
    events = doc["traceEvents"]
    one = len(orjson.dumps(events))
    copies = max(1, round(mb * 1e6 / one))
    head = {k: v for k, v in doc.items() if k != "traceEvents"}
    keys = list(head)
    # Kineto's order: metadata, then the events, then traceName & co.
    before = {k: head[k] for k in keys[: max(1, len(keys) - 2)]}
    after = {k: head[k] for k in keys if k not in before}
    first_bytes = orjson.dumps(before)[:-1] + b',\n"traceEvents": [\n'
    last_bytes = b"\n]," + orjson.dumps(after)[1:] if after else b"\n]}"
    body = shared if shared is not None else EventsMember(dest.with_suffix(".body.gz"))
    if body.text_bytes < 0:
        body.text_bytes = 0
        with gzip.open(body.path, "wb", compresslevel=1) as fh:
            for tile in tiles(events, copies):
                if not tile:
                    continue
                text = orjson.dumps(tile)[1:-1].replace(b"},{", b"},\n  {")
                text = text if body.text_bytes == 0 else b",\n  " + text
                fh.write(text)
                body.text_bytes += len(text)
    with dest.open("wb") as out:
        out.write(gzip.compress(first_bytes, compresslevel=1))
        with body.path.open("rb") as src:
            shutil.copyfileobj(src, out, 16 << 20)
        out.write(gzip.compress(last_bytes, compresslevel=1))
    if shared is None:
        body.path.unlink()
    return copies, len(first_bytes) + body.text_bytes + len(last_bytes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", choices=("dlrm8", "a100"), default="dlrm8")
    ap.add_argument("--mb", type=float, default=None, help="uncompressed MB per rank")
    ap.add_argument("--ranks", type=int, default=8, help="a100 set: number of ranks")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--traces", type=Path, default=TRACES, help="the shared traces folder")
    args = ap.parse_args()
    if not args.traces.is_dir():
        raise SystemExit(f"{args.traces}: no such folder (pass --traces)")
    if args.set == "dlrm8":
        mb = args.mb or 45.0
        out = args.out or REPO / "bench" / "data" / "large8"
        docs = [(None, _load(src)) for src in sorted((args.traces / DLRM).glob("worker*.json"))]
    else:
        mb = args.mb or 31.0
        out = args.out or REPO / "bench" / "data" / f"a100_{args.ranks}x{mb:g}"
        docs = []
        for r in range(args.ranks):
            doc = _load(args.traces / A100)
            doc["distributedInfo"] = {**doc["distributedInfo"], "rank": r,
                                      "world_size": args.ranks}
            docs.append((r, doc))
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        # a100 ranks share their events (only distributedInfo differs): compress them once.
        body = EventsMember(Path(tmp) / "events.gz") if args.set == "a100" else None
        for _, doc in docs:
            rank = doc["distributedInfo"]["rank"]
            dest = out / f"rank{rank}.pt.trace.json.gz"
            copies, n = write_tiled(doc, mb, dest, body)
            print(f"{dest}: {copies} steps, {n / 1e6:.1f} MB uncompressed", flush=True)


if __name__ == "__main__":
    main()
