"""Which file and folder names are traces, by name alone (shared by local and object-store listing)."""

from __future__ import annotations

TRACE_SUFFIXES = (".json", ".json.gz", ".json.zst")
#: Files in a run folder that are not traces (by name) and folders whose JSON is not traces.
NON_TRACE_FILES = frozenset(
    {"run.json", "truth.json", "hang.json", "report.json", "report.schema.json"}
)
NON_TRACE_DIRS = frozenset({"fr", "errors", "inject", "stacks", "nccl", "ranks", "progress"})


def is_trace_name(name: str) -> bool:
    return name.endswith(TRACE_SUFFIXES)
