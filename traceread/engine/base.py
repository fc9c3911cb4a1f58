"""What every executor shares: the callback type, the failed-task marker and the interface.

A leaf of the engine, so the Ray executor and the local ones can both use it without importing
each other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

Done = Callable[[int, Any], None]


class TaskFailed:
    """A task whose worker failed twice: the reason, for the report's warnings."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


class Executor(Protocol):
    """Runs ``fn(*args)`` for every args tuple; calls ``done(i, result | TaskFailed)`` per item."""

    def map(self, fn: Callable[..., Any], items: Sequence[tuple[Any, ...]], done: Done) -> None: ...
