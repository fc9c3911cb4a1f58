"""A small mutation check of the test suite: does a deliberate bug in the diagnosis code fail a test?

Each mutant is data (``bench/mutants.json``): a file, an exact text in it and what to put instead,
and why that is a wrong diagnosis. For every mutant this script copies the checkout (tracked files
only, plus ``../shared`` beside it through a symlink), applies the one change, runs the test command
in the copy and records whether any test failed (killed) or all passed (survived). A mutant whose
old text is not found exactly once is reported as ``stale`` (the code moved on; fix the mutant),
never silently skipped.

    python bench/mutation.py                       # every mutant, the default test command
    python bench/mutation.py --only stragglers     # mutants whose id contains "stragglers"
    python bench/mutation.py --json mutation.json  # also write the per-mutant results

The default test command is the whole suite without the end-to-end tests (``-m "not slow"``), with
``-x`` so a killed mutant stops at its first failure; ``--tests`` overrides it. The kill rate goes to
docs/benchmarks.md ("Mutation check").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MUTANTS = REPO / "bench" / "mutants.json"
DEFAULT_TESTS = ["-m", "not slow", "-x", "-q", "-p", "no:cacheprovider", "-n", "2"]


@dataclass(frozen=True)
class Mutant:
    id: str
    file: str
    old: str
    new: str
    why: str


def load_mutants(path: Path = MUTANTS) -> list[Mutant]:
    """The mutants as data; a malformed entry is an error here, not a silent skip."""
    rows = json.loads(path.read_text())
    out = []
    for row in rows:
        missing = {"id", "file", "old", "new", "why"} - set(row)
        if missing:
            raise SystemExit(f"{path}: mutant {row.get('id', '?')} lacks {sorted(missing)}")
        out.append(Mutant(**{k: row[k] for k in ("id", "file", "old", "new", "why")}))
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


def run_one(m: Mutant, work: Path, tests: list[str], timeout: int) -> dict[str, object]:
    target = work / m.file
    original = target.read_text()
    target.write_text(original.replace(m.old, m.new, 1))
    env = {**os.environ, "PYTHONPATH": str(work), "TRACEREAD_CACHE_DIR": str(work.parent / "cache")}
    t0 = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", *tests], cwd=work, env=env, capture_output=True,
                              text=True, timeout=timeout)
        outcome = "survived" if proc.returncode == 0 else "killed"
        tail = (proc.stdout or "").strip().splitlines()[-1:] if proc.stdout else []
    except subprocess.TimeoutExpired:
        outcome, tail = "killed", ["timeout"]
    finally:
        target.write_text(original)
    return {"id": m.id, "file": m.file, "why": m.why, "outcome": outcome, "seconds": round(time.monotonic() - t0, 1),
            "last_line": tail[0] if tail else ""}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="run the mutants whose id contains this text")
    ap.add_argument("--tests", help="pytest arguments instead of the default (quoted, split on spaces)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per mutant (default 1800)")
    ap.add_argument("--json", help="write the per-mutant results here")
    args = ap.parse_args(argv)
    mutants = [m for m in load_mutants() if not args.only or args.only in m.id]
    tests = args.tests.split() if args.tests else DEFAULT_TESTS
    results: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="traceread-mutation-") as tmp:
        work = Path(tmp) / "checkout"
        work.mkdir()
        copy_checkout(work)
        for m in mutants:
            if not applies(m, work):
                res: dict[str, object] = {"id": m.id, "file": m.file, "why": m.why, "outcome": "stale"}
            else:
                res = run_one(m, work, tests, args.timeout)
            results.append(res)
            print(f"{res['outcome']:9s} {m.id}  ({res.get('seconds', '-')} s)", flush=True)
    counted = [r for r in results if r["outcome"] != "stale"]
    killed = sum(r["outcome"] == "killed" for r in counted)
    print(f"killed {killed} of {len(counted)} mutants"
          + (f" ({100.0 * killed / len(counted):.0f} %)" if counted else "")
          + (f"; {len(results) - len(counted)} stale" if len(counted) < len(results) else ""))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0 if killed == len(counted) and len(counted) == len(results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
