"""What every subcommand does the same way: output files, formats, verbosity and colour.

* ``-o -`` is stdout, for every command that writes a document; ``-o FILE`` picks the format from
  the extension when ``--format`` is not given, and a format the extension contradicts (or an
  extension the command cannot write) is refused with one line, exit 2.
* An output that cannot be written (missing folder, read-only, a folder where a file is wanted)
  is one line on stderr, exit 2, checked before any work is done.
* ``-q/--quiet`` (only the answer and errors), ``-v/--verbose`` (what was read and from where,
  every warning), ``--color auto|always|never`` and ``--no-color`` (``$NO_COLOR`` too).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click

from traceread.commands.fail import fail
from traceread.errors import TraceReadError
from traceread.textsafe import clean

__all__ = ["UI", "OutputError", "check_writable", "fail", "is_stdout", "open_in_browser", "resolve_format", "ui",
           "ui_options", "write_output"]

F = TypeVar("F", bound=Callable[..., Any])


class OutputError(TraceReadError):
    """An output the command cannot write, or a format it cannot write there (exit 2)."""


@dataclass
class UI:
    """How chatty and how colourful a command is (set by :func:`ui_options`)."""

    quiet: bool = False
    verbose: bool = False
    color: str = "auto"  # auto | always | never

    def note(self, text: str) -> None:
        """A line on stderr about what was done (not with --quiet)."""
        if not self.quiet:
            click.echo(clean(text), err=True)

    def detail(self, text: str) -> None:
        """A line on stderr only with --verbose."""
        if self.verbose and not self.quiet:
            click.echo(clean(text), err=True)


def ui() -> UI:
    """The current command's :class:`UI` (defaults outside a command)."""
    ctx = click.get_current_context(silent=True)
    while ctx is not None:
        if "traceread.ui" in ctx.meta:
            found: UI = ctx.meta["traceread.ui"]
            return found
        ctx = ctx.parent
    return UI()


def _set(field: str) -> Callable[[click.Context, click.Parameter, Any], Any]:
    def callback(ctx: click.Context, _param: click.Parameter, value: Any) -> Any:
        state = ctx.meta.setdefault("traceread.ui", UI())
        if field == "no_color":
            if value:
                state.color = "never"
        elif field == "color":
            if value is not None and state.color != "never":
                state.color = value
        elif value:
            setattr(state, field, True)
        return value

    return callback


def ui_options(fn: F) -> F:
    """``-q/--quiet``, ``-v/--verbose``, ``--color WHEN``, ``--no-color`` on a command."""
    options = [
        click.option("-q", "--quiet", is_flag=True, expose_value=False, callback=_set("quiet"), is_eager=True,
                     help="Only the answer (and errors): no summary tables, progress or notes."),
        click.option("-v", "--verbose", is_flag=True, expose_value=False, callback=_set("verbose"), is_eager=True,
                     help="Also say what was read and from where (cache hits), and list every warning."),
        click.option("--color", type=click.Choice(["auto", "always", "never"]), default=None, expose_value=False,
                     callback=_set("color"), help="Colour on the terminal (auto: when writing to one, unless $NO_COLOR)."),
        click.option("--no-color", is_flag=True, expose_value=False, callback=_set("no_color"), is_eager=True,
                     help="No colour (same as --color never or $NO_COLOR)."),
    ]
    for opt in reversed(options):
        fn = opt(fn)
    return fn


def is_stdout(output: str | None) -> bool:
    return output == "-"


def resolve_format(command: str, fmt: str | None, output: str | None, by_suffix: dict[str, str],
                   default: str, *, folder_formats: tuple[str, ...] = ()) -> str:
    """The format to write: ``--format`` if given (checked against the extension), else the one
    the extension of ``-o`` names, else ``default``. Refuses an extension the command cannot
    write, and a ``--format`` the extension contradicts (``-o x.csv --format json``)."""
    if output is None or is_stdout(output):
        return fmt or default
    name = Path(output).name.lower()
    suffix = next((s for s in sorted(by_suffix, key=len, reverse=True) if name.endswith(s)), None)
    if suffix is None:
        if fmt in folder_formats or (fmt is not None and not Path(output).suffix):
            return str(fmt)  # the user named the format; nothing contradicts it
        known = ", ".join(sorted(set(by_suffix)))
        folders = f", or a folder with --format {'/'.join(folder_formats)}" if folder_formats else ""
        raise OutputError(f"traceread {command} cannot write {Path(output).suffix or 'a file without an extension'} "
                          f"(it writes {known}{folders})", output)
    if fmt in folder_formats:
        raise OutputError(f"--format {fmt} writes a folder of files: give a folder name, not a {suffix} file", output)
    if fmt is not None and by_suffix[suffix] != fmt:
        raise OutputError(f"--format {fmt} does not match the {suffix} extension (that is {by_suffix[suffix]})", output)
    return by_suffix[suffix]


def check_writable(output: str | Path | None, *, folder: bool = False) -> None:
    """Fail now, in one line, when ``output`` cannot be written (before any analysis runs)."""
    if output is None or is_stdout(str(output)):
        return
    p = Path(output)
    parent = p.parent if str(p.parent) else Path(".")
    if folder:
        if p.exists() and not p.is_dir():
            raise OutputError("exists and is not a folder", str(output))
        target = p if p.exists() else parent
        if not target.is_dir():
            raise OutputError(f"cannot write: the folder {parent} does not exist", str(output))
        if not os.access(target, os.W_OK):
            raise OutputError("cannot write: permission denied", str(output))
        return
    if p.is_dir():
        raise OutputError("is a folder; give a file name", str(output))
    if not parent.is_dir():
        raise OutputError(f"cannot write: the folder {parent} does not exist", str(output))
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise OutputError("cannot write: permission denied", str(output))


def write_output(output: str | None, data: str | bytes) -> None:
    """``data`` to the file ``output`` (stdout for None or ``-``); an OSError is one line, exit 2."""
    if output is None or is_stdout(output):
        if isinstance(data, bytes):
            sys.stdout.flush()
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
        else:
            sys.stdout.write(data)
            sys.stdout.flush()
        return
    try:
        if isinstance(data, bytes):
            Path(output).write_bytes(data)
        else:
            Path(output).write_text(data, encoding="utf-8")
    except OSError as exc:
        raise OutputError(f"cannot write ({exc.strerror or exc})", output) from None


def open_in_browser(path: Path) -> bool:
    """The page in the default browser (``--open``); False when no browser could be started."""
    import webbrowser

    try:
        return bool(webbrowser.open(path.resolve().as_uri()))
    except Exception:  # no browser is not an error of the report
        return False
