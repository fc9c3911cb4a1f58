"""Regenerate the report gallery in reports/ (``make reports``): one scenario each, its JSON report and
a screenshot of its HTML page, and the index reports/README.md.

Every input is in this repository (sample_traces/, tests/data/) or simulated here deterministically,
and every report is built without the cache from a path relative to the input's root, so the JSON is
byte-identical on every machine: ``tests/test_reports_gallery.py`` rebuilds it and fails when the
gallery is stale. Screenshots need chromium (``--no-screenshots`` leaves them as they are).

    python scripts/make_reports.py            # all of it
    python scripts/make_reports.py --json-only --out /tmp/gallery   # what the staleness test compares
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Scenario:
    name: str
    title: str
    shows: str
    root: str  # folder the report runs in ("" = the repository; "@sim" = a simulated job made here)
    path: str  # what `traceread report` is given, relative to root
    command: str = "report"  # report | hang
    simulate: tuple[str, ...] = ()


SCENARIOS = (
    Scenario("straggler", "A GPU straggler", "8-rank DDP on H100; rank 5's GPU is 3 ms slow per step and every "
             "all-reduce waits for it: the answer names rank 5, the share of the step and what to check.",
             "", "sample_traces/ddp_straggler_h100"),
    Scenario("pipeline_bubble", "A pipeline bubble", "4-stage 1F1B pipeline, 8 micro-batches: the bubble is "
             "the biggest loss; the advice says how much more micro-batches or interleaving would save.",
             "", "sample_traces/pp_1f1b_h100"),
    Scenario("slow_steps", "Slow steps", "4-rank DDP on A100 with three slow steps (data loader, GC pause, "
             "checkpoint): each slow step's excess and what covered it.", "", "sample_traces/slow_steps_a100"),
    Scenario("hang", "A deadlock", "a real 2-rank gloo job where rank 1 skipped an all-reduce: the culprit, the "
             "collective it never joined, its Python line (traceread hang).", "", "sample_traces/cpu_hang_gloo",
             command="hang"),
    Scenario("memory", "Where the memory goes", "4-rank FSDP recorded with profile_memory: the peak rank, "
             "the leak of 16 MiB per step on every rank, the guide's model beside it.", "",
             "sample_traces/fsdp_memory_h100"),
    Scenario("nccl_only", "NCCL logs alone", "NCCL_DEBUG=INFO logs of an EC2 job, no trace: the network "
             "plugin failed to load and NCCL fell back to sockets.", "",
             "tests/data/nccl/ofi_failed_ec2_nccl2.21_ofi1.16.log"),
    Scenario("serving", "An inference engine", "a simulated vLLM-style engine serving with tensor "
             "parallelism: engine iterations as steps, prefill and decode apart, serving advice.",
             "@sim", "serving_tp2", simulate=("serving",)),
)


def _env(cache: Path) -> dict[str, str]:
    return dict(os.environ, TRACEREAD_CACHE_DIR=str(cache), PYTHONPATH=os.pathsep.join(
        [str(REPO), os.environ.get("PYTHONPATH", "")]), COLUMNS="100", NO_COLOR="1")


def _traceread(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "traceread.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900)


def build_json(s: Scenario, out: Path, work: Path, env: dict[str, str]) -> Path:
    """Write ``out/<name>.json``; returns the folder the report ran in (for the page)."""
    root = REPO
    if s.root == "@sim":
        root = work / "sim"
        root.mkdir(parents=True, exist_ok=True)
        if not (root / s.path).exists():
            # the simulator's Python entry: every scenario, those the CLI does not list too (serving)
            res = subprocess.run([sys.executable, "-c", "import sys; from traceread.simulate import simulate; "
                                  "simulate(sys.argv[1], sys.argv[2])", *s.simulate, s.path],
                                 cwd=root, env=env, capture_output=True, text=True, timeout=900)
            if res.returncode:
                raise SystemExit(f"make_reports: simulate {s.name}: {res.stderr.strip()[-500:]}")
    target = out / f"{s.name}.json"
    if s.command == "hang":
        res = _traceread(["hang", s.path, "--format", "json", "-o", "-"], root, env)
    else:
        res = _traceread(["report", s.path, "--no-cache", "-j", "1", "--format", "json", "-o", "-"], root, env)
    if res.returncode:
        raise SystemExit(f"make_reports: {s.name}: exit {res.returncode}: {res.stderr.strip()[-500:]}")
    target.write_text(json.dumps(json.loads(res.stdout), indent=1, sort_keys=True, ensure_ascii=False) + "\n",
                      encoding="utf-8")
    return root


def screenshot(s: Scenario, root: Path, out: Path, work: Path, env: dict[str, str]) -> None:
    browser = next((b for b in ("chromium", "chromium-browser") if shutil.which(b)), None)
    if browser is None:
        raise SystemExit("make_reports: chromium is needed for the screenshots (or pass --no-screenshots)")
    page = work / f"{s.name}.html"
    res = _traceread(["report", s.path, "--no-cache", "-j", "1", "-o", str(page)], root, env)
    if res.returncode:
        raise SystemExit(f"make_reports: page {s.name}: {res.stderr.strip()[-500:]}")
    png = out / f"{s.name}.png"
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
                    f"--user-data-dir={work / 'profile'}", "--virtual-time-budget=20000", "--window-size=1280,1600",
                    f"--screenshot={png}", page.resolve().as_uri()], capture_output=True, timeout=300, check=True)


def index(out: Path) -> None:
    lines = ["# Report gallery", "",
             "One report per kind of problem traceread explains: the JSON document (`traceread report --format json`, "
             "or `traceread hang --format json` for the hang) and a screenshot of the HTML page. "
             "Regenerate with `make reports`; `tests/test_reports_gallery.py` fails when these are stale.", "",
             "| scenario | what it shows | input | report | page |", "|---|---|---|---|---|"]
    for s in SCENARIOS:
        source = f"`traceread.simulate.simulate({s.simulate[0]!r}, ...)`" if s.root == "@sim" else f"`{s.path}`"
        answer = ""
        doc = json.loads((out / f"{s.name}.json").read_text())
        if s.command == "report" and doc.get("findings"):
            answer = f" First finding: *{doc['findings'][0]['title'][:140]}*"
        lines.append(f"| {s.title} | {s.shows}{answer} | {source} | [{s.name}.json]({s.name}.json) | "
                     f"[{s.name}.png]({s.name}.png) |")
    (out / "README.md").write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "reports")
    ap.add_argument("--json-only", action="store_true", help="the JSON documents only (no index, no screenshots)")
    ap.add_argument("--no-screenshots", action="store_true")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="traceread-gallery-") as tmp:
        work = Path(tmp)
        env = _env(work / "cache")
        for s in SCENARIOS:
            root = build_json(s, args.out, work, env)
            if not (args.json_only or args.no_screenshots):
                screenshot(s, root, args.out, work, env)
    if not args.json_only:
        index(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
