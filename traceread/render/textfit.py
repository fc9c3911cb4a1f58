"""Text laid out for the width it is given: the terminal's, ``$COLUMNS``, or a default when piped.

Three rules every terminal view follows (the report, ``diff``, ``hang``):

* the width is the terminal's when writing to one, else ``$COLUMNS``, else :data:`PIPE_WIDTH`;
* no line carries padding: rich pads every table row to the table's width, so lines are stripped
  of trailing blanks (colour codes kept) before they are written — a log or ``grep`` sees the text;
* a table too wide for the width *folds*: each row becomes two lines, the later columns stacked
  under the earlier ones (header likewise), instead of rich truncating numbers to "42.…".
"""

from __future__ import annotations

import io
import os
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Any

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

#: Width used when the output is not a terminal and ``$COLUMNS`` is unset (logs are read wide).
PIPE_WIDTH = 120
#: Narrowest layout attempted; below it rich wraps whatever does not fit.
MIN_WIDTH = 40

_TRAILING = re.compile(r"[ \t]+((?:\x1b\[[0-9;]*m)*)$", re.M)


def output_width(stream: IO[Any] | None = None) -> int:
    """Columns to lay out for: the terminal's when ``stream`` is one, else ``$COLUMNS``, else 120."""
    env = os.environ.get("COLUMNS", "")
    try:
        isatty = bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError):
        isatty = False
    if env.isdigit() and int(env) > 0:
        return max(MIN_WIDTH, int(env))
    if isatty:
        return max(MIN_WIDTH, shutil.get_terminal_size((PIPE_WIDTH, 24)).columns)
    return PIPE_WIDTH


def use_color(stream: IO[Any] | None, choice: str = "auto") -> bool:
    """``always`` / ``never``; ``auto``: a terminal, unless ``$NO_COLOR`` is set (no-color.org)."""
    if choice == "always":
        return True
    if choice == "never" or os.environ.get("NO_COLOR"):
        return False
    try:
        return bool(stream is not None and stream.isatty())
    except (AttributeError, ValueError):
        return False


def strip_padding(text: str) -> str:
    """Every line without trailing blanks (a colour reset after them is kept)."""
    return _TRAILING.sub(r"\1", text)


def buffer_console(width: int, color: bool) -> tuple[Console, io.StringIO]:
    """A console that renders into a string at ``width`` columns, with or without colour."""
    buf = io.StringIO()
    con = Console(file=buf, width=width, force_terminal=color, color_system="standard" if color else None,
                  no_color=not color, highlight=False, emoji=False, soft_wrap=False, legacy_windows=False)
    return con, buf


@dataclass(frozen=True)
class Column:
    """One column of a fitted table: header, alignment, and whether it is free text (folds inside
    its cell; never stacked) or a key (repeated on the first line only)."""

    header: str
    justify: str = "right"
    text: bool = False
    key: bool = False


def _table(title: str | None, cols: Sequence[Column], rows: Sequence[Sequence[Any]], bx: box.Box) -> Table:
    t = Table(title=title, box=bx, title_justify="left", expand=False, show_edge=False, title_style="bold")
    for c in cols:
        if c.text:
            t.add_column(c.header, justify=c.justify, overflow="fold", ratio=1)  # type: ignore[arg-type]
        else:
            t.add_column(c.header, justify=c.justify, no_wrap=True, overflow="fold")  # type: ignore[arg-type]
    for r in rows:
        t.add_row(*r)
    return t


def _stacked(cols: Sequence[Column], rows: Sequence[Sequence[Any]]) -> tuple[list[Column], list[list[Any]]]:
    """Keys stay; the other columns are paired, the second half under the first (two lines a row)."""
    keys = [i for i, c in enumerate(cols) if c.key]
    rest = [i for i, c in enumerate(cols) if not c.key]
    half = (len(rest) + 1) // 2
    top, bottom = rest[:half], rest[half:]
    out_cols = [Column(f"{cols[i].header}\n", cols[i].justify, cols[i].text, key=True) for i in keys]
    for j, i in enumerate(top):
        below = cols[bottom[j]].header if j < len(bottom) else ""
        out_cols.append(Column(f"{cols[i].header}\n{below}", cols[i].justify, cols[i].text))
    out_rows = []
    for r in rows:
        row = [r[i] for i in keys]
        for j, i in enumerate(top):
            a = r[i] if isinstance(r[i], Text) else Text(str(r[i]))
            if j < len(bottom):
                b = r[bottom[j]] if isinstance(r[bottom[j]], Text) else Text(str(r[bottom[j]]))
                a = Text.assemble(a, "\n", b)
            row.append(a)
        out_rows.append(row)
    return out_cols, out_rows


def fitted_table(title: str | None, cols: Sequence[Column], rows: Sequence[Sequence[Any]], width: int,
                 bx: box.Box = box.SIMPLE_HEAD) -> Table:
    """A table that fits ``width``: one line a row when it fits, else each row folded onto two lines
    (:func:`_stacked`). Free-text columns take what is left and wrap inside their cells."""
    t = _table(title, cols, rows, bx)
    probe = Console(width=10_000, file=io.StringIO())
    need = Measurement.get(probe, probe.options, t)
    if any(c.text for c in cols):
        fixed = _table(None, [c for c in cols if not c.text], [[v for v, c in zip(r, cols) if not c.text] for r in rows], bx)
        need_fixed = Measurement.get(probe, probe.options, fixed).maximum + 24  # the text column keeps >= 24
        if need_fixed <= width:
            return t
    elif need.maximum <= width:
        return t
    if sum(1 for c in cols if not c.key) < 2:
        return t
    scols, srows = _stacked(cols, rows)
    return _table(title, scols, srows, bx)
