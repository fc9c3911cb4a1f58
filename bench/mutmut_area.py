"""Generated mutants for one diagnosis area: mutmut on the area's modules, judged by the area's tests only.

The hand-written mutants of ``bench/mutants.json`` check the cases someone thought of; this one lets a
tool (mutmut, pinned in the ``[mutation]`` extra) change every comparison, constant, boolean operator
and argument of the area's modules, and reports which changes no test notices. Areas, their modules
and their test files are in ``bench/mutmut_areas.toml``.

The run happens in a temporary copy of the checkout (tracked and untracked-but-not-ignored files,
``../shared`` linked beside it, a fresh ``TRACEREAD_CACHE_DIR``), never in the working tree: mutmut
writes its mutated package to ``mutants/`` under the folder it runs in. ``PYTHONPATH`` points at the
mutated package so subprocesses the tests start import it too.

    python bench/mutmut_area.py --list                       # the areas
    python bench/mutmut_area.py steps                        # every mutant of the area
    python bench/mutmut_area.py memory --sample 60 --seed 1  # 60 of them, drawn reproducibly
    python bench/mutmut_area.py compare --functions 'traceread.compare.diff.*'
    python bench/mutmut_area.py hang --json hang.json --keep /tmp/hang-mutants

It prints the counts (generated, killed, survived, timeout, no tests, other), the kill rate
(killed + timeout over the mutants run) and every survivor's diff. Survivors are triaged by hand in
docs/benchmarks.md ("Generated mutants"): killed after a new test, equivalent (with the reason), or a
gap left open with its reason.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]
AREAS = REPO / "bench" / "mutmut_areas.toml"
#: mutmut's words for a mutant's fate, as ``mutmut results`` prints them.
STATUSES = ("killed", "survived", "timeout", "no tests", "suspicious", "skipped", "segfault", "not checked",
            "check was interrupted by user", "caught by type check")
_RESULT = re.compile(r"^\s*(\S+): (.+?)\s*$")


def load_areas(path: Path = AREAS) -> tuple[dict[str, Any], dict[str, dict[str, list[str]]]]:
    """(common settings, area -> {modules, tests}); a malformed area is an error, not a skip."""
    data = tomllib.loads(path.read_text())
    areas = data.get("areas") or {}
    for name, a in areas.items():
        for key in ("modules", "tests"):
            if not a.get(key) or not all(isinstance(x, str) for x in a[key]):
                raise SystemExit(f"{path}: area {name} needs a list of {key}")
        missing = [t for t in a["tests"] if not (REPO / t.split("::")[0]).is_file()]
        if missing:
            raise SystemExit(f"{path}: area {name}: no such test file {missing}")
        for pattern in a["modules"]:
            if not any(fnmatch.fnmatch(str(p.relative_to(REPO)), pattern) for p in (REPO / "traceread").rglob("*.py")):
                raise SystemExit(f"{path}: area {name}: no module matches {pattern}")
    return data.get("mutmut") or {}, areas


def copy_checkout(dest: Path) -> None:
    """Tracked and untracked-but-not-ignored files, and ../shared linked where the mutated tests look."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    shared = REPO.parent / "shared"
    if shared.is_dir():  # the tests run in dest/mutants: their ../shared is dest/shared
        (dest / "shared").symlink_to(shared.resolve())


def write_config(dest: Path, common: dict[str, Any], area: dict[str, list[str]]) -> None:
    """mutmut's [mutmut] section in setup.cfg (it reads pyproject's [tool.mutmut] first: there is none)."""
    if "[tool.mutmut]" in (dest / "pyproject.toml").read_text():
        raise SystemExit("pyproject.toml has a [tool.mutmut] section: mutmut would ignore the area's settings")

    def lines(values: list[str]) -> str:
        return "".join(f"\n    {v}" for v in values)

    cfg = ("[mutmut]\n"
           "source_paths = traceread\n"
           f"only_mutate ={lines(area['modules'])}\n"
           f"pytest_add_cli_args ={lines(list(common.get('pytest_args', [])))}\n"
           f"pytest_add_cli_args_test_selection ={lines(area['tests'])}\n"
           f"also_copy ={lines(list(common.get('also_copy', [])))}\n"
           f"timeout_multiplier = {float(common.get('timeout_multiplier', 10.0))}\n"
           f"timeout_constant = {float(common.get('timeout_constant', 5.0))}\n"
           f"process_isolation = {common.get('process_isolation', 'forkserver')}\n"
           f"forkserver_warmup = {common.get('forkserver_warmup', 'collect')}\n"
           "use_git_change_detection = false\n")
    (dest / "setup.cfg").write_text(cfg)


def mutmut(dest: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """One mutmut command in its own process group: stopping this script stops it and its workers too."""
    exe = Path(sys.executable).with_name("mutmut")
    cmd = [str(exe) if exe.is_file() else "mutmut", *args]
    proc = subprocess.Popen(cmd, cwd=dest, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate()
    except BaseException:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def results(dest: Path, env: dict[str, str]) -> dict[str, str]:
    """Mutant name -> status, every mutant generated."""
    out = mutmut(dest, "results", "--all", "true", env=env)
    got: dict[str, str] = {}
    for line in out.stdout.splitlines():
        m = _RESULT.match(line)
        if m and m.group(2) in STATUSES:
            got[m.group(1)] = m.group(2)
    return got


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("area", nargs="?", help="an area of bench/mutmut_areas.toml")
    ap.add_argument("--list", action="store_true", help="list the areas and exit")
    ap.add_argument("--sample", type=int, help="run this many of the area's mutants, drawn with --seed")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--functions", nargs="*", default=[], help="only mutants whose name matches one of these globs")
    ap.add_argument("--max-children", type=int, default=1, help="parallel mutant runs (default 1: a shared box)")
    ap.add_argument("--json", help="write counts, survivors and timings here")
    ap.add_argument("--keep", help="run in this folder and keep it (mutmut show/browse work there afterwards)")
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `kill` cleans up like Ctrl-C
    common, areas = load_areas()
    if args.list or not args.area:
        for name, a in areas.items():
            print(f"{name:10s} {' '.join(a['modules'])}\n{'':10s} tests: {' '.join(a['tests'])}")
        return 0
    if args.area not in areas:
        raise SystemExit(f"no area {args.area!r}; known: {', '.join(areas)}")
    area = areas[args.area]
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix=f"mutmut-{args.area}-"))
    dest = tmp / "checkout"
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    started = time.monotonic()
    try:
        copy_checkout(dest)
        write_config(dest, common, area)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MUTANT_UNDER_TEST")}
        env["PYTHONPATH"] = str(dest / "mutants")
        env["TRACEREAD_CACHE_DIR"] = str(tmp / "cache")
        # 1. generate the mutants and record which tests reach which function (no mutant matches the name)
        first = mutmut(dest, "run", "--max-children", str(args.max_children), "no-such-mutant-*", env=env)
        names = sorted(results(dest, env))
        if not names:
            print(first.stdout[-4000:], first.stderr[-4000:], sep="\n")
            raise SystemExit("mutmut generated no mutants (its output is above)")
        chosen = [n for n in names if not args.functions or any(fnmatch.fnmatch(n, g) for g in args.functions)]
        if args.sample and args.sample < len(chosen):
            chosen = sorted(random.Random(args.seed).sample(chosen, args.sample))
        prepared = time.monotonic() - started
        print(f"{args.area}: {len(names)} mutants generated in {', '.join(area['modules'])} and the tests reaching "
              f"each function recorded ({prepared:.0f} s); running {len(chosen)}", flush=True)
        # 2. run the chosen mutants
        run = mutmut(dest, "run", "--max-children", str(args.max_children), *chosen, env=env)
        ran = time.monotonic() - started - prepared
        status = results(dest, env)
        counts: dict[str, int] = {}
        for n in chosen:
            counts[status.get(n, "not checked")] = counts.get(status.get(n, "not checked"), 0) + 1
        tested = sum(v for k, v in counts.items() if k not in ("not checked", "skipped"))
        caught = counts.get("killed", 0) + counts.get("timeout", 0)
        survivors = [n for n in chosen if status.get(n) in ("survived", "no tests")]
        diffs = {n: mutmut(dest, "show", n, env=env).stdout for n in survivors}
        seconds = time.monotonic() - started
        print(f"{args.area}: generated {len(names)}, run {len(chosen)}: "
              + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
              + f"; kill rate {100.0 * caught / max(1, tested):.1f} % (killed + timeout of {tested}); "
              f"{seconds:.0f} s in all, {ran:.0f} s running mutants")
        if counts.get("not checked"):
            print(run.stdout[-3000:], run.stderr[-3000:], sep="\n")
        for n in survivors:
            print(f"\n--- {status[n]}: {n}\n{diffs[n].strip()}")
        if args.json:
            Path(args.json).write_text(json.dumps({
                "area": args.area, "modules": area["modules"], "tests": area["tests"], "generated": len(names),
                "run": len(chosen), "sample": args.sample, "seed": args.seed, "counts": counts,
                "kill_rate_pct": 100.0 * caught / max(1, tested), "seconds": seconds, "seconds_preparing": prepared,
                "seconds_running": ran,
                "status": {n: status.get(n) for n in chosen}, "survivors": diffs}, indent=1))
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
