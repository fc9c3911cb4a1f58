"""The mutation check's mutants (bench/mutants.json) stay live: each names one exact place in today's
code, parses once applied, and says why it is a wrong diagnosis. A refactor that moves the code makes
a mutant stale; this test fails then, so the mutant is fixed with the code it describes (the check
itself, ``python bench/mutation.py``, runs the suite once per mutant: see docs/testing.md)."""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _harness():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("traceread_bench_mutation", REPO / "bench" / "mutation.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve the module by name
    spec.loader.exec_module(mod)
    return mod


HARNESS = _harness()
MUTANTS = HARNESS.load_mutants()


def test_mutants_exist_and_ids_say_where() -> None:
    assert len(MUTANTS) >= 70
    for m in MUTANTS:
        assert m.file.startswith("traceread/") and m.file.endswith(".py"), m.id
        assert len(m.why) > 20, f"{m.id}: say why this is a wrong diagnosis"
        assert all((REPO / t).is_file() for t in m.first), f"{m.id}: a 'first' test file does not exist"


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.id for m in MUTANTS])
def test_mutant_applies_once_and_parses(mutant) -> None:  # type: ignore[no-untyped-def]
    assert HARNESS.applies(mutant, REPO), f"{mutant.id} is stale: its old text is not found exactly once in {mutant.file}"
    src = (REPO / mutant.file).read_text()
    ast.parse(src.replace(mutant.old, mutant.new, 1), filename=mutant.file)
