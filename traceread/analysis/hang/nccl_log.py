"""Where ``traceread hang`` and older code find the NCCL log reader; it lives in
:mod:`traceread.analysis.comm.nccl` (communicators, plugin lines, diagnoses, NCCL Inspector)."""

from traceread.analysis.comm.nccl import (
    MAX_LINE_CHARS,
    SLOW_INIT_S,
    find_nccl_logs,
    looks_like_nccl_log,
    nccl_logs_under,
    parse_nccl_logs,
    refit,
)

__all__ = ["MAX_LINE_CHARS", "SLOW_INIT_S", "find_nccl_logs", "looks_like_nccl_log", "nccl_logs_under",
           "parse_nccl_logs", "refit"]
