"""How a command reports bad input: one terminal-safe line on stderr and an exit code, never a traceback.

Every ``traceread: error: ...`` line is written here (the commands through :func:`fail`, the console
entry point through :func:`error_line`), so the prefix, the escaping of names from traces and the
exit codes (:mod:`traceread.errors`) cannot drift apart between commands.
"""

from __future__ import annotations

from typing import NoReturn

import click

from traceread.errors import EXIT_BAD_INPUT
from traceread.textsafe import clean


def error_line(message: str) -> str:
    """``traceread: error: MESSAGE`` with every control character made visible (file names are data)."""
    return f"traceread: error: {clean(message)}"


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print :func:`error_line` on stderr and end the running command with ``code``."""
    click.echo(error_line(message), err=True)
    click.get_current_context().exit(code)
