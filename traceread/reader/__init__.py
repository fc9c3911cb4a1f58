"""Fast, faithful Kineto trace reader: trace files -> :class:`traceread.model.RankTrace` tables.

``discover`` finds trace files, ``read_rank`` reads one file (through the parquet cache),
``read_traces`` reads a whole job in parallel and never fails because one rank is broken.
"""

from traceread.reader.discover import discover
from traceread.reader.read import read_rank, read_traces

__all__ = ["discover", "read_rank", "read_traces"]
