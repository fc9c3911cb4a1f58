"""Imports run one way: commands → analyze → engine / crossrank → summary → analysis, reader → model.

Checked on the source (every import statement, top-level or inside a function), so a shortcut that
would make the layout lie fails here. The one sanctioned exception: ``reader/read.py`` (the public
``read_rank`` / ``read_traces``) calls into the engine from inside its functions.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "traceread"

#: module (path under traceread/) -> packages/modules it must never import
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "options.py": ("traceread.engine", "traceread.summary", "traceread.crossrank", "traceread.analyze",
                   "traceread.commands", "traceread.reader", "traceread.analysis"),
    "summary.py": ("traceread.engine", "traceread.crossrank", "traceread.analyze", "traceread.commands"),
    "crossrank.py": ("traceread.engine", "traceread.analyze", "traceread.commands"),
    "engine/": ("traceread.analyze", "traceread.crossrank", "traceread.commands"),
    "analysis/": ("traceread.engine", "traceread.summary", "traceread.crossrank", "traceread.analyze",
                  "traceread.commands"),
    "reader/": ("traceread.engine", "traceread.summary", "traceread.crossrank", "traceread.analyze",
                "traceread.commands"),
}
EXCEPTIONS = {("reader/read.py", "traceread.engine"),
              ("analysis/drift.py", "traceread.analyze")}  # --cycle all: one report per cycle (to move up)


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{a.name}" for a in node.names)
    return out


def test_imports_run_one_way() -> None:
    bad = []
    for where, forbidden in FORBIDDEN.items():
        files = sorted((PKG / where).rglob("*.py")) if where.endswith("/") else [PKG / where]
        for f in files:
            rel = f.relative_to(PKG).as_posix()
            for imp in _imports(f):
                for banned in forbidden:
                    if (imp == banned or imp.startswith(banned + ".")) and (rel, banned) not in EXCEPTIONS:
                        bad.append(f"{rel} imports {imp}")
    assert bad == []


def test_analyze_stays_small() -> None:
    """The orchestration module is orchestration only (the 800-line version held everything)."""
    assert len((PKG / "analyze.py").read_text().splitlines()) <= 250
