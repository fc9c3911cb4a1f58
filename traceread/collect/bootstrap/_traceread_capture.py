"""Inside a rank: the per-step time series, and recording K steps when the launcher or ``snap`` asks.

Called from ``_traceread_rank._on_step`` (the global optimizer-step hook). Stdlib only until a capture
starts (torch is imported by the job by then). Format and rules: docs/watch.md.

* ``append_step``: one ``O_APPEND`` write of ``"<step> <time_ns>\\n"`` to ``RUN/progress/rank{R}.steps``
  per optimizer step, so the launcher's watch sees every step's duration, not only the latest; at most
  ``MAX_SERIES_LINES`` lines (bounded disk).
* ``on_step``: at most every ``CHECK_EVERY_NS`` one ``os.stat`` of ``RUN/inject/capture.request``; a
  request with a new id asks for optimizer steps ``start_step .. start_step + steps - 1``. The rank
  starts ``torch.profiler`` one step before (warm-up, discarded) so the same step numbers are recorded
  on every rank, writes ``RUN/captures/capture{N}/rank{R}.pt.trace.json.gz`` and its outcome
  ``rank{R}.json``. It never starts while another profiler is active (the default window, ``--every``,
  the job's own). Every failure is logged to ``RUN/inject/rank{R}.log`` and the job runs on.
"""

from __future__ import annotations

import atexit
import gzip
import json
import os
import shutil
import time
from typing import Any

MAX_SERIES_LINES = 2_000_000  # ≈ 60 MB per rank; a 15 ms step job reaches it after 8 hours
CHECK_EVERY_NS = 10_000_000  # one stat of the request file per step, at most 100 per second
MAX_CAPTURE_STEPS = 200
WARMUP_STEPS = 1


class _Capture:
    """What this rank keeps for the series and for captures."""

    def __init__(self) -> None:
        self.series_fd: int | None = None
        self.series_lines = 0
        self.series_done = False
        self.last_check_ns = 0
        self.request_sig: tuple[int, int, int] | None = None
        self.seen_id = 0
        self.pending: dict[str, Any] | None = None
        self.prof: Any = None
        self.active: dict[str, Any] | None = None
        self.exit_registered = False
        self.job_profiler = False  # the job started its own profiler: no capture in this rank any more


def _rank_module() -> Any:
    import _traceread_rank  # the bootstrap's own module (already imported: it calls us)

    return _traceread_rank


def _cap(state: Any) -> _Capture:
    cap = getattr(state, "capture", None)
    if cap is None:
        cap = _Capture()
        state.capture = cap
    return cap


# --------------------------------------------------------------------------------------- series


def append_step(state: Any) -> None:
    """One line per optimizer step; never raises (a failure stops the series, logged once)."""
    cap = _cap(state)
    if cap.series_done:
        return
    try:
        if cap.series_fd is None:  # a restarted rank process starts its series again
            cap.series_fd = os.open(state.path("progress", f"rank{state.rank}.steps"),
                                    os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o644)
            try:
                os.unlink(state.path("progress", f"rank{state.rank}.exit"))
            except OSError:
                pass
            if not cap.exit_registered:  # registered after torch's own: runs before them at exit
                atexit.register(_at_exit, state, cap)
                cap.exit_registered = True
        os.write(cap.series_fd, f"{state.step} {time.time_ns()}\n".encode())
        cap.series_lines += 1
        if cap.series_lines >= MAX_SERIES_LINES:
            _close_series(cap)
            _rank_module()._log(state, f"step series: {MAX_SERIES_LINES} lines written; no more appended "
                                       f"(progress/rank{state.rank}.steps is bounded)")
    except BaseException:
        _close_series(cap)
        _rank_module()._log_exc(state, "step series append; series stopped")


def _close_series(cap: _Capture) -> None:
    cap.series_done = True
    if cap.series_fd is not None:
        try:
            os.close(cap.series_fd)
        except OSError:
            pass
        cap.series_fd = None


# ------------------------------------------------------------------------------------- captures


def on_step(state: Any) -> None:
    """After each optimizer step: drive a running capture, else look for a new request. Never raises."""
    cap = _cap(state)
    try:
        if cap.prof is not None:
            _advance(state, cap)
            return
        now = time.monotonic_ns()
        if now - cap.last_check_ns >= CHECK_EVERY_NS:
            cap.last_check_ns = now
            _check_request(state, cap)
        if cap.pending is not None:
            _maybe_start(state, cap)
    except BaseException as exc:
        _rank_module()._log_exc(state, f"capture (step {state.step})")
        _abandon(state, cap, f"failed: {exc!r}")


def _check_request(state: Any, cap: _Capture) -> None:
    path = state.path("inject", "capture.request")
    try:
        st = os.stat(path)
    except OSError:
        return
    sig = (st.st_mtime_ns, st.st_ino, st.st_size)
    if sig == cap.request_sig:
        return
    cap.request_sig = sig
    try:
        with open(path, encoding="utf-8") as fh:
            req = json.load(fh)
        rid, start, steps = int(req["id"]), int(req["start_step"]), int(req["steps"])
        ranks = req.get("ranks")
    except (OSError, ValueError, KeyError, TypeError):
        _rank_module()._log(state, f"capture request unreadable at step {state.step}; ignored")
        return
    if rid <= cap.seen_id:
        return
    cap.seen_id = rid
    if int(req.get("requested_at_ns") or 0) < _process_start_ns(state):
        return  # asked of an earlier process of this rank (before a restart): its step numbers are not ours
    if ranks is not None and state.rank not in {int(r) for r in ranks}:
        return
    entry = {"id": rid, "start_step": start, "steps": max(1, min(steps, MAX_CAPTURE_STEPS))}
    if cap.active is not None:
        _status(state, entry, "skipped", None, f"capture {cap.active['id']} still recording on this rank")
        return
    if cap.pending is not None:
        _status(state, cap.pending, "skipped", None, f"superseded by capture {rid} before it started")
    cap.pending = entry
    _rank_module()._log(state, f"capture {rid} requested: steps {start}-{start + entry['steps'] - 1} "
                               f"(now after step {state.step})")


def _process_start_ns(state: Any) -> int:
    """When this rank process started (its first clock sample), less a second of clock slack."""
    try:
        return int(state.info["clock"][0]["time_ns"]) - 1_000_000_000
    except (KeyError, IndexError, TypeError, ValueError):
        return 0


def on_job_profiler(state: Any) -> None:
    """The job starts its own profiler (two Kineto sessions at once crash the process): drop a capture
    that is recording, and never start one again in this rank. Never raises."""
    try:
        cap = _cap(state)
        cap.job_profiler = True
        if cap.prof is not None or cap.active is not None:
            _abandon(state, cap, "the job started its own profiler during the capture")
        elif cap.pending is not None:
            req, cap.pending = cap.pending, None
            _status(state, req, "skipped", None, "the job runs its own profiler")
    except BaseException:
        _rank_module()._log_exc(state, "capture: job profiler")


def _maybe_start(state: Any, cap: _Capture) -> None:
    req = cap.pending
    assert req is not None
    first, done = req["start_step"], state.step
    if cap.job_profiler or state.info.get("job_profiler"):
        cap.pending = None
        _status(state, req, "skipped", None, "the job runs its own profiler")
        return
    if done >= first:
        cap.pending = None
        _status(state, req, "missed", None, f"the request was read after step {done}, past the start step {first}")
        return
    if done < first - 1 - WARMUP_STEPS:
        return  # not yet
    if state.prof is not None and not state.profile_done:
        if done == first - 1:
            cap.pending = None
            _status(state, req, "skipped", None, "the default profiling window was still recording at the start step")
        return  # wait until the default window is done
    import torch

    if torch.autograd._profiler_enabled():
        cap.pending = None
        _status(state, req, "skipped", None, "another profiler (the job's own, or --every) is active")
        return
    cap.pending = None
    _start(state, cap, req, torch)


def _start(state: Any, cap: _Capture, req: dict[str, Any], torch: Any) -> None:
    from torch.profiler import ProfilerAction, ProfilerActivity, profile

    first, last = req["start_step"], req["start_step"] + req["steps"] - 1

    def schedule(step: int) -> Any:
        if step < first:
            return ProfilerAction.WARMUP
        if step < last:
            return ProfilerAction.RECORD
        return ProfilerAction.RECORD_AND_SAVE if step == last else ProfilerAction.NONE

    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    cfg = state.config
    folder = state.path("captures", f"capture{req['id']}")
    os.makedirs(folder, exist_ok=True)
    cap.active = {**req, "first": first, "last": last, "folder": folder, "t0": time.perf_counter()}
    prof = profile(activities=activities, schedule=schedule, on_trace_ready=lambda p: _export(state, cap, p),
                   record_shapes=bool(cfg.get("record_shapes", True)), with_stack=bool(cfg.get("with_stack", False)))
    # ProfilerStep#N is optimizer step N: the work that follows this hook is step state.step + 1
    prof.step_num = state.step + 1
    prof.current_action = prof._prev_schedule_action = schedule(prof.step_num)
    _rank_module()._fail_point(state, "capture")
    cap.prof = prof
    prof.start()
    if not cap.exit_registered:
        atexit.register(_at_exit, state, cap)
        cap.exit_registered = True
    _rank_module()._log(state, f"capture {req['id']} started after step {state.step}: records {first}-{last}")


def _advance(state: Any, cap: _Capture) -> None:
    prof = cap.prof
    prof.step()  # at the last step this exports (on_trace_ready) and leaves the profiler idle
    if cap.active is None or state.step >= cap.active["last"]:
        cap.prof = None
        prof.on_trace_ready = None
        prof.stop()
        cap.active = None


def _export(state: Any, cap: _Capture, prof: Any) -> None:
    act = cap.active
    assert act is not None
    name = f"rank{state.rank}.pt.trace.json.gz"
    final = os.path.join(act["folder"], name)
    tmp_json = os.path.join(act["folder"], f".rank{state.rank}.{os.getpid()}.json")
    tmp_gz = os.path.join(act["folder"], f".rank{state.rank}.{os.getpid()}.gz")
    t0 = time.perf_counter()
    try:
        prof.export_chrome_trace(tmp_json)
        with open(tmp_json, "rb") as src, gzip.open(tmp_gz, "wb", compresslevel=4) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        os.replace(tmp_gz, final)
        _status(state, act, "recorded", os.path.relpath(final, state.run_dir), None)
        _rank_module()._log(state, f"capture {act['id']} written to {os.path.relpath(final, state.run_dir)} "
                                   f"in {time.perf_counter() - t0:.3f} s")
    except BaseException as exc:
        _rank_module()._log_exc(state, f"capture {act['id']} export")
        _status(state, act, "failed", None, f"export: {exc!r}")
    finally:
        for tmp in (tmp_json, tmp_gz, f"{tmp_json}.tmp"):
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _status(state: Any, req: dict[str, Any], outcome: str, trace: str | None, reason: str | None) -> None:
    """``captures/capture{N}/rank{R}.json``: what this rank did with the request (``snap`` waits for it)."""
    try:
        folder = state.path("captures", f"capture{req['id']}")
        os.makedirs(folder, exist_ok=True)
        recorded = [req["start_step"], req["start_step"] + req["steps"] - 1] if outcome == "recorded" else None
        doc = {"id": req["id"], "rank": state.rank, "state": outcome, "steps": recorded, "trace": trace,
               "reason": reason, "time_ns": time.time_ns()}
        _rank_module()._atomic_write_json(os.path.join(folder, f"rank{state.rank}.json"), doc)
        if outcome != "recorded":
            _rank_module()._log(state, f"capture {req['id']} {outcome}: {reason}")
    except BaseException:
        _rank_module()._log_exc(state, "capture status")


def _abandon(state: Any, cap: _Capture, reason: str) -> None:
    """Stop a capture that broke; the job goes on without it."""
    prof, act = cap.prof, cap.active
    cap.prof, cap.active, cap.pending = None, None, None
    if prof is not None:
        try:
            prof.on_trace_ready = None
            prof.stop()
        except BaseException:
            pass
    if act is not None:
        _status(state, act, "failed", None, reason)


def _at_exit(state: Any, cap: _Capture) -> None:
    """The interpreter is exiting: say so at once (``progress/rank{R}.exit``: the seconds a job takes to
    tear down are no stall to the watch), then drop a capture cut short."""
    try:
        with open(state.path("progress", f"rank{state.rank}.exit"), "w", encoding="ascii") as fh:
            fh.write(f"{state.step} {time.time_ns()}\n")
    except BaseException:
        pass
    if cap.prof is not None:
        _abandon(state, cap, f"the job ended after step {state.step}, inside the capture")
    _close_series(cap)
