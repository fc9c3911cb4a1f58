"""The three import roots install under one namespace, and pyproject lists every package."""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_namespace_imports() -> None:
    for name in ("traceread", "traceread.collectors", "traceread.reports"):
        assert importlib.import_module(name).__name__ == name


def test_every_package_folder_is_listed_in_pyproject() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    roots = {"traceread": REPO / "traceread", "traceread.collectors": REPO / "collectors", "traceread.reports": REPO / "reports"}
    found = set()
    for prefix, root in roots.items():
        for init in root.rglob("__init__.py"):
            rel = init.parent.relative_to(root)
            found.add(".".join([prefix, *rel.parts]) if rel.parts else prefix)
    assert found <= listed, f"add to pyproject packages: {sorted(found - listed)}"


def test_core_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = "import sys, traceread.cli, traceread.reader, traceread.model; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
