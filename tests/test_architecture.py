"""The import contract: folders are the stages, and imports run one way through them.

    read → engine → analysis → assemble → compare → render / export → commands / api → cli

Below them all sit the leaves (``errors``, ``model``, ``intervals``, ``options``, ``report_schema``,
``textsafe``, ``fmt``, ``devices``): vocabulary every stage may use, importing nothing above it. ``collect`` and
``simulate`` stand beside the path and use only the leaves and ``read``'s formats.

Checked on the source: every import statement counts, the ones inside functions too (they run), so
a deferred import cannot hide an upward arrow or a cycle. ``docs/architecture.md`` explains the
stages; a change that needs to break this rule needs a new stage or a moved module, not an exception.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "traceread"

LEAVES = ("errors", "model", "intervals", "options", "report_schema", "textsafe", "fmt", "devices")
#: stage -> its rank on the path; a module may import its own stage, a lower one, or a leaf.
STAGES = {"read": 1, "engine": 2, "analysis": 3, "assemble": 4, "compare": 5, "render": 6, "export": 6,
          "commands": 7, "api": 7, "cli": 8}
#: beside the path: these import only the leaves, ``read`` and themselves.
BESIDE = {"collect": ("read",), "simulate": ("read",)}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in PKG.rglob("*.py")}


def imports_of(name: str) -> set[str]:
    """Every traceread module ``name`` imports, top-level or deferred (``from a import b`` counts as
    ``a.b`` when that is a module, else as ``a``)."""
    path = MODULES[name]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert not node.level, f"{path}: relative import (write the absolute name)"
            base = node.module or ""
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in MODULES:
                t = t.rpartition(".")[0]
            if t and t != name and t.startswith("traceread"):
                out.add(t)
    return out


def stage(name: str) -> str:
    parts = name.split(".")
    top = parts[1] if len(parts) > 1 else "traceread"
    return "cli" if top == "__main__" else top


def allowed(src: str, dst: str) -> bool:
    """Whether module ``src`` may import module ``dst``."""
    s, d = stage(src), stage(dst)
    if d in LEAVES or d == "traceread":  # vocabulary, or the package itself (``__version__``)
        return s not in LEAVES or d in LEAVES
    if s == "traceread":  # the package facade: lazy entry points to the public API
        return True
    if s in LEAVES:
        return False
    if s in BESIDE:
        return d == s or d in BESIDE[s]
    if d in BESIDE:
        return s == "commands"
    return s == d or STAGES[d] < STAGES[s]


def _deferred(node: ast.AST) -> bool:
    return any(isinstance(x, (ast.Import, ast.ImportFrom)) for f in ast.walk(node)
               if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) for x in ast.walk(f))


def test_every_module_has_a_stage() -> None:
    unknown = sorted({stage(m) for m in MODULES} - set(STAGES) - set(LEAVES) - set(BESIDE) - {"traceread"})
    assert unknown == [], f"a new top-level module or folder: give it a stage here and in docs/architecture.md: {unknown}"


def test_imports_follow_the_stages() -> None:
    bad = sorted(f"{m} imports {d}" for m in MODULES for d in imports_of(m) if not allowed(m, d))
    assert bad == []


def test_no_import_cycles() -> None:
    graph = {m: {d for d in imports_of(m) if d != "traceread"} for m in MODULES}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                cycles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert cycles == []


def test_the_checker_sees_what_it_must() -> None:
    """The checker itself: deferred imports are found and the rule refuses upward arrows (a blind
    checker would pass vacuously)."""
    assert any(_deferred(ast.parse(p.read_text())) for p in MODULES.values())
    assert "traceread.analysis.time.breakdown" in imports_of("traceread.assemble.rank_map")  # deferred there
    assert not allowed("traceread.read.peek", "traceread.analysis.time.steps")
    assert not allowed("traceread.analysis.comm.layout", "traceread.assemble.queries")
    assert not allowed("traceread.engine.tasks", "traceread.assemble.rank_map")
    assert not allowed("traceread.fmt", "traceread.analysis.comm.layout")
    assert not allowed("traceread.collect.launcher", "traceread.render.terminal")
    assert allowed("traceread.render.html", "traceread.assemble.queries")
    assert allowed("traceread.assemble.report", "traceread.engine.executors")


def test_report_driver_stays_small() -> None:
    """The driver is orchestration only (the 800-line version held everything)."""
    assert len((PKG / "assemble" / "report.py").read_text().splitlines()) <= 250
