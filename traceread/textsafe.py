"""Make strings from traces, logs and file names safe to print on a terminal.

A kernel name, a process-group description, an NCCL log line or a file name is data written by
someone else. Printed raw, ``ESC[2J`` clears the user's screen, ``ESC]0;…BEL`` retitles the window,
``ESC]8;;url`` plants a hyperlink and a bidi override (U+202E) reverses what follows. Every control
character (C0, DEL, C1 — ESC included, so no escape sequence can start) and every bidi control is
written as a visible ``\\xNN`` / ``\\uNNNN`` escape instead: the user sees that the name was odd, and
the terminal interprets nothing. Rich markup (``[bold]``) is a separate hazard handled where strings
meet rich: pass them as ``Text`` or through :func:`rich.markup.escape`.

JSON output keeps the exact data (its encoder escapes controls as ``\\u001b``); HTML is escaped by the
template engine. Only the terminal and ``--format text`` views go through here.
"""

from __future__ import annotations

import re
from typing import Any

#: C0 controls, DEL, C1 controls, and the Unicode bidi embeddings/overrides/isolates.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
#: Same, but newline and tab are layout in text we composed ourselves.
_UNSAFE_KEEP_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _visible(m: re.Match[str]) -> str:
    c = ord(m.group(0))
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def clean(text: Any) -> str:
    """One line safe for a terminal: every control (newline included) becomes a visible escape."""
    s = text if isinstance(text, str) else str(text)
    return _UNSAFE.sub(_visible, s)


def clean_lines(text: str) -> str:
    """A block of lines safe for a terminal: like :func:`clean`, but newlines and tabs stay."""
    return _UNSAFE_KEEP_LINES.sub(_visible, text)


def clean_data(obj: Any) -> Any:
    """A copy of a JSON-like document with every string (keys too) passed through :func:`clean`."""
    if isinstance(obj, str):
        return clean(obj)
    if isinstance(obj, dict):
        return {(clean(k) if isinstance(k, str) else k): clean_data(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [clean_data(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(clean_data(v) for v in obj)
    return obj
