"""Regenerate tests/data/fr/groups_{stop,spin,skip,order}: real 8-process torchrun/gloo jobs that hang.

Usage: ``python tests/jobs/make_fr_fixtures.py [--only stop] [--out tests/data/fr]`` (about 30 s per job on
2 cores). Runs tests/jobs/fr_groups_job.py under ``torchrun --standalone --nproc-per-node 8`` once per
fault, waits for its dumps, kills it, and keeps what a user would have, each fault in another layout
(so the tests cover discovery too):

* ``groups_stop``  — torch's ``TORCH_FR_DUMP_TEMP_FILE`` style, flat: ``_dump_<R>`` (pickles, no extension),
  ``stacks/rank<R>.txt``; no ``run.json``.
* ``groups_spin``  — a collector-style run: ``fr/rank<R>.pkl`` from the dump threads plus ``fr/rank2.json``
  fetched from the worker server (rank 2 held the GIL: no pickle), ``stacks/``, ``launcher.log``
  (torchrun's prefixed output), ``run.json``.
* ``groups_skip``  — flat, torch's older default prefix: ``nccl_trace_rank_<R>`` (pickles) only.
* ``groups_order`` — nested per host: ``node0/fr/rank<R>.json`` (JSON) for ranks 0-3,
  ``node1/dumps/host1_rank<R>.pkl`` for ranks 4-7, ``node*/stacks/``.

``truth.json`` beside each: the faulted rank and why (by construction of the fault), and for every
rank that wrote one the collective its main thread was in when the dumps were taken (group name, op,
seq: the job's own count, checked here against the seq Flight Recorder recorded).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
JOB = HERE / "fr_groups_job.py"
OUT = HERE.parent / "data" / "fr"
WHY = {"stop": "no_dump", "spin": "host_elsewhere", "skip": "out_of_order", "order": "out_of_order"}
RANK_OF = {"stop": 5, "spin": 2, "skip": 6, "order": 3}
DESCRIPTION = {
    "stop": "rank 5 stopped itself (SIGSTOP) before its first TP all-reduce of step 2",
    "spin": "rank 2 spins holding the GIL before its DP all-reduce of step 2",
    "skip": "rank 6 skipped its DP all-reduce of step 2 and went on to the world all-reduce",
    "order": "rank 3 issued the world all-reduce before its DP all-reduce in step 2",
}


def run_job(fault: str, run: Path) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE="[rank${rank}]:")
    env.pop("PYTHONPATH", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "8", "--tee", "3",
           str(JOB), "--out", str(run), "--fault", fault]
    log = open(run.parent / f"{fault}.log", "w")  # closed in the finally below
    p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not (run / ".done").exists():
            if time.monotonic() > deadline or p.poll() is not None:
                raise SystemExit(f"{fault}: the job did not hang and dump as planned (see {log.name})")
            time.sleep(0.2)
    finally:
        pids = [int(f.read_text()) for f in (run / "pids").glob("rank*")] if (run / "pids").is_dir() else []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
        log.close()
    return (run.parent / f"{fault}.log").read_text(errors="replace")


def truth_of(fault: str, run: Path) -> dict:
    culprit = RANK_OF[fault]
    inside = {}
    for f in sorted((run / "truth").glob("rank*.json")):
        doc = json.loads(f.read_text())
        if doc["in"] is not None:  # the culprit too, when it is in a collective (skip, order)
            inside[str(doc["rank"])] = doc["in"]
    for r, cur in inside.items():  # the job's count must be Flight Recorder's seq
        d = pickle.loads((run / "fr" / f"rank{r}.pkl").read_bytes())
        seqs = [e["collective_seq_id"] for e in d["entries"] if e["process_group"][0] == cur["pg"]]
        assert seqs and seqs[-1] == cur["seq"], (fault, r, cur, seqs[-3:])
    stuck: dict[str, dict] = {}
    for r, cur in sorted(inside.items(), key=lambda kv: int(kv[0])):
        g = stuck.setdefault(f"{cur['pg']}#{cur['seq']}", {"pg": cur["pg"], "seq": cur["seq"], "op": cur["op"],
                                                          "waiting": []})
        g["waiting"].append(int(r))
    return {"job": "tests/jobs/fr_groups_job.py", "fault": fault, "description": DESCRIPTION[fault], "world_size": 8,
            "layout": {"tp": 2, "dp": 2, "pp": 2, "rank": "tp + 2*dp + 4*pp"},
            "culprits": [{"rank": culprit, "why": WHY[fault]}],
            "waiting": {r: cur for r, cur in sorted(inside.items(), key=lambda kv: int(kv[0]))},
            "stuck": sorted(stuck.values(), key=lambda g: (int(g["pg"]), g["seq"]))}


def _copy(src: Path, dst: Path) -> None:
    if src.is_file() and src.stat().st_size:
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src, dst)


def lay_out(fault: str, run: Path, log: str, dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    if fault == "stop":
        for r in range(8):
            _copy(run / "fr" / f"rank{r}.pkl", dest / f"_dump_{r}")
            _copy(run / "stacks" / f"rank{r}.txt", dest / "stacks" / f"rank{r}.txt")
    elif fault == "spin":
        for r in range(8):
            _copy(run / "fr" / f"rank{r}.pkl", dest / "fr" / f"rank{r}.pkl")
            if not (run / "fr" / f"rank{r}.pkl").exists():
                _copy(run / "fr_ws" / f"rank{r}.json", dest / "fr" / f"rank{r}.json")
            _copy(run / "stacks" / f"rank{r}.txt", dest / "stacks" / f"rank{r}.txt")
        lines = [ln for ln in log.splitlines() if ln.startswith("[rank") and "Warning" not in ln]
        (dest / "launcher.log").write_text("\n".join(lines[-200:]) + "\n")
        (dest / "run.json").write_text(json.dumps({"command": ["torchrun", "fr_groups_job.py", "--fault", fault],
                                                   "world_size": 8}) + "\n")
    elif fault == "skip":
        for r in range(8):
            _copy(run / "fr" / f"rank{r}.pkl", dest / f"nccl_trace_rank_{r}")
    elif fault == "order":
        for r in range(8):
            if r < 4:
                _copy(run / "fr" / f"rank{r}.json", dest / "node0" / "fr" / f"rank{r}.json")
            else:
                _copy(run / "fr" / f"rank{r}.pkl", dest / "node1" / "dumps" / f"host1_rank{r}.pkl")
            _copy(run / "stacks" / f"rank{r}.txt", dest / f"node{r // 4}" / "stacks" / f"rank{r}.txt")
    (dest / "truth.json").write_text(json.dumps(truth_of(fault, run), indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=sorted(RANK_OF), action="append")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    for fault in args.only or sorted(RANK_OF):
        with tempfile.TemporaryDirectory(prefix=f"frjob_{fault}_") as tmp:
            run = Path(tmp) / "run"
            run.mkdir()
            t0 = time.monotonic()
            log = run_job(fault, run)
            lay_out(fault, run, log, args.out / f"groups_{fault}")
            print(f"{fault}: {time.monotonic() - t0:.0f} s -> {args.out / f'groups_{fault}'}")


if __name__ == "__main__":
    main()
