"""Bounded CLI fuzzing in CI: every mutation kind of ``bench/fuzz_cli.py`` through the real commands.

``bench/fuzz_cli.py --cases 10000`` is the benchmark (README "Reliability"); this runs the first cases
of the same deterministic sequence — every mutation kind at least once (truncation, byte flips,
deleted/renamed keys, wrong types, NaN/Infinity, negative durations, strings for numbers, non-UTF-8,
deep nesting, injection payloads, empty files, gzip and whitespace bombs, symlink loops, folders named
``*.json``, duplicated ranks, hostile file names, damaged NCCL logs and hang evidence, missing paths)
— on ``sample_traces/`` and, when present, ``../shared/traces``, within a time budget. No traceback,
no hang, no exit code outside 0/2/3, no peak RSS over the bound, no unescaped terminal control.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import fuzz_cli

pytestmark = pytest.mark.slow
KINDS = len(fuzz_cli.MUTATIONS) + len(fuzz_cli.SPECIALS)


def test_fuzz_cli_bounded() -> None:
    totals = fuzz_cli.run_fuzz(cases=12 * KINDS, seed=0, max_events=300, timeout=20.0, max_rss_mb=1500.0,
                               bomb_mb=16, time_budget_s=45.0)
    assert totals.cases >= KINDS, f"only {totals.cases} cases ran in the budget"
    assert set(totals.by_kind) == set(fuzz_cli.MUTATIONS) | set(fuzz_cli.SPECIALS)
    assert not totals.violations, (dict(totals.violations), totals.failures[:3])
    assert set(totals.exit_codes) <= {"0", "2", "3"}


def test_classify_counts_what_it_must() -> None:
    """The harness itself: a traceback, a hang, a stray exit code, memory and an escape are each caught."""
    case = fuzz_cli.Case(0, "x", "s", ["report"], text_output=True)
    ok = {"code": 0, "tb": None, "stdout": "fine\n", "stderr": "", "maxrss_mb": 100.0}
    assert fuzz_cli.classify(case, ok, 1500) == []
    assert fuzz_cli.classify(case, {**ok, "tb": "Traceback"}, 1500) == ["traceback"]
    assert fuzz_cli.classify(case, {**ok, "killed": "timeout", "code": None}, 1500) == ["hang"]
    assert fuzz_cli.classify(case, {**ok, "code": 1}, 1500) == ["bad_exit"]
    assert fuzz_cli.classify(case, {**ok, "maxrss_mb": 2000.0}, 1500) == ["memory"]
    assert fuzz_cli.classify(case, {**ok, "stdout": "a\x1b[2Jb"}, 1500) == ["unsafe"]
    assert fuzz_cli.classify(case, {**ok, "stdout": "a\u202eb"}, 1500) == ["unsafe"]
