"""Fast tests of the collect pieces: env rules, bootstrap chaining/selection, watchdog, run.json, launcher.

Real processes everywhere (plain python children, real files); torchrun runs live in test_collect_e2e.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import needs
import psutil
import pytest
from click.testing import CliRunner

from traceread.collect.env import collect_env
from traceread.collect.inject import bootstrap_dir
from traceread.collect.launcher import CollectOptions, host_dir_for, multi_node_env, run_collect
from traceread.collect.runinfo import merge_host_runs, read_json, write_json
from traceread.collect.watchdog import Watchdog, read_progress

PY = sys.executable


def _opts(run: Path, cmd: list[str], **kw) -> CollectOptions:
    return CollectOptions(run_dir=run, command=cmd, echo=False, poll_s=0.05, **kw)


# ------------------------------------------------------------------------------------------------ env


def test_env_user_settings_win_and_bootstrap_first(tmp_path: Path) -> None:
    base = {"NCCL_DEBUG": "WARN", "PYTHONPATH": "/user/lib", "TORCH_FR_BUFFER_SIZE": "7"}
    env, added = collect_env(tmp_path, base, {"wait": 1}, 123)
    assert env["NCCL_DEBUG"] == "WARN" and "NCCL_DEBUG" not in added
    assert env["TORCH_FR_BUFFER_SIZE"] == "7"
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in env  # legacy alias only mirrors what traceread set
    assert env["NCCL_DEBUG_FILE"] == str(tmp_path / "nccl" / "nccl.%h.%p.log")
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == str(tmp_path / "fr" / "rank")
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3" and env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep) == [str(bootstrap_dir()), "/user/lib"]
    assert json.loads(env["TRACEREAD_CONFIG"]) == {"wait": 1}
    assert env["TRACEREAD_LAUNCHER_PID"] == "123"


def test_env_no_inject_leaves_pythonpath(tmp_path: Path) -> None:
    env, _ = collect_env(tmp_path, {"PYTHONPATH": "/a"}, {}, 1, inject=False)
    assert env["PYTHONPATH"] == "/a"


def test_multi_node_detection() -> None:
    assert multi_node_env({"SLURM_JOB_NUM_NODES": "4", "SLURM_PROCID": "2"})
    assert not multi_node_env({"SLURM_JOB_NUM_NODES": "1", "SLURM_PROCID": "0"})
    assert multi_node_env({"OMPI_COMM_WORLD_SIZE": "2"})
    assert not multi_node_env({})


def test_host_folder_name_per_task() -> None:
    import socket

    from traceread.collect.launcher import host_folder_name

    host = socket.gethostname()
    assert host_folder_name({}) == host
    assert host_folder_name({"SLURM_NTASKS_PER_NODE": "4", "SLURM_LOCALID": "2"}) == f"{host}.2"
    assert host_folder_name({"SLURM_NTASKS_PER_NODE": "1", "SLURM_LOCALID": "0"}) == host
    assert multi_node_env({"SLURM_NTASKS": "4", "SLURM_PROCID": "3"})


def test_per_host_layout_folder(tmp_path: Path) -> None:
    import socket

    assert host_dir_for(tmp_path, "per-host") == (tmp_path / socket.gethostname(), "per-host")
    assert host_dir_for(tmp_path, "flat") == (tmp_path, "flat")


# ------------------------------------------------------------------------------------------ bootstrap


#: Hang guards only: how long a rendezvous below may wait before the test fails instead of hanging.
#: A working run never waits this long; a slow one waits longer than usual and still passes.
GUARD_S = 120.0


def until(cond, what: str, guard_s: float = GUARD_S) -> None:  # type: ignore[no-untyped-def]
    """Wait until ``cond()`` holds (a rendezvous on something the process under test writes)."""
    give_up = time.monotonic() + guard_s
    while not cond():
        assert time.monotonic() < give_up, f"never happened: {what}"
        time.sleep(0.05)


def _run_python(code: str, env_extra: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRACEREAD_", "RANK", "LOCAL_RANK"))}
    env.update(env_extra)
    return subprocess.run([PY, "-c", code], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)


def test_bootstrap_chains_existing_sitecustomize_and_acts_only_in_ranks(tmp_path: Path) -> None:
    user = tmp_path / "userlib"
    user.mkdir()
    (user / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = 'yes'\n")
    run = tmp_path / "run"
    env, _ = collect_env(run, {"PYTHONPATH": str(user)}, {}, 999999)
    code = ("import os, sys; print(os.environ.get('USER_SITE_RAN'), '_traceread_rank' in sys.modules, "
            "os.environ.get('TRACEREAD_INJECTED_PID'))")
    # not a rank: chained user sitecustomize ran, nothing installed
    out = _run_python(code, {k: env[k] for k in ("PYTHONPATH", "TRACEREAD_RUN_DIR", "TRACEREAD_CONFIG",
                                                 "TRACEREAD_LAUNCHER_PID")}, tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[:2] == ["yes", "True"] and out.stdout.split()[2] == "None"
    assert not (run / "ranks").exists()
    # a rank: installs, writes its rank file and progress file, marks itself for its children
    out = _run_python(code, {k: env[k] for k in ("PYTHONPATH", "TRACEREAD_RUN_DIR", "TRACEREAD_CONFIG")}
                      | {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4"}, tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "yes" and out.stdout.split()[2].isdigit()
    info = read_json(run / "ranks" / "rank3.json")
    assert info and info["rank"] == 3 and info["local_rank"] == 1 and info["world_size"] == 4
    # the job's signals are left alone: the C-level fallback takes a free real-time signal, and a dump
    # is asked for through a FIFO
    assert info["signals"] == {"stacks": "SIGRTMAX"} and info["stack_signal"] == signal.SIGRTMAX
    assert Path(info["dump_trigger"]).name == "rank3.fifo" and not os.path.exists(info["dump_trigger"])
    assert read_progress(run / "progress" / "rank3")[0] == 0
    assert any(c["label"] == "exit" for c in info["clock"])


def test_stack_signal_asked_for_while_the_rank_exits_does_not_kill_it(tmp_path: Path) -> None:
    """The launcher's C-level stack fallback (a real-time signal) may reach a rank that is already
    shutting down, after faulthandler let go of the signal (a slow exit past the hang timeout): the
    signal is then ignored, not the default action that ended the job (exit -64). A program exec'd by
    the rank still starts with the signal's default action, so its own free-signal choice is unchanged."""
    run = tmp_path / "run"
    env, _ = collect_env(run, {}, {}, 999999)
    code = ("import faulthandler, os, signal, subprocess, sys\n"
            "child = 'import signal; print(signal.getsignal(signal.SIGRTMAX) == signal.SIG_DFL)'\n"
            "print(subprocess.run([sys.executable, '-c', child], capture_output=True, text=True).stdout.strip())\n"
            "faulthandler.unregister(signal.SIGRTMAX)  # what interpreter shutdown does\n"
            "os.kill(os.getpid(), signal.SIGRTMAX)  # the fallback asked for at that moment\n"
            "print('still running')\n")
    out = _run_python(code, {k: env[k] for k in ("PYTHONPATH", "TRACEREAD_RUN_DIR", "TRACEREAD_CONFIG")}
                      | {"RANK": "0"}, tmp_path)
    assert out.returncode == 0, (out.returncode, out.stderr[-2000:])
    assert out.stdout.split("\n")[:2] == ["True", "still running"], out.stdout
    assert read_json(run / "ranks" / "rank0.json")["stack_signal"] == signal.SIGRTMAX  # the fallback was armed


def test_bootstrap_skips_torchrun_agent_and_rank_children(tmp_path: Path) -> None:
    run = tmp_path / "run"
    env, _ = collect_env(run, {}, {}, 999999)
    base = {k: env[k] for k in ("PYTHONPATH", "TRACEREAD_RUN_DIR", "TRACEREAD_CONFIG")} | {"RANK": "0"}
    out = _run_python("pass", base | {"TRACEREAD_INJECTED_PID": "12345"}, tmp_path)
    assert out.returncode == 0 and not (run / "ranks").exists()
    agent = subprocess.run([PY, "-m", "torch.distributed.run", "--help"], env={**os.environ, **base},
                           capture_output=True, text=True, timeout=60)
    assert agent.returncode == 0 and not (run / "ranks").exists()


def test_bootstrap_install_failure_is_logged_and_harmless(tmp_path: Path) -> None:
    run = tmp_path / "run"
    env, _ = collect_env(run, {}, {}, 999999)
    base = {k: env[k] for k in ("PYTHONPATH", "TRACEREAD_RUN_DIR", "TRACEREAD_CONFIG")}
    out = _run_python("print('ok')", base | {"RANK": "0", "TRACEREAD_INJECT_FAIL": "install"}, tmp_path)
    assert out.returncode == 0 and out.stdout.strip() == "ok" and out.stderr == ""
    log = (run / "inject" / "rank0.log").read_text()
    assert "FAILED install" in log and "TRACEREAD_INJECT_FAIL" in log


def test_bootstrap_dump_while_main_thread_blocked(tmp_path: Path) -> None:
    """The dump thread answers while the main thread sits in a blocking call (no torch needed)."""
    run = tmp_path / "run"
    env, _ = collect_env(run, {}, {}, 999999)
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEREAD_")}
    child_env.update({k: env[k] for k in ("PYTHONPATH", "TRACEREAD_RUN_DIR", "TRACEREAD_CONFIG")} | {"RANK": "0"})
    script = tmp_path / "blocked.py"
    script.write_text("import time\n\ndef waiting_forever():\n    time.sleep(3600)\n\nwaiting_forever()\n")
    proc = subprocess.Popen([PY, str(script)], env=child_env)
    try:
        dog = Watchdog(run, grace_s=GUARD_S)  # dump_all returns as soon as the rank answers
        # the rank file is rewritten once its handlers are in place
        until(lambda: dog.local_ranks().get(0, {}).get("dump_trigger"), "the rank's dump trigger")
        dump = dog.dump_all("test")
        assert dump["answered_ranks"] == [0]
        stacks = (run / "stacks" / "rank0.txt").read_text()
        assert "blocked.py\", line 4 in waiting_forever" in stacks
        assert "_traceread_rank" not in stacks  # the dump thread leaves itself out
    finally:
        proc.kill()
        proc.wait()
        trigger = (read_json(run / "ranks" / "rank0.json") or {}).get("dump_trigger")
        if trigger and Path(trigger).parent.name.startswith("traceread-dump-"):
            shutil.rmtree(Path(trigger).parent)  # SIGKILL: no atexit (the launcher removes it in a real run)


def test_gil_held_rank_gets_c_level_stacks_on_a_free_realtime_signal(tmp_path: Path) -> None:
    """A rank stuck in C code holding the GIL cannot run the dump thread: the fallback is faulthandler
    on the real-time signal the rank registered (never SIGUSR1/SIGUSR2, which belong to the job)."""
    run = tmp_path / "run"
    env, _ = collect_env(run, {}, {}, 999999)
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEREAD_")}
    child_env.update({k: env[k] for k in ("PYTHONPATH", "TRACEREAD_RUN_DIR", "TRACEREAD_CONFIG")} | {"RANK": "0"})
    script = tmp_path / "gil.py"
    script.write_text("def holding_the_gil():\n    print('ready', flush=True)\n    sum(range(10**13))\n\n"
                      "holding_the_gil()\n")
    proc = subprocess.Popen([PY, str(script)], env=child_env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        busy = psutil.Process(proc.pid)
        start = busy.cpu_times().user
        # 0.3 s of CPU (not of wall time) since 'ready': only sum() runs after it, so the GIL is held from
        # here on however slowly the machine gets there
        until(lambda: busy.cpu_times().user >= start + 0.3, "0.3 s of CPU in sum()")
        dump = Watchdog(run, grace_s=1.0).dump_all("test")  # the rank cannot answer: the wait is a choice
        assert dump["asked_ranks"] == [0] and dump["answered_ranks"] == [] and dump["stack_fallback_ranks"] == [0]
        stacks = run / "stacks" / "rank0.txt"  # faulthandler writes it in the signal handler, when it runs
        until(lambda: stacks.exists() and 'gil.py", line 3 in holding_the_gil' in stacks.read_text(),
              "the C-level stack in stacks/rank0.txt")
        assert proc.poll() is None  # the signal dumped stacks; it did not end the job
    finally:
        proc.kill()
        proc.wait()
        trigger = (read_json(run / "ranks" / "rank0.json") or {}).get("dump_trigger")
        if trigger and Path(trigger).parent.name.startswith("traceread-dump-"):
            shutil.rmtree(Path(trigger).parent)


# ------------------------------------------------------------------------------------------- watchdog


def _progress(run: Path, rank: int, step: int, t_ns: int, pid: int = 1) -> None:
    (run / "progress").mkdir(parents=True, exist_ok=True)
    (run / "progress" / f"rank{rank}").write_text(f"{step:>12d} {t_ns:>20d} {pid:>10d}\n")


def test_watchdog_fixed_timeout_fires_once_per_stall(tmp_path: Path) -> None:
    dog = Watchdog(tmp_path, timeout_s=20.0, started_at=0.0)
    _progress(tmp_path, 0, 0, 0)
    assert not dog.poll(now=100.0)  # not armed before the first step
    _progress(tmp_path, 0, 1, 1_000_000_000)
    assert not dog.poll(now=101.0)
    assert not dog.poll(now=120.0)
    assert dog.poll(now=121.5)
    assert not dog.poll(now=200.0)  # reported already
    _progress(tmp_path, 0, 2, 2_000_000_000)
    assert not dog.poll(now=201.0)  # progress re-arms
    assert dog.poll(now=222.0)


def test_watchdog_adaptive_timeout_is_max_of_floor_and_factor_median(tmp_path: Path) -> None:
    dog = Watchdog(tmp_path, floor_s=30.0, factor=10.0, started_at=0.0)
    t = 0.0
    for step in range(1, 8):  # 5 s per step on rank 0, 7 s on rank 1 -> median 5 or 7
        _progress(tmp_path, 0, step, int(step * 5e9))
        _progress(tmp_path, 1, step, int(step * 7e9))
        t += 1.0
        dog.poll(now=t)
    assert dog.median_step_s() in (5.0, 6.0, 7.0)
    assert dog.effective_timeout_s() == pytest.approx(10.0 * dog.median_step_s())
    dog2 = Watchdog(tmp_path / "x", floor_s=30.0, factor=10.0)
    assert dog2.effective_timeout_s() is None  # unarmed, no start-up timeout


def test_watchdog_startup_timeout(tmp_path: Path) -> None:
    dog = Watchdog(tmp_path, startup_timeout_s=50.0, started_at=0.0)
    assert not dog.poll(now=49.0)
    assert dog.poll(now=51.0)


def test_nccl_pipes_get_one_byte_and_dead_pipes_are_skipped(tmp_path: Path) -> None:
    from traceread.collect.watchdog import poke_nccl_pipes

    os.mkfifo(tmp_path / "pipe_rank0.pipe")
    os.mkfifo(tmp_path / "pipe_rank1.pipe")  # no reader: like a rank that exited
    fd = os.open(tmp_path / "pipe_rank0.pipe", os.O_RDONLY | os.O_NONBLOCK)  # the reader, open before the poke
    try:
        assert poke_nccl_pipes(tmp_path) == ["pipe_rank0.pipe"]
        assert os.read(fd, 16) == b"1"  # written before poke_nccl_pipes returned: in the pipe now
    finally:
        os.close(fd)


# --------------------------------------------------------------------------------------------- runinfo


def test_merge_host_runs(tmp_path: Path) -> None:
    for host, ranks, code in (("a", [0, 1], 0), ("b", [2, 3], 3)):
        (tmp_path / host).mkdir()
        write_json(tmp_path / host / "run.json", {
            "host": host, "exit_code": code, "start_ns": 10 if host == "a" else 5, "end_ns": 20,
            "command": ["x"], "ranks": {str(r): {"rank": r, "host": host, "pid": 100 + r, "world_size": 4} for r in ranks}})
    merged = merge_host_runs(tmp_path)
    assert merged == read_json(tmp_path / "run.json")
    assert merged["hosts"] == ["a", "b"] and sorted(merged["ranks"]) == ["0", "1", "2", "3"]
    assert merged["exit_code"] == 3 and merged["start_ns"] == 5
    assert merged["world"]["world_size"] == 4 and [r["rank"] for r in merged["world"]["nodes"]["b"]] == [2, 3]
    assert merged["clock"]["uncertainty_us"] == {"0": 0.0, "1": 0.0, "2": None, "3": None}


def test_clock_offsets_use_measurement_only_across_hosts() -> None:
    from traceread.collect.runinfo import clock_offsets

    ranks = {0: {"host": "a", "clock_sync": {"offset_ns": 0, "uncertainty_ns": 0}},
             1: {"host": "a", "clock_sync": {"offset_ns": 900, "uncertainty_ns": 70_000}},
             2: {"host": "b", "clock_sync": {"offset_ns": -2_500_000, "uncertainty_ns": 80_000}},
             3: {"host": "b"}}
    c = clock_offsets(ranks)
    assert c["offsets_us"] == {"0": 0.0, "1": 0.0, "2": -2500.0, "3": 0.0}
    assert c["uncertainty_us"] == {"0": 0.0, "1": 0.0, "2": 80.0, "3": None}
    assert c["measured"]["1"] == {"offset_us": 0.9, "uncertainty_us": 70.0}


# -------------------------------------------------------------------------------------------- launcher


def test_launcher_exit_code_and_log_copy(tmp_path: Path) -> None:
    code = "import sys; print('to-out'); print('to-err', file=sys.stderr); sys.exit(7)"
    assert run_collect(_opts(tmp_path / "run", [PY, "-c", code])) == 7
    log = (tmp_path / "run" / "launcher.log").read_text()
    assert "to-out" in log and "to-err" in log
    doc = read_json(tmp_path / "run" / "run.json")
    assert doc["exit_code"] == 7 and doc["command"][0] == PY and doc["layout"] == "flat"
    # the single process started by the launcher counts as rank 0
    assert doc["ranks"]["0"]["pid"] > 0


def test_launcher_missing_command(tmp_path: Path) -> None:
    assert run_collect(_opts(tmp_path / "run", ["/nonexistent/prog"])) == 127


def test_launcher_child_killed_by_signal(tmp_path: Path) -> None:
    code = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    assert run_collect(_opts(tmp_path / "run", [PY, "-c", code])) == 128 + 9


def test_cli_forwards_sigterm_and_returns_child_code(tmp_path: Path) -> None:
    child = ("import signal, sys, time\n"
             "signal.signal(signal.SIGTERM, lambda *a: sys.exit(42))\n"
             "print('ready', flush=True)\ntime.sleep(3600)\n")
    proc = subprocess.Popen([PY, "-m", "traceread.cli", "collect", "-o", str(tmp_path / "run"), "--", PY, "-c", child],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 42


def test_cli_help_has_examples() -> None:
    from traceread.cli import cli

    result = CliRunner().invoke(cli, ["collect", "--help"])
    assert result.exit_code == 0
    assert "traceread collect -o runs/exp1 -- torchrun" in result.output and "--hang-timeout" in result.output


def test_cli_requires_command(tmp_path: Path) -> None:
    from traceread.cli import cli

    result = CliRunner().invoke(cli, ["collect", "-o", str(tmp_path / "r")])
    assert result.exit_code != 0 and "COMMAND" in result.output


# --------------------------------------------------------------------------------------------- samples


@pytest.mark.parametrize("name", ["cpu_ddp_gloo", "cpu_straggler_gloo", "cpu_hang_gloo"])
def test_recorded_samples_follow_the_run_folder_contract(samples_dir: Path, name: str) -> None:
    """The committed samples (tests/jobs/record_samples.sh) have the files report/hang rely on."""
    run = samples_dir / name
    doc = read_json(run / "run.json")
    assert doc and sorted(doc["ranks"]) == ["0", "1"] and doc["world"]["world_size"] == 2
    for r in (0, 1):
        assert (run / "traces" / f"rank{r}.pt.trace.json.gz").stat().st_size > 1000
        assert read_json(run / "ranks" / f"rank{r}.json")["pid"] == doc["ranks"][str(r)]["pid"]
    if name == "cpu_hang_gloo":
        hang = read_json(run / "hang.json")
        assert doc["exit_code"] != 0 and hang["answered_ranks"] == [0, 1]
        assert set(hang) >= {"detected_at", "timeout_s", "answered_ranks", "action", "last_step_per_rank"}
        fr = [read_json(run / "fr" / f"rank{r}.json") for r in (0, 1)]
        enqueued = [int(d["pg_status"]["0"]["last_enqueued_collective"]) for d in fr]
        assert enqueued[0] == enqueued[1] + 1  # rank 1 never issued the collective rank 0 waits in
        assert "in stuck_in_data_loading" in (run / "stacks" / "rank1.txt").read_text()
    else:
        assert doc["exit_code"] == 0 and doc["hang"] is None


@pytest.mark.slow
def test_plain_python_job_is_rank0_and_profiled(tmp_path: Path) -> None:
    """``traceread collect -- python train.py`` (no torchrun): the direct child is rank 0, gets a trace."""
    needs.module("torch")
    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "print(type(torch.__spec__.loader).__name__, type(torch.__loader__).__name__)\n"
        "m = torch.nn.Linear(8, 8); opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for _ in range(6):\n"
        "    m(torch.randn(4, 8)).sum().backward(); opt.step(); opt.zero_grad()\n")
    run = tmp_path / "run"
    assert run_collect(_opts(run, [PY, str(script)], wait=0, warmup=1, active=2)) == 0
    assert "SourceFileLoader SourceFileLoader" in (run / "launcher.log").read_text()  # wrapper removed
    info = read_json(run / "ranks" / "rank0.json")
    assert info["steps"] == 6 and info["profiler_steps"] == [1, 2] and "dist" not in info
    import gzip

    with gzip.open(run / "traces" / "rank0.pt.trace.json.gz", "rt") as fh:
        names = {e.get("name") for e in json.load(fh)["traceEvents"]}
    assert {"ProfilerStep#1", "ProfilerStep#2", "Optimizer.step#SGD.step"} <= names


def test_refuses_to_mix_runs_unless_overwrite(tmp_path: Path) -> None:
    from traceread.errors import TraceReadError

    run = tmp_path / "run"
    assert run_collect(_opts(run, [PY, "-c", "print('first')"])) == 0
    with pytest.raises(TraceReadError, match="already holds a collected run"):
        run_collect(_opts(run, [PY, "-c", "pass"]))
    assert run_collect(_opts(run, [PY, "-c", "print('second')"], overwrite=True)) == 0
    log = (run / "launcher.log").read_text()
    assert "second" in log and "first" not in log


def test_sigusr1_to_launcher_dumps_every_rank(tmp_path: Path) -> None:
    """``kill -USR1 <traceread>``: the (single, rank 0) job dumps its stacks and goes on running."""
    script = tmp_path / "job.py"
    script.write_text("import time\n\ndef busy_waiting():\n    print('ready', flush=True)\n    time.sleep(3600)\n\n"
                      "busy_waiting()\n")
    run = tmp_path / "run"
    proc = subprocess.Popen([PY, "-m", "traceread.cli", "collect", "-o", str(run), "--", PY, str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGUSR1)
        until((run / "inject" / "rank0.ack").exists, "the rank's ack")  # written after its stacks
        assert read_json(run / "inject" / "rank0.ack")["reason"] == "request"
        assert 'job.py", line 5 in busy_waiting' in (run / "stacks" / "rank0.txt").read_text()
        assert proc.poll() is None  # dump only: the job keeps running
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    doc = read_json(run / "run.json")
    assert doc["dumps"][0]["reason"] == "SIGUSR1" and doc["dumps"][0]["answered_ranks"] == [0]
    assert doc["hang"] is None


@pytest.mark.slow
def test_on_hang_dump_keeps_the_job_running(tmp_path: Path) -> None:
    """A job that stops stepping for a while: hang.json + stacks, and the job goes on stepping and
    finishes (exit 0). Each pause lasts until the rank has answered that hang's dump (its ack file
    names the step it was at), not a fixed time: the dump always finds it there, however slow the
    machine. The job pauses again after its last step, so a slow exit is part of that second stall,
    already dumped, and never a stall of its own."""
    needs.module("torch")
    script = tmp_path / "train.py"
    run = tmp_path / "run"
    script.write_text(
        "import json, os, time, torch\n"
        f"ACK, GIVE_UP = {str(run / 'inject' / 'rank0.ack')!r}, time.monotonic() + {GUARD_S}\n"
        "def dumped_at(step):\n"
        "    return os.path.exists(ACK) and json.load(open(ACK))['step'] == step\n"
        "def slow_checkpoint(step):\n"
        "    while not dumped_at(step) and time.monotonic() < GIVE_UP: time.sleep(0.05)\n"
        "m = torch.nn.Linear(4, 4); opt = torch.optim.SGD(m.parameters(), lr=0.1)\n"
        "for step in range(6):\n"
        "    m(torch.randn(2, 4)).sum().backward(); opt.step()\n"
        "    if step in (2, 5):\n"
        "        slow_checkpoint(step + 1)\n")
    assert run_collect(_opts(run, [PY, str(script)], hang_timeout_s=2.5, profile=False)) == 0
    hang = read_json(run / "hang.json")  # the latest hang: the pause after the last step
    assert hang["action"] == "dump" and hang["answered_ranks"] == [0] and hang["last_step_per_rank"] == {"0": 6}
    stacks = (run / "stacks" / "rank0.txt").read_text()
    assert stacks.count('train.py", line 6 in slow_checkpoint') == 2, stacks
    doc = read_json(run / "run.json")
    assert [d["answered_ranks"] for d in doc["dumps"]] == [[0], [0]], doc["dumps"]
    doc = read_json(run / "run.json")
    assert doc["exit_code"] == 0 and doc["ranks"]["0"]["steps"] == 6
    assert doc["ranks"]["0"]["env"]["TORCHELASTIC_ERROR_FILE"] == str(run.resolve() / "errors" / "rank0.json")
