"""Small JSON side files (``run.json``, ``hang.json``, torchelastic error files, rank records): one loader.

A side file only adds to a report, so a missing, half-written or foreign one is never an error:
the loader returns None and, where the caller keeps warnings, says in one line which file and
what is wrong with it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def load_json_object(path: Path, warnings: list[str] | None) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when it cannot be read, is not JSON or is not an object,
    with ``<path>: <what is wrong>`` appended to ``warnings`` (``None``: say nothing, e.g. a rank's
    record that may be mid-write). Invalid UTF-8 is replaced, not fatal: the rest still counts."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8", errors="replace"))
    except (OSError, ValueError) as exc:
        if warnings is not None:
            warnings.append(f"{path}: cannot read ({(str(exc).splitlines() or [type(exc).__name__])[0]})")
        return None
    if not isinstance(doc, dict):
        if warnings is not None:
            warnings.append(f"{path}: not a JSON object")
        return None
    return doc
