"""Which file and folder names are traces, by name alone (shared by local and object-store listing)."""

from __future__ import annotations

TRACE_SUFFIXES = (".json", ".json.gz", ".json.zst")
#: How the reader's message starts when a file is not a trace (traceread.read.decode, traceread.read.foreign):
#: a folder walk passes such a file over with a note instead of counting a missing rank.
NOT_A_TRACE = "not a Kineto trace"
#: Files in a run folder that are not traces (by name) and folders whose JSON is not traces.
NON_TRACE_FILES = frozenset(
    {"run.json", "truth.json", "hang.json", "report.json", "report.schema.json", "trigger.json", "watch.json"}
)
# captures/: the watch's windows, read on purpose (docs/watch.md), not as the baseline window; telemetry/: GPU sensors
NON_TRACE_DIRS = frozenset({"fr", "errors", "inject", "stacks", "nccl", "ranks", "progress", "captures", "telemetry"})


def is_trace_name(name: str) -> bool:
    return name.endswith(TRACE_SUFFIXES)

#: Other tools' files that are never a Kineto trace: a folder walk keeps them so the reader can name
#: them (traceread.read.foreign) instead of passing over them in silence.
FOREIGN_SUFFIXES = (".nsys-rep", ".qdrep", ".qdstrm", ".ncu-rep", ".xplane.pb", ".pftrace", ".perfetto-trace",
                    ".sqlite", ".rocpd", ".et")


def is_foreign_name(name: str) -> bool:
    return name.lower().endswith(FOREIGN_SUFFIXES)
