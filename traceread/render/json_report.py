"""The report as JSON: schema ``traceread.report/1``, serialised stably, and checked against the contract.

Scripts and dashboards parse this output, so two things are promised: the *stable* fields below are
always present (``null`` when the trace cannot support them) and never renamed or retyped within
``/1``; and every field that is present has the type ``traceread/report_schema.py`` declares.
:func:`validate` checks both and is what the tests (and ``traceread report --format json``) rely on.
"""

from __future__ import annotations

import math
import types
import typing
from typing import Any, get_args, get_origin, get_type_hints

import orjson

from traceread import report_schema as rs

#: Fields that are part of the stable API, per TypedDict. Everything else in report_schema is *extra*.
STABLE_FIELDS: dict[str, tuple[str, ...]] = {
    "Report": (
        "schema", "source", "warnings", "ranks", "collectives", "stragglers", "pipeline",
        "slow_steps", "hang", "findings", "ledger", "coverage", "layout",
    ),
    "RankEntry": (
        "rank", "file", "device", "num_sms", "window_us", "gpu_busy_us", "compute_us", "comm_us",
        "exposed_comm_us", "memcpy_us", "exposed_memcpy_us", "idle_us", "comm_overlap_pct",
        "gpu_util_pct", "sm_efficiency_pct", "achieved_occupancy_pct", "mfu_pct", "steps",
    ),
    "StepEntry": ("step", "start_us", "duration_us"),
    "CollectiveEntry": ("pg", "name", "count", "bytes", "latency_us", "wait_us", "algbw_gbps", "busbw_gbps"),
    "StragglerEntry": ("rank", "blame_us_per_step", "arrived_last", "cause"),
    "PipelineEntry": ("stages", "microbatches", "schedule", "bubble_pct", "theory_bubble_pct"),
    "SlowStepEntry": ("step", "duration_us", "median_us", "excess_us", "cause"),
    "HangEntry": ("pg", "seq", "op", "missing_ranks", "waiting_ranks", "stacks"),
    "Finding": ("id", "title", "impact_us_per_step", "explanation", "category", "role"),
    "Ledger": ("step_us", "step", "critical_rank", "parts"),
    "RankLedger": ("step", "step_us", "parts"),
    "LedgerPart": ("category", "role", "rank", "us"),
    "Coverage": ("explained_us", "step_us"),
    "Layout": ("degrees", "groups"),
    "LayoutGroup": ("pg", "desc", "role", "size", "ranks", "nodes", "evidence"),
    "Memory": ("ranks", "peak_rank", "peak_allocated_bytes", "median_peak_allocated_bytes", "imbalance_bytes",
               "leak_ranks", "model", "snapshots"),
    "MemoryRank": ("rank", "device", "peak_allocated_bytes", "peak_reserved_bytes", "headroom_bytes", "peak_step",
                   "peak_phase", "peak_operator", "fragmentation_bytes", "growth_per_step_bytes", "leak"),
}

_TYPED_DICTS: dict[str, type] = {
    name: getattr(rs, name) for name in STABLE_FIELDS
} | {"IdleBreakdown": rs.IdleBreakdown}


def _jsonable(obj: Any) -> Any:
    """Non-finite floats become null (JSON has no NaN); numpy scalars become Python numbers."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalar
        return _jsonable(obj.item())
    return obj


def to_json(report: rs.Report, *, indent: bool = True) -> str:
    """The document as JSON text (keys in document order, 2-space indent, NaN -> null)."""
    opts = orjson.OPT_INDENT_2 if indent else 0
    return orjson.dumps(_jsonable(report), option=opts | orjson.OPT_NON_STR_KEYS).decode()


def _check(value: Any, tp: Any, where: str, errors: list[str]) -> None:
    """Append an error when ``value`` does not have type ``tp`` (a report_schema annotation)."""
    origin = get_origin(tp)
    if tp is Any:
        return
    if origin in (typing.Union, types.UnionType):
        options = get_args(tp)
        if value is None and type(None) in options:
            return
        trial: list[str] = []
        for opt in options:
            if opt is type(None):
                continue
            sub: list[str] = []
            _check(value, opt, where, sub)
            if not sub:
                return
            trial.extend(sub)
        errors.append(trial[0] if trial else f"{where}: null is not allowed")
        return
    if tp is type(None):
        if value is not None:
            errors.append(f"{where}: expected null, got {type(value).__name__}")
        return
    if isinstance(tp, type) and tp.__name__ in _TYPED_DICTS and hasattr(tp, "__annotations__"):
        _check_typed_dict(value, tp, where, errors)
        return
    if origin is list:
        if not isinstance(value, list):
            errors.append(f"{where}: expected a list, got {type(value).__name__}")
            return
        (item_tp,) = get_args(tp) or (Any,)
        for i, item in enumerate(value):
            _check(item, item_tp, f"{where}[{i}]", errors)
        return
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            errors.append(f"{where}: expected an object, got {type(value).__name__}")
            return
        args = get_args(tp)
        if args:
            for k, v in value.items():
                _check(v, args[1], f"{where}.{k}", errors)
        return
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            errors.append(f"{where}: expected a number, got {type(value).__name__}")
        return
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            errors.append(f"{where}: expected an integer, got {type(value).__name__}")
        return
    if tp is str:
        if not isinstance(value, str):
            errors.append(f"{where}: expected a string, got {type(value).__name__}")
        return
    if tp is bool:
        if not isinstance(value, bool):
            errors.append(f"{where}: expected true/false, got {type(value).__name__}")
        return


def _check_typed_dict(value: Any, td: type, where: str, errors: list[str]) -> None:
    if not isinstance(value, dict):
        errors.append(f"{where}: expected an object, got {type(value).__name__}")
        return
    hints = get_type_hints(td)
    for name in STABLE_FIELDS.get(td.__name__, ()):
        if name not in value:
            errors.append(f"{where}: missing stable field {name!r}")
    for name, tp in hints.items():
        if name in value:
            _check(value[name], tp, f"{where}.{name}", errors)


def validate(doc: Any) -> list[str]:
    """Every way ``doc`` breaks the ``traceread.report/1`` contract; an empty list means it is valid.

    Checks: the schema id, presence of every stable field (values may be null only where the
    schema allows null), and the type of every declared field that is present. Unknown extra
    fields are allowed (the schema only grows).
    """
    errors: list[str] = []
    _check_typed_dict(doc, rs.Report, "$", errors)
    if isinstance(doc, dict) and doc.get("schema") != rs.SCHEMA_ID:
        errors.append(f"$.schema: expected {rs.SCHEMA_ID!r}, got {doc.get('schema')!r}")
    return errors


def assert_valid(doc: Any) -> None:
    """Raise ``AssertionError`` listing the first problems (for tests)."""
    errors = validate(doc)
    if errors:
        raise AssertionError("report does not match traceread.report/1:\n  " + "\n  ".join(errors[:20]))
