"""Fast, faithful Kineto trace reader: trace files -> :class:`traceread.model.RankTrace` tables.

``discover`` finds trace files, ``read_rank`` reads one file (through the parquet cache),
``read_traces`` reads a whole job in parallel and never fails because one rank is broken.
The names are resolved on first use, so importing ``traceread.reader.discover`` (the report's warm
path) does not import polars.
"""

from __future__ import annotations

from typing import Any

# Bound here, not lazily: once the submodule ``discover`` is imported it would shadow the function.
from traceread.reader.discover import discover

__all__ = ["discover", "read_rank", "read_traces"]


def __getattr__(name: str) -> Any:
    if name in ("read_rank", "read_traces"):
        from traceread.reader import read

        return getattr(read, name)
    raise AttributeError(name)
