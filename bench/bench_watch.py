"""What the slow-step watch costs: the rank's step hook and the launcher's CPU.

1. Rank hook, per optimizer step: the existing progress ``pwrite`` alone vs with the watch's additions
   (the ``.steps`` append and the request check: one ``os.stat`` at most every 10 ms), timed on the real
   bootstrap functions (``_traceread_rank``/``_traceread_capture``) over ``--steps`` calls. The request
   check is timed at one call per 10 ms (what a 10 ms step pays) and at every call (its throttle open).
2. Launcher: a writer thread appends, for ``--ranks`` ranks, ``<step> <time_ns>`` lines at ``--step-ms`` per step, as
   the ranks do, while the launcher's :class:`Watch` polls every 0.25 s for ``--seconds``; the CPU
   time the polls used (``time.thread_time``) per second of wall time.

    python bench/bench_watch.py --steps 20000 --ranks 8 --step-ms 15 --seconds 20
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "traceread" / "collect" / "bootstrap"))

import _traceread_capture  # noqa: E402
import _traceread_rank  # noqa: E402

from traceread.collect.watch import Watch, WatchOptions  # noqa: E402


def rank_hook(steps: int, folder: Path) -> dict[str, float]:
    for sub in ("progress", "inject", "captures"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    state = _traceread_rank._State(str(folder), {}, 0)
    state.info["clock"] = [{"time_ns": time.time_ns()}]
    _traceread_rank._open_progress(state)

    def per_call(fn) -> float:
        runs = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(steps):
                state.step += 1
                fn()
            runs.append((time.perf_counter() - t0) / steps * 1e6)
        return statistics.median(runs)

    progress = per_call(lambda: _traceread_rank._write_progress(state))
    append = per_call(lambda: _traceread_capture.append_step(state))
    cap = _traceread_capture._cap(state)

    def check_every_call() -> None:
        cap.last_check_ns = 0
        _traceread_capture.on_step(state)

    check_open = per_call(check_every_call)
    check = per_call(lambda: _traceread_capture.on_step(state))  # throttled: at most every 10 ms
    return {"progress_us": progress, "steps_append_us": append, "request_check_throttled_us": check,
            "request_check_every_call_us": check_open}


def launcher(ranks: int, step_ms: float, seconds: float, folder: Path) -> dict[str, float]:
    for sub in ("progress", "inject", "captures", "ranks"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    stop = threading.Event()

    def writer() -> None:
        """Ranks of a synchronous job end each step together (the collectives align them)."""
        fds = [os.open(folder / "progress" / f"rank{r}.steps", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
               for r in range(ranks)]
        step = 0
        while not stop.is_set():
            step += 1
            for fd in fds:
                os.write(fd, f"{step} {time.time_ns()}\n".encode())
            time.sleep(step_ms / 1e3)
        for fd in fds:
            os.close(fd)

    threads = [threading.Thread(target=writer, daemon=True)]
    for t in threads:
        t.start()
    cfg = {"wait": 5, "warmup": 3, "active": 10, "repeat": 1, "every": 0, "profile": True}
    watch = Watch(folder, WatchOptions(), cfg, note=lambda text: None)
    cpu = 0.0
    polls = 0
    t_end = time.monotonic() + seconds
    while time.monotonic() < t_end:
        c0 = time.thread_time()
        watch.poll(lambda reason: {})
        cpu += time.thread_time() - c0
        polls += 1
        time.sleep(0.25)
    stop.set()
    for t in threads:
        t.join()
    return {"launcher_cpu_ms_per_s": cpu / seconds * 1e3, "polls": polls, "steps_seen": watch.detector.job_done,
            "captures": [c["kind"] for c in watch.captures]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--step-ms", type=float, default=15.0)
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        hook = rank_hook(args.steps, Path(tmp) / "hook")
        watch = launcher(args.ranks, args.step_ms, args.seconds, Path(tmp) / "watch")
    added = hook["steps_append_us"] + hook["request_check_throttled_us"]
    out = {**{k: round(v, 3) if isinstance(v, float) else v for k, v in {**hook, **watch}.items()},
           "added_per_step_us": round(added, 3),
           "added_percent_of_step": round(added / (args.step_ms * 1e3) * 100, 4)}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
