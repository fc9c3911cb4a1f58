"""Errors that reach the user as one line, never as a traceback."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any


class TraceReadError(Exception):
    """A problem with the user's input, reported as ``<file>: <what is wrong>``.

    The CLI prints ``str(error)`` and exits with :data:`EXIT_BAD_INPUT`; it never shows a traceback
    for this class.
    """

    def __init__(self, message: str, path: str | None = None) -> None:
        self.path = path
        self.message = message
        super().__init__(f"{path}: {message}" if path else message)


class TraceFileError(TraceReadError):
    """One trace file cannot be read (corrupt, truncated, not a trace). Other ranks go on."""


class RankConflictError(TraceReadError):
    """Two files claim the same rank, or files from different jobs were mixed."""


def guarded(name: str, warnings: list[str], fn: Callable[[], Any], default: Any = None) -> Any:
    """Run one analysis; on failure record a one-line warning and return ``default``.

    Every stage uses it (the map, the reduce, the driver): one analysis that fails leaves its part
    of the document empty and says why, and the report goes on."""
    try:
        return fn()
    except Exception as exc:  # the report must survive any single analysis
        where = traceback.extract_tb(exc.__traceback__)[-1]
        warnings.append(f"{name} skipped: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''} "
                        f"({Path(where.filename).name}:{where.lineno})")
        return default


# Exit codes shared by every subcommand (documented in the README).
EXIT_OK = 0
EXIT_BAD_INPUT = 2  # unreadable / inconsistent input
EXIT_NO_TRACES = 3  # nothing usable was found
