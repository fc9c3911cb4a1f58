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
import stat
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from traceread import __version__
from traceread.collect.env import collect_env
from traceread.collect.job_profiler import job_profilers, summary_line
from traceread.collect.runinfo import build_run_json, iso, merge_host_runs, pid_running, read_ranks, write_json
from traceread.collect.schedule import DEFAULT_ACTIVE, DEFAULT_WAIT, DEFAULT_WARMUP, short_job_active, too_short_note
from traceread.collect.telemetry import start_telemetry
from traceread.collect.watch import Watch, WatchOptions
from traceread.collect.watchdog import DEFAULT_FACTOR, DEFAULT_FLOOR_S, Watchdog
from traceread.errors import TraceReadError
from traceread.textsafe import clean_lines

SUBDIRS = ("traces", "ranks", "progress", "inject", "stacks", "fr", "nccl", "errors", "captures")
OPTIONAL_SUBDIRS = ("memory",)  # created only when asked for (--memory-snapshot)
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
    memory_snapshot: bool = False  # RUN/memory/rank{R}.pickle at the window's end, rank{R}_oom.pickle on OOM
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
    watch: WatchOptions = field(default_factory=WatchOptions)  # the slow-step watch (docs/watch.md)

    def profiler_config(self) -> dict[str, Any]:
        return {"wait": self.wait, "warmup": self.warmup, "active": self.active, "repeat": self.repeat,
                "every": self.every, "max_cycles": self.max_cycles,
                "ranks": self.ranks, "record_shapes": self.record_shapes, "with_stack": self.with_stack,
                "profile_memory": self.profile_memory or self.memory_snapshot,
                "memory_snapshot": self.memory_snapshot, "profile": self.profile}


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
    """``<host>``, or ``<host>.<local task>`` when srun/mpirun runs several launchers on one host;
    ``TRACEREAD_HOST_FOLDER`` names it outright (a launcher that places several per-node commands on
    one machine, e.g. collectors/ray/launch.py on a one-node Ray cluster)."""
    env = dict(os.environ) if env is None else env
    if env.get("TRACEREAD_HOST_FOLDER", "").strip(". /"):
        return env["TRACEREAD_HOST_FOLDER"].strip().replace("/", "_")
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
    """Copies the child's stdout/stderr lines to our own streams and to ``launcher.log`` (when it can)."""

    def __init__(self, log_path: Path | None, echo: bool) -> None:
        self.log: IO[bytes] | None = None
        self.log_path = log_path
        self.open_error: str | None = None
        if log_path is not None:
            try:
                self.log = open(log_path, "ab", buffering=0)
            except OSError as exc:
                self.open_error = exc.strerror or str(exc)
        self.log_failed = False
        self.lock = threading.Lock()
        self.echo = echo
        self.threads: list[threading.Thread] = []

    def pump(self, src: IO[bytes], dst: IO[bytes]) -> None:
        def run() -> None:
            # signals for the launcher must reach its main thread, which forwards them
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1,
                                                         signal.SIGUSR2})
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
        _stderr(line)

    def _log(self, line: bytes) -> None:
        """Copy to launcher.log; a run folder that became unwritable (full disk, read-only remount)
        stops the copy, never the pump: a pump that died would stop draining the job's pipe and hang it.
        The first failure is said once on stderr, so a short log is not mistaken for the whole output."""
        with self.lock:
            if self.log is None or self.log.closed or self.log_failed:
                return
            try:
                self.log.write(line)
                return
            except OSError as exc:
                self.log_failed = True
                reason = exc.strerror or str(exc)
        _stderr(f"[traceread] {clean_lines(str(self.log_path))}: cannot write any more ({clean_lines(reason)}); "
                "the job's output from here on is not in launcher.log\n".encode())

    def close(self, timeout: float = 5.0) -> None:
        for t in self.threads:
            t.join(timeout)  # a grandchild may keep the pipe open; do not wait for it forever
        with self.lock:
            if self.log is not None:
                self.log.close()


def _stderr(line: bytes) -> None:
    try:
        sys.stderr.buffer.write(line)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def make_host_dir(host_dir: Path) -> str | None:
    """Create the folder this launcher writes into and its sub-folders; why not, when it cannot.

    A folder that cannot be created (read-only file system, immutable parent, no free inodes, a path
    through a file) must not stop the job: the caller runs it without collection. A sub-folder that
    cannot be made is left to the ranks (each part of the collection fails on its own, quietly)."""
    try:
        host_dir.mkdir(parents=True, exist_ok=True)
        if not os.access(host_dir, os.W_OK | os.X_OK):
            return "not writable"
    except OSError as exc:
        return exc.strerror or str(exc)
    except RuntimeError as exc:  # a symlink loop on the way
        return str(exc)
    for sub in SUBDIRS:
        try:
            (host_dir / sub).mkdir(exist_ok=True)
        except OSError:
            pass
    return None


def prepare_host_dir(host_dir: Path, overwrite: bool) -> None:
    """Refuse to mix two runs in one folder; with ``overwrite`` remove what an earlier run wrote."""
    earlier = [host_dir / n for n in ("run.json", "hang.json", "launcher.log", "watch.json")
               if (host_dir / n).exists()]
    earlier += [p for sub in SUBDIRS + OPTIONAL_SUBDIRS if (host_dir / sub).is_dir() for p in (host_dir / sub).iterdir()]
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
    """Run ``opts.command`` under collection; returns the exit code the launcher must exit with.

    When the run folder cannot be used the command still runs, unchanged and uncollected, with one
    warning: collect never changes the job's outcome."""
    try:
        run_root = opts.run_dir.resolve()
    except (OSError, RuntimeError):  # a symlink loop: the folder is unusable, said below
        run_root = Path(os.path.abspath(opts.run_dir))
    host_dir, layout = host_dir_for(run_root, opts.layout)
    try:
        prepare_host_dir(host_dir, opts.overwrite)
        problem = make_host_dir(host_dir)
        if problem is None and opts.memory_snapshot:
            (host_dir / "memory").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        problem = exc.strerror or str(exc)
    collecting = problem is None
    if collecting:
        env, added = collect_env(host_dir, os.environ, opts.profiler_config(), os.getpid(),
                                 inject=opts.inject, fr_buffer=opts.fr_buffer)
    else:
        env, added = dict(os.environ), {}
    tee = _Tee(host_dir / "launcher.log" if collecting else None, opts.echo)
    start_ns = time.time_ns()
    if collecting:
        tee.note(f"collecting into {host_dir} ({layout} layout): {' '.join(opts.command)}")
        if tee.open_error:
            tee.note(f"{host_dir / 'launcher.log'}: {tee.open_error}; the job's output is not copied there")
    else:
        tee.note(f"cannot use {host_dir}: {problem}; running the command without collection: "
                 f"{' '.join(opts.command)}")
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
        # SIGUSR2 is the job's (SLURM's --signal=USR2@N before the time limit, checkpoint-on-preemption
        # handlers): forwarded like SIGTERM, never taken for ourselves (its default would kill us).
        for sig, handler in ((signal.SIGINT, forward), (signal.SIGTERM, forward), (signal.SIGHUP, forward),
                             (signal.SIGUSR2, forward), (signal.SIGUSR1, on_usr1)):
            previous[sig] = signal.signal(sig, handler)
    try:
        proc = subprocess.Popen(opts.command, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True)
    except OSError as exc:
        for restored, old_handler in previous.items():
            signal.signal(restored, old_handler)
        tee.note(f"cannot start {opts.command[0]!r}: {exc.strerror or exc}")
        tee.close()
        if collecting:
            _finalize_quietly(opts, run_root, host_dir, layout, added, start_ns, EXIT_NOT_FOUND, None, None, [])
        return EXIT_NOT_FOUND
    child["pid"] = proc.pid
    for signum in pending:
        _killpg(proc.pid, signum)
    assert proc.stdout is not None and proc.stderr is not None  # both are pipes (above)
    tee.pump(proc.stdout, sys.stdout.buffer)
    tee.pump(proc.stderr, sys.stderr.buffer)

    dog = Watchdog(host_dir, timeout_s=opts.hang_timeout_s, floor_s=opts.hang_floor_s, factor=opts.hang_factor,
                   startup_timeout_s=opts.startup_timeout_s, grace_s=opts.dump_grace_s)
    telemetry = start_telemetry(host_dir) if collecting else None  # GPU sensors, ~1 Hz (collect/telemetry.py)
    hang: dict[str, Any] | None = None
    dumps: list[dict[str, Any]] = []
    watch = Watch(host_dir, opts.watch, opts.profiler_config(), tee.note) if collecting and opts.inject else None

    def capture_dump(reason: str) -> dict[str, Any]:  # recorded in the capture's trigger.json, not in "dumps"
        return dog.dump_all(reason, signal_fallback=False)
    killed_for_hang = False
    watchdog_broken = not collecting
    try:
        while proc.poll() is None:
            try:
                proc.wait(timeout=opts.poll_s)
                break
            except subprocess.TimeoutExpired:
                pass
            if watchdog_broken:
                if dump_requested.is_set():
                    dump_requested.clear()
                    tee.note("SIGUSR1 received: no dump, nothing is collected in this run")
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
                continue
            if watch is not None:
                try:
                    watch.poll(capture_dump)
                except Exception as exc:  # never the job's problem: the watch stops, the job and watchdog go on
                    tee.note(f"watch stopped: {type(exc).__name__}: {exc}")
                    watch = None
    finally:
        for restored, old_handler in previous.items():
            signal.signal(restored, old_handler)
    returncode = proc.wait()
    if telemetry is not None:
        opts.extra["telemetry"] = telemetry.stop()
    if watch is not None:
        try:
            watch.finish()
        except Exception as exc:
            tee.note(f"watch: cannot close the captures: {type(exc).__name__}: {exc}")
    tee.close()
    code = _exit_code(returncode)
    if killed_for_hang and code == 0:
        code = EXIT_HANG_KILLED
    if collecting:
        _finalize_quietly(opts, run_root, host_dir, layout, added, start_ns, code, returncode, hang, dumps)
        summary = "".join(f"[traceread] {clean_lines(line)}\n"
                          for line in closing_summary(opts, run_root, host_dir, code, hang, time.time_ns() - start_ns))
        if opts.echo:
            sys.stderr.write(summary)
        try:
            with open(host_dir / "launcher.log", "a", encoding="utf-8") as log:
                log.write(summary)
        except OSError:
            pass
    return code


def capture_summary(host_dir: Path) -> str | None:
    """One line on the captures (the watch's and snap's): how many, which kinds, where."""
    from traceread.collect.captures import capture_dir, capture_ids
    from traceread.collect.runinfo import read_json

    ids = capture_ids(host_dir)
    if not ids:
        return None
    kinds = []
    for cid in ids:
        trig = read_json(capture_dir(host_dir, cid) / "trigger.json") or {}
        steps = trig.get("steps")
        where = f"steps {steps[0]}-{steps[1]}" if isinstance(steps, list) and len(steps) == 2 else "no steps"
        traces = len(list(capture_dir(host_dir, cid).glob("rank*.pt.trace.json.gz")))
        kinds.append(f"#{cid} {trig.get('kind', '?')} {where} ({traces} trace(s))")
    return f"  caught:  {len(ids)} capture(s) in {host_dir / 'captures'}: " + "; ".join(kinds)


def _no_trace_note(host_dir: Path, opts: CollectOptions) -> str | None:
    """Why no trace was written, when none was: no rank imported torch, or the job was too short."""
    try:
        if any((host_dir / "traces").glob("rank*.pt.trace.json*")):
            return None
        ranks = read_ranks(host_dir)
    except OSError:
        return None
    if ranks and not any(i.get("torch") for i in ranks.values()):
        return (f"no trace: no rank imported torch ({len(ranks)} rank(s) ran without it), so there was "
                "nothing to profile")
    steps = [int(i["steps"]) for i in ranks.values() if isinstance(i.get("steps"), int)]
    return too_short_note(max(steps) if steps else None, opts.wait, opts.warmup, opts.active)


def _finalize_quietly(*args: Any) -> None:
    """:func:`_finalize`; a run folder that became unwritable is one line: the job's exit code still wins."""
    try:
        _finalize(*args)
    except OSError as exc:
        _stderr(f"[traceread] {clean_lines(str(exc))}: run.json not written\n".encode())


def _terminate(proc: subprocess.Popen, grace_s: float, rank_pids: list[int]) -> None:
    """SIGTERM the group and the ranks, SIGKILL whatever is left after ``grace_s``.

    torchrun starts each worker in its own session, so the ranks are signalled by pid as well
    (pids come from ``ranks/rank{R}.json``; only live processes we started are signalled).
    """
    _killpg(proc.pid, signal.SIGTERM)
    for pid in rank_pids:
        _kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and (proc.poll() is None or any(pid_running(p) for p in rank_pids)):
        time.sleep(0.1)
    _killpg(proc.pid, signal.SIGKILL)
    for pid in rank_pids:
        _kill(pid, signal.SIGKILL)


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def _finalize(opts: CollectOptions, run_root: Path, host_dir: Path, layout: str, added: dict[str, str],
              start_ns: int, code: int, returncode: int | None, hang: dict[str, Any] | None,
              dumps: list[dict[str, Any]]) -> None:
    """Merge rank files into run.json; drop empty placeholder files (stacks opened for faulthandler)."""
    end_ns = time.time_ns()
    fifos = [*(host_dir / "fr").glob("pipe_rank*.pipe"), *(host_dir / "inject").glob("rank*.dump")]
    fifos += [Path(i["dump_trigger"]) for i in read_ranks(host_dir).values() if isinstance(i.get("dump_trigger"), str)]
    for path in fifos:  # NCCL's and the dump threads' FIFOs are useless after the job (a killed rank left its own)
        try:
            if stat.S_ISFIFO(path.lstat().st_mode):
                path.unlink()
            if path.parent.name.startswith("traceread-dump-"):
                path.parent.rmdir()
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
        "telemetry": opts.extra.get("telemetry"),
        "files": _inventory(host_dir),
    }
    write_json(host_dir / "run.json", build_run_json(host_dir, base))
    if layout == "per-host":
        merge_host_runs(run_root)


def _inventory(host_dir: Path) -> dict[str, list[str]]:
    """Relative paths of what was collected, per kind (so a reader knows what to expect)."""
    out = {}
    for sub in ("traces", "fr", "stacks", "errors", "nccl", "memory", "captures"):
        if sub in ("memory", "captures") and not (host_dir / sub).is_dir():
            continue
        found = (host_dir / sub).rglob("*") if sub == "captures" else (host_dir / sub).glob("*")
        out[sub] = sorted(str(p.relative_to(host_dir)) for p in found if p.is_file() and not p.name.startswith("."))
    return out


def closing_summary(opts: CollectOptions, run_root: Path, host_dir: Path, code: int, hang: dict[str, Any] | None,
                    elapsed_ns: int) -> list[str]:
    """The lines printed after every collect: what ran, what was collected where (a window cut short
    by the end of the job says so), and the command to run next."""
    import shlex

    ranks = read_ranks(host_dir)
    traces = sorted(p for p in (host_dir / "traces").rglob("rank*.pt.trace.json*") if p.is_file())
    partial = {r: i["partial"] for r, i in ranks.items() if isinstance(i.get("partial"), dict)}
    steps = sorted({(min(i["profiler_steps"]), max(i["profiler_steps"])) for i in ranks.values()
                    if isinstance(i.get("profiler_steps"), list) and i["profiler_steps"]})
    ran = sorted({int(i["steps"]) for i in ranks.values() if isinstance(i.get("steps"), int)})
    did = "" if not ran else (f", {ran[0]} optimizer step(s)" if len(ran) == 1 else
                              f", {ran[0]}-{ran[-1]} optimizer steps by rank")
    lines = [f"done in {elapsed_ns / 1e9:.1f} s, exit code {code}{did}: {run_root}"]
    if traces:
        where = "steps unknown" if not steps else (
            f"steps {steps[0][0]}-{steps[0][1]}" if len(steps) == 1 else "steps differ by rank")
        lines.append(f"  traces:  {len(traces)} file(s) from {len(ranks) or '?'} rank(s), {where}, in {host_dir / 'traces'}")
        if partial:
            p = next(iter(partial.values()))
            cut = ("the job started its own profiler after traceread recorded" if "profiler" in str(p.get("cut_by"))
                   else "the job ended after recording")
            lines.append(f"  partial: {cut} {p.get('recorded')} of the --active {p.get('active')} "
                         f"steps on {len(partial)} rank(s); those steps are kept and reported")
    elif job_profilers(ranks):
        lines.append("  traces:  none from traceread: it stepped aside for the job's own profiler (below)")
    elif opts.profile and opts.inject:
        why = _no_trace_note(host_dir, opts)
        lines.append("  traces:  none — " + (why if why else
                                              "no rank reported an optimizer step (did the job step an optimizer?)"))
    extras = [f"{n} {what}" for n, what in ((len(list((host_dir / "nccl").glob("*"))), "NCCL log(s)"),
                                           (len(list((host_dir / "stacks").glob("*"))), "stack dump(s)"),
                                           (len(list((host_dir / "fr").glob("*"))), "Flight Recorder dump(s)"))
              if n]
    own = summary_line(ranks)
    if own:
        lines.append("  " + own)
    caught = capture_summary(host_dir)
    if caught:
        lines.append(caught)
    if extras:
        lines.append("  also:    " + ", ".join(extras))
    restarts = sorted(p.name for p in (host_dir / "attempts").glob("attempt*") if p.is_dir())
    if restarts:
        lines.append(f"  restarts: torchrun restarted the job {len(restarts)} time(s); each attempt's files are in "
                     f"{host_dir / 'attempts'}/attempt<K>")
    errors = sorted(p.name for p in (host_dir / "errors").glob("rank*.json")) if code else []
    quoted = shlex.quote(str(run_root))
    nxt = []
    if traces or any(j.get("traces") for j in job_profilers(ranks).values()):
        nxt.append(f"traceread report {quoted}")
    if hang or errors or restarts or (host_dir / "hang.json").exists() or any((host_dir / "fr").glob("*")):
        nxt.append(f"traceread hang {quoted}")  # a failed job too: it says which rank failed first
    torch_seen = any(i.get("torch") for i in ranks.values())
    if not traces and not nxt and (torch_seen or not ranks):  # a job without torch has nothing to profile
        run = [int(i["steps"]) for i in ranks.values() if isinstance(i.get("steps"), int)]
        nxt.append(f"traceread collect -o {shlex.quote(str(run_root) + '-2')} --wait 0 --warmup 1 --active "
                   f"{short_job_active(max(run)) if run else 3} -- {' '.join(shlex.quote(c) for c in opts.command)}")
    if nxt:
        lines.append("  next:    " + "   ".join(nxt))
    return lines
