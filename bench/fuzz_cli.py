"""Fuzz the CLI with damaged and hostile inputs; count what must never happen.

Every real trace in ``../shared/traces`` (when present) and ``sample_traces/`` is mutated —
truncation, byte flips (JSON text and gzip stream), deleted/renamed keys, values of the wrong type,
NaN/Infinity/huge numbers, negative durations, strings for numbers, duplicated ranks, empty and
non-UTF-8 files, deep nesting, gzip and whitespace bombs, symlink loops, folders named ``*.json``,
terminal/HTML injection payloads in every string, lone UTF-16 surrogates, damaged NCCL logs and
damaged hang evidence, hostile run folders (``run_folder``: impossible world sizes, 100k-deep
``run.json``/``hang.json``/error files, fields of the wrong shape, FIFOs and folders under the names
the analyses read, an export saved into the folder, a rank outside the world size) and single-bit
flips in a filled cache (``cache_flip``: the document, the rank summaries, the parse-cache tables,
their metadata and checksums) — and run through ``traceread report`` (json, text, rich, html),
``hang``, ``diff`` and ``export`` (when the installed CLI has it), in-process through the CLI entry
point, in a worker process that is recycled.

Counted per case, all of which must be 0:

* ``traceback``  — an exception escaped the CLI (or "Traceback" was printed);
* ``hang``       — the case ran past ``--timeout`` seconds (the worker is killed and replaced);
* ``bad_exit``   — an exit code other than 0 (ok), 2 (bad input), 3 (nothing usable);
* ``memory``     — the worker's peak RSS went over ``--max-rss-mb``;
* ``unsafe``     — terminal/text output carried a control character, an escape sequence or a bidi
  override, or HTML output carried an unescaped ``<img`` payload;
* ``multiline_error`` — an exit-2/3 error message was not one line;
* ``silently_wrong`` — a ``cache_flip`` case exited 0 with a document that differs from the one
  computed without the cache (a damaged cache may cost time, never change the answer).

Usage::

    python bench/fuzz_cli.py --cases 10000            # the benchmark (README "Reliability")
    python bench/fuzz_cli.py --cases 200 --seed 7     # a quick run
    python bench/fuzz_cli.py --replay 1234 --keep /tmp/case  # rebuild and rerun one case
    python bench/fuzz_cli.py --kinds cache_flip,run_folder --cases 600   # only these kinds

Traces are cut to their first ``--max-events`` events (default 1000) so a case takes ~0.1 s; the
mutations, not the size, are what is being tested (size has its own benchmarks).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gzip
import hashlib
import io
import json
import math
import multiprocessing as mp
import os
import random
import re
import resource
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "sample_traces"
HANG_RUN = SAMPLES / "cpu_hang_gloo"
#: Collected runs whose cache the ``cache_flip`` cases damage (small: a flip in the tables re-reads one rank).
CACHE_RUNS = (SAMPLES / "cpu_ddp_gloo", SAMPLES / "h100_ddp_gloo_2proc_1gpu")
NCCL_LOG_LINES = [
    "h-1:101:201 [0] NCCL INFO NCCL version 2.21.5+cuda12.4",
    "h-1:101:201 [0] NCCL INFO comm 0x55 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 1a000 commId 0xabc - Init START",
    "h-1:101:201 [0] NCCL INFO Channel 00/02 :    0   1",
    "h-1:101:201 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via NET/Socket/0",
    "h-1:101:201 [0] NCCL INFO Init timings - ncclCommInitRank: rank 0 nranks 2 total 41.20 (kernels 0.30, "
    "alloc 0.01, bootstrap 39.50, allgathers 0.02, topo 0.80, graphs 0.10, connections 0.40, rest 0.07)",
    "h-2:102:202 [1] misc/socket.cc:483 NCCL WARN socketStartConnect: Connect to 10.0.0.2<45763> failed : abort",
    "[rank0]:[E1206 18:44:12.715 ProcessGroupNCCL.cpp:607] [Rank 0] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=7753, OpType=ALLREDUCE, NumelIn=5, NumelOut=5, Timeout(ms)=600000) ran for "
    "600061 milliseconds before timing out.",
]


def payload(tag: str) -> str:
    """A string that clears the screen, retitles the window, plants a hyperlink, starts a C1 CSI,
    reverses text and carries HTML and rich markup — all of which must arrive inert."""
    return (f"{tag}\x1b[2J\x1b]0;pwned\x07\x1b]8;;http://evil.example/\x1b\\link\x1b]8;;\x1b\\\x9b31m\x1bc"
            f"\u202e<img src=x onerror=alert(1)>[bold red]{tag}[/bold red]\r\x08")


#: Anything a terminal could interpret: C0 but newline/tab, DEL, C1, bidi controls.
UNSAFE_TEXT = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
UNSAFE_HTML = re.compile(r"<img src=x|<script>alert")


# ----------------------------------------------------------------------------------------- sources


@dataclass
class Source:
    """One real trace, cut to ``max_events`` events, as a document and as pristine bytes."""

    name: str
    doc: dict[str, Any]
    text: bytes
    pristine: Path | None = None  # a clean copy on disk (the A side of diff cases)


def shared_traces() -> Path | None:
    for cand in (os.environ.get("TRACEREAD_SHARED_DIR"), REPO.parent / "shared"):
        if cand and (Path(cand) / "traces").is_dir():
            return Path(cand) / "traces"
    return None


def trace_files(include_shared: bool = True) -> list[Path]:
    files = sorted(SAMPLES.rglob("*.pt.trace.json.gz"))
    shared = shared_traces() if include_shared else None
    if shared is not None:
        files += sorted(p for p in shared.rglob("*") if p.is_file() and p.name.endswith((".json", ".json.gz")))
    return files


def _cut(f: Path, max_events: int) -> bytes | None:
    """The trace cut to its first ``max_events`` events, cached: parsing the 60 MB traces takes a minute."""
    st = f.stat()
    key = hashlib.sha1(f"{f.resolve()}|{st.st_size}|{st.st_mtime_ns}|{max_events}".encode()).hexdigest()
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "traceread-fuzz" / f"{key}.json"
    if cache.is_file():
        return cache.read_bytes() or None
    try:
        data = f.read_bytes()
        data = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
        doc = orjson.loads(data)
        ok = isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list)
    except (OSError, ValueError, EOFError):
        ok = False
    out = b""
    if ok:
        doc["traceEvents"] = doc["traceEvents"][:max_events]
        out = orjson.dumps(doc)
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_bytes(out)
    return out or None


def load_sources(files: list[Path], max_events: int) -> list[Source]:
    out = []
    for f in files:
        text = _cut(f, max_events)
        if text is not None:
            out.append(Source(str(f.relative_to(f.parents[1])), orjson.loads(text), text))
    return out


# --------------------------------------------------------------------------------------- mutations

NUMERIC_KEYS = ("ts", "dur", "pid", "tid", "id")
WEIRD_NUMBERS = [math.nan, math.inf, -math.inf, 1e308, -1e308, 2**64, -(2**63), 0, -1, 1e-300]


def _events(doc: dict[str, Any]) -> list[Any]:
    ev = doc.get("traceEvents")
    return ev if isinstance(ev, list) and ev else [{}]


def _pick_dicts(rng: random.Random, doc: dict[str, Any], n: int) -> list[dict[str, Any]]:
    ev = [e for e in _events(doc) if isinstance(e, dict)] or [doc]
    return [rng.choice(ev) for _ in range(n)] + ([doc] if rng.random() < 0.2 else [])


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc, allow_nan=True).encode()


def m_truncate(rng: random.Random, s: Source) -> bytes:
    return s.text[: rng.randrange(0, max(1, len(s.text)))]


def m_byteflip(rng: random.Random, s: Source) -> bytes:
    b = bytearray(s.text)
    for _ in range(rng.choice([1, 3, 20, 200])):
        b[rng.randrange(len(b))] = rng.randrange(256)
    return bytes(b)


def m_delete_key(rng: random.Random, s: Source) -> bytes:
    doc = copy.deepcopy(s.doc)
    for d in _pick_dicts(rng, doc, rng.choice([1, 10, 100])):
        if d:
            d.pop(rng.choice(list(d)), None)
    if rng.random() < 0.2:
        doc.pop(rng.choice(["traceEvents", "deviceProperties", "distributedInfo", "schemaVersion"]), None)
    return _dumps(doc)


def m_rename_key(rng: random.Random, s: Source) -> bytes:
    doc = copy.deepcopy(s.doc)
    for d in _pick_dicts(rng, doc, rng.choice([1, 10, 100])):
        if d:
            k = rng.choice(list(d))
            d[k.upper() + "_"] = d.pop(k)
    return _dumps(doc)


def _other_type(rng: random.Random, v: Any) -> Any:
    choices = [None, True, "x", "", 7, -3.5, [], [1, "a"], {}, {"a": {"b": []}}]
    return rng.choice([c for c in choices if type(c) is not type(v)])


def m_wrong_type(rng: random.Random, s: Source) -> bytes:
    doc = copy.deepcopy(s.doc)
    for d in _pick_dicts(rng, doc, rng.choice([1, 10, 100])):
        if d:
            k = rng.choice(list(d))
            d[k] = _other_type(rng, d[k])
    if rng.random() < 0.1:
        doc["traceEvents"] = _other_type(rng, doc["traceEvents"])
    return _dumps(doc)


def m_weird_numbers(rng: random.Random, s: Source) -> bytes:
    doc = copy.deepcopy(s.doc)
    for d in _pick_dicts(rng, doc, rng.choice([1, 10, 100])):
        d[rng.choice(NUMERIC_KEYS)] = rng.choice(WEIRD_NUMBERS)
        if isinstance(d.get("args"), dict) and d["args"]:
            d["args"][rng.choice(list(d["args"]))] = rng.choice(WEIRD_NUMBERS)
    return _dumps(doc)


def m_negative_durations(rng: random.Random, s: Source) -> bytes:
    doc = copy.deepcopy(s.doc)
    for d in _pick_dicts(rng, doc, rng.choice([1, 50, 5000])):
        if isinstance(d.get("dur"), (int, float)):
            d["dur"] = -abs(d["dur"]) - 1
    return _dumps(doc)


def m_strings_for_numbers(rng: random.Random, s: Source) -> bytes:
    doc = copy.deepcopy(s.doc)
    for d in _pick_dicts(rng, doc, rng.choice([1, 50, 5000])):
        for k in NUMERIC_KEYS:
            if isinstance(d.get(k), (int, float)):
                d[k] = rng.choice([str(d[k]), f"{d[k]}us", "1,5", ""])
    return _dumps(doc)


def m_non_utf8(rng: random.Random, s: Source) -> bytes:
    b = bytearray(s.text)
    for _ in range(rng.choice([1, 10])):
        i = b.find(b'"name": "', rng.randrange(len(b)))
        if i >= 0:
            b[i + 9:i + 9] = rng.choice([b"\xff\xfe", b"\xc3\x28", b"\xed\xa0\x80", b"\x80"])
    return bytes(b) if rng.random() < 0.8 else s.text.decode("utf-8", "replace").encode("utf-16")


def m_deep_nesting(rng: random.Random, s: Source) -> bytes:
    depth = rng.choice([1000, 100_000])
    nest = b"[" * depth + b"]" * depth if rng.random() < 0.5 else b'{"a":' * depth + b"1" + b"}" * depth
    return s.text.replace(b'"traceEvents": [', b'"traceEvents": [{"name": "deep", "args": ' + nest + b"}, ", 1)


def m_inject(rng: random.Random, s: Source) -> bytes:
    """Every string value of the trace (names, args: pg desc, shapes, thread names) gets a payload."""
    doc = copy.deepcopy(s.doc)
    budget = [rng.choice([5, 200, 100_000])]

    def walk(o: Any, key: str = "") -> Any:
        if isinstance(o, dict):
            return {k: walk(v, k) for k, v in o.items()}
        if isinstance(o, list):
            return [walk(v, key) for v in o]
        if isinstance(o, str) and budget[0] > 0:
            budget[0] -= 1
            return o + payload(key[:12] or "v")
        return o

    return _dumps(walk(doc))


def m_lone_surrogate(rng: random.Random, s: Source) -> bytes:
    """Lone UTF-16 surrogates in names, as Python's own ``json`` writes them (``\\ud800``)."""
    doc = copy.deepcopy(s.doc)
    for d in _pick_dicts(rng, doc, rng.choice([1, 10, 100])):
        if isinstance(d.get("name"), str):
            d["name"] += rng.choice(["\ud800", "\udfff", "\udbff\udbff", "x\udc00y"])
    return json.dumps(doc, allow_nan=True, ensure_ascii=True).encode()


def m_empty(rng: random.Random, s: Source) -> bytes:
    return rng.choice([b"", b" ", b"{}", b"[]", b"null", b'{"traceEvents": []}', b'{"traceEvents": null}'])


MUTATIONS: dict[str, Callable[[random.Random, Source], bytes]] = {
    "truncate": m_truncate, "byteflip": m_byteflip, "delete_key": m_delete_key, "rename_key": m_rename_key,
    "wrong_type": m_wrong_type, "weird_numbers": m_weird_numbers, "negative_durations": m_negative_durations,
    "strings_for_numbers": m_strings_for_numbers, "non_utf8": m_non_utf8, "deep_nesting": m_deep_nesting,
    "inject": m_inject, "lone_surrogate": m_lone_surrogate, "empty": m_empty,
}


@dataclass
class Case:
    """A folder of files and the CLI arguments to run on it."""

    index: int
    kind: str
    source: str
    argv: list[str]
    check_html: Path | None = None
    text_output: bool = True
    notes: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # set while the case runs (the cache it uses)
    truth: dict[str, Any] | None = None  # cache_flip: the document computed without the cache
    mutations: int = 0  # run_folder: how many mutations were applied


def _write_trace(path: Path, data: bytes, rng: random.Random, gz_flip: bool = False) -> Path:
    if rng.random() < 0.5:
        gz = bytearray(gzip.compress(data, compresslevel=1))
        if gz_flip:
            for _ in range(rng.choice([1, 5])):
                gz[rng.randrange(10, max(11, len(gz)))] = rng.randrange(256)
        path = path.with_name(path.name + ".gz")
        path.write_bytes(bytes(gz))
    else:
        path.write_bytes(data)
    return path


SPECIALS = ("gzip_bomb", "whitespace_bomb", "symlink_loop", "folder_named_json", "dup_ranks", "hostile_names",
            "nccl_log", "hang_evidence", "missing_path", "run_folder", "cache_flip", "fr_dumps")
ALL_KINDS = tuple(MUTATIONS) + SPECIALS


@dataclass
class CacheRun:
    """A collected run, its document without the cache, and a cache filled by a report of it."""

    run: Path
    truth: dict[str, Any]
    cache: Path


def build_case(index: int, seed: int, sources: list[Source], root: Path, bombs: dict[str, Path],
               commands: list[str], kinds: tuple[str, ...] = ALL_KINDS,
               cache_runs: list[CacheRun] | None = None) -> Case:
    """Case ``index``: deterministic from (seed, index); files under ``root`` (an empty folder)."""
    rng = random.Random(seed * 1_000_003 + index)
    kind = kinds[index % len(kinds)]  # every (kind, source) pair within the first kinds x sources cases
    src = sources[(index // len(kinds)) % len(sources)]
    if kind == "cache_flip":
        return _cache_flip_case(index, rng, root, cache_runs or [])
    run = root / "run"
    run.mkdir()
    target: Path = run
    if kind in MUTATIONS:
        data = MUTATIONS[kind](rng, src)
        f = _write_trace(run / "rank0.pt.trace.json", data, rng, gz_flip=kind == "byteflip")
        target = f if rng.random() < 0.5 else run
    elif kind in ("gzip_bomb", "whitespace_bomb"):
        big = rng.random() < 0.01 and f"{kind}_big" in bombs  # the 3 MB -> GBs bomb, now and then
        (run / "rank0.pt.trace.json.gz").symlink_to(bombs[f"{kind}_big" if big else kind])
    elif kind == "symlink_loop":
        (run / "loop").symlink_to(run)
        (run / "sub").mkdir()
        (run / "sub" / "up").symlink_to(run)
        (run / "a.pt.trace.json").symlink_to(run / "b.pt.trace.json")
        (run / "b.pt.trace.json").symlink_to(run / "a.pt.trace.json")
        (run / "dangling.pt.trace.json.gz").symlink_to(run / "nowhere")
        (run / "rank0.pt.trace.json").write_bytes(src.text)
    elif kind == "folder_named_json":
        (run / "rank0.pt.trace.json").mkdir()
        (run / "rank1.pt.trace.json.gz").mkdir()
        (run / "rank1.pt.trace.json.gz" / "x.json").write_bytes(b"{}")
        target = run / rng.choice(["rank0.pt.trace.json", "rank1.pt.trace.json.gz", "."])
    elif kind == "dup_ranks":
        for i in range(rng.choice([2, 3])):
            (run / f"rank{i}.pt.trace.json").write_bytes(src.text)
    elif kind == "hostile_names":
        name = payload("file").replace("/", "_")
        (run / f"rank0{name}.pt.trace.json").write_bytes(m_inject(rng, src))
        (run / f"bad{name}.pt.trace.json").write_bytes(b'{"traceEvents": [')
        (run / f"nccl{name}.log").write_text("\n".join(_nccl_lines(rng, hostile=True)))
    elif kind == "nccl_log":
        (run / "train.log").write_bytes(_mutate_lines(rng, _nccl_lines(rng, hostile=rng.random() < 0.3)))
        if rng.random() < 0.3:
            (run / "rank0.pt.trace.json").write_bytes(src.text)
        target = run / "train.log" if rng.random() < 0.3 else run
    elif kind == "hang_evidence":
        shutil.copytree(HANG_RUN, run, dirs_exist_ok=True, symlinks=True)
        _mutate_hang_run(rng, run)
    elif kind == "missing_path":
        target = run / "does-not-exist" / "rank0.pt.trace.json"
    applied = 0
    if kind == "run_folder":
        shutil.copytree(HANG_RUN, run, dirs_exist_ok=True, symlinks=True)
        applied = _mutate_run_folder(rng, run, src)
    elif kind == "fr_dumps":
        target = _fr_dumps_case(rng, run)
    cmd = rng.choice(commands)
    case = Case(index, kind, src.name, [], mutations=applied)
    if cmd == "hang" or (kind in ("hang_evidence", "fr_dumps") and rng.random() < 0.5):
        case.argv = ["hang", str(target if target.is_dir() or kind == "fr_dumps" else run), "--format",
                     rng.choice(["text", "json"])]
        case.text_output = "json" not in case.argv
    elif cmd == "diff":
        other = src.pristine if src.pristine is not None else target
        a, b = (other, target) if rng.random() < 0.5 else (target, other)
        fmt = rng.choice(["text", "json"])
        case.argv = ["diff", str(a), str(b), "--format", fmt, "--no-cache"]
        case.text_output = fmt == "text"
    elif cmd == "export":
        out = root / "export-out"
        case.argv = ["export", str(target), "-o", str(out)]
        case.text_output = True
    else:
        fmt = cmd.split("-", 1)[1]
        case.argv = ["report", str(target), "--no-cache", "-j", "1", "--format", fmt]
        if fmt == "html":
            case.check_html = root / "out.html"
            case.argv += ["-o", str(case.check_html)]
        elif fmt == "rich":
            case.argv += ["--no-html"]
        case.text_output = fmt != "json"
    return case


def _nccl_lines(rng: random.Random, hostile: bool) -> list[str]:
    lines = list(NCCL_LOG_LINES)
    if hostile:
        p = payload("nccl").replace(":", ";")
        lines = [line.replace("h-1", "evil\x1bc" + "host").replace("abort", p) for line in lines]
        lines.append(f"h-1:101:201 [0] NCCL WARN {p} Cuda failure {p}")
    return lines


def _mutate_lines(rng: random.Random, lines: list[str]) -> bytes:
    text = "\n".join(lines * rng.choice([1, 50])).encode()
    b = bytearray(text)
    for _ in range(rng.choice([0, 1, 30])):
        b[rng.randrange(len(b))] = rng.randrange(256)
    if rng.random() < 0.2:
        b += b"x" * rng.choice([10_000, 3_000_000])  # one huge line
    return bytes(b)


FR_FIXTURES = REPO / "tests" / "data" / "fr"


def _fr_dump_files(folder: Path) -> list[tuple[int, Path]]:
    """(rank, file) of every Flight Recorder dump in a fixture run, by the rank in its name."""
    out = []
    for p in sorted(folder.rglob("*")):
        m = re.search(r"(\d+)(?:\.\w+)?$", p.name)
        if p.is_file() and m and "stacks" not in p.parts and p.suffix in ("", ".pkl", ".json") and p.name != "truth.json":
            out.append((int(m.group(1)), p))
    return out


def _fr_mutate(rng: random.Random, data: bytes) -> bytes:
    """One hostile change to a dump: cut, flipped bytes, weird numbers, nesting, a shared-reference bomb."""
    import pickle

    how = rng.choice(["truncate", "flip", "numbers", "nesting", "laughs", "types", "empty", "gzip"])
    if how == "truncate":
        return data[: rng.randrange(max(1, len(data)))]
    if how == "flip":
        b = bytearray(data or b" ")
        for _ in range(rng.choice([1, 8, 64])):
            b[rng.randrange(len(b))] = rng.randrange(256)
        return bytes(b)
    if how == "empty":
        return b""
    if how == "gzip":
        return gzip.compress(data, mtime=0)
    try:  # our own fixtures: the test data of this repository
        doc = pickle.loads(data) if data[:1] == b"\x80" else json.loads(data)
    except Exception:  # a fixture that does not parse stays as it is
        return data
    entries = doc.get("entries") or [{}]
    e = rng.choice(entries) if isinstance(entries, list) and entries else {}
    if how == "numbers":
        for key in ("record_id", "collective_seq_id", "p2p_seq_id", "pg_id", "time_created_ns"):
            e[key] = rng.choice(WEIRD_NUMBERS + ["7", None, [1], {"x": 1}])
        for st in (doc.get("pg_status") or {}).values():
            st["last_enqueued_collective"] = rng.choice(WEIRD_NUMBERS + ["x", None])
    elif how == "nesting":
        deep: Any = []
        for _ in range(rng.choice([100, 5000])):
            deep = [deep]
        e["input_sizes"] = deep
        doc["pg_config"] = {"0": {"name": "0", "desc": deep, "ranks": deep}}
    elif how == "laughs":  # shared references: tiny as a pickle; JSON cannot share, so it gets a smaller tree
        pickled = data[:1] == b"\x80"
        x: Any = [1]
        for _ in range(rng.choice([20, 40]) if pickled else 14):
            x = [x, x]
        e["input_sizes"] = x
        if pickled:
            e["frames"] = [{"name": x, "filename": x, "line": x}] * 100
    else:
        for key in ("process_group", "profiling_name", "state", "frames", "entries", "pg_status"):
            target = doc if key in ("entries", "pg_status") else e
            if rng.random() < 0.3:
                target[key] = _other_type(rng, target.get(key))
        e["profiling_name"] = payload("nccl") if rng.random() < 0.5 else e.get("profiling_name")
    try:
        if data[:1] == b"\x80":
            return pickle.dumps(doc, protocol=2)
        return json.dumps(doc, allow_nan=True).encode()
    except (RecursionError, TypeError, ValueError):
        return data


def _fr_dumps_case(rng: random.Random, run: Path) -> Path:
    """A fixture run's dumps laid out anew (flat, RUN/fr, nested, deep, renamed, one file, torch prefixes),
    some of them damaged; what ``hang`` (or ``report``) is pointed at."""
    folders = sorted(p for p in FR_FIXTURES.iterdir() if p.is_dir())
    src = rng.choice(folders)
    layout = rng.choice(["flat", "fr", "nested", "deep", "renamed", "torch_prefix", "one_file"])
    placed: list[Path] = []
    for rank, f in _fr_dump_files(src):
        ext = f.suffix
        name = {"flat": f"rank{rank}{ext}", "fr": f"fr/rank{rank}{ext}", "nested": f"node{rank % 2}/fr/rank{rank}{ext}",
                "deep": f"a/b/c/d/host{rank}_rank{rank}{ext}", "renamed": f"dump-{rng.randrange(10**6)}_rank{rank}.bin",
                "torch_prefix": f"_dump_{rank}" if ext != ".json" else f"_dump_{rank}.json",
                "one_file": f"only/{f.name}"}[layout]
        dest = run / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        data = f.read_bytes()
        if rng.random() < 0.3:
            data = _fr_mutate(rng, data)
        dest.write_bytes(data)
        placed.append(dest)
    if rng.random() < 0.3 and (src / "stacks").is_dir():
        shutil.copytree(src / "stacks", run / "stacks", dirs_exist_ok=True)
    if rng.random() < 0.1 and hasattr(os, "mkfifo"):
        (run / "errors").mkdir(exist_ok=True)
        os.mkfifo(run / "errors" / "rank2.json")
        os.mkfifo(run / "fr_fifo_rank9.pkl")
    if layout == "one_file" and placed:
        return rng.choice(placed)
    return run


def _mutate_hang_run(rng: random.Random, run: Path) -> None:
    files = [p for p in sorted(run.rglob("*")) if p.is_file() and p.suffix in (".json", ".txt", ".log", "")]
    for p in rng.sample(files, k=min(len(files), rng.choice([1, 2, 4]))):
        data = p.read_bytes()
        how = rng.choice(["truncate", "flip", "inject", "empty", "wrong_type"])
        if how == "truncate":
            data = data[: rng.randrange(max(1, len(data)))]
        elif how == "flip":
            b = bytearray(data or b" ")
            for _ in range(rng.choice([1, 10])):
                b[rng.randrange(len(b))] = rng.randrange(256)
            data = bytes(b)
        elif how == "inject":
            txt = data.decode("utf-8", "replace")
            if p.suffix == ".json":
                txt = re.sub(r'"((?:[^"\\]|\\.)*)"', lambda m: '"' + m.group(1) + json.dumps(payload("s"))[1:-1] + '"', txt)
            else:
                txt = txt.replace("in ", "in " + payload("frame"))
            data = txt.encode()
        elif how == "empty":
            data = b""
        else:
            try:
                doc = json.loads(data)
                if isinstance(doc, dict) and doc:
                    doc[rng.choice(list(doc))] = _other_type(rng, None)
                data = json.dumps(doc).encode()
            except ValueError:
                data = b"[]"
        p.write_bytes(data)


def _nested(rng: random.Random) -> bytes:
    depth = rng.choice([1000, 100_000])
    return b"[" * depth + b"]" * depth if rng.random() < 0.5 else b'{"a":' * depth + b"1" + b"}" * depth


def _put(path: Path, data: bytes) -> None:
    """Write ``data`` as a regular file at ``path``, whatever an earlier mutation left there (a FIFO would
    block this writer, a folder or a link loop refuse it)."""
    if path.is_symlink() or (path.exists() and not path.is_file()):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def _edit_json(path: Path, fn: Callable[[dict[str, Any]], None]) -> None:
    doc: Any = {}
    if path.is_file() and not path.is_symlink():
        try:
            doc = json.loads(path.read_bytes())
        except (OSError, ValueError, RecursionError):
            doc = {}
    if not isinstance(doc, dict):
        doc = {}
    fn(doc)
    _put(path, json.dumps(doc, allow_nan=True).encode())


def _replace(path: Path, how: str) -> None:
    """``path`` replaced by a FIFO (a reader that opens it plainly blocks forever), a folder, or a symlink loop."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    if how == "fifo":
        os.mkfifo(path)
    elif how == "folder":
        path.mkdir()
        (path / "x.json").write_text("{}")
    else:
        path.symlink_to(path)


IMPOSSIBLE = [10**12, 1e12, -3, 0, "9" * 5000, True, None, [], {"a": 1}, math.inf, math.nan, 2**70]


def _mutate_run_folder(rng: random.Random, run: Path, src: Source) -> int:
    """1-3 of the ways a run folder is damaged or hostile (on a copy of a collected hang); how many."""
    doc = copy.deepcopy(src.doc)
    ways: list[Callable[[], None]] = [
        lambda: _edit_json(run / "run.json", lambda d: d.update(world_size=rng.choice(IMPOSSIBLE))),
        lambda: _edit_json(run / "run.json", lambda d: d.update(world={"world_size": rng.choice(IMPOSSIBLE)})),
        lambda: _edit_json(run / "run.json", lambda d: d.update(ranks=rng.choice(IMPOSSIBLE))),
        lambda: _put(run / rng.choice(["run.json", "hang.json"]), _nested(rng)),
        lambda: _put(run / "errors" / "rank1.json", _nested(rng)),
        lambda: _put(run / "errors" / f"rank{'9' * 30}.json", b"{}"),
        lambda: _edit_json(run / "hang.json", lambda d: d.update(
            last_step_per_rank=rng.choice([[5, 4], {"9" * 40: 3}, {"0": "x", "1": None}, "steps", 7]))),
        lambda: _edit_json(run / "hang.json", lambda d: d.update(
            unanswered_ranks=rng.choice([{"1": 1}, "1", [10**12], [None, "a"], 3]))),
        lambda: _edit_json(run / "hang.json", lambda d: d.update(timeout_s=rng.choice([[1], "5 s", {"a": 1}, math.nan]))),
        lambda: _replace(run / rng.choice(["run.json", "hang.json", "errors/rank2.json"]),
                         rng.choice(["fifo", "folder", "loop"])),
        lambda: _put(run / rng.choice(["timeline.json", "traces/timeline.json"]), json.dumps(
            {"traceEvents": _events(doc)[:50], "displayTimeUnit": "ms",
             "otherData": {"generator": "traceread 0.1.0", "ranks": [0, 1]}}).encode()),
        lambda: _put(run / "traces" / "extra.pt.trace.json", json.dumps(
            {k: v for k, v in doc.items() if k != "distributedInfo"}, allow_nan=True).encode()),
        lambda: _put(run / "traces" / "rank1.pt.trace.json.gz", gzip.compress(m_lone_surrogate(rng, src))),
        lambda: _put(run / "ranks" / "rank0.json", _nested(rng)),
    ]
    picked = rng.sample(ways, k=rng.choice([1, 1, 2, 3]))
    for way in picked:
        way()
    return len(picked)


def _flip_bit(rng: random.Random, path: Path) -> None:
    data = bytearray(path.read_bytes())
    if data:
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(data))


def _cache_flip_case(index: int, rng: random.Random, root: Path, cache_runs: list[CacheRun]) -> Case:
    """One bit flipped in one file of a filled cache, at the layer the report will read first."""
    cr = cache_runs[index % len(cache_runs)]
    cache = root / "cache"
    shutil.copytree(cr.cache, cache)
    layer = rng.choice(["documents", "summaries", "tables"])
    if layer != "documents":  # the layer under test must be the one read
        shutil.rmtree(cache / "documents", ignore_errors=True)
    if layer == "tables":
        shutil.rmtree(cache / "summaries", ignore_errors=True)
    if layer == "tables":
        files = [p for p in cache.glob("*/*") if p.parent.name not in ("documents", "summaries")]
    else:
        files = sorted((cache / layer).glob("*.msgpack"))
    _flip_bit(rng, rng.choice(sorted(files)))
    return Case(index, "cache_flip", f"{cr.run.name}:{layer}", ["report", str(cr.run), "-j", "1", "--format", "json"],
                text_output=False, env={"TRACEREAD_CACHE_DIR": str(cache)}, truth=cr.truth)


def answer(doc: dict[str, Any]) -> str:
    """A report document without its warnings (a damaged cache entry adds one), comparable as text."""
    return json.dumps({k: v for k, v in doc.items() if k != "warnings"}, sort_keys=True, default=str)


def make_cache_runs(folder: Path) -> list[CacheRun]:
    """Each of :data:`CACHE_RUNS`: its document without the cache and a cache filled by one report."""
    out = []
    for run in CACHE_RUNS:
        if not run.is_dir():
            continue
        cache = folder / run.name
        truth = _run_in_process(["report", str(run), "-j", "1", "--format", "json", "--no-cache"])
        filled = _run_in_process(["report", str(run), "-j", "1", "--format", "json"], {"TRACEREAD_CACHE_DIR": str(cache)})
        if truth["code"] != 0 or filled["code"] != 0:
            raise SystemExit(f"cannot prepare the cache of {run}: {truth['stderr'][-300:]}{filled['stderr'][-300:]}")
        out.append(CacheRun(run, json.loads(truth["stdout"]), cache))
    return out


def make_bombs(folder: Path, expand_mb: int, big_mb: int = 0) -> dict[str, Path]:
    """Gzips of ``expand_mb`` MB (and ``big_mb`` MB) of zeros named like a trace, and of a trace padded
    with spaces. Both compress ~1000:1."""
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for kind, head, fill, tail, size in (
            ("gzip_bomb", b"", b"\0", b"", expand_mb),
            ("whitespace_bomb", b'{"traceEvents": [', b" ", b"]}", expand_mb),
            ("gzip_bomb_big", b"", b"\0", b"", big_mb),
            ("whitespace_bomb_big", b'{"traceEvents": [', b" ", b"]}", big_mb)):
        if not size:
            continue
        p = folder / f"{kind}.pt.trace.json.gz"
        if not p.exists():
            chunk = fill * (1 << 20)
            with gzip.open(p, "wb", compresslevel=1) as fh:
                fh.write(head)
                for _ in range(size):
                    fh.write(chunk)
                fh.write(tail)
        out[kind] = p
    return out


# ------------------------------------------------------------------------------------------ worker


def _run_in_process(argv: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """``traceread ARGV`` through the console entry point, stdout/stderr captured, ``env`` set meanwhile."""
    from traceread.cli import main

    out, err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8"), io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    code: Any = 0
    tb = None
    old_argv = sys.argv
    old_env = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    sys.argv = ["traceread", *argv]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # this is what we count
        tb = traceback.format_exc()
        code = None
    finally:
        sys.argv = old_argv
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    res = {}
    for name, stream in (("stdout", out), ("stderr", err)):
        stream.flush()
        res[name] = stream.buffer.getvalue().decode("utf-8", "replace")  # type: ignore[attr-defined]
    res.update(code=code, tb=tb, maxrss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return res


def _worker(conn: Any, cache_dir: str) -> None:
    os.environ["TRACEREAD_CACHE_DIR"] = cache_dir
    os.environ["COLUMNS"] = "160"
    import traceread.cli  # noqa: F401 - import once, before the first case is timed

    conn.send("ready")
    while True:
        job = conn.recv()
        if job is None:
            return
        argv, env = job
        conn.send(_run_in_process(argv, env))


class Worker:
    """A recycled worker process: killed on timeout or memory, replaced after ``recycle`` cases."""

    def __init__(self, cache_dir: str) -> None:
        self.cache_dir = cache_dir
        self.proc: Any = None
        self.done = 0

    def start(self) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        # not a daemon: `report` on several files starts its own process pool
        self.proc = ctx.Process(target=_worker, args=(child, self.cache_dir))
        self.proc.start()
        if not self.conn.poll(120) or self.conn.recv() != "ready":
            raise RuntimeError("fuzz worker did not start")
        self.done = 0

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.is_alive():
                self.proc.kill()
            self.proc.join(5)
            self.proc = None

    def rss_mb(self) -> float:
        try:
            with open(f"/proc/{self.proc.pid}/status") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024
        except (OSError, AttributeError):
            pass
        return 0.0

    def run(self, argv: list[str], timeout: float, kill_rss_mb: float, env: dict[str, str] | None = None) -> dict[str, Any]:
        if self.proc is None:
            self.start()
        self.conn.send((argv, env or {}))
        deadline = time.monotonic() + timeout
        peak = 0.0
        while not self.conn.poll(0.05):
            peak = max(peak, self.rss_mb())
            if peak > kill_rss_mb:
                self.stop()
                return {"code": None, "killed": "memory", "maxrss_mb": peak, "stdout": "", "stderr": "", "tb": None}
            if time.monotonic() > deadline or not self.proc.is_alive():
                why = "timeout" if self.proc.is_alive() else "worker died"
                self.stop()
                return {"code": None, "killed": why, "maxrss_mb": peak, "stdout": "", "stderr": "", "tb": None}
        res = self.conn.recv()
        res["maxrss_mb"] = max(res["maxrss_mb"], peak)
        self.done += 1
        return res


def classify(case: Case, res: dict[str, Any], max_rss_mb: float) -> list[str]:
    """The violations of one case (empty = fine)."""
    bad = []
    if res.get("killed") == "timeout":
        bad.append("hang")
    elif res.get("killed") == "memory":
        bad.append("memory")
    elif res.get("killed"):
        bad.append("traceback")  # the process died under us (segfault, os._exit)
    if res.get("tb") or "Traceback (most recent call last)" in res["stdout"] + res["stderr"]:
        bad.append("traceback")
    if res.get("code") is not None and res["code"] not in (0, 2, 3):
        bad.append("bad_exit")
    if res.get("maxrss_mb", 0) > max_rss_mb and "memory" not in bad:
        bad.append("memory")
    texts = [res["stderr"]] + ([res["stdout"]] if case.text_output else [])
    if any(UNSAFE_TEXT.search(t) for t in texts):
        bad.append("unsafe")
    if case.check_html is not None and case.check_html.is_file():
        if UNSAFE_HTML.search(case.check_html.read_text("utf-8", "replace")):
            bad.append("unsafe")
    if res.get("code") in (2, 3):
        errs = [ln for ln in res["stderr"].splitlines() if ln.strip() and not ln.startswith(("Usage:", "Try "))]
        if len(errs) > 1 and not any(ln.startswith("traceread: error:") for ln in errs[:1]):
            bad.append("multiline_error")
    if case.truth is not None and res.get("code") == 0:
        try:
            same = answer(json.loads(res["stdout"])) == answer(case.truth)
        except ValueError:
            same = False
        if not same:
            bad.append("silently_wrong")
    return bad


def _count(totals: Totals, case: Case, res: dict[str, Any], bad: list[str], dt: float, index: int) -> None:
    totals.cases += 1
    totals.exit_codes[str(res.get("code") if not res.get("killed") else res["killed"])] += 1
    totals.by_kind[case.kind] += 1
    totals.run_folder_mutations += case.mutations
    if case.kind == "cache_flip" and "failed its integrity check" in res.get("stdout", ""):
        totals.cache_flips_detected += 1
    fmt = case.argv[case.argv.index("--format") + 1] if "--format" in case.argv else ""
    totals.by_command[case.argv[0] + ("-" + fmt if case.argv[0] == "report" else "")] += 1
    totals.peak_rss_mb = max(totals.peak_rss_mb, res.get("maxrss_mb", 0.0))
    totals.slowest_s = max(totals.slowest_s, dt)
    for b in set(bad):
        totals.violations[b] += 1
    if bad:
        totals.failures.append({"index": index, "kind": case.kind, "source": case.source, "argv": case.argv,
                                "violations": sorted(set(bad)), "code": res.get("code"), "killed": res.get("killed"),
                                "seconds": round(dt, 2), "tb": (res.get("tb") or "")[-1500:],
                                "stderr": res["stderr"][-600:]})


def has_command(name: str) -> bool:
    from traceread.cli import SUBCOMMANDS

    return name in SUBCOMMANDS


@dataclass
class Totals:
    cases: int = 0
    violations: Counter = field(default_factory=Counter)
    exit_codes: Counter = field(default_factory=Counter)
    by_kind: Counter = field(default_factory=Counter)
    by_command: Counter = field(default_factory=Counter)
    failures: list[dict[str, Any]] = field(default_factory=list)
    peak_rss_mb: float = 0.0
    slowest_s: float = 0.0
    run_folder_mutations: int = 0  # mutations applied over all run_folder cases
    cache_flips_detected: int = 0  # cache_flip cases whose damaged entry was caught by its checksum


def run_fuzz(cases: int, seed: int = 0, *, include_shared: bool = True, max_events: int = 1000,
             timeout: float = 30.0, max_rss_mb: float = 1500.0, bomb_mb: int = 64, big_bomb_mb: int = 0,
             recycle: int = 500, workers: int = 1,
             on_progress: Callable[[Totals, float], None] | None = None,
             only: list[int] | None = None, keep: Path | None = None, progress: bool = False,
             time_budget_s: float | None = None, kinds: tuple[str, ...] = ALL_KINDS) -> Totals:
    """Run ``cases`` cases (or the indices in ``only``) of ``kinds`` and count violations."""
    sources = load_sources(trace_files(include_shared), max_events)
    if not sources:
        raise SystemExit("no source traces found")
    # weights: the cheap renderers often, html/diff (two reports, or a 4 MB page) less
    commands = ["report-json"] * 4 + ["report-text"] * 3 + ["report-rich"] * 2 + ["report-html", "hang", "hang", "diff"]
    if has_command("export"):
        commands.append("export")
    totals = Totals()
    work = Path(tempfile.mkdtemp(prefix="traceread-fuzz-"))
    try:
        pristine = work / "pristine"
        pristine.mkdir()
        for i, s in enumerate(sources):
            s.pristine = pristine / f"{i}" / "rank0.pt.trace.json"
            s.pristine.parent.mkdir()
            s.pristine.write_bytes(s.text)
        bombs = make_bombs(work / "bombs", bomb_mb, big_bomb_mb)
        cache_runs = make_cache_runs(work / "cache-runs") if "cache_flip" in kinds else []
        t_start = time.monotonic()  # the budget is for the cases, not the set-up
        lock = threading.Lock()
        indices = iter(only if only is not None else range(cases))

        def drive(slot: int) -> None:
            worker = Worker(str(work / f"cache{slot}"))
            root = keep if keep is not None else work / f"case{slot}"
            try:
                while time_budget_s is None or time.monotonic() - t_start <= time_budget_s:
                    with lock:
                        index = next(indices, None)
                    if index is None:
                        return
                    if root.exists():
                        shutil.rmtree(root)
                    root.mkdir(parents=True)
                    case = build_case(index, seed, sources, root, bombs, commands, kinds, cache_runs)
                    t0 = time.monotonic()
                    res = worker.run(case.argv, timeout, kill_rss_mb=max(2 * max_rss_mb, 3000.0), env=case.env)
                    dt = time.monotonic() - t0
                    bad = classify(case, res, max_rss_mb)
                    with lock:
                        _count(totals, case, res, bad, dt, index)
                        if progress and totals.cases % 100 == 0:
                            print(f"{totals.cases} cases, {sum(totals.violations.values())} violations, "
                                  f"{time.monotonic() - t_start:.0f} s", file=sys.stderr, flush=True)
                        if on_progress is not None and totals.cases % 500 == 0:
                            on_progress(totals, time.monotonic() - t_start)
                    if bad or worker.done >= recycle:
                        # ru_maxrss only grows, so a case's peak is the worker's peak when it rose during the
                        # case; after a violation the worker is replaced so the next case is measured afresh
                        worker.stop()
            finally:
                worker.stop()

        threads = [threading.Thread(target=drive, args=(k,)) for k in range(max(1, workers))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return totals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-events", type=int, default=1000)
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds per case before it counts as a hang")
    ap.add_argument("--max-rss-mb", type=float, default=1500.0, help="peak RSS bound per case")
    ap.add_argument("--bomb-mb", type=int, default=64, help="decompressed size of the gzip bombs")
    ap.add_argument("--big-bomb-mb", type=int, default=0,
                    help="also a bomb of this size, used by 1%% of the bomb cases (the issue's case: 3000)")
    ap.add_argument("--no-shared", action="store_true", help="only sample_traces/")
    ap.add_argument("--replay", type=int, nargs="*", help="run only these case indices")
    ap.add_argument("--keep", type=Path, help="with --replay: leave the case files here")
    ap.add_argument("--json", type=Path, help="write the counts here")
    ap.add_argument("--workers", type=int, default=1, help="worker processes running cases at once")
    ap.add_argument("--kinds", help=f"comma-separated kinds to run (default all: {', '.join(ALL_KINDS)})")
    args = ap.parse_args()
    kinds = tuple(k.strip() for k in args.kinds.split(",")) if args.kinds else ALL_KINDS
    unknown = set(kinds) - set(ALL_KINDS)
    if unknown:
        ap.error(f"--kinds: unknown {', '.join(sorted(unknown))}")
    t0 = time.monotonic()

    def write(totals: Totals, wall: float) -> dict[str, Any]:
        summary = {
            "cases": totals.cases, "wall_s": round(wall, 1), "seed": args.seed, "workers": args.workers,
            "max_events": args.max_events,
            "violations": {k: totals.violations.get(k, 0) for k in
                           ("traceback", "hang", "bad_exit", "memory", "unsafe", "multiline_error", "silently_wrong")},
            "run_folder_cases": totals.by_kind.get("run_folder", 0),
            "run_folder_mutations": totals.run_folder_mutations,
            "cache_flips": totals.by_kind.get("cache_flip", 0),
            "cache_flips_detected": totals.cache_flips_detected,
            "exit_codes": dict(totals.exit_codes), "by_kind": dict(totals.by_kind),
            "by_command": dict(totals.by_command), "peak_rss_mb": round(totals.peak_rss_mb),
            "slowest_case_s": round(totals.slowest_s, 2), "failures": totals.failures[:50],
        }
        if args.json:
            args.json.write_text(json.dumps(summary, indent=1))
        return summary

    totals = run_fuzz(args.cases, args.seed, include_shared=not args.no_shared, max_events=args.max_events,
                      timeout=args.timeout, max_rss_mb=args.max_rss_mb, bomb_mb=args.bomb_mb,
                      big_bomb_mb=args.big_bomb_mb, workers=args.workers, on_progress=write,
                      only=args.replay, keep=args.keep, progress=True, kinds=kinds)
    summary = write(totals, time.monotonic() - t0)
    print(json.dumps({k: v for k, v in summary.items() if k != "failures"}, indent=1))
    for f in totals.failures[:10]:
        print(json.dumps(f, indent=1), file=sys.stderr)
    sys.exit(1 if sum(totals.violations.values()) else 0)


if __name__ == "__main__":
    main()
