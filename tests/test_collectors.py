"""The launch recipes in collectors/ run as written, with local stand-ins for the schedulers.

Each recipe's own command line wraps a real 2-node job (tests/jobs/ddp_train.py, gloo, one rank per
"node", rank 1 sleeping 50 ms per step): the SLURM batch script runs under an ``srun`` shim that
starts its per-node command once per node, the PyTorchJob's and the SkyPilot task's scripts run once
per pod/node with the environment their operator sets, and the Ray launcher runs on a real local Ray
cluster. The "nodes" share this machine's host name (so torchrun's rendezvous resolves them); each
writes its own per-host folder, named through ``TRACEREAD_HOST_FOLDER`` as a launcher that places
several nodes on one machine does, so the per-host layout and the merge of run.json are exercised. Every run must end with both
ranks' traces in one run folder and ``traceread report`` naming rank 1 as the straggler.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from ports import free_port as _free_port

pytest.importorskip("torch", reason="the recipes run a real torchrun job")

REPO = Path(__file__).resolve().parents[1]
JOB = ["tests/jobs/ddp_train.py", "--steps", "10", "--sleep-rank", "1", "--sleep-s", "0.05"]
COLLECT_ARGS = "--wait 1 --warmup 1 --active 3"
pytestmark = pytest.mark.slow

SRUN_SHIM = """#!{python}
# srun stand-in: the per-node command once per node (SLURM_JOB_NUM_NODES), with the variables srun
# sets, each node's run sub-folder named node-<i>; exits with the worst exit code.
import os, subprocess, sys
args = sys.argv[1:]
while args and args[0].startswith("-"):
    args.pop(0)
n = int(os.environ["SLURM_JOB_NUM_NODES"])
procs = []
for i in range(n):
    env = dict(os.environ, SLURM_PROCID=str(i), SLURM_NODEID=str(i), SLURM_LOCALID="0", SLURM_NTASKS=str(n),
               SLURM_NNODES=str(n), SLURM_STEP_NUM_TASKS=str(n), TRACEREAD_HOST_FOLDER=f"node-{{i}}")
    procs.append(subprocess.Popen(args, env=env))
sys.exit(max(p.wait() for p in procs))
"""
SCONTROL_SHIM = """#!/bin/sh
# scontrol stand-in: every node of the allocation is reachable as localhost here.
[ "$1 $2" = "show hostnames" ] && echo localhost
"""


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    bindir = tmp / "bin"
    bindir.mkdir(exist_ok=True)
    path = os.pathsep.join([str(bindir), str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = dict(os.environ, PATH=path, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               TRACEREAD_CACHE_DIR=str(tmp / "cache"), OMP_NUM_THREADS="1")
    env.update(extra)
    return env


def _per_node(tmp: Path, script: str, envs: list[dict[str, str]], names: list[str]) -> list[int]:
    """Run ``script`` (bash) once per node, node i's run sub-folder named ``names[i]``."""
    procs = [subprocess.Popen(["bash", "-c", script], env=_env(tmp, **e, TRACEREAD_HOST_FOLDER=name), cwd=REPO)
             for e, name in zip(envs, names)]
    return [p.wait(timeout=600) for p in procs]


def _check_run(run: Path, hosts: list[str], tmp: Path) -> dict[str, Any]:
    for host in hosts:
        assert sorted(p.name for p in (run / host / "traces").glob("rank*.pt.trace.json.gz")), f"{host}: no trace"
    merged = json.loads((run / "run.json").read_text())
    assert merged["exit_code"] == 0 and sorted(merged["world"]["ranks_seen"]) == [0, 1]
    res = subprocess.run([sys.executable, "-m", "traceread.cli", "report", str(run), "--format", "json", "-o", "-"],
                         env=_env(tmp), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    doc = json.loads(res.stdout)
    assert doc["source"]["ranks_read"] == 2
    stragglers = [f for f in doc["findings"] if f["id"] == "straggler"]
    assert stragglers and stragglers[0]["rank"] == 1, [f["title"] for f in doc["findings"]]
    return doc


def test_slurm_batch_script_under_an_srun_stand_in(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "srun").write_text(SRUN_SHIM.format(python=sys.executable))
    (tmp_path / "bin" / "scontrol").write_text(SCONTROL_SHIM)
    for shim in ("srun", "scontrol"):
        (tmp_path / "bin" / shim).chmod(0o755)
    run = tmp_path / "run"
    env = _env(tmp_path, SLURM_JOB_NAME="traced-train", SLURM_JOB_ID="4242", SLURM_JOB_NUM_NODES="2",
               SLURM_JOB_NODELIST="node-[0-1]", RUN=str(run), GPUS_PER_NODE="1", RDZV_PORT=str(_free_port()),
               COLLECT_ARGS=COLLECT_ARGS)
    res = subprocess.run(["bash", "collectors/slurm/traceread.sbatch", *JOB], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"traceread report {run}" in res.stdout
    _check_run(run, ["node-0", "node-1"], tmp_path)


def _yaml(path: str) -> Any:
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load((REPO / path).read_text())


def test_kubernetes_pytorchjob_pods(tmp_path: Path) -> None:
    job = _yaml("collectors/kubernetes/pytorchjob.yaml")
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["template"] == specs["Worker"]["template"]
    container = specs["Master"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["/bin/bash", "-c"]
    script = container["args"][0].replace("/runs", str(tmp_path / "runs")).replace("train.py --lr 3e-4", " ".join(JOB))
    env = {e["name"]: e["value"] for e in container["env"]}
    port = str(_free_port())
    pods = ["traced-train-master-0", "traced-train-worker-0"]
    envs = [dict(env, COLLECT_ARGS=COLLECT_ARGS, PET_NNODES="2", PET_NPROC_PER_NODE="1", PET_NODE_RANK=str(i),
                 MASTER_ADDR="localhost", MASTER_PORT=port) for i in range(2)]
    assert _per_node(tmp_path, script, envs, pods) == [0, 0]
    _check_run(tmp_path / "runs" / env["JOB_NAME"], pods, tmp_path)


def test_skypilot_task_run_script(tmp_path: Path) -> None:
    task = _yaml("collectors/skypilot/task.yaml")
    assert "/runs" in task["file_mounts"] and task["num_nodes"] == 2
    script = task["run"].replace("/runs", str(tmp_path / "runs"))
    base = {k: str(v) for k, v in task["envs"].items()}
    base.update(TRAIN=JOB[0], TRAIN_ARGS=" ".join(JOB[1:]), COLLECT_ARGS=COLLECT_ARGS)
    envs = [dict(base, SKYPILOT_NODE_RANK=str(i), SKYPILOT_NODE_IPS="127.0.0.1\n127.0.0.2", SKYPILOT_NUM_NODES="2",
                 SKYPILOT_NUM_GPUS_PER_NODE="1") for i in range(2)]
    assert _per_node(tmp_path, script, envs, ["sky-node-0", "sky-node-1"]) == [0, 0]
    _check_run(tmp_path / "runs" / base["RUN_NAME"], ["sky-node-0", "sky-node-1"], tmp_path)


def test_ray_job_launcher_on_a_local_ray_cluster(tmp_path: Path) -> None:
    """A real one-machine Ray cluster, started by the launcher as the job's driver (no address given). Nothing
    here stops Ray for the whole machine (``ray stop`` would end another test's cluster too)."""
    pytest.importorskip("ray", reason="ray is in the [ray] extra")
    env = _env(tmp_path, RAY_ADDRESS="", RAY_USAGE_STATS_ENABLED="0")
    for attempt in range(3):  # Ray gives its raylet a fixed time to register: a busy box may need another go
        run = tmp_path / f"run{attempt}"
        res = subprocess.run([sys.executable, "collectors/ray/launch.py", "--nodes", "2", "--gpus-per-node", "1",
                              "--pack", "--run", str(run), "--port", str(_free_port()), "--collect-args", COLLECT_ARGS,
                              "--", *JOB], env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
        if res.returncode == 0 or "timed out during startup" not in res.stderr:
            break
    assert res.returncode == 0, res.stderr[-3000:]
    _check_run(run, ["node0", "node1"], tmp_path)


def test_collect_forwards_sigusr2_to_the_job(tmp_path: Path) -> None:
    """SLURM's --signal=USR2@N reaches the job's own handler through traceread collect (the recipe keeps it)."""
    job = tmp_path / "job.py"
    mark = tmp_path / "got-usr2"
    job.write_text(f"""
import signal, sys, time
signal.signal(signal.SIGUSR2, lambda *_: (open({str(mark)!r}, "w").write("1"), sys.exit(0)))
print("ready", flush=True)
time.sleep(120)
sys.exit(3)
""")
    proc = subprocess.Popen([sys.executable, "-m", "traceread.cli", "collect", "-o", str(tmp_path / "run"), "--",
                             sys.executable, str(job)], env=_env(tmp_path), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:  # the job has installed its handler once it says so
        if line.strip() == "ready":
            break
    proc.send_signal(signal.SIGUSR2)
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert proc.poll() == 0, proc.stderr.read() if proc.stderr else ""
    assert mark.read_text() == "1"
