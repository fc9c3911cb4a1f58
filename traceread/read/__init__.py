"""Fast, faithful Kineto trace reader: trace files -> :class:`traceread.model.RankTrace` tables.

One file at a time and nothing else: no cache, no processes, no analysis. ``discover`` finds trace
files; :mod:`parse` reads one. Reading a whole job through the caches and the executors is the
engine's (:mod:`traceread.engine.jobs`: ``read_rank``, ``read_traces``). Importing
``traceread.read.discover`` (the report's warm path) does not import polars.
"""

from __future__ import annotations

# Bound here: once the submodule ``discover`` is imported it would shadow the function.
from traceread.read.discover import discover

__all__ = ["discover"]
