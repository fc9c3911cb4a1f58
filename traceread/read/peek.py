"""What one trace file says about where it belongs: rank, job shape, cycle, steps, start time.

Two levels: :func:`name_facts` reads only the path (rank, ``cycle{C}``, the
``tensorboard_trace_handler`` timestamp, the collected RUN folder); :func:`peek` adds what the file
itself says — ``distributedInfo`` rank / world size / backend, ``ProfilerStep#N`` numbers and host
durations, the first step's epoch time (``baseTimeNanoseconds`` + ``ts``) and start-up events
(analysis.warmup) — with a light decode that keeps no tables. Used by :mod:`traceread.read.cycles`.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from traceread.errors import TraceFileError
from traceread.read.discover import NOT_A_TRACE
from traceread.read.jsonfile import read_json_value
from traceread.read.ranks import rank_from_name
from traceread.read.warmup import NOT_STARTUP_CATS

_CYCLE_RE = re.compile(r"(?<![a-z])cycle[-_]?(\d+)", re.IGNORECASE)
#: ``tensorboard_trace_handler``: ``{worker}.{time}.pt.trace.json`` (time in ms, or ns in newer torch).
_STAMP_RE = re.compile(r"\.(\d{10}|\d{13}|\d{16}|\d{19})\.pt\.trace\.json")
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")


@dataclass
class FileFacts:
    """What one file says about where it belongs (None: unknown)."""

    path: Path
    rank: int | None = None
    world_size: int | None = None
    backend: str | None = None
    run_dir: str | None = None  # the collected RUN folder holding it (run.json)
    cycle_hint: int | None = None  # cycle{C} in its name or folder
    name_time_ns: int | None = None  # tensorboard_trace_handler timestamp in the name
    start_ns: int | None = None  # epoch ns of its first recorded step (or first event)
    steps: dict[int, float] = field(default_factory=dict)  # step -> host duration µs
    warm_names: dict[str, float] = field(default_factory=dict)  # start-up event name -> total µs
    peeked: bool = False
    unreadable: str | None = None  # why the peek could not decode it (one line)
    device: str | None = None  # deviceProperties names, sorted and joined (the GPU model the job ran on)
    distributed: bool | None = None  # distributedInfo present (torch.distributed was initialised)
    end_ns: int | None = None  # epoch ns of its last recorded event
    sketch: tuple[int, ...] = ()  # bottom-k hashes of its kernel (else operator) names: which model ran

    @property
    def time_ns(self) -> int | None:
        return self.start_ns if self.start_ns is not None else self.name_time_ns


def _stamp_ns(name: str) -> int | None:
    m = _STAMP_RE.search(name)
    if not m:
        return None
    digits = m.group(1)
    return int(digits) * 10 ** (19 - len(digits))


def _cycle_hint(path: Path) -> int | None:
    for part in (path.name, path.parent.name):
        m = _CYCLE_RE.search(part)
        if m:
            return int(m.group(1))
    return None


def _run_dir(path: Path) -> str | None:
    """The collected RUN folder holding ``path``: the nearest folder with a ``run.json``, or its parent
    in the per-host layout (``RUN/<host>/run.json`` beside ``RUN/run.json``, or saying so itself)."""
    for parent in list(path.parents)[:4]:
        if (parent / "run.json").is_file():
            if (parent.parent / "run.json").is_file() or _per_host(parent / "run.json"):
                return str(parent.parent)
            return str(parent)
    return None


@functools.lru_cache(maxsize=256)
def _per_host(run_json: Path) -> bool:
    try:
        doc = read_json_value(run_json)
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("layout") == "per-host"


def name_facts(path: Path) -> FileFacts:
    """Facts from the path alone (no reading)."""
    return FileFacts(path=path, rank=rank_from_name(path), run_dir=_run_dir(path), cycle_hint=_cycle_hint(path),
                     name_time_ns=_stamp_ns(path.name))


def _top_value(top: dict[str, msgspec.Raw], key: str) -> Any:
    """One top-level value of the document, decoded (None when absent or not JSON)."""
    raw = top.get(key)
    if raw is None:
        return None
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None


#: Peeks already made in this process, by (path, size, mtime): ``--cycle all`` chooses files once
#: per cycle and must not decode every file each time. Small (a few numbers and names per file).
_PEEKED: dict[tuple[str, int, int], dict[str, Any]] = {}
_PEEK_FIELDS = ("rank", "world_size", "backend", "start_ns", "steps", "warm_names", "unreadable", "device",
                "distributed", "end_ns", "sketch")
#: Hashes kept per file to compare the models two files ran (a bottom-k sketch of the name set).
SKETCH_K = 64


def _name_hash(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode("utf-8", "replace"), digest_size=8).digest(), "big")


def sketch_similarity(a: tuple[int, ...], b: tuple[int, ...]) -> float | None:
    """Estimated Jaccard similarity of the name sets two bottom-k sketches stand for (None: unknown)."""
    if not a or not b:
        return None
    union = sorted(set(a) | set(b))[:SKETCH_K]
    both = set(a) & set(b)
    return sum(1 for h in union if h in both) / len(union)


def peek(facts: FileFacts) -> FileFacts:
    """Add what the file's header and step/start-up events say; a file that cannot be decoded is
    left as it is (the real read reports it in one line)."""
    try:
        st = facts.path.stat()
        key = (str(facts.path.resolve()), st.st_size, st.st_mtime_ns)
    except OSError:
        key = None
    if key is not None and key in _PEEKED:
        for name, value in _PEEKED[key].items():
            setattr(facts, name, dict(value) if isinstance(value, dict) else value)
        facts.peeked = True
        return facts
    _peek_file(facts)
    if key is not None:
        if len(_PEEKED) > 100_000:
            _PEEKED.clear()
        _PEEKED[key] = {name: getattr(facts, name) for name in _PEEK_FIELDS}
    return facts


def _scan(batch: list[Any], steps: dict[int, float], warm: dict[str, float], first_ts: float | None,
          warmup_event: Any, names: dict[str, set[str]], span: list[float]) -> float | None:
    """One batch of events into the peek: ProfilerStep durations, warm-up event names, first step
    start (returned), kernel and operator names (``names``), first and last event time (``span``)."""
    for e in batch:
        name = e.name
        if not isinstance(name, str) or e.ph != "X" or not isinstance(e.ts, (int, float)):
            continue
        dur = float(e.dur) if isinstance(e.dur, (int, float)) else 0.0
        if e.cat in ("kernel", "Kernel"):
            names["kernel"].add(name)
        elif e.cat in ("cpu_op", "Operator"):
            names["op"].add(name)
        span[0] = min(span[0], float(e.ts))
        span[1] = max(span[1], float(e.ts) + dur)
        m = _STEP_RE.match(name) if name.startswith("ProfilerStep#") else None
        if m and e.cat != "gpu_user_annotation":
            step = int(m.group(1))
            steps[step] = max(steps.get(step, 0.0), dur)
            first_ts = e.ts if first_ts is None else min(first_ts, e.ts)
        elif e.cat not in NOT_STARTUP_CATS and warmup_event(name):
            warm[name] = warm.get(name, 0.0) + dur
    return first_ts


def _peek_file(facts: FileFacts) -> None:
    from traceread.read.inflate import uncompressed_chunks
    from traceread.read.stream import EventStream
    from traceread.read.warmup import warmup_event

    facts.peeked = True
    # The reader's own bounded stream: a peek holds one batch of events, never the whole file,
    # and meets the same guards (--max-rank-bytes, bombs) as the full read.
    stream = EventStream(facts.path, uncompressed_chunks(facts.path), bytearray())
    steps: dict[int, float] = {}
    warm: dict[str, float] = {}
    first_ts: float | None = None
    names: dict[str, set[str]] = {"kernel": set(), "op": set()}
    span = [float("inf"), float("-inf")]
    try:
        for batch in stream:
            first_ts = _scan(batch, steps, warm, first_ts, warmup_event, names, span)
    except TraceFileError as exc:
        facts.unreadable = exc.message
        return
    except Exception as exc:  # any decode problem: one line, the file is left out
        facts.unreadable = f"cannot read trace: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return
    if "traceEvents" not in stream.top:
        facts.unreadable = f"{NOT_A_TRACE}: no traceEvents"
        return
    other = _top_value(stream.top, "otherData")
    if isinstance(other, dict) and str(other.get("generator") or "").startswith("traceread"):
        facts.unreadable = f"{NOT_A_TRACE}: a timeline written by traceread export (every rank merged)"
        return
    dist_v = _top_value(stream.top, "distributedInfo")
    dist = dist_v if isinstance(dist_v, dict) else {}
    facts.distributed = isinstance(dist_v, dict)
    props = _top_value(stream.top, "deviceProperties")
    gpus = sorted({str(p.get("name")).strip() for p in props if isinstance(p, dict) and str(p.get("name") or "").strip()}) \
        if isinstance(props, list) else []
    facts.device = ", ".join(gpus) or None
    which = names["kernel"] or names["op"]
    facts.sketch = tuple(sorted(_name_hash(n) for n in which)[:SKETCH_K])
    for key, attr in (("rank", "rank"), ("world_size", "world_size")):
        v = dist.get(key)
        if isinstance(v, int) and not isinstance(v, bool):
            setattr(facts, attr, v)
    if isinstance(dist.get("backend"), str):
        facts.backend = dist["backend"]
    base_v = _top_value(stream.top, "baseTimeNanoseconds")
    base = base_v if isinstance(base_v, int) and not isinstance(base_v, bool) else None
    facts.steps.update(steps)
    facts.warm_names.update(warm)
    if first_ts is not None:
        if base is not None:
            facts.start_ns = base + int(first_ts * 1000)
        elif first_ts > 1e15:  # old traces: ts is epoch µs
            facts.start_ns = int(first_ts * 1000)
    if span[1] > span[0]:
        if base is not None:
            facts.end_ns = base + int(span[1] * 1000)
        elif span[1] > 1e15:
            facts.end_ns = int(span[1] * 1000)
        if facts.start_ns is None:  # no steps: the first event starts the window
            facts.start_ns = (base + int(span[0] * 1000)) if base is not None else \
                (int(span[0] * 1000) if span[0] > 1e15 else None)
