"""What an agent can ask traceread, as plain functions returning JSON-able dicts.

The MCP server (:mod:`traceread.commands.mcp`) registers each of these as a tool; they are plain
functions so the same answers can be tested without a protocol in between. They run the same
driver, engine and caches as the CLI (``build_report``), so an agent's report is a
cache hit for the user's ``traceread report`` and the other way round.

Why bounded: an agent reads the reply into its context window. A report document is 100 kB–10 MB;
the reply keeps what an engineer acts on (the answer, the findings with their evidence, the
ledger, the layout) within ``max_bytes`` and, when it had to leave something out, writes the whole
document to a file and says where (``full_json``), so nothing is lost, only not inlined.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from traceread.errors import TraceReadError

#: Default bound on one reply's JSON text (bytes): about 15k tokens.
MAX_REPLY_BYTES = 60_000
#: Where replies that were cut write the whole document (a folder per user; overridable).
OUT_ENV = "TRACEREAD_AGENT_OUT"

#: Report options an agent may pass (the Python API's names; docs/api.md).
REPORT_OPTIONS = ("workers", "use_cache", "cycle", "params", "tokens_per_step", "n_layers", "seq_len", "d_model")


def _out_dir() -> Path:
    base = os.environ.get(OUT_ENV) or os.path.join(tempfile.gettempdir(), f"traceread-agent-{os.getuid()}")
    path = Path(base)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _check_paths(paths: Sequence[str] | str) -> list[str]:
    items = [paths] if isinstance(paths, str) else list(paths)
    if not items:
        raise TraceReadError("no paths given: pass a run folder, trace files or globs")
    for p in items:
        if "://" not in p and not any(c in p for c in "*?[") and not Path(p).exists():
            raise TraceReadError(f"{p}: no such file or folder")
    return items


def _size(obj: Any) -> int:
    return len(json.dumps(obj, default=str))


def _write_full(kind: str, document: Any) -> str:
    text = json.dumps(document, default=str, indent=1)
    name = f"{kind}-{hashlib.sha256(text.encode()).hexdigest()[:16]}.json"
    path = _out_dir() / name
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return str(path)


def bounded(kind: str, reply: dict[str, Any], document: Any, max_bytes: int, trims: Sequence[tuple[str, int]]) -> dict[str, Any]:
    """``reply`` within ``max_bytes``: list fields named in ``trims`` are cut to their given lengths in
    turn (then halved) until it fits; when anything was cut the whole ``document`` is written to a
    file named in ``full_json`` and ``truncated`` lists what was shortened."""
    cut: list[str] = []
    for key, keep in trims:
        if _size(reply) <= max_bytes:
            break
        if isinstance(reply.get(key), list) and len(reply[key]) > keep:
            reply[key] = reply[key][:keep]
            cut.append(key)
    while _size(reply) > max_bytes:
        longest = max((k for k, v in reply.items() if isinstance(v, list) and len(v) > 1),
                      key=lambda k: _size(reply[k]), default=None)
        if longest is None:
            break
        reply[longest] = reply[longest][: len(reply[longest]) // 2]
        cut.append(longest)
    if cut:
        reply["truncated"] = sorted(set(cut))
        reply["full_json"] = _write_full(kind, document)
    return reply


def _rows(df: Any, limit: int | None = None) -> list[dict[str, Any]]:
    rows = df.to_dicts()
    return rows if limit is None else rows[:limit]


FINDING_FIELDS = ("id", "title", "impact_us_per_step", "impact_pct", "impact_us_total", "category", "role", "rank",
                  "predicted_saving_us", "explanation", "evidence", "suggestions")


def report(paths: Sequence[str] | str, max_bytes: int = MAX_REPLY_BYTES, **options: Any) -> dict[str, Any]:
    """Where the time goes: the answer, what to change, every finding with its evidence, the step
    ledger and the parallel layout (``traceread report``)."""
    from dataclasses import replace

    from traceread.assemble.queries import median_step_us
    from traceread.assemble.report import ReportOptions, build_report
    from traceread.render.tables import table
    from traceread.render.terminal import answer, headline

    unknown = sorted(set(options) - set(REPORT_OPTIONS))
    if unknown:
        raise TraceReadError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(REPORT_OPTIONS)}")
    opts = replace(ReportOptions(), **{k: v for k, v in options.items() if v is not None})
    doc = build_report(_check_paths(paths), opts)
    ans, change = answer(doc)
    reply: dict[str, Any] = {
        "headline": headline(doc),
        "answer": ans,
        "change": change,
        "step_us": median_step_us(doc),
        "findings": [{k: f.get(k) for k in FINDING_FIELDS} for f in doc.get("findings") or []],
        "coverage": doc.get("coverage"),
        "ledger": _rows(table(doc, "ledger")),
        "layout": _rows(table(doc, "layout")),
        "warnings": list(doc.get("warnings") or []),
        "schema": doc.get("schema"),
    }
    return bounded("report", reply, doc, max_bytes, [("warnings", 10), ("ledger", 40), ("layout", 40), ("findings", 10)])


def hang(path: str, max_bytes: int = MAX_REPLY_BYTES, workers: int | None = None) -> dict[str, Any]:
    """Why a job hung (``traceread hang``): the culprits first, the stuck groups, the dumps read."""
    from traceread.analysis.hang.diagnose import diagnose

    (p,) = _check_paths([path])
    diag = diagnose(Path(p), workers)
    if diag is None:
        return {"hang": False, "message": f"{p}: no hang evidence (no Flight Recorder dump with an unfinished "
                                          "collective, stack dump, hang.json, watchdog timeout or timeout error file)"}
    entry = dict(diag.entry)
    entry["hang"] = True
    return bounded("hang", entry, diag.entry, max_bytes, [("groups", 20), ("ranks", 64), ("culprits", 16)])


def diff(a: str, b: str, max_bytes: int = MAX_REPLY_BYTES, top: int = 15) -> dict[str, Any]:
    """What changed from run A to run B (``traceread diff``): step time, breakdown, findings that
    appeared or vanished, changes beyond noise only."""
    from traceread.assemble.report import ReportOptions, build_report
    from traceread.compare.diff import diff_reports
    from traceread.render.json_report import _jsonable

    pa, pb = _check_paths([a, b])
    opts = ReportOptions()
    d = _jsonable(diff_reports(build_report([pa], opts), build_report([pb], opts), top=top))
    return bounded("diff", dict(d), d, max_bytes, [("kernels", 10), ("operators", 10), ("collectives", 10)])


def contents(path: str) -> dict[str, Any]:
    """What a folder holds before anything is analysed: trace files and ranks, profiling cycles,
    watch captures, NCCL logs, Flight Recorder dumps, stack dumps, error files, run.json."""
    from traceread.read.discover import find

    (p,) = _check_paths([path])
    root = Path(p)
    found = find([p])
    out: dict[str, Any] = {"path": str(root), "traces": [str(f) for f in found.files[:200]],
                           "trace_files": len(found.files)}
    if not root.is_dir():
        return out
    cycles = sorted(d.name for d in (root / "traces").glob("cycle*") if d.is_dir()) if (root / "traces").is_dir() else []
    captures = sorted(d.name for d in (root / "captures").glob("capture*") if d.is_dir()) \
        if (root / "captures").is_dir() else []

    def listed(sub: str, pattern: str = "*") -> list[str]:
        folder = root / sub
        return sorted(str(f.relative_to(root)) for f in folder.glob(pattern) if f.is_file())[:200] if folder.is_dir() else []

    out.update({
        "run_json": (root / "run.json").is_file(),
        "cycles": cycles,
        "captures": captures,
        "nccl_logs": listed("nccl"),
        "flight_recorder": listed("fr"),
        "stacks": listed("stacks"),
        "errors": listed("errors"),
        "progress": listed("progress"),
        "hang_json": (root / "hang.json").is_file(),
    })
    if out["run_json"]:
        from traceread.read.jsonfile import read_json_value

        try:
            run = read_json_value(root / "run.json")
        except (OSError, ValueError) as exc:  # a damaged run.json is named, not raised: listing must not fail on it
            out["run_json_error"] = f"run.json: {exc}"
        else:
            if isinstance(run, dict):
                out["command"] = run.get("command")
                out["exit_code"] = run.get("exit_code")
                world = run.get("world")
                out["world_size"] = world.get("world_size") if isinstance(world, dict) else None
    return out


def export_timeline(paths: Sequence[str] | str, output: str) -> dict[str, Any]:
    """One Perfetto timeline of every rank on one clock, findings marked (``traceread export``)."""
    from traceread.assemble.report import ReportOptions, build_report
    from traceread.export import ExportOptions, export_trace

    items = _check_paths(paths)
    out = Path(output)
    if not out.parent.is_dir():
        raise TraceReadError(f"{output}: its folder does not exist")
    doc = build_report(items, ReportOptions())
    if not doc.get("ranks"):
        raise TraceReadError(f"no readable trace under {', '.join(items)} (nothing to put on a timeline)")
    res = export_trace(doc, out, ExportOptions())
    return {"output": str(res.path), "bytes": res.bytes_written, "events": res.events, "ranks": sorted(res.ranks),
            "findings_marks": res.findings_slices, "warnings": list(res.warnings),
            "open": "https://ui.perfetto.dev (Open trace file)"}


def skill_text() -> str:
    """The packaged SKILL.md: when to use which command and how to read the answer."""
    from importlib.resources import files

    return (files("traceread.commands") / "skill" / "SKILL.md").read_text(encoding="utf-8")


def glossary() -> dict[str, str]:
    """Finding id (or id prefix ending in ``*``) → its one-line meaning, from SKILL.md's table."""
    out: dict[str, str] = {}
    for line in skill_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`") and cells[0].endswith("`"):
            out[cells[0].strip("`")] = cells[1]
    return out


def finding_docs(finding_id: str) -> dict[str, Any]:
    """What a finding id means and where its definition is documented."""
    table = glossary()
    key = finding_id if finding_id in table else next(
        (k for k in table if k.endswith("*") and finding_id.startswith(k[:-1])), None)
    if key is None:
        raise TraceReadError(f"no finding {finding_id!r}; findings: {', '.join(sorted(table))}")
    reply: dict[str, Any] = {"id": finding_id, "meaning": table[key],
                             "page": "docs/report.md#findings-shares-of-the-step-ledger",
                             "related": ["docs/ledger.md", "docs/cross-rank.md", "docs/hang-and-nccl.md"]}
    docs = Path(__file__).resolve().parents[2] / "docs" / "report.md"
    if docs.is_file():  # a source checkout (pip install -e): the full definition from the docs page
        for line in docs.read_text(encoding="utf-8").splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) == 2 and key in cells[0].replace("`", "").split(", "):
                reply["definition"] = cells[1]
                break
    return reply
