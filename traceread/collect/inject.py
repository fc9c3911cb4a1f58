"""Where the in-job bootstrap lives and how a child environment gets it.

The code that runs inside ranks is ``bootstrap/_traceread_rank.py`` (loaded by ``bootstrap/sitecustomize.py``).
It is stdlib-only until the user imports torch, so the job's interpreter needs no traceread install:
only the bootstrap folder on ``PYTHONPATH``.
"""

from __future__ import annotations

import os
from pathlib import Path

BOOTSTRAP_DIR = Path(__file__).resolve().parent / "bootstrap"


def bootstrap_dir() -> Path:
    """Folder holding ``sitecustomize.py``; raises when the package data is missing from the install."""
    if not (BOOTSTRAP_DIR / "sitecustomize.py").is_file():
        raise FileNotFoundError(f"{BOOTSTRAP_DIR}: traceread bootstrap files are missing (broken install)")
    return BOOTSTRAP_DIR


def prepend_pythonpath(env: dict[str, str], folder: Path) -> str:
    """``folder`` first on PYTHONPATH, the user's entries kept after it (and never duplicated)."""
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(folder)]
    return os.pathsep.join([str(folder), *parts])
