"""What ``traceread collect`` does inside each training rank, with no change to the training script.

Loaded by the bootstrap ``sitecustomize.py`` at interpreter start. Self-contained (stdlib only; torch
is touched only after the user's own ``import torch`` finished) so the job's interpreter does not need
traceread installed. Every entry point catches everything: a failure here is logged to
``RUN/inject/rank{R}.log`` and the job runs on untouched.

What it installs, in a selected rank:

* ``RUN/ranks/rank{R}.json``: host, pid, world layout, clock samples, torch/NCCL versions, device
  (rewritten as more becomes known; the launcher merges these into ``RUN/run.json``).
* a global optimizer-step post hook (``torch.optim.optimizer.register_optimizer_step_post_hook``):
  writes the step count + wall time to ``RUN/progress/rank{R}`` (one ``pwrite`` per step, for the
  launcher's hang watchdog) and drives ``torch.profiler`` with ``prof.step()``; the trace of each
  finished cycle is written atomically to ``RUN/traces/rank{R}.pt.trace.json.gz`` (one cycle) or
  ``RUN/traces/cycle{C}/rank{R}.pt.trace.json.gz`` (``repeat`` > 1 or ``every``; at most
  ``max_cycles`` kept: the first and the latest, see docs/cycles.md).
* ``faulthandler`` on fatal signals and on one real-time signal nobody in the process had claimed
  (the highest free one, e.g. SIGRTMAX) -> ``RUN/stacks/rank{R}.txt`` (C level, no GIL).
* a dump thread blocked reading a FIFO (``$TMPDIR/traceread-dump-*/rank{R}.fifo``, else
  ``RUN/inject/rank{R}.dump``; its path is ``dump_trigger`` in the rank file): one byte from the launcher makes it dump all-thread
  stacks and the Flight Recorder buffer(s) to ``RUN/fr/rank{R}.json`` (pickle ``.pkl`` fallback), then
  write ``RUN/inject/rank{R}.ack``; it runs while the main thread is blocked inside a collective.
  No signal mask and no signal of the job's is touched: SIGUSR1/SIGUSR2 stay the job's (SLURM's
  ``--signal=USR2@60``, checkpoint-on-preemption handlers).
* a ``sys.excepthook`` that writes the torchelastic error file format to ``RUN/errors/rank{R}.json``
  and to torchrun's ``TORCHELASTIC_ERROR_FILE`` (the zero-code equivalent of ``@record``).
* with ``memory_snapshot``: a memory snapshot (``torch.cuda.memory._snapshot()``'s dict, pickled as
  ``_dump_snapshot`` does) at the end of each profiled window, ``RUN/memory/rank{R}.pickle``
  (``rank{R}_cycle{C}.pickle`` with several cycles), and ``RUN/memory/rank{R}_oom.pickle`` on an
  out-of-memory error. On a GPU the allocator's history is recorded during the window
  (``_record_memory_history``) and the OOM observer takes the snapshot before the error is raised; on
  a CPU-only job the snapshot is built from the window's profile (``_memory_viz._profile_to_snapshot``,
  which needs ``with_stack``), and an uncaught OOM error stops the profiler so the window so far is
  written. The job's exception and exit code are untouched.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import gzip
import json
import os
import pickle
import shutil
import signal
import socket
import stat
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any

import _traceread_capture

if TYPE_CHECKING:
    from types import FrameType

#: Real-time signals the C-level stack fallback may take, highest first; glibc keeps the lowest few.
_STACK_SIGNAL_CHOICES = tuple(range(signal.SIGRTMAX, signal.SIGRTMIN + 3, -1))
_AGENT_MODULES = ("torch.distributed.run", "torch.distributed.launch", "torchrun")


class _State:
    """Everything this module keeps for one rank process."""

    def __init__(self, run_dir: str, config: dict[str, Any], rank: int) -> None:
        self.run_dir = run_dir
        self.config = config
        self.rank = rank
        self.fail = {f.strip() for f in os.environ.get("TRACEREAD_INJECT_FAIL", "").split(",") if f.strip()}
        self.info: dict[str, Any] = {}
        self.lock = threading.Lock()
        self.step = 0
        self.driver: int | None = None  # id() of the optimizer whose steps count
        self.progress_fd: int | None = None
        self.stacks_file: Any = None
        self.prof: Any = None
        self.profile_selected = False
        self.profile_done = False
        self.cycles = 0
        self.partial: tuple[int, int] | None = None  # (active steps recorded, unfinished step) of a window cut short
        self.cycle_log: list[dict[str, Any]] = []  # one entry per finished cycle (info["cycles"])
        self.step_ns: dict[int, int] = {}  # profiler step number -> wall time it began (active steps only)
        self.torch_ready = False
        self.dist_described = False
        self.hook_handle: Any = None
        self.clock_thread: threading.Thread | None = None
        self.hook_s = 0.0  # total time spent in our step hook (reported, to prove it is cheap)
        self.mem_history = False  # CUDA allocator history recording (memory_snapshot)
        self.oom = False  # an out-of-memory error happened (the next snapshot is the OOM one)
        self.oom_written = False
        self.dump_trigger: str | None = None  # the FIFO the launcher writes a byte into to ask for a dump
        self.guard: Any = None  # _traceread_profiler_guard.Guard: watches the job's own profiler
        self.cut_by = "the exit"  # what cut a partial window short (the exit, or the job's own profiler)

    def path(self, *parts: str) -> str:
        return os.path.join(self.run_dir, *parts)


_STATE: _State | None = None


# ----------------------------------------------------------------------------------------- helpers


def _log(state: _State | None, msg: str) -> None:
    """Append one line to ``RUN/inject/rank{R}.log``; never raises."""
    try:
        if state is None:
            return
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
        with open(state.path("inject", f"rank{state.rank}.log"), "a", encoding="utf-8") as fh:
            fh.write(f"{stamp}Z pid={os.getpid()} {msg}\n")
    except Exception:
        pass


def _log_exc(state: _State | None, what: str) -> None:
    _log(state, f"FAILED {what}: {traceback.format_exc().strip()}")


def _atomic_write_json(path: str, obj: Any) -> None:
    text = json.dumps(obj, indent=1, default=str)  # serialise first: a failure leaves no partial file
    tmp = f"{path}.tmp{os.getpid()}.{threading.get_ident()}"
    _write_then_rename(tmp, path, text.encode("utf-8"))


def _write_then_rename(tmp: str, path: str, data: bytes) -> None:
    """``data`` to ``tmp``, renamed over ``path``; on any failure (a full disk) ``tmp`` is removed,
    so no empty or partial temp file is left in the run folder."""
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _clock_sample(label: str) -> dict[str, Any]:
    """Wall and monotonic clocks read back to back: lets report map monotonic-based times to wall."""
    t0 = time.time_ns()
    mono = time.monotonic_ns()
    t1 = time.time_ns()
    return {"label": label, "time_ns": (t0 + t1) // 2, "monotonic_ns": mono, "read_ns": t1 - t0}


def _fail_point(state: _State, name: str) -> None:
    """Test knob: ``TRACEREAD_INJECT_FAIL=export,hook,dump,install,torch`` raises at that point."""
    if name in state.fail:
        raise RuntimeError(f"traceread injected failure at {name!r} (TRACEREAD_INJECT_FAIL)")


def _is_agent() -> bool:
    """True in torchrun's own agent process (it must stay untouched)."""
    argv = list(getattr(sys, "orig_argv", []) or [])
    for i, arg in enumerate(argv[:4]):
        if arg == "-m" and i + 1 < len(argv) and argv[i + 1] in _AGENT_MODULES:
            return True
        if os.path.basename(arg) in ("torchrun",):
            return True
    return False


def _select_rank() -> int | None:
    """The global rank this process is, or None when traceread must not act here.

    Acts when RANK (or OMPI_COMM_WORLD_RANK / PMI_RANK; LOCAL_RANK in a world of 1) is set — a rank
    started by torchrun/srun/mpirun — or when this is the single process started directly by the
    launcher (rank SLURM_PROCID or 0). Never in torchrun's agent, never in a
    process started by a rank (dataloader/compile workers inherit ``TRACEREAD_INJECTED_PID``).
    """
    env = os.environ
    if env.get("TRACEREAD_INJECTED_PID") or _is_agent():
        return None
    for key in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if env.get(key, "").strip().isdigit():
            return int(env[key])
    if env.get("LOCAL_RANK", "").strip().isdigit() and env.get("WORLD_SIZE", "1") == "1":
        return int(env["LOCAL_RANK"])
    if env.get("TRACEREAD_LAUNCHER_PID") == str(os.getppid()):  # `traceread collect -- python train.py`
        task = env.get("SLURM_PROCID", "0")  # srun starting one launcher per task
        return int(task) if task.isdigit() else 0
    return None


def _wanted(ranks: str, rank: int) -> bool:
    if ranks.strip() in ("", "all", "*"):
        return True
    try:
        return rank in {int(r) for r in ranks.split(",") if r.strip()}
    except ValueError:
        return False


# ----------------------------------------------------------------------------------------- install


def install() -> None:
    """Entry point from ``sitecustomize``: set everything up in a selected rank; never raises."""
    global _STATE
    state: _State | None = None
    try:
        run_dir = _attempt_dir(os.environ.get("TRACEREAD_RUN_DIR", ""))
        rank = _select_rank()
        if not run_dir or rank is None:
            return
        config = json.loads(os.environ.get("TRACEREAD_CONFIG", "{}") or "{}")
        state = _State(run_dir, config, rank)
        os.environ["TRACEREAD_INJECTED_PID"] = str(os.getpid())
        for sub in ("inject", "ranks", "progress", "stacks", "fr", "traces", "errors", "nccl"):
            os.makedirs(state.path(sub), exist_ok=True)
        _STATE = state
        _log(state, f"install rank={rank} argv={getattr(sys, 'orig_argv', sys.argv)!r}")
        _fail_point(state, "install")
        _drop_legacy_env(state)
        # without torchrun nobody sets it: then ``@record`` in the script also writes into RUN/errors
        os.environ.setdefault("TORCHELASTIC_ERROR_FILE", state.path("errors", f"rank{rank}.json"))
        _describe_process(state)
        _write_rank_json(state)
    except BaseException:
        _log_exc(state, "install")
        return
    for name, fn in (
        ("progress", _open_progress),
        ("faulthandler", _install_faulthandler),
        ("dump-thread", _install_dump_thread),
        ("excepthook", _install_excepthook),
        ("torch-import-hook", _install_torch_hook),
    ):
        try:
            fn(state)
        except BaseException:
            _log_exc(state, name)
    try:
        atexit.register(_at_exit, state)
    except BaseException:
        _log_exc(state, "atexit")
    _write_rank_json(state)


def _attempt_dir(run_dir: str) -> str:
    """Where this rank writes: ``RUN`` in torchrun's first attempt (and without torchrun), else
    ``RUN/attempts/attempt{K}`` for restart K (``TORCHELASTIC_RESTART_COUNT``), so no attempt overwrites
    another's traces, progress, errors, stacks or dumps. The NCCL log and Flight Recorder paths the
    launcher pointed into ``RUN`` follow (NCCL and torch read them after this, at init)."""
    count = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if not run_dir or not count.isdigit() or int(count) == 0:
        return run_dir
    attempt = os.path.join(run_dir, "attempts", f"attempt{int(count)}")
    for key in ("NCCL_DEBUG_FILE", "TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
                "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"):
        value = os.environ.get(key, "")
        if value.startswith(run_dir + os.sep):
            os.environ[key] = attempt + value[len(run_dir):]
    return attempt


def _describe_process(state: _State) -> None:
    env = os.environ
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
            "ROLE_RANK", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT",
            "CUDA_VISIBLE_DEVICES", "SLURM_PROCID", "SLURM_NODEID", "OMPI_COMM_WORLD_RANK",
            "NCCL_DEBUG", "NCCL_DEBUG_FILE", "TORCH_FR_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE",
            "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
            "TORCHELASTIC_ERROR_FILE")
    state.info.update({
        "rank": state.rank,
        "local_rank": int(env["LOCAL_RANK"]) if env.get("LOCAL_RANK", "").isdigit() else None,
        "world_size": int(env["WORLD_SIZE"]) if env.get("WORLD_SIZE", "").isdigit() else None,
        "local_world_size": int(env["LOCAL_WORLD_SIZE"]) if env.get("LOCAL_WORLD_SIZE", "").isdigit() else None,
        "group_rank": int(env["GROUP_RANK"]) if env.get("GROUP_RANK", "").isdigit() else None,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "argv": list(getattr(sys, "orig_argv", sys.argv)),
        "python": sys.version.split()[0],
        "env": {k: env[k] for k in keys if k in env},
        "clock": [_clock_sample("start")],
        "signals": {},
        "profiled": False,
        "trace": None,
        "steps": 0,
        "inject_errors": [],
    })


def _drop_legacy_env(state: _State) -> None:
    """Unset the legacy FR names traceread added when this torch reads the new ``TORCH_FR_*`` ones.

    Both are exported by the launcher (it cannot know the job's torch); torch >= 2.8 warns about the
    legacy names. The version comes from package metadata: torch itself is not imported here.
    """
    legacy = [k for k in os.environ.get("TRACEREAD_LEGACY_ENV", "").split(",") if k]
    if not legacy:
        return
    from importlib import metadata

    try:
        major, minor = (int(x) for x in metadata.version("torch").split(".")[:2])
    except Exception:
        return
    if (major, minor) >= (2, 8):
        for key in legacy:
            os.environ.pop(key, None)


def _write_rank_json(state: _State) -> None:
    try:
        with state.lock:
            info = dict(state.info)
            info["steps"] = state.step
            info["hook_overhead_ms"] = round(state.hook_s * 1e3, 3)
        _atomic_write_json(state.path("ranks", f"rank{state.rank}.json"), info)
    except BaseException:
        _log_exc(state, "write ranks json")


def _open_progress(state: _State) -> None:
    state.progress_fd = os.open(state.path("progress", f"rank{state.rank}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    _write_progress(state)


def _write_progress(state: _State) -> None:
    """``"<step> <time_ns> <pid>"`` in fixed width at offset 0: one syscall, never a torn read."""
    if state.progress_fd is not None:
        os.pwrite(state.progress_fd, f"{state.step:>12d} {time.time_ns():>20d} {os.getpid():>10d}\n".encode(), 0)


def _install_faulthandler(state: _State) -> None:
    state.stacks_file = open(state.path("stacks", f"rank{state.rank}.txt"), "a", encoding="utf-8")
    faulthandler.enable(file=state.stacks_file, all_threads=True)
    signum = _free_signal()
    if signum is None:
        _log(state, "no free real-time signal: no C-level stack fallback in this rank")
        return
    try:
        # What faulthandler puts back when it lets go of the signal (interpreter shutdown): "ignore",
        # not the default action (end the process), so a fallback dump asked for while the job is
        # exiting (a slow exit past the hang timeout) cannot kill it. Exec'd children still start
        # with the default: exec resets a handler, and until shutdown the handler is faulthandler's.
        signal.signal(signum, signal.SIG_IGN)
    except (ValueError, OSError):  # not the main thread: as before, the default action comes back
        pass
    faulthandler.register(signum, file=state.stacks_file, all_threads=True, chain=False)
    state.info["signals"]["stacks"] = _signal_name(signum)
    state.info["stack_signal"] = signum


def _free_signal() -> int | None:
    """A real-time signal with its default action, i.e. that nothing in this process claimed."""
    for signum in _STACK_SIGNAL_CHOICES:
        try:
            if signal.getsignal(signum) == signal.SIG_DFL:
                return signum
        except (ValueError, OSError):
            continue
    return None


def _signal_name(signum: int) -> str:
    return "SIGRTMAX" if signum == signal.SIGRTMAX else f"SIGRTMAX-{signal.SIGRTMAX - signum}"


def _install_dump_thread(state: _State) -> None:
    """A thread blocked in ``read`` on a FIFO: the launcher's byte wakes it; no signal involved."""
    path, fd = _open_trigger(state)
    thread = threading.Thread(target=_dump_loop, args=(state, fd), name="traceread-dump", daemon=True)
    thread.start()
    state.dump_trigger = path
    state.info["dump_trigger"] = path


def _open_trigger(state: _State) -> tuple[str, int]:
    """Create and open (read-write, so it never reads end-of-file) this rank's dump FIFO.

    In a private folder of the local temp folder (``traceread-dump-*``, mode 0700): a FIFO in the run
    folder would trip tools that copy or archive it (``chattr -R``, ``rsync``) and some shared file
    systems refuse FIFOs; ``RUN/inject`` only when no temp folder is usable."""
    import tempfile

    last: BaseException | None = None
    for where in ("temp", "run"):
        try:
            if where == "temp":
                path = os.path.join(tempfile.mkdtemp(prefix="traceread-dump-"), f"rank{state.rank}.fifo")
            else:
                path = state.path("inject", f"rank{state.rank}.dump")
                try:
                    os.unlink(path)  # left by an earlier process with this rank (a restart)
                except FileNotFoundError:
                    pass
            os.mkfifo(path, 0o600)
            return path, os.open(path, os.O_RDWR | os.O_CLOEXEC)
        except OSError as exc:
            last = exc
            _log(state, f"dump FIFO in the {where} folder: {exc!r}")
    raise RuntimeError(f"no dump FIFO could be made: {last!r}")


_FAULTS = {signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGABRT}


def _quiet_thread() -> None:
    """Block asynchronous signals in a traceread thread so the kernel routes them to the job's threads.

    Without this, a SIGTERM sent to the rank may land on our thread: its Python handler then waits
    until the main thread next wakes up (e.g. the end of a ``time.sleep``). Fault signals stay open.
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, set(signal.valid_signals()) - _FAULTS)


def _dump_loop(state: _State, fd: int) -> None:
    try:
        _quiet_thread()
    except BaseException:
        _log_exc(state, "dump thread signal mask")
    while True:
        try:
            if not os.read(fd, 64):
                return
        except InterruptedError:
            continue
        except BaseException:
            _log_exc(state, "dump trigger read")
            return
        try:
            dump_now(state, reason="request")
        except BaseException:
            _log_exc(state, "dump")


def dump_now(state: _State, reason: str) -> dict[str, Any]:
    """Write all-thread stacks and the Flight Recorder buffer(s), then the ack file the launcher waits for."""
    started = time.time_ns()
    ack: dict[str, Any] = {"rank": state.rank, "pid": os.getpid(), "reason": reason, "time_ns": started,
                           "step": state.step, "stacks": None, "fr": [], "errors": []}
    try:
        _fail_point(state, "dump")
        if state.stacks_file is not None:
            state.stacks_file.write(f"\n=== traceread dump rank {state.rank} pid {os.getpid()} step {state.step} "
                                    f"at {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())} ({reason}) ===\n")
            state.stacks_file.flush()
            try:
                state.stacks_file.write(_format_other_threads())
            except BaseException:
                faulthandler.dump_traceback(file=state.stacks_file, all_threads=True)
            state.stacks_file.flush()
            ack["stacks"] = os.path.relpath(state.stacks_file.name, state.run_dir)
    except BaseException as exc:
        ack["errors"].append(f"stacks: {exc!r}")
    try:
        ack["fr"] = _dump_flight_recorder(state)
    except BaseException as exc:
        ack["errors"].append(f"fr: {exc!r}")
    ack["elapsed_ms"] = round((time.time_ns() - started) / 1e6, 3)
    _atomic_write_json(state.path("inject", f"rank{state.rank}.ack"), ack)
    _log(state, f"dump ({reason}) wrote stacks={ack['stacks']} fr={ack['fr']} errors={ack['errors']}")
    return ack


def _format_other_threads() -> str:
    """All threads but this dump thread, in faulthandler's exact text format (one parser for both).

    faulthandler would list this thread as "Current thread"; it only shows traceread's own frames.
    """
    me = threading.get_ident()
    main = threading.main_thread().ident
    out = []
    frames = sys._current_frames()
    for ident in sorted(frames, key=lambda i: (i != main, i)):
        if ident == me:
            continue
        out.append(f"Thread 0x{ident:016x} (most recent call first):\n")
        frame: FrameType | None = frames[ident]
        depth = 0
        while frame is not None and depth < 100:
            out.append(f'  File "{frame.f_code.co_filename}", line {frame.f_lineno} in {frame.f_code.co_name}\n')
            frame, depth = frame.f_back, depth + 1
        out.append("\n")
    return "".join(out)


def _dump_flight_recorder(state: _State) -> list[str]:
    """FR JSON from the NCCL recorder (CUDA builds) and/or the CPU (gloo) recorder; pickle fallback.

    ``fr/rank{R}.json`` is the NCCL recorder when it has entries, else the CPU recorder; when both have
    entries the CPU one also goes to ``fr/rank{R}.cpu.json``.
    """
    if "torch" not in sys.modules:
        return []
    c10d = getattr(sys.modules["torch"]._C, "_distributed_c10d", None)
    if c10d is None:
        return []
    dumps: list[tuple[str, bytes, str]] = []  # (recorder, payload, ext)
    for recorder, json_fn, pkl_fn in (("nccl", "_dump_nccl_trace_json", "_dump_nccl_trace"),
                                      ("cpu", "_dump_fr_trace_json", "_dump_fr_trace")):
        payload, ext = None, "json"
        if hasattr(c10d, json_fn):
            try:
                payload = getattr(c10d, json_fn)(True, False)
            except BaseException as exc:
                _log(state, f"{json_fn} failed: {exc!r}")
        if payload is None and hasattr(c10d, pkl_fn):
            try:
                payload, ext = getattr(c10d, pkl_fn)(True, True, False), "pkl"
            except BaseException as exc:
                _log(state, f"{pkl_fn} failed: {exc!r}")
        if payload is not None:
            if isinstance(payload, str):
                payload = payload.encode()
            dumps.append((recorder, bytes(payload), ext))
    nonempty = [d for d in dumps if _has_entries(d[1], d[2])]
    chosen = nonempty or dumps[-1:]
    written = []
    for i, (recorder, payload, ext) in enumerate(chosen):
        name = f"rank{state.rank}.{ext}" if i == 0 else f"rank{state.rank}.{recorder}.{ext}"
        path = state.path("fr", name)
        _write_then_rename(f"{path}.tmp{os.getpid()}", path, payload)
        written.append(os.path.relpath(path, state.run_dir))
    return written


def _has_entries(payload: bytes, ext: str) -> bool:
    if ext == "json":
        try:
            return bool(json.loads(payload).get("entries"))
        except Exception:
            return False
    return b"entries" in payload


def _install_excepthook(state: _State) -> None:
    previous = sys.excepthook

    def hook(exc_type: Any, exc: BaseException, tb: Any) -> None:
        try:
            _record_error(state, exc_type, exc, tb)
        except BaseException:
            _log_exc(state, "excepthook")
        try:
            _on_uncaught_oom(state, exc)
        except BaseException:
            _log_exc(state, "OOM snapshot")
        previous(exc_type, exc, tb)

    sys.excepthook = hook


def _record_error(state: _State, exc_type: Any, exc: BaseException, tb: Any) -> None:
    """torchelastic's error-file format (``ErrorHandler.record_exception``), so torchrun shows the traceback."""
    doc = {"message": {"message": f"{exc_type.__name__}: {exc}",
                       "extraInfo": {"py_callstack": "".join(traceback.format_exception(exc_type, exc, tb)),
                                     "timestamp": str(int(time.time())), "timestamp_ns": str(time.time_ns())}}}
    ours = state.path("errors", f"rank{state.rank}.json")
    elastic = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if elastic and os.path.abspath(elastic) == os.path.abspath(ours) and os.path.exists(ours):
        return  # ``@record`` already wrote it (same format, maybe more detail)
    _atomic_write_json(ours, doc)
    if elastic and not os.path.exists(elastic):
        os.makedirs(os.path.dirname(elastic) or ".", exist_ok=True)
        _atomic_write_json(elastic, doc)
    _log(state, f"recorded uncaught {exc_type.__name__} to errors/rank{state.rank}.json")


# ------------------------------------------------------------------------------ torch-side pieces


class _TorchImportHook:
    """Meta-path finder that runs ``_on_torch_imported`` right after the user's ``import torch``.

    Importing torch ourselves at interpreter start would change the job (import order, start time);
    waiting for the user's import changes nothing.
    """

    def __init__(self, state: _State) -> None:
        self.state = state

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "torch":
            return None
        try:
            sys.meta_path.remove(self)  # one shot; also avoids finding ourselves below
        except ValueError:
            pass
        spec = None
        for finder in list(sys.meta_path):  # whoever would have found torch (PathFinder, editable finders...)
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            try:
                spec = find(name, path, target)
            except Exception:
                spec = None
            if spec is not None:
                break
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            _log(self.state, "torch import not hooked (no standard loader); no profiling/progress in this rank")
            return spec
        loader = spec.loader
        state = self.state

        class _Loader:
            def create_module(self, spec: Any) -> Any:
                return loader.create_module(spec)

            def exec_module(self, module: Any) -> None:
                try:
                    loader.exec_module(module)
                finally:  # leave no trace of the wrapper on torch itself
                    module.__loader__ = loader
                    if getattr(module, "__spec__", None) is not None:
                        module.__spec__.loader = loader
                _on_torch_imported(state)

            def __getattr__(self, item: str) -> Any:
                return getattr(loader, item)

        spec.loader = _Loader()
        return spec


def _install_torch_hook(state: _State) -> None:
    if "torch" in sys.modules:  # a chained sitecustomize imported it already
        _on_torch_imported(state)
    else:
        sys.meta_path.insert(0, _TorchImportHook(state))


def _on_torch_imported(state: _State) -> None:
    try:
        _fail_point(state, "torch")
        torch = sys.modules["torch"]
        state.info["torch"] = str(torch.__version__)
        state.info["clock"].append(_clock_sample("torch_imported"))
        from torch.optim.optimizer import register_optimizer_step_post_hook

        state.hook_handle = register_optimizer_step_post_hook(lambda opt, args, kwargs: _on_step(state, opt))
        state.torch_ready = True
        state.profile_selected = bool(state.config.get("profile", True)) and _wanted(
            str(state.config.get("ranks", "all")), state.rank)
        _install_profiler_guard(state, torch)
        _log(state, f"torch {torch.__version__} imported; optimizer-step hook installed; profile={state.profile_selected}")
        _write_rank_json(state)
    except BaseException:
        _log_exc(state, "torch import hook")


def _ours() -> Any:
    """Context for traceread's own profiler calls (the guard lets them through); a no-op without it."""
    guard = sys.modules.get("_traceread_profiler_guard")
    return guard.ours() if guard is not None else contextlib.nullcontext()


def _install_profiler_guard(state: _State, torch: Any) -> None:
    """Watch the job's own profiler (``_traceread_profiler_guard``): traceread steps aside before it starts."""
    try:
        import _traceread_profiler_guard as guard_mod

        guard = guard_mod.Guard(lambda detail: _on_job_profiler(state, detail),
                                lambda dirs, files: _on_job_paths(state, dirs, files),
                                lambda msg: _log(state, msg))
        state.guard = guard_mod.install(torch, guard)
    except BaseException:
        _log_exc(state, "profiler guard")


def _on_job_profiler(state: _State, detail: dict[str, Any]) -> None:
    """The job starts its own profiler (called just before its session begins): close traceread's
    window now — export the steps it recorded, discard a window that recorded none — and never
    profile again in this rank. Two Kineto sessions at once crash the process (issue #36)."""
    if state.prof is not None:
        recorded = _recorded_in_window(state, state.prof)
        state.cut_by = "the job's own profiler"
        _stop_profiler(state, keep_partial=True)  # exports (marked partial) when steps were recorded
        _stop_memory_history(state)
        window = f"stopped early, {recorded} recorded step(s) kept" if recorded else "stopped before it recorded a step"
    elif state.cycles:
        window = "already finished"
    elif state.profile_selected and not state.profile_done:
        window = "not started yet; it will not start"
    else:
        window = "none in this rank"
    state.profile_done = True
    _traceread_capture.on_job_profiler(state)  # a capture recording now stops too; none starts later
    _note_job_profiler(state, {**detail, "traceread_window": window})


def _note_job_profiler(state: _State, detail: dict[str, Any]) -> None:
    """``job_profiler`` in the rank file (the launcher's summary and the report read it) and the log."""
    job = state.info.setdefault("job_profiler", {"from_step": state.step + 1, "trace_dirs": [], "traces": []})
    job.update({k: v for k, v in detail.items() if k not in ("trace_dirs", "traces")})
    job["trace_dirs"] = sorted(set(job["trace_dirs"]) | set(detail.get("trace_dirs") or []))
    _log(state, f"the job started its own profiler ({job.get('api')}) in optimizer step {job['from_step']}; "
                f"traceread stepped aside (its window: {job.get('traceread_window', 'unknown')}); "
                f"the job's traces: {', '.join(job['trace_dirs']) or 'where its handler writes'}")
    _write_rank_json(state)


def _on_job_paths(state: _State, dirs: list[str], files: list[str]) -> None:
    job = state.info.setdefault("job_profiler", {"from_step": state.step + 1, "trace_dirs": [], "traces": []})
    job["trace_dirs"], job["traces"] = list(dirs), list(files)
    _write_rank_json(state)


def _on_step(state: _State, opt: Any) -> None:
    """Global optimizer-step post hook: progress, profiler schedule. Catches everything."""
    t0 = time.perf_counter()
    try:
        if state.driver is None:
            state.driver = id(opt)
        elif id(opt) != state.driver:
            return  # several optimizers: the first one that stepped defines "a step"
        state.step += 1
        _write_progress(state)
        _traceread_capture.append_step(state)  # the per-step series for the launcher's watch
        _fail_point(state, "hook")
        if state.step == 1:
            state.info["clock"].append(_clock_sample("first_step"))
        if not state.dist_described:
            _describe_torch(state)
        if state.profile_selected and not state.profile_done:
            with _ours():
                _drive_profiler(state)
        with _ours():
            _traceread_capture.on_step(state)  # captures asked by the watch or `traceread snap` (docs/watch.md)
    except BaseException:
        state.profile_done = True
        _log_exc(state, f"step hook (step {state.step}); profiling disabled for this rank")
        _stop_profiler(state)
    finally:
        state.hook_s += time.perf_counter() - t0


def _describe_torch(state: _State) -> None:
    """Versions, device and process-group layout, once ``torch.distributed`` is initialised."""
    torch = sys.modules["torch"]
    info = state.info
    try:
        if torch.cuda.is_available():
            ver = torch.cuda.nccl.version()  # tuple in torch >= 1.13, int (e.g. 2708) before
            info["nccl"] = ".".join(map(str, ver)) if isinstance(ver, tuple) else str(ver)
        else:
            info["nccl"] = None
    except BaseException:
        info["nccl"] = None
    try:
        if torch.cuda.is_available():
            dev = torch.cuda.current_device()
            prop = torch.cuda.get_device_properties(dev)
            info["device"] = {"type": "cuda", "index": dev, "name": prop.name,
                              "capability": f"{prop.major}.{prop.minor}", "memory_bytes": prop.total_memory,
                              "sm_count": prop.multi_processor_count, "count": torch.cuda.device_count(),
                              "cuda": torch.version.cuda}
        else:
            info["device"] = {"type": "cpu", "name": "cpu", "count": os.cpu_count()}
    except BaseException as exc:
        info["device"] = {"type": "unknown", "error": repr(exc)}
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        info["dist"] = {"backend": str(dist.get_backend()), "rank": dist.get_rank(),
                        "world_size": dist.get_world_size()}
        state.dist_described = True
        if state.config.get("clock_sync", True):
            _start_clock_sync(state, dist.get_rank(), dist.get_world_size())
    elif state.step >= 3:
        state.dist_described = True  # a non-distributed job: stop asking
    _write_rank_json(state)


def _start_clock_sync(state: _State, rank: int, world: int) -> None:
    """Measure this rank's clock offset to rank 0 in a background thread (see ``_clock_sync``)."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT", "")
    if world < 2 or not addr or not port.isdigit():
        return
    state.clock_thread = threading.Thread(target=_clock_sync, args=(state, addr, int(port), rank, world),
                                          name="traceread-clock", daemon=True)
    state.clock_thread.start()


def _clock_sync(state: _State, addr: str, port: int, rank: int, world: int, rounds: int = 4) -> None:
    """NTP-style offset to rank 0 through the job's TCPStore, on a separate client connection.

    Rank r: ``t0``; set ``ping``; get ``pong`` (= rank 0's ``time_ns`` when it answered); ``t1``.
    Rank 0's clock read lies in [t0, t1], so ``offset = pong - (t0 + t1) / 2`` with
    ``uncertainty = (t1 - t0) / 2`` holds whatever the network delays; the best of ``rounds`` is kept.
    Add ``offset_ns`` to this rank's wall-clock times to get rank 0's clock. Nothing here touches the
    job's process groups or store client; the blocking calls release the GIL.
    """
    try:
        _quiet_thread()
        import datetime

        from torch.distributed import TCPStore

        store = TCPStore(addr, port, is_master=False, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=120))
        env = os.environ
        prefix = f"traceread/clock/{env.get('TORCHELASTIC_RUN_ID', 'none')}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
        if rank == 0:
            answered = 0
            for r in range(1, world):
                try:
                    for i in range(rounds):
                        store.wait([f"{prefix}{r}/ping{i}"])
                        store.set(f"{prefix}{r}/pong{i}", str(time.time_ns()))
                    answered += 1
                except Exception as exc:
                    _log(state, f"clock sync: rank {r} did not ping ({exc!r}); skipped")
            result: dict[str, Any] = {"offset_ns": 0, "uncertainty_ns": 0, "reference_rank": 0, "answered": answered}
        else:
            best: tuple[int, int] | None = None
            for i in range(rounds):
                t0 = time.time_ns()
                store.set(f"{prefix}{rank}/ping{i}", "1")
                remote = int(store.get(f"{prefix}{rank}/pong{i}"))
                t1 = time.time_ns()
                sample = (remote - (t0 + t1) // 2, (t1 - t0) // 2)
                if best is None or sample[1] < best[1]:
                    best = sample
            for i in range(rounds):
                for key in (f"{prefix}{rank}/ping{i}", f"{prefix}{rank}/pong{i}"):
                    store.delete_key(key)
            assert best is not None
            result = {"offset_ns": best[0], "uncertainty_ns": best[1], "reference_rank": 0, "rounds": rounds}
        result["method"] = "TCPStore ping-pong with rank 0"
        state.info["clock_sync"] = result
        _log(state, f"clock sync: {result}")
        _write_rank_json(state)
    except BaseException:
        _log_exc(state, "clock sync")


def _drive_profiler(state: _State) -> None:
    """Start the profiler at the end of optimizer step 1, then ``prof.step()`` at each later step.

    Windows are bounded: after ``repeat`` cycles the profiler is stopped and the hook costs nothing.
    """
    cfg = state.config
    if state.prof is None:
        import torch

        if torch.autograd._profiler_enabled():
            state.profile_done = True  # the script runs its own profiler: never fight it
            _log(state, "a profiler is already active in this process; traceread does not profile")
            _note_job_profiler(state, {"api": "unknown (already active when traceread's window began)"})
            return
        from torch.profiler import ProfilerActivity, profile, schedule

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        wait, warmup, active, repeat = _schedule_numbers(cfg)
        import warnings

        # torch warns on every later cycle that events are not accumulated: that is what we want (each
        # cycle is exported on its own), and the warning would land in the job's output
        warnings.filterwarnings("ignore", message="Warning: Profiler clears events at the end of each cycle")
        snap_from_profile = bool(cfg.get("memory_snapshot")) and not torch.cuda.is_available()
        state.prof = profile(
            activities=activities,
            schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=repeat),
            on_trace_ready=lambda prof: _export(state, prof),
            record_shapes=bool(cfg.get("record_shapes", True)) or snap_from_profile,
            with_stack=bool(cfg.get("with_stack", False)) or snap_from_profile,
            profile_memory=bool(cfg.get("profile_memory", False)) or bool(cfg.get("memory_snapshot")),
        )
        _start_memory_history(state)
        state.prof.start()
        state.step_ns[0] = time.time_ns()
        state.info["profiled"] = True
        state.info["profile_start_step"] = state.step
        _log(state, f"profiler started after optimizer step {state.step}: {cfg}")
        return
    state.prof.step()
    state.step_ns[int(getattr(state.prof, "step_num", 0))] = time.time_ns()
    if len(state.step_ns) > 4 * int(cfg["active"]) + 8:  # bounded: only the recent steps matter
        for key in sorted(state.step_ns)[: len(state.step_ns) // 2]:
            del state.step_ns[key]
    _, _, _, repeat = _schedule_numbers(cfg)
    if repeat > 0 and state.cycles >= repeat:
        _stop_profiler(state)
        state.profile_done = True
        _stop_memory_history(state)


def _schedule_numbers(cfg: dict[str, Any]) -> tuple[int, int, int, int]:
    """(wait, warmup, active, repeat) for ``torch.profiler.schedule``.

    ``every`` N > 0 is the periodic mode: one cycle every N steps (wait = N - warmup - active) with no
    limit on cycles (repeat 0; disk use is bounded by ``max_cycles``). Otherwise ``repeat`` cycles.
    The numbers are the launcher's (``CollectOptions.profiler_config``, defaults in
    ``traceread.collect.schedule``): the rank keeps none of its own, so the two cannot disagree."""
    wait, warmup, active = int(cfg["wait"]), int(cfg["warmup"]), int(cfg["active"])
    every = int(cfg.get("every") or 0)
    if every > 0:
        return max(0, every - warmup - active), warmup, active, 0
    return wait, warmup, active, int(cfg["repeat"])


def _multi_cycle(cfg: dict[str, Any]) -> bool:
    """Whether traces go to ``traces/cycle{C}/`` (several cycles) or ``traces/`` (one, as before)."""
    return int(cfg.get("every", 0) or 0) > 0 or int(cfg.get("repeat", 1)) != 1


def _trace_path(state: _State, cycle: int) -> str:
    name = f"rank{state.rank}.pt.trace.json.gz"
    if not _multi_cycle(state.config):
        return state.path("traces", name)
    folder = state.path("traces", f"cycle{cycle}")
    os.makedirs(folder, exist_ok=True)
    return os.path.join(folder, name)


def _drop_old_cycles(state: _State) -> None:
    """Keep at most ``max_cycles`` traces of this rank: the first cycle and the latest ones.

    The first is kept because drift is measured against it; each rank deletes only its own file
    (and the cycle folder once it is empty)."""
    cap = int(state.config.get("max_cycles", 0) or 0)
    kept = [c for c in state.cycle_log if c.get("trace")]
    if cap <= 0 or len(kept) <= cap:
        return
    for entry in kept[1:len(kept) - cap + 1] if cap > 1 else kept[:len(kept) - cap]:
        path = state.path(entry["trace"])
        try:
            os.unlink(path)
        except OSError:
            pass
        try:
            os.rmdir(os.path.dirname(path))
        except OSError:
            pass  # another rank's file is still there
        entry["trace"] = None
        entry["dropped"] = True
        _log(state, f"cycle {entry['cycle']} trace removed (max_cycles={cap})")


def _recorded_in_window(state: _State, prof: Any) -> int:
    """Active steps already finished in the window in progress (torch.profiler.schedule's own rule:
    step ``s`` records when ``s mod (wait + warmup + active) >= wait + warmup``)."""
    wait, warmup, active, repeat = _schedule_numbers(state.config)
    n = wait + warmup + active
    step = int(getattr(prof, "step_num", 0))
    if n <= 0 or (repeat > 0 and step // n >= repeat):
        return 0
    return max(0, step % n - (wait + warmup))


def _stop_profiler(state: _State, keep_partial: bool = False) -> None:
    """Stop the profiler. ``keep_partial`` (the job is ending): a window that already recorded active
    steps is exported, marked partial, instead of thrown away; the step cut short by the exit is renamed
    in the trace so no reader takes it for a training step."""
    prof, state.prof = state.prof, None
    if prof is None:
        return
    try:
        recorded = _recorded_in_window(state, prof) if keep_partial else 0
        if recorded > 0:
            state.partial = (recorded, int(getattr(prof, "step_num", 0)))
        else:
            prof.on_trace_ready = None  # nothing recorded yet (or not ending): nothing to export
        with _ours():
            prof.stop()
    except BaseException:
        _log_exc(state, "profiler stop")


def _copy_replacing(src: Any, dst: Any, old: bytes, new: bytes, chunk: int = 1 << 20) -> None:
    """Copy ``src`` to ``dst`` with every ``old`` replaced by ``new``, in bounded memory (a match
    across two chunks is found: the tail that could start one is carried over)."""
    carry = b""
    while True:
        block = src.read(chunk)
        if not block:
            dst.write(carry.replace(old, new))
            return
        data = (carry + block).replace(old, new)
        keep = len(old) - 1
        carry, out = (data[-keep:], data[:-keep]) if keep and len(data) > keep else (data, b"") if keep else (b"", data)
        dst.write(out)


def _export(state: _State, prof: Any) -> None:
    """on_trace_ready: Kineto JSON -> gzip -> ``os.replace`` into this cycle's trace path."""
    state.cycles += 1
    t0 = time.perf_counter()
    end_ns = time.time_ns()
    tmp_json = state.path("traces", f".rank{state.rank}.{os.getpid()}.export.json")
    tmp_gz = state.path("traces", f".rank{state.rank}.{os.getpid()}.export.gz")
    last = int(getattr(prof, "step_num", 0)) - 1  # called from step() that left the last active step
    partial = state.partial
    recorded = partial[0] if partial else int(state.config["active"])
    steps = list(range(last - recorded + 1, last + 1))
    entry: dict[str, Any] = {"cycle": state.cycles, "steps": [steps[0], steps[-1]] if steps else None,
                             "start_ns": state.step_ns.get(steps[0]) if steps else None, "end_ns": end_ns,
                             "trace": None}
    if partial:
        entry["partial"] = {"recorded": recorded, "active": int(state.config["active"]),
                            "unfinished_step": partial[1], "cut_by": state.cut_by}
    try:
        _fail_point(state, "export")
        final = _trace_path(state, state.cycles)
        prof.export_chrome_trace(tmp_json)
        with open(tmp_json, "rb") as src, gzip.open(tmp_gz, "wb", compresslevel=4) as dst:
            if partial:  # the step the exit cut short is no training step: renamed, so readers skip it
                _copy_replacing(src, dst, f'"ProfilerStep#{partial[1]}"'.encode(),
                                f'"traceread: step {partial[1]} cut short by {state.cut_by}"'.encode())
            else:
                shutil.copyfileobj(src, dst, 1 << 20)
        os.replace(tmp_gz, final)
        state.info["trace"] = entry["trace"] = os.path.relpath(final, state.run_dir)
        state.info["profiler_steps"] = steps
        if state.config.get("memory_snapshot"):
            entry["memory_snapshot"] = _write_snapshot(state, prof, _snapshot_name(state))
        if partial:
            state.info["partial"] = entry["partial"]
        _log(state, f"trace cycle {state.cycles} written to {state.info['trace']} "
                    f"in {time.perf_counter() - t0:.3f} s")
    except BaseException as exc:
        state.info["inject_errors"].append(f"export: {exc!r}")
        _log_exc(state, "trace export")
    finally:
        _remove_temps(state.path("traces"), f".rank{state.rank}.{os.getpid()}.export")
        state.cycle_log.append(entry)
        try:
            _drop_old_cycles(state)
        except BaseException:
            _log_exc(state, "drop old cycles")
        state.info["cycles"] = state.cycle_log
        _write_rank_json(state)


def _snapshot_name(state: _State) -> str:
    if state.oom:
        return f"rank{state.rank}_oom.pickle"
    if _multi_cycle(state.config):
        return f"rank{state.rank}_cycle{state.cycles}.pickle"
    return f"rank{state.rank}.pickle"


def _start_memory_history(state: _State) -> None:
    """GPU: record the allocator's history during the window and snapshot on OOM (before the error)."""
    if not state.config.get("memory_snapshot"):
        return
    try:
        torch = sys.modules["torch"]
        os.makedirs(state.path("memory"), exist_ok=True)
        if not torch.cuda.is_available():
            return
        torch.cuda.memory._record_memory_history(max_entries=int(state.config.get("memory_history", 100_000)))
        state.mem_history = True

        def observer(device: Any, alloc: Any, device_alloc: Any, device_free: Any) -> None:
            try:
                if not state.oom_written:
                    state.oom = True
                    _write_snapshot(state, None, f"rank{state.rank}_oom.pickle")
            except BaseException:
                _log_exc(state, "OOM observer")

        torch._C._cuda_attach_out_of_memory_observer(observer)
        _log(state, "memory history recording started (memory_snapshot)")
    except BaseException:
        _log_exc(state, "memory history")


def _stop_memory_history(state: _State) -> None:
    """After the last window the history stops costing the job anything."""
    if not state.mem_history:
        return
    try:
        sys.modules["torch"].cuda.memory._record_memory_history(enabled=None)
        state.mem_history = False
    except BaseException:
        _log_exc(state, "memory history stop")


def _write_snapshot(state: _State, prof: Any, name: str) -> str | None:
    """``RUN/memory/<name>``, atomically: the CUDA allocator's snapshot, else one built from ``prof``."""
    try:
        torch = sys.modules["torch"]
        if torch.cuda.is_available():
            snap = torch.cuda.memory._snapshot()
        elif prof is not None:
            from torch.cuda._memory_viz import _profile_to_snapshot

            snap = _profile_to_snapshot(prof)
        else:
            return None
        os.makedirs(state.path("memory"), exist_ok=True)
        path = state.path("memory", name)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as fh:
            pickle.dump(snap, fh)
        os.replace(tmp, path)
        if name.endswith("_oom.pickle"):
            state.oom_written = True
        _log(state, f"memory snapshot written to memory/{name}")
        return os.path.relpath(path, state.run_dir)
    except BaseException:
        _log_exc(state, f"memory snapshot {name}")
        return None


def _is_oom(exc: BaseException) -> bool:
    """torch's OutOfMemoryError (CUDA), or the CPU allocator's "can't allocate memory" RuntimeError."""
    torch = sys.modules.get("torch")
    oom_type = getattr(torch, "OutOfMemoryError", None) if torch is not None else None
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    msg = str(exc)
    return isinstance(exc, (RuntimeError, MemoryError)) and ("out of memory" in msg.lower()
                                                             or "can't allocate memory" in msg)


def _on_uncaught_oom(state: _State, exc: BaseException) -> None:
    """An uncaught OOM error: on a CPU-only job stop the profiler, which writes the window so far (trace
    and snapshot, named _oom); on a GPU the OOM observer already wrote the snapshot."""
    if not state.config.get("memory_snapshot") or state.oom_written or not _is_oom(exc):
        return
    state.oom = True
    prof = state.prof
    if prof is None:
        _log(state, "out-of-memory error outside the profiled window: no snapshot")
        return
    with _ours():
        prof.stop()  # a recording window is exported by on_trace_ready (_export), snapshot included
    state.prof = None
    state.profile_done = True


def _remove_temps(folder: str, prefix: str) -> None:
    """Our temporary files and the profiler's own (Kineto writes ``<path>.tmp`` first): a failed
    export (a full disk) leaves none of them in the run folder."""
    try:
        names = [n for n in os.listdir(folder) if n.startswith(prefix)]
    except OSError:
        return
    for name in names:
        try:
            os.unlink(os.path.join(folder, name))
        except OSError:
            pass


def _at_exit(state: _State) -> None:
    try:
        state.info["clock"].append(_clock_sample("exit"))
        _stop_profiler(state, keep_partial=True)
        if state.clock_thread is not None:
            state.clock_thread.join(2.0)  # a short job may end before the offset exchange finished
        _write_rank_json(state)
        _log(state, f"exit after {state.step} optimizer steps; hook overhead {state.hook_s * 1e3:.2f} ms")
    except BaseException:
        pass
    if state.dump_trigger and state.info.get("pid") == os.getpid():  # not in a forked child
        remove_trigger(state.dump_trigger)


def remove_trigger(path: str) -> None:
    """Remove a dump FIFO and its private temp folder (the launcher calls it for ranks that died)."""
    try:
        if stat.S_ISFIFO(os.lstat(path).st_mode):
            os.unlink(path)
        folder = os.path.dirname(path)
        if os.path.basename(folder).startswith("traceread-dump-"):
            os.rmdir(folder)
    except BaseException:
        pass
