"""``RUN/run.json``: one document describing the collected job, built from the per-rank files.

Ranks write ``ranks/rank{R}.json`` themselves (host, pid, versions, device, clock samples); the launcher
merges them here at the end with the command, exit code, times and options. With per-host layout
(``RUN/<host>/...``) every host's launcher writes ``RUN/<host>/run.json`` and then re-merges all of them
into ``RUN/run.json`` (atomic replace; the last host to finish sees everyone).
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from traceread.read.jsonfile import load_json_object

RUN_JSON_VERSION = 1

# Clock model recorded with every run (see docs/collect.md, "Clocks").
SAME_HOST_CLOCK = ("offsets_us[r] is added to rank r's wall-clock times to express them on rank 0's clock. "
                   "Ranks on rank 0's host share its CLOCK_REALTIME: 0 +- 0. Other hosts: NTP-style "
                   "ping-pong through the job's TCPStore at the first step (best of 4, uncertainty = half "
                   "the round trip); unknown (null) when it could not run. 'measured' lists every rank's "
                   "measurement, same-host ones included (a check: they should be ~0).")


def iso(ns: int) -> str:
    """UTC ISO-8601 with milliseconds, for humans reading run.json."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns / 1e9)) + f".{(ns // 1_000_000) % 1000:03d}Z"


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from ``path``, or None when missing/partial (a rank may die mid-write)."""
    return load_json_object(path, None)


def write_json(path: Path, doc: dict[str, Any]) -> None:
    """Atomic write (temp file + ``os.replace``) so a reader never sees half a file."""
    text = json.dumps(doc, indent=1, sort_keys=False, default=str)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink(missing_ok=True)  # a full disk leaves no empty temp file behind
        except OSError:
            pass
        raise


def read_ranks(host_dir: Path) -> dict[int, dict[str, Any]]:
    """``ranks/rank{R}.json`` under ``host_dir`` keyed by rank; ``steps`` is the larger of the rank
    file's count and ``progress/rank{R}``'s (written at every step: a rank killed by a signal never
    rewrote its rank file, which then still says the step it was last written at)."""
    out: dict[int, dict[str, Any]] = {}
    for path in sorted((host_dir / "ranks").glob("rank*.json")):
        doc = read_json(path)
        if doc is not None and isinstance(doc.get("rank"), int):
            done = read_progress(host_dir / "progress" / f"rank{doc['rank']}")
            if done is not None and (not isinstance(doc.get("steps"), int) or done[0] > doc["steps"]):
                doc["steps"] = done[0]
            out[doc["rank"]] = doc
    return out


def read_progress(path: Path) -> tuple[int, int, int] | None:
    """``(step, time_ns, pid)`` from a progress file, None if unreadable."""
    try:
        parts = path.read_bytes().split()
        return int(parts[0]), int(parts[1]), int(parts[2])
    except (OSError, ValueError, IndexError):
        return None


def world_layout(ranks: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """World size and which global ranks ran on which host (with local rank and pid)."""
    nodes: dict[str, list[dict[str, Any]]] = {}
    for r, info in sorted(ranks.items()):
        nodes.setdefault(str(info.get("host")), []).append(
            {"rank": r, "local_rank": info.get("local_rank"), "pid": info.get("pid")})
    sizes = {info["world_size"] for info in ranks.values() if info.get("world_size")}
    return {"world_size": max(sizes) if sizes else (len(ranks) or None),
            "ranks_seen": sorted(ranks), "nodes": nodes}


def clock_offsets(ranks: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Per-rank offset to rank 0's wall clock in µs (add it to the rank's times) and its uncertainty.

    Same host as rank 0: 0 ± 0 (one CLOCK_REALTIME). Other hosts: the rank's TCPStore ping-pong
    measurement (``clock_sync`` in its rank file) when it ran, else 0 with unknown (None) uncertainty.
    """
    ref = ranks.get(0) or (next(iter(ranks.values())) if ranks else {})
    offsets: dict[str, float] = {}
    unc: dict[str, float | None] = {}
    measured: dict[str, dict[str, float]] = {}
    for r, info in sorted(ranks.items()):
        sync = info.get("clock_sync") or {}
        if "offset_ns" in sync and "uncertainty_ns" in sync:
            measured[str(r)] = {"offset_us": sync["offset_ns"] / 1e3, "uncertainty_us": sync["uncertainty_ns"] / 1e3}
        if info.get("host") == ref.get("host"):
            offsets[str(r)], unc[str(r)] = 0.0, 0.0
        elif str(r) in measured:
            offsets[str(r)], unc[str(r)] = measured[str(r)]["offset_us"], measured[str(r)]["uncertainty_us"]
        else:
            offsets[str(r)], unc[str(r)] = 0.0, None
    return {"method": "same host: shared CLOCK_REALTIME; other hosts: TCPStore ping-pong with rank 0",
            "note": SAME_HOST_CLOCK, "offsets_us": offsets, "uncertainty_us": unc, "measured": measured}


def cycle_listing(ranks: dict[int, dict[str, Any]]) -> list[dict[str, Any]]:
    """The job's profiling cycles from the ranks' own ``cycles`` entries (docs/cycles.md).

    Per cycle: its number, the profiler steps it recorded ``[first, last]``, the wall-clock start
    (earliest rank's first recorded step) and end (latest rank's export), the ranks whose trace
    is on disk, and the ranks whose trace was removed by ``--max-cycles``.
    """
    by_cycle: dict[int, dict[str, Any]] = {}
    for r, info in sorted(ranks.items()):
        for c in info.get("cycles") or []:
            if not isinstance(c, dict) or not isinstance(c.get("cycle"), int):
                continue
            row = by_cycle.setdefault(c["cycle"], {"cycle": c["cycle"], "steps": c.get("steps"), "start_ns": None,
                                                   "end_ns": None, "ranks": [], "dropped_ranks": [], "traces": {}})
            for key, pick in (("start_ns", min), ("end_ns", max)):
                if isinstance(c.get(key), int):
                    row[key] = c[key] if row[key] is None else pick(row[key], c[key])
            if c.get("trace"):
                row["ranks"].append(r)
                row["traces"][str(r)] = c["trace"]
            elif c.get("dropped"):
                row["dropped_ranks"].append(r)
    out = []
    for _, row in sorted(by_cycle.items()):
        row["start_time"] = iso(row["start_ns"]) if row["start_ns"] else None
        row["end_time"] = iso(row["end_ns"]) if row["end_ns"] else None
        row["kept"] = bool(row["ranks"])
        out.append(row)
    return out


def build_run_json(host_dir: Path, base: dict[str, Any]) -> dict[str, Any]:
    """``base`` (command, exit code, times, options...) plus the merged rank files of this host."""
    ranks = read_ranks(host_dir)
    doc = {"version": RUN_JSON_VERSION, **base}
    doc["host"] = socket.gethostname()
    doc["hosts"] = sorted({str(i.get("host")) for i in ranks.values()} | {doc["host"]})
    doc["world"] = world_layout(ranks)
    doc["ranks"] = {str(r): info for r, info in sorted(ranks.items())}
    doc["clock"] = clock_offsets(ranks)
    versions = {i["torch"] for i in ranks.values() if i.get("torch")}
    doc["torch"] = sorted(versions)[0] if len(versions) == 1 else sorted(versions) or None
    nccl = {i["nccl"] for i in ranks.values() if i.get("nccl")}
    doc["nccl"] = sorted(nccl)[0] if len(nccl) == 1 else sorted(nccl) or None
    doc["cycles"] = cycle_listing(ranks)
    return doc


def merge_host_runs(run_root: Path) -> dict[str, Any] | None:
    """Merge ``RUN/<host>/run.json`` files into ``RUN/run.json`` (per-host layout). Returns the merged doc."""
    docs = [d for d in (read_json(p) for p in sorted(run_root.glob("*/run.json"))) if d]
    if not docs:
        return None
    merged: dict[str, Any] = {"version": RUN_JSON_VERSION, "layout": "per-host",
                              "command": docs[0].get("command"), "options": docs[0].get("options")}
    ranks: dict[str, Any] = {}
    per_host: dict[str, Any] = {}
    for d in docs:
        ranks.update(d.get("ranks") or {})
        per_host[str(d.get("host"))] = {k: d.get(k) for k in ("exit_code", "start_time", "end_time", "start_ns",
                                                                "end_ns", "hang", "dir")}
    codes = [d.get("exit_code") for d in docs if d.get("exit_code")]
    merged["exit_code"] = codes[0] if codes else 0
    merged["start_ns"] = min(d.get("start_ns") or 0 for d in docs)
    merged["end_ns"] = max(d.get("end_ns") or 0 for d in docs)
    merged["start_time"], merged["end_time"] = iso(merged["start_ns"]), iso(merged["end_ns"])
    merged["hosts"] = sorted(per_host)
    merged["per_host"] = per_host
    int_ranks = {int(r): v for r, v in ranks.items()}
    merged["world"] = world_layout(int_ranks)
    merged["ranks"] = {str(r): v for r, v in sorted(int_ranks.items())}
    merged["clock"] = clock_offsets(int_ranks)
    merged["cycles"] = cycle_listing(int_ranks)
    write_json(run_root / "run.json", merged)
    return merged


def pid_running(pid: int) -> bool:
    """Alive and not a zombie (a rank that exited but was not reaped yet has ended)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False
