"""A small mutation check of the test suite: does a deliberate bug in the diagnosis code fail a test?

Each mutant is data (``bench/mutants.json``): an id, a file, an exact text in it and what to put
instead, and why that is a wrong diagnosis. For every mutant this script copies the checkout (tracked
and untracked-but-not-ignored files, plus ``../shared`` beside it through a symlink), applies the one
change, runs the test command in the copy and records whether a test failed (killed, with the first
failing test) or all passed (survived). A mutant whose old text is not found exactly once is reported
as ``stale`` (the code moved on; fix the mutant), never silently skipped; ``tests/test_mutants.py``
fails the suite on a stale mutant, so they are fixed with the code they describe.

Before the mutants, the same test command runs on the unmutated copy: if it fails there, every
mutant would look killed, so the script stops and says so (``--no-baseline`` skips that run).
Every run gets its own traceread cache folder and the mutated file's bytecode is removed, so nothing
computed by the original code (or by another mutant) is reused.

    python bench/mutation.py                       # every mutant, the default test command
    python bench/mutation.py --only stragglers     # mutants whose id contains "stragglers"
    python bench/mutation.py --only time. --tests "tests/test_analysis_steps.py -x -q"
    python bench/mutation.py --list                # the mutants and whether each applies
    python bench/mutation.py --json mutation.json  # also write the per-mutant results

A mutant may name ``first``: test files of its area, run alone before the whole command (a fast
path on a small machine: the whole suite takes minutes and its killing test may be scheduled last).
When they fail, the mutant is killed; when they pass, the whole command decides, so the verdict is
the whole command's either way (``--no-first`` turns the fast path off; ``--tests`` implies it).

The default test command is the whole suite without the end-to-end tests (``-m "not slow"``) and
without the executor tests (:data:`EXECUTOR_TESTS`), with ``-x`` so a killed mutant stops at its first
failure; ``--tests`` overrides it (split like a shell).
The kill rate goes to docs/benchmarks.md ("Mutation check").
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MUTANTS = REPO / "bench" / "mutants.json"
#: The executor tests compare the Ray / node-local / s3:// engines with the local one, both running the
#: same (mutated) analysis: they cannot tell a wrong diagnosis, and Ray clusters are slow and flaky on a busy box.
EXECUTOR_TESTS = ("tests/test_engine_ray.py", "tests/test_engine_node_local.py", "tests/test_engine_remote.py")
DEFAULT_TESTS = ["-m", "not slow", "-x", "-q", "-p", "no:cacheprovider", "-n", "2",
                 *(f"--ignore={t}" for t in EXECUTOR_TESTS)]
#: Never run inside a mutated copy: it checks that each mutant's old text is in the code, which the
#: applied mutant has just replaced (it would "kill" every mutant).
STALENESS_TEST = "tests/test_mutants.py"
FIELDS = ("id", "file", "old", "new", "why")
#: pytest exit codes: 1 = tests failed, 2 = interrupted (a collection error counts: the mutant broke an import).
KILLED_RC = {1, 2}


@dataclass(frozen=True)
class Mutant:
    id: str
    file: str
    old: str
    new: str
    why: str
    first: tuple[str, ...] = ()  # test files to run first (the fast path); the whole command when they pass


def load_mutants(path: Path = MUTANTS) -> list[Mutant]:
    """The mutants as data; a malformed entry is an error here, not a silent skip."""
    rows = json.loads(path.read_text())
    out = []
    for row in rows:
        missing = set(FIELDS) - set(row)
        if missing:
            raise SystemExit(f"{path}: mutant {row.get('id', '?')} lacks {sorted(missing)}")
        if row["old"] == row["new"]:
            raise SystemExit(f"{path}: mutant {row['id']} changes nothing")
        first = row.get("first") or []
        if not isinstance(first, list) or not all(isinstance(t, str) and t.startswith("tests/") for t in first):
            raise SystemExit(f"{path}: mutant {row['id']}: 'first' must be a list of tests/... files")
        out.append(Mutant(**{k: row[k] for k in FIELDS}, first=tuple(first)))
    ids = [m.id for m in out]
    if len(set(ids)) != len(ids):
        raise SystemExit(f"{path}: duplicate mutant ids")
    return out


def applies(m: Mutant, root: Path = REPO) -> bool:
    """Whether the mutant's old text occurs exactly once in its file (else it is stale)."""
    p = root / m.file
    return p.is_file() and p.read_text().count(m.old) == 1


def copy_checkout(dest: Path) -> None:
    """Tracked and untracked-but-not-ignored files of the checkout, and ../shared as a symlink."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if not src.is_file():
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)
    shared = REPO.parent / "shared"
    if shared.is_dir():
        (dest.parent / "shared").symlink_to(shared.resolve())


def _drop_bytecode(path: Path) -> None:
    """The compiled copy of a rewritten file: the source's mtime changes, but never trust a same-size rewrite."""
    if path.suffix == ".py":
        Path(importlib.util.cache_from_source(str(path))).unlink(missing_ok=True)


def run_tests(work: Path, tests: list[str], timeout: int, cache: Path) -> tuple[str, str]:
    """(outcome, detail): ``passed``, ``failed`` (detail: the first failing test) or ``error``."""
    shutil.rmtree(cache, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(work), "TRACEREAD_CACHE_DIR": str(cache)}
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", *tests, f"--ignore={STALENESS_TEST}",
                               f"--deselect={STALENESS_TEST}"], cwd=work,
                              env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return "failed", f"timeout after {timeout} s"
    out = proc.stdout or ""
    if proc.returncode == 0:
        return "passed", (out.strip().splitlines() or [""])[-1]
    if proc.returncode in KILLED_RC:
        first = re.search(r"^(?:FAILED|ERROR) (\S+)", out, re.M)
        return "failed", first.group(1) if first else (out.strip().splitlines() or ["?"])[-1]
    return "error", f"pytest exit {proc.returncode}: {(out.strip().splitlines() or [proc.stderr.strip()])[-1]}"


def run_one(m: Mutant, work: Path, tests: list[str], timeout: int, fast: bool = True) -> dict[str, object]:
    """The mutant applied, its ``first`` test files run alone (when given and ``fast``), then, unless
    they already failed, the whole test command: a survivor is always judged by the whole command."""
    target = work / m.file
    original = target.read_text()
    target.write_text(original.replace(m.old, m.new, 1))
    _drop_bytecode(target)
    t0 = time.monotonic()
    try:
        outcome = "passed"
        if fast and m.first:
            outcome, detail = run_tests(work, ["-m", "not slow", "-x", "-q", "-p", "no:cacheprovider", *m.first],
                                        timeout, work.parent / "cache")
        if outcome == "passed":
            outcome, detail = run_tests(work, tests, timeout, work.parent / "cache")
    finally:
        target.write_text(original)
        _drop_bytecode(target)
    verdict = {"failed": "killed", "passed": "survived"}.get(outcome, "error")
    return {"id": m.id, "file": m.file, "why": m.why, "outcome": verdict, "seconds": round(time.monotonic() - t0, 1),
            "by": detail}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--only", help="run the mutants whose id contains this text")
    ap.add_argument("--tests", help="pytest arguments instead of the default (quoted, split like a shell)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per run (default 1800)")
    ap.add_argument("--json", help="write the per-mutant results here")
    ap.add_argument("--list", action="store_true", help="list the mutants and whether each applies; run nothing")
    ap.add_argument("--no-baseline", action="store_true", help="do not run the tests on the unmutated copy first")
    ap.add_argument("--no-first", action="store_true",
                    help="skip the fast path: every mutant runs the whole test command only")
    args = ap.parse_args(argv)
    mutants = [m for m in load_mutants() if not args.only or args.only in m.id]
    if args.list:
        for m in mutants:
            print(f"{'ok' if applies(m) else 'STALE':5s} {m.id:40s} {m.file}  — {m.why}")
        return 0 if all(applies(m) for m in mutants) else 1
    tests = shlex.split(args.tests) if args.tests else DEFAULT_TESTS
    results: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="traceread-mutation-") as tmp:
        work = Path(tmp) / "checkout"
        work.mkdir()
        copy_checkout(work)
        if not args.no_baseline:
            t0 = time.monotonic()
            outcome, detail = run_tests(work, tests, args.timeout, Path(tmp) / "cache")
            if outcome != "passed":  # once more: a test that fails only sometimes is named, not trusted
                print(f"baseline  {outcome}: {detail}; running it again", flush=True)
                outcome, detail = run_tests(work, tests, args.timeout, Path(tmp) / "cache")
            print(f"baseline  {outcome}: {detail}  ({time.monotonic() - t0:.1f} s)", flush=True)
            if outcome != "passed":
                print("the tests fail without any mutant: fix that first (every mutant would look killed)")
                return 2
        for m in mutants:
            if not applies(m, work):
                res: dict[str, object] = {"id": m.id, "file": m.file, "why": m.why, "outcome": "stale"}
            else:
                res = run_one(m, work, tests, args.timeout, fast=not args.no_first and not args.tests)
            results.append(res)
            print(f"{res['outcome']:9s} {m.id}  ({res.get('seconds', '-')} s)  {res.get('by', '')}", flush=True)
    counted = [r for r in results if r["outcome"] in ("killed", "survived")]
    killed = sum(r["outcome"] == "killed" for r in counted)
    others = len(results) - len(counted)
    print(f"killed {killed} of {len(counted)} mutants"
          + (f" ({100.0 * killed / len(counted):.0f} %)" if counted else "")
          + (f"; {others} stale or errored" if others else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0 if killed == len(counted) and not others else 1


if __name__ == "__main__":
    raise SystemExit(main())
