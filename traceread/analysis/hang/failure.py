"""Why the job stopped: the first failure by time, and every other rank's error as its echo.

When one rank of a distributed job fails, every other rank fails soon after, of *that*: its peer closed
the connection (gloo "Connection closed by peer", NCCL remote errors), its communicator was aborted,
its collective timed out, or torchrun sent it SIGTERM. torchrun's "Root Cause (first observed
failure)" is the first *process to exit*, which can be such an echo. The answer here is the rank that
failed of its own, first by time, with its exception, line and step; the others are listed as
consequences and never named as the cause.

Evidence, per attempt (``RUN`` is torchrun's attempt 0; ``RUN/attempts/attempt{K}`` restart K):

* ``errors/rank{R}.json`` (torchelastic's error-file format): exception type and message, traceback,
  ``timestamp`` (s) and the collector's ``timestamp_ns``.
* ``stacks/rank{R}.txt``: faulthandler's "Fatal Python error: Segmentation fault" (SIGSEGV, SIGABRT,
  SIGBUS, SIGFPE) with the crashing thread's frames; the file's modification time is when it was written.
* ``launcher.log``: torchrun's ``failed (exitcode: -9) local_rank: 1 (pid: 123)`` lines and its failure
  blocks (rank, host, exit code, signal, time), matched to ranks and attempts by pid.
* ``progress/rank{R}`` (optimizer steps done and when) and ``ranks/rank{R}.json`` (host, pid, whether the
  process reached its exit): the step a rank was in, and a rank that vanished without a word.
* ``run.json``: the job's exit code.

How the first failure is chosen (docs/hang-and-nccl.md, "Why the job stopped"): every failing rank's
error is put in a *family*; the echo families (``peer_gone``, ``comm_aborted``, ``watchdog_timeout``,
``terminated``: SIGTERM/SIGINT from the launcher) are consequences. Of the rest the earliest by time is
the first failure (nanosecond error stamps, else second stamps, the crash dump's write time, torchrun's
failure time, the last step's time, in that order of precision); later independent failures are listed
as ``others``. When every error is an echo the cause is not in the errors (a hang, or a rank that left
nothing): the answer says so and the hang diagnosis follows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traceread.analysis.hang.files import read_head, read_tail, regular
from traceread.errors import TraceFileError
from traceread.read.jsonfile import load_json_object, plausible_rank
from traceread.textsafe import clean_data

#: Bytes read from the end of a stack dump (a fatal error is written last).
STACK_TAIL = 256 << 10
LOG_TAIL = 4 << 20
MAX_RANK_FILES = 1 << 16

#: family -> (is an echo of another rank's failure, what to do next)
FAMILIES: dict[str, tuple[bool, str]] = {
    "cuda_illegal_access": (False, "Rerun with CUDA_LAUNCH_BLOCKING=1 on that rank so the error names the kernel that "
                                   "faulted, or run that rank under compute-sanitizer (compute-sanitizer --tool memcheck)."),
    "cuda_error": (False, "Rerun with CUDA_LAUNCH_BLOCKING=1 so the error is raised at the kernel that failed; check "
                          "that node's kernel log (dmesg) for Xid errors."),
    "oom": (False, "Out of memory: see the memory section of the report (peak, headroom, the allocation that failed); "
                   "collect with --memory-snapshot to see what held the memory."),
    "nccl_error": (False, "An NCCL error: read the NCCL diagnosis (traceread report RUN, NCCL section) and the rank's "
                          "NCCL log (NCCL WARN lines) for the transport that failed."),
    "killed": (False, "Killed by SIGKILL with no Python error: the host's OOM killer (dmesg | grep -i 'killed process') "
                      "or the scheduler (time or memory limit, preemption) stopped it."),
    "segfault": (False, "A crash in native code: the faulthandler stack shows the Python line that called it; run "
                        "that rank under gdb or with a debug build of the extension."),
    "abort": (False, "The process aborted (SIGABRT): a C++ assertion or std::terminate; read the last lines of its "
                     "log for the message before the abort."),
    "fatal_signal": (False, "The process died of a signal: read the last lines of its log and the node's kernel log."),
    "python_error": (False, "Fix the exception at the line shown; it stopped the rank."),
    "exit_code": (False, "The process exited with a non-zero code without an error file: read the end of its log."),
    "peer_gone": (True, ""),
    "comm_aborted": (True, ""),
    "watchdog_timeout": (True, ""),
    "terminated": (True, ""),
}
ECHO_WORDS = {"peer_gone": "peer gone", "comm_aborted": "aborted communicator", "watchdog_timeout": "watchdog timeout",
              "terminated": "stopped by the launcher"}

_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("peer_gone", re.compile(r"Connection closed by peer|Connection reset by peer|remote worker crash|Broken pipe|"
                             r"ECONNRESET|EPIPE|ncclRemoteError|remote process exited|peer .*(closed|disconnected)|"
                             r"Connection refused|recvBytes|Socket Timeout", re.I)),
    ("comm_aborted", re.compile(r"abort(ed)? communicator|communicator (was |has been )?abort|ProcessGroup\w* (is |was )?"
                                r"(aborted|shut ?down|destroyed)|NCCL communicator was aborted|"
                                r"process group (has been )?(aborted|destroyed)", re.I)),
    ("watchdog_timeout", re.compile(r"Watchdog caught collective operation timeout|timed out|timeout", re.I)),
    ("oom", re.compile(r"out of memory|OutOfMemoryError|\bMemoryError\b|Cannot allocate memory|CUBLAS_STATUS_ALLOC_FAILED",
                       re.I)),
    ("cuda_illegal_access", re.compile(r"illegal memory access|illegal instruction|misaligned address|"
                                       r"device-side assert|unspecified launch failure", re.I)),
    ("nccl_error", re.compile(r"\bNCCL (error|WARN)|nccl(Unhandled|System|Internal|Invalid)\w*", re.I)),
    ("cuda_error", re.compile(r"CUDA error|cudaError|CUBLAS_STATUS|CUDNN_STATUS|Xid", re.I)),
)
_SIGNALS = {1: "SIGHUP", 2: "SIGINT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 9: "SIGKILL",
            11: "SIGSEGV", 13: "SIGPIPE", 15: "SIGTERM"}
_FATAL = {"Segmentation fault": (11, "segfault"), "Aborted": (6, "abort"), "Bus error": (7, "fatal_signal"),
          "Floating point exception": (8, "fatal_signal"), "Illegal instruction": (4, "fatal_signal")}
_PY_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (.+)$')
_FH_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+) in (.+)$')
_AGENT_FAILED = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")
_WATCHDOG = re.compile(r"\[Rank (\d+)\]\s+Watchdog caught collective operation timeout")
_BLOCK_KEY = re.compile(r"^\s*(time|host|rank|exitcode|error_file)\s*:\s*(.*)$")
_LIB = re.compile(r"/(site|dist)-packages/|/lib/python\d|<frozen |traceread/collect/bootstrap/")


@dataclass
class RankFailure:
    """One rank's end, as the evidence tells it."""

    rank: int
    attempt: int
    family: str
    message: str  # "RuntimeError: CUDA error: ..." / "killed by SIGKILL" / "exit code 3"
    exception: str | None = None  # "RuntimeError"
    where: str | None = None  # "train.py:32 in fail" (innermost frame outside libraries)
    traceback_tail: list[str] = field(default_factory=list)  # its last frames, innermost last
    host: str | None = None
    time_ns: int | None = None
    time_from: str = "unknown"
    step: int | None = None  # optimizer steps it had completed when it failed
    exit_code: int | None = None
    signal: str | None = None
    sources: list[str] = field(default_factory=list)

    @property
    def echo(self) -> bool:
        return FAMILIES.get(self.family, (False, ""))[0]

    def as_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "attempt": self.attempt, "family": self.family, "echo": self.echo,
                "message": self.message, "exception": self.exception, "where": self.where,
                "traceback": self.traceback_tail, "host": self.host, "time_ns": self.time_ns,
                "time_from": self.time_from, "step": self.step, "exit_code": self.exit_code, "signal": self.signal,
                "sources": self.sources, "next_step": FAMILIES.get(self.family, (False, ""))[1] or None}


@dataclass
class _Attempt:
    index: int
    folder: Path
    failures: dict[int, RankFailure] = field(default_factory=dict)
    progress: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # rank -> (step, time_ns, pid)
    ranks: dict[int, dict[str, Any]] = field(default_factory=dict)  # rank -> ranks/rank{R}.json


def classify(message: str) -> str:
    """The family of an error message (first rule that matches; a plain exception is ``python_error``)."""
    for family, pattern in _RULES:
        if pattern.search(message):
            return family
    return "python_error"


def attempt_folders(run_dir: Path) -> list[tuple[int, Path]]:
    """``(attempt, folder)``, oldest first: ``RUN`` is attempt 0, ``RUN/attempts/attempt{K}`` restart K."""
    out = [(0, run_dir)]
    base = run_dir / "attempts"
    if base.is_dir():
        found = []
        for d in base.iterdir():
            if d.is_dir() and d.name.startswith("attempt") and d.name[7:].isdigit() and len(d.name) < 16:
                found.append((int(d.name[7:]), d))
        out += sorted(found)
    return out


def _rank_files(folder: Path, pattern: str) -> list[tuple[int, Path]]:
    out: list[tuple[int, Path]] = []
    if not folder.is_dir():
        return out
    # exactly rank{R}<suffix>: progress/ also holds rank{R}.steps and rank{R}.exit (the watch's series, docs/watch.md)
    exact = re.compile(r"rank(\d+)" + re.escape(pattern.split("*", 1)[1] if "*" in pattern else ""))
    for i, p in enumerate(sorted(folder.glob(pattern))):
        if i >= MAX_RANK_FILES:
            break
        m = exact.fullmatch(p.name)
        r = plausible_rank(int(m.group(1))) if m and len(m.group(1)) < 8 else None
        if r is not None and regular(p):
            out.append((r, p))
    return out


def _frames(text: str, pattern: re.Pattern[str]) -> list[tuple[str, int, str]]:
    out = []
    for line in text.splitlines():
        m = pattern.match(line)
        if m:
            out.append((m.group(1), int(m.group(2)), m.group(3).strip()))
    return out


def _user_frame(frames: list[tuple[str, int, str]]) -> str | None:
    """The innermost frame outside libraries (torch, site-packages, the standard library): the user's line."""
    for f, line, func in reversed(frames):
        if not _LIB.search(f):
            return f"{f}:{line} in {func}"
    return f"{frames[-1][0]}:{frames[-1][1]} in {frames[-1][2]}" if frames else None


def _short_frames(frames: list[tuple[str, int, str]], n: int = 4) -> list[str]:
    return [f"{Path(f).name}:{line} in {func}" for f, line, func in frames[-n:]]


def _from_error_file(rank: int, attempt: int, path: Path, problems: list[str]) -> RankFailure | None:
    doc = load_json_object(path, problems)
    if not isinstance(doc, dict):
        return None
    msg = doc.get("message")
    extra: dict[str, Any] = {}
    if isinstance(msg, dict):
        info = msg.get("extraInfo")
        extra = info if isinstance(info, dict) else {}
        msg = msg.get("message")
    text = str(msg)[:4000] if isinstance(msg, (str, int, float)) else ""
    stack = str(extra.get("py_callstack") or "")[:200_000]
    frames = _frames(stack, _PY_FRAME)
    exc = re.match(r"([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Warning|Failure))\b", text)
    f = RankFailure(rank=rank, attempt=attempt, family=classify(text), message=text.splitlines()[0][:500] if text else
                    "an error file without a message", exception=exc.group(1).rsplit(".", 1)[-1] if exc else None,
                    where=_user_frame(frames), traceback_tail=_short_frames(frames), sources=[str(path)])
    if f.family == "python_error" and f.exception in ("MemoryError", "OutOfMemoryError"):
        f.family = "oom"
    for key, scale in (("timestamp_ns", 1), ("timestamp", 1_000_000_000)):
        try:
            v = int(str(extra.get(key)))
        except (TypeError, ValueError):
            continue
        if 0 < v < (1 << 62) // scale:
            f.time_ns, f.time_from = v * scale, "error file" + (" (ns)" if scale == 1 else " (s)")
            break
    return f


def _from_stack_file(rank: int, attempt: int, path: Path) -> RankFailure | None:
    """A faulthandler fatal-signal dump: the signal, and the crashing thread's frames."""
    try:
        data, _cut = read_tail(path, STACK_TAIL)
    except TraceFileError:
        return None
    text = data.decode("utf-8", "replace")
    at = text.rfind("Fatal Python error: ")
    if at < 0:
        return None
    head = text[at:].splitlines()[0].removeprefix("Fatal Python error: ").strip()
    signum, family = next(((n, fam) for k, (n, fam) in _FATAL.items() if head.startswith(k)), (None, "fatal_signal"))
    block = text[at:]
    cur = block.find("Current thread")
    frames = _frames(block[cur:] if cur >= 0 else block, _FH_FRAME)
    frames.reverse()  # faulthandler prints the most recent call first
    f = RankFailure(rank=rank, attempt=attempt, family=family, message=f"Fatal Python error: {head[:200]}",
                    exception=None, where=_user_frame(frames), traceback_tail=_short_frames(frames),
                    signal=_SIGNALS.get(signum) if signum else None, sources=[str(path)])
    try:
        f.time_ns, f.time_from = path.stat().st_mtime_ns, "crash dump written"
    except OSError:
        pass
    return f


def _progress(path: Path) -> tuple[int, int, int] | None:
    try:
        parts = read_head(path, 128).split()
        step, t_ns, pid = (int(x) for x in parts[:3])
    except (TraceFileError, ValueError):
        return None
    return step, t_ns, pid


def _torchrun(run_dir: Path, problems: list[str],
              timed_out: set[int]) -> tuple[dict[int, int], dict[int, dict[str, str]]]:
    """From ``launcher.log``: pid -> exit code (the agent's ``failed (exitcode: ...)`` lines, every attempt),
    and rank -> torchrun's failure block of the last attempt (time, host, exitcode); ``timed_out`` gets the
    ranks whose NCCL watchdog reported a collective timeout (it then tears the process down)."""
    log = run_dir / "launcher.log"
    codes: dict[int, int] = {}
    blocks: dict[int, dict[str, str]] = {}
    if not regular(log):
        return codes, blocks
    try:
        data, _cut = read_tail(log, LOG_TAIL)
    except TraceFileError as exc:
        problems.append(str(exc))
        return codes, blocks
    text = data.decode("utf-8", "replace")
    for m in _AGENT_FAILED.finditer(text):
        codes[int(m.group(3))] = int(m.group(1))
    timed_out.update(int(m.group(1)) for m in _WATCHDOG.finditer(text) if len(m.group(1)) < 8)
    cur: dict[str, str] = {}
    for line in text.splitlines():
        km = _BLOCK_KEY.match(line)
        if not km:
            continue
        key, value = km.group(1), km.group(2).strip()
        if key == "time":
            cur = {"time": value}
        cur[key] = value
        if key == "exitcode":
            rm = re.match(r"(\d+)", cur.get("rank", ""))
            if rm and len(rm.group(1)) < 8:
                blocks[int(rm.group(1))] = dict(cur)
    return codes, blocks


def _exit_failure(rank: int, attempt: int, code: int, source: str) -> RankFailure:
    if code < 0 or code > 128:
        signum = -code if code < 0 else code - 128
        name = _SIGNALS.get(signum, f"signal {signum}")
        family = {9: "killed", 11: "segfault", 6: "abort", 15: "terminated", 2: "terminated",
                  1: "terminated"}.get(signum, "fatal_signal")
        return RankFailure(rank=rank, attempt=attempt, family=family, message=f"killed by {name}" if signum == 9 else
                           f"died of {name}", exit_code=code, signal=name, sources=[source])
    return RankFailure(rank=rank, attempt=attempt, family="exit_code", message=f"exit code {code}", exit_code=code,
                       sources=[source])


def _read_attempt(index: int, folder: Path, problems: list[str]) -> _Attempt:
    a = _Attempt(index, folder)
    for r, p in _rank_files(folder / "progress", "rank*"):
        got = _progress(p)
        if got is not None:
            a.progress[r] = got
    for r, p in _rank_files(folder / "ranks", "rank*.json"):
        doc = load_json_object(p, problems)
        if isinstance(doc, dict):
            a.ranks[r] = doc
    for r, p in _rank_files(folder / "errors", "rank*.json"):
        f = _from_error_file(r, index, p, problems)
        if f is not None:
            a.failures[r] = f
    for r, p in _rank_files(folder / "stacks", "rank*.txt"):
        f = _from_stack_file(r, index, p)
        if f is not None and (r not in a.failures or a.failures[r].echo):
            a.failures[r] = f
    return a


def _exited(info: dict[str, Any]) -> bool:
    clock = info.get("clock")
    return isinstance(clock, list) and any(isinstance(c, dict) and c.get("label") == "exit" for c in clock)


def _complete(a: _Attempt, codes: dict[int, int], blocks: dict[int, dict[str, str]], last: bool) -> None:
    """Exit codes, signals, hosts, steps and times from the launcher and the rank files."""
    for r, info in a.ranks.items():
        pid = info.get("pid")
        code = codes.get(pid) if isinstance(pid, int) else None
        if code is None and last and r in blocks:
            try:
                code = int(blocks[r].get("exitcode", "").split()[0])
            except (ValueError, IndexError):
                code = None
        f = a.failures.get(r)
        if code is not None and code != 0:
            ef = _exit_failure(r, a.index, code, "launcher.log")
            if f is None:
                a.failures[r] = f = ef
            else:
                f.exit_code, f.signal = code, f.signal or ef.signal
        elif f is None and not _exited(info) and a.progress.get(r) and codes:
            # no error, no exit code, never reached its exit: the process vanished (stopped from outside)
            a.failures[r] = RankFailure(rank=r, attempt=a.index, family="killed", message="vanished: no error, no "
                                        "exit record (killed from outside)", sources=[str(a.folder / "ranks")])
    for r, f in a.failures.items():
        info = a.ranks.get(r) or {}
        if isinstance(info.get("host"), str):
            f.host = info["host"][:200]
        elif last and r in blocks:
            f.host = blocks[r].get("host")
        prog = a.progress.get(r)
        if prog is not None:
            f.step = prog[0]
            if f.time_ns is None:
                f.time_ns, f.time_from = prog[1], "last step (a lower bound)"


def _story(a: _Attempt) -> tuple[RankFailure | None, list[RankFailure], list[RankFailure]]:
    """(first failure, consequences, later independent failures) of one attempt."""
    own = sorted((f for f in a.failures.values() if not f.echo),
                 key=lambda f: (f.time_ns is None, f.time_ns or 0, f.rank))
    echoes = sorted((f for f in a.failures.values() if f.echo), key=lambda f: (f.time_ns is None, f.time_ns or 0, f.rank))
    if not own:
        return None, echoes, []
    return own[0], echoes, own[1:]


def _say(f: RankFailure, with_attempt: bool) -> str:
    where = f" at {f.where}" if f.where else ""
    step = f" after optimizer step {f.step}" if f.step else (" before its first optimizer step" if f.step == 0 else "")
    host = f" on {f.host}" if f.host else ""
    att = f" (attempt {f.attempt})" if with_attempt else ""
    return f"Rank {f.rank}{host} failed first{att}: {f.message}{where}{step}."


def diagnose_failure(run_dir: str | Path) -> dict[str, Any] | None:
    """``Report["failure"]``: the first failure, its echoes, the attempts; None when nothing failed."""
    root = Path(run_dir)
    if not root.is_dir():
        return None
    problems: list[str] = []
    run = load_json_object(root / "run.json", problems) if regular(root / "run.json") else None
    run = run if isinstance(run, dict) else {}
    exit_code = run.get("exit_code") if isinstance(run.get("exit_code"), int) else None
    timed_out: set[int] = set()
    codes, blocks = _torchrun(root, problems, timed_out)
    folders = attempt_folders(root)
    attempts = [_read_attempt(i, d, problems) for i, d in folders]
    for a in attempts:
        _complete(a, codes, blocks, a is attempts[-1])
    last = attempts[-1]
    # the collector found the job hung and killed it (--on-hang kill): the exit code is ours, not a rank's failure
    stopped_on_hang = isinstance(run.get("hang"), dict) and run["hang"].get("action") == "kill"
    if exit_code and not stopped_on_hang and not any(a.failures for a in attempts) and len(last.ranks) == 1:
        # one process and no launcher of its own (plain python): the job's exit code is the rank's
        (r,) = last.ranks
        last.failures[r] = _exit_failure(r, last.index, exit_code, "run.json")
        _complete(last, {}, {}, True)
    for a in attempts:
        for r, f in a.failures.items():  # torn down by its NCCL watchdog after a timeout: an echo of the hang
            if r in timed_out and f.family in ("abort", "fatal_signal", "exit_code", "killed"):
                f.family = "watchdog_timeout"
                f.message = f"torn down by the NCCL watchdog after a collective timed out ({f.message})"
    if not any(a.failures for a in attempts) and not exit_code:
        return None
    stories = [_story(a) for a in attempts]
    multi = len(attempts) > 1
    out_attempts: list[dict[str, Any]] = []
    for a, (first, echoes, _later) in zip(attempts, stories):
        steps = max((p[0] for p in a.progress.values()), default=None)
        starts: list[int] = [c["time_ns"] for info in a.ranks.values() for c in (info.get("clock") or [])
                  if isinstance(c, dict) and c.get("label") == "start" and isinstance(c.get("time_ns"), int)]
        ends = [p[1] for p in a.progress.values()]
        out_attempts.append({
            "attempt": a.index, "folder": str(a.folder), "started_ns": min(starts) if starts else None,
            "last_step_ns": max(ends) if ends else None, "steps": steps,
            "ended_by": first.as_json() if first else (echoes[0].as_json() if echoes else None),
            "failed": bool(a.failures)})
    if multi:  # steps and time a restart lost: what the failed attempt did, from its start to its end
        for i, item in enumerate(out_attempts[:-1]):
            nxt = out_attempts[i + 1]
            item["steps_lost"] = item["steps"]
            if item["started_ns"] and nxt["started_ns"]:
                item["time_lost_s"] = round((nxt["started_ns"] - item["started_ns"]) / 1e9, 3)
    # the answer: the last attempt that failed (a restart that then ran clean says what the failed one lost)
    failed = [i for i, a in enumerate(attempts) if a.failures]
    pick = failed[-1] if failed else len(attempts) - 1
    first, echoes, others = stories[pick]
    lines: list[str] = []
    if first is not None:
        lines.append(_say(first, multi))
        if echoes:
            lines.append(f"{len(echoes)} other rank(s) failed as a consequence: "
                         + "; ".join(f"rank {e.rank} ({ECHO_WORDS.get(e.family, e.family)})" for e in echoes[:8])
                         + (f" (+{len(echoes) - 8} more)" if len(echoes) > 8 else "") + ".")
        if others:
            lines.append("Later, independently: " + "; ".join(
                f"rank {o.rank}: {o.message}" + (f" at {o.where}" if o.where else "") for o in others[:4]) + ".")
    elif echoes:
        e0 = echoes[0]
        lines.append(f"The job stopped, but every error is an echo of another failure ({len(echoes)} rank(s): "
                     + ", ".join(sorted({ECHO_WORDS.get(e.family, e.family) for e in echoes})) + f"); rank {e0.rank} "
                     f"reported first ({e0.message[:160]}" + (f" at {e0.where}" if e0.where else "") + "). No rank "
                     "left the error that started it: a hang (see the hang diagnosis) or a rank that died without a "
                     "word.")
    elif run.get("hang"):
        lines.append(f"traceread collect found the job hung and stopped it (exit code {exit_code}); no rank failed "
                     "of its own: the hang diagnosis has the culprits.")
    else:
        lines.append(f"The job exited with code {exit_code}, and no rank left an error, a crash dump or an exit code "
                     "of its own (read the end of launcher.log).")
    if multi:
        restarted = [x for x in out_attempts if x["failed"]]
        tail = out_attempts[-1]
        lines.append(f"{len(attempts)} attempts (torchrun restarts): " + "; ".join(
            f"attempt {x['attempt']} " + (f"ended by rank {x['ended_by']['rank']} ({x['ended_by']['family']})"
                                           if x["ended_by"] else "ran to the end")
            + (f" after {x['steps']} step(s)" if x.get("steps") is not None else "") for x in out_attempts) + "."
            + (f" The report analyses attempt {tail['attempt']}." if restarted else ""))
    return clean_data({  # messages, paths and host names come from files anyone could write: no terminal control
        "summary": " ".join(lines),
        "lines": lines,
        "first": first.as_json() if first else None,
        "consequences": [e.as_json() for e in echoes],
        "others": [o.as_json() for o in others],
        "attempts": out_attempts,
        "attempt": attempts[pick].index,
        "exit_code": exit_code,
        "problems": problems[:20],
    })
