"""``traceread collect``: run a training command unchanged and collect what explains its time and hangs.

The command runs as its own process group (``start_new_session``); SIGINT/SIGTERM to the launcher are
forwarded to the group; its stdout/stderr are streamed through line by line and copied to
``RUN/launcher.log``; the launcher exits with the command's exit code (128+N when it died of signal N).
No torch import here: the launcher must start on a login node without torch.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from traceread import __version__
from traceread.collect.env import collect_env
from traceread.collect.runinfo import build_run_json, iso, merge_host_runs, read_ranks, write_json
from traceread.collect.schedule import DEFAULT_ACTIVE, DEFAULT_WAIT, DEFAULT_WARMUP, too_short_note
from traceread.collect.watchdog import DEFAULT_FACTOR, DEFAULT_FLOOR_S, Watchdog
from traceread.errors import TraceReadError
from traceread.textsafe import clean_lines

SUBDIRS = ("traces", "ranks", "progress", "inject", "stacks", "fr", "nccl", "errors")
EXIT_HANG_KILLED = 124  # --on-hang kill, when the killed command itself exited 0
EXIT_NOT_FOUND = 127


@dataclass
class CollectOptions:
    """Everything ``traceread collect`` was asked to do (recorded in run.json)."""

    run_dir: Path
    command: list[str]
    wait: int = DEFAULT_WAIT
    warmup: int = DEFAULT_WARMUP
    active: int = DEFAULT_ACTIVE
    repeat: int = 1
    every: int = 0  # periodic profiling: one cycle every N steps (0: off; see docs/cycles.md)
    max_cycles: int = 10  # traces kept per rank: the first cycle and the latest ones
    ranks: str = "all"
    record_shapes: bool = True
    with_stack: bool = False
    profile_memory: bool = False
    profile: bool = True
    inject: bool = True
    hang_timeout_s: float | None = None
    hang_floor_s: float = DEFAULT_FLOOR_S
    hang_factor: float = DEFAULT_FACTOR
    startup_timeout_s: float | None = None
    on_hang: str = "dump"
    dump_grace_s: float = 10.0
    kill_grace_s: float = 15.0
    layout: str = "auto"  # auto | flat | per-host
    fr_buffer: int = 20000
    poll_s: float = 0.25
    echo: bool = True
    overwrite: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def profiler_config(self) -> dict[str, Any]:
        return {"wait": self.wait, "warmup": self.warmup, "active": self.active, "repeat": self.repeat,
                "every": self.every, "max_cycles": self.max_cycles,
                "ranks": self.ranks, "record_shapes": self.record_shapes, "with_stack": self.with_stack,
                "profile_memory": self.profile_memory, "profile": self.profile}


def multi_node_env(env: dict[str, str] | None = None) -> bool:
    """True when srun/mpirun started several launchers (per node or per task) that may share RUN."""
    env = dict(os.environ) if env is None else env
    for key in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES", "SLURM_NTASKS"):
        if env.get(key, "").isdigit() and int(env[key]) > 1 and "SLURM_PROCID" in env:
            return True
    for key in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"):
        if env.get(key, "").isdigit() and int(env[key]) > 1:
            return True
    return False


def host_folder_name(env: dict[str, str] | None = None) -> str:
    """``<host>``, or ``<host>.<local task>`` when srun/mpirun runs several launchers on one host."""
    env = dict(os.environ) if env is None else env
    host = socket.gethostname()
    local_size = env.get("SLURM_NTASKS_PER_NODE", env.get("OMPI_COMM_WORLD_LOCAL_SIZE", "1")).split("(")[0]
    local_id = env.get("SLURM_LOCALID", env.get("OMPI_COMM_WORLD_LOCAL_RANK", "0"))
    if local_size.isdigit() and int(local_size) > 1 and local_id.isdigit():
        return f"{host}.{local_id}"
    return host


def host_dir_for(run_dir: Path, layout: str) -> tuple[Path, str]:
    """Folder this launcher writes into: ``RUN`` (flat) or ``RUN/<host>`` (per-host)."""
    if layout == "auto":
        layout = "per-host" if multi_node_env() else "flat"
    if layout == "per-host":
        return run_dir / host_folder_name(), layout
    return run_dir, "flat"


class _Tee:
    """Copies the child's stdout/stderr lines to our own streams and to ``launcher.log``."""

    def __init__(self, log_path: Path, echo: bool) -> None:
        self.log = open(log_path, "ab", buffering=0)
        self.log_failed = False
        self.lock = threading.Lock()
        self.echo = echo
        self.threads: list[threading.Thread] = []

    def pump(self, src: IO[bytes], dst: IO[bytes]) -> None:
        def run() -> None:
            # signals for the launcher must reach its main thread, which forwards them
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1})
            for line in iter(src.readline, b""):
                self._log(line)
                if self.echo:
                    try:
                        dst.write(line)
                        dst.flush()
                    except (OSError, ValueError):
                        pass
            src.close()

        t = threading.Thread(target=run, daemon=True)
        t.start()
        self.threads.append(t)

    def note(self, text: str) -> None:
        """A launcher message: on stderr and in the log, prefixed so it is told apart from the job."""
        line = f"[traceread] {clean_lines(text)}\n".encode()
        self._log(line)
        try:
            sys.stderr.buffer.write(line)
            sys.stderr.flush()
        except (OSError, ValueError):
            pass

    def _log(self, line: bytes) -> None:
        """Copy to launcher.log; a run folder that became unwritable (full disk, read-only remount)
        stops the copy, never the pump: a pump that died would stop draining the job's pipe and hang it."""
        with self.lock:
            if self.log.closed or self.log_failed:
                return
            try:
                self.log.write(line)
            except OSError:
                self.log_failed = True

    def close(self, timeout: float = 5.0) -> None:
        for t in self.threads:
            t.join(timeout)  # a grandchild may keep the pipe open; do not wait for it forever
        with self.lock:
            self.log.close()


def prepare_host_dir(host_dir: Path, overwrite: bool) -> None:
    """Refuse to mix two runs in one folder; with ``overwrite`` remove what an earlier run wrote."""
    earlier = [host_dir / n for n in ("run.json", "hang.json", "launcher.log") if (host_dir / n).exists()]
    earlier += [p for sub in SUBDIRS if (host_dir / sub).is_dir() for p in (host_dir / sub).iterdir()]
    if earlier and not overwrite:
        raise TraceReadError("already holds a collected run; choose a new folder or pass --overwrite",
                             str(host_dir))
    for path in earlier:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run_collect(opts: CollectOptions) -> int:
    """Run ``opts.command`` under collection; returns the exit code the launcher must exit with."""
    run_root = opts.run_dir.resolve()
    host_dir, layout = host_dir_for(run_root, opts.layout)
    prepare_host_dir(host_dir, opts.overwrite)
    for sub in SUBDIRS:
        (host_dir / sub).mkdir(parents=True, exist_ok=True)
    env, added = collect_env(host_dir, os.environ, opts.profiler_config(), os.getpid(),
                             inject=opts.inject, fr_buffer=opts.fr_buffer)
    tee = _Tee(host_dir / "launcher.log", opts.echo)
    start_ns = time.time_ns()
    tee.note(f"collecting into {host_dir} ({layout} layout): {' '.join(opts.command)}")
    # Handlers first: a signal that arrives while the child starts is forwarded once it exists.
    dump_requested = threading.Event()
    pending: list[int] = []
    child: dict[str, int] = {}
    previous: dict[int, Any] = {}

    def forward(signum: int, _frame: Any) -> None:
        if "pid" in child:
            _killpg(child["pid"], signum)
        else:
            pending.append(signum)

    def on_usr1(_signum: int, _frame: Any) -> None:
        dump_requested.set()

    if threading.current_thread() is threading.main_thread():
        for sig, handler in ((signal.SIGINT, forward), (signal.SIGTERM, forward), (signal.SIGHUP, forward),
                             (signal.SIGUSR1, on_usr1)):
            previous[sig] = signal.signal(sig, handler)
    try:
        proc = subprocess.Popen(opts.command, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
    except OSError as exc:
        for restored, old_handler in previous.items():
            signal.signal(restored, old_handler)
        tee.note(f"cannot start {opts.command[0]!r}: {exc.strerror or exc}")
        tee.close()
        _finalize(opts, run_root, host_dir, layout, added, start_ns, EXIT_NOT_FOUND, None, None, [])
        return EXIT_NOT_FOUND
    child["pid"] = proc.pid
    for signum in pending:
        _killpg(proc.pid, signum)
    assert proc.stdout is not None and proc.stderr is not None  # both are pipes (above)
    tee.pump(proc.stdout, sys.stdout.buffer)
    tee.pump(proc.stderr, sys.stderr.buffer)

    dog = Watchdog(host_dir, timeout_s=opts.hang_timeout_s, floor_s=opts.hang_floor_s, factor=opts.hang_factor,
                   startup_timeout_s=opts.startup_timeout_s, grace_s=opts.dump_grace_s)
    hang: dict[str, Any] | None = None
    dumps: list[dict[str, Any]] = []
    killed_for_hang = False
    watchdog_broken = False
    try:
        while proc.poll() is None:
            try:
                proc.wait(timeout=opts.poll_s)
                break
            except subprocess.TimeoutExpired:
                pass
            if watchdog_broken:
                continue
            try:
                if dump_requested.is_set():
                    dump_requested.clear()
                    tee.note("SIGUSR1 received: asking every rank for stacks + Flight Recorder")
                    dump = dog.dump_all("SIGUSR1")
                    dumps.append({k: v for k, v in dump.items() if k != "acks"})
                    tee.note(f"dump answered by ranks {dump['answered_ranks']}")
                if dog.poll():
                    stalled = dog.stall_s(time.monotonic()) or 0.0
                    tee.note(f"HANG: no optimizer step for {stalled:.1f} s (timeout {dog.effective_timeout_s():.1f} s); "
                             f"last steps {dict((r, p.step) for r, p in sorted(dog.progress.items()))}; dumping")
                    dump = dog.dump_all("hang")
                    hang = dog.hang_record(opts.on_hang, dump)
                    dog.write_hang(hang)
                    dumps.append({k: v for k, v in dump.items() if k != "acks"})
                    tee.note(f"stacks + Flight Recorder answered by ranks {dump['answered_ranks']} "
                             f"(no answer: {dump['unanswered_ranks']}); see {host_dir / 'hang.json'}")
                    if opts.on_hang == "kill":
                        tee.note("--on-hang kill: terminating the job")
                        killed_for_hang = True
                        _terminate(proc, opts.kill_grace_s, [int(i["pid"]) for i in dog.local_ranks().values()])
                        break
            except OSError as exc:  # the run folder became unwritable: keep the job running, stop watching
                watchdog_broken = True
                tee.note(f"watchdog stopped, cannot write in {host_dir}: {exc}")
    finally:
        for restored, old_handler in previous.items():
            signal.signal(restored, old_handler)
    returncode = proc.wait()
    if opts.profile and opts.inject and not any((host_dir / "traces").glob("rank*.pt.trace.json*")):
        steps = [int(i["steps"]) for i in read_ranks(host_dir).values() if isinstance(i.get("steps"), int)]
        note = too_short_note(max(steps) if steps else None, opts.wait, opts.warmup, opts.active)
        if note:
            tee.note(note)
    tee.close()
    code = _exit_code(returncode)
    if killed_for_hang and code == 0:
        code = EXIT_HANG_KILLED
    try:
        _finalize(opts, run_root, host_dir, layout, added, start_ns, code, returncode, hang, dumps)
    except OSError as exc:  # the run folder became unwritable: the job's exit code still wins
        sys.stderr.write(f"[traceread] {clean_lines(str(exc))}: run.json not written\n")
    return code


def _terminate(proc: subprocess.Popen, grace_s: float, rank_pids: list[int]) -> None:
    """SIGTERM the group and the ranks, SIGKILL whatever is left after ``grace_s``.

    torchrun starts each worker in its own session, so the ranks are signalled by pid as well
    (pids come from ``ranks/rank{R}.json``; only live processes we started are signalled).
    """
    _killpg(proc.pid, signal.SIGTERM)
    for pid in rank_pids:
        _kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and (proc.poll() is None or any(_is_alive(p) for p in rank_pids)):
        time.sleep(0.1)
    _killpg(proc.pid, signal.SIGKILL)
    for pid in rank_pids:
        _kill(pid, signal.SIGKILL)


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def _is_alive(pid: int) -> bool:
    """Alive and not a zombie (a zombie rank is already dead; its parent just has not reaped it)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False


def _finalize(opts: CollectOptions, run_root: Path, host_dir: Path, layout: str, added: dict[str, str],
              start_ns: int, code: int, returncode: int | None, hang: dict[str, Any] | None,
              dumps: list[dict[str, Any]]) -> None:
    """Merge rank files into run.json; drop empty placeholder files (stacks opened for faulthandler)."""
    end_ns = time.time_ns()
    for path in (host_dir / "fr").glob("pipe_rank*.pipe"):  # NCCL's FIFOs are useless after the job
        try:
            path.unlink()
        except OSError:
            pass
    for path in (host_dir / "stacks").glob("rank*.txt"):
        try:
            if path.stat().st_size == 0:
                path.unlink()
        except OSError:
            pass
    options = {k: v for k, v in asdict(opts).items() if k not in ("run_dir", "command", "extra", "echo", "overwrite")}
    base = {
        "traceread_version": __version__,
        "command": list(opts.command),
        "cwd": os.getcwd(),
        "dir": str(host_dir),
        "layout": layout,
        "exit_code": code,
        "child_returncode": returncode,
        "start_ns": start_ns,
        "end_ns": end_ns,
        "start_time": iso(start_ns),
        "end_time": iso(end_ns),
        "duration_s": round((end_ns - start_ns) / 1e9, 3),
        "launcher": {"pid": os.getpid(), "python": sys.version.split()[0]},
        "options": options,
        "env_added": added,
        "hang": hang,
        "dumps": dumps,
        "files": _inventory(host_dir),
    }
    write_json(host_dir / "run.json", build_run_json(host_dir, base))
    if layout == "per-host":
        merge_host_runs(run_root)


def _inventory(host_dir: Path) -> dict[str, list[str]]:
    """Relative paths of what was collected, per kind (so a reader knows what to expect)."""
    out = {}
    for sub in ("traces", "fr", "stacks", "errors", "nccl"):
        out[sub] = sorted(str(p.relative_to(host_dir)) for p in (host_dir / sub).glob("*")
                          if p.is_file() and not p.name.startswith("."))
    return out
