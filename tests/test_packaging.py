"""Every folder of traceread/ installs as the package its path names, and the core needs no torch."""

from __future__ import annotations

from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[1]


def test_every_package_installs() -> None:
    """Every folder under traceread/ is a package that setuptools' find() picks up: a file's path is
    its import name (no package-dir remap)."""
    from setuptools import find_packages

    found = set(find_packages(str(REPO), include=["traceread*"]))
    folders = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "traceread").rglob("*.py")
               if "bootstrap" not in p.parts}  # bootstrap/: package data put on the job's PYTHONPATH
    assert folders <= found, f"folders without __init__.py: {sorted(folders - found)}"
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert "package-dir" not in config


def test_core_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = "import sys, traceread.cli, traceread.read, traceread.model; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
