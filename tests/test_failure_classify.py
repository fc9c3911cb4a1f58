"""The first failure and its echoes, decided from run folders written here in the collector's own formats
(fast; the real torchrun jobs that fail each way are in tests/test_failure_e2e.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from traceread.analysis.hang.failure import classify, diagnose_failure

T0 = 1_795_000_000_000_000_000


def _error(run: Path, rank: int, message: str, t_ns: int, frames: list[tuple[str, int, str]] | None = None,
           folder: str = "") -> None:
    stack = "Traceback (most recent call last):\n" + "".join(
        f'  File "{f}", line {line}, in {func}\n    x()\n' for f, line, func in frames or []) + message + "\n"
    doc = {"message": {"message": message, "extraInfo": {"py_callstack": stack, "timestamp": str(t_ns // 10**9),
                                                         "timestamp_ns": str(t_ns)}}}
    d = run / folder / "errors"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"rank{rank}.json").write_text(json.dumps(doc))


def _progress(run: Path, rank: int, step: int, t_ns: int, folder: str = "") -> None:
    d = run / folder / "progress"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"rank{rank}").write_text(f"{step:>12d} {t_ns:>20d} {1000 + rank:>10d}\n")


@pytest.mark.parametrize("message, family", [
    ("RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.2]:4444", "peer_gone"),
    ("torch.distributed.DistBackendError: NCCL error: remote process exited or there was a network error, "
     "NCCL version 2.21.5 ncclRemoteError", "peer_gone"),
    ("RuntimeError: [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=12, OpType=ALLREDUCE) "
     "ran for 600000 milliseconds before timing out.", "watchdog_timeout"),
    ("RuntimeError: NCCL communicator was aborted on rank 2.", "comm_aborted"),
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", "oom"),
    ("RuntimeError: CUDA error: an illegal memory access was encountered", "cuda_illegal_access"),
    ("RuntimeError: CUDA error: device-side assert triggered", "cuda_illegal_access"),
    ("RuntimeError: CUDA error: uncorrectable ECC error encountered", "cuda_error"),
    ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error, "
     "ncclSystemError", "nccl_error"),
    ("KeyError: 'labels'", "python_error"),
])
def test_families(message: str, family: str) -> None:
    assert classify(message) == family


def test_an_echo_first_in_time_is_still_a_consequence(tmp_path: Path) -> None:
    """Rank 0's "Connection closed by peer" is stamped before rank 3's own error reached its file (a slow
    traceback write): the cause is still rank 3, and rank 0 is its consequence."""
    _error(tmp_path, 0, "RuntimeError: Connection closed by peer [10.0.0.4]:1", T0 + 5)
    _error(tmp_path, 3, "KeyError: 'labels'", T0 + 900, [("/site-packages/torch/x.py", 10, "f"),
                                                         ("/job/train.py", 41, "batch")])
    _error(tmp_path, 1, "RuntimeError: [Rank 1] Watchdog caught collective operation timeout", T0 + 10**9)
    for r in range(4):
        _progress(tmp_path, r, 17, T0 - 10**6)
    f = diagnose_failure(tmp_path)
    assert f is not None
    first = f["first"]
    assert (first["rank"], first["exception"], first["where"], first["step"]) == (3, "KeyError",
                                                                                 "/job/train.py:41 in batch", 17)
    assert {(c["rank"], c["family"]) for c in f["consequences"]} == {(0, "peer_gone"), (1, "watchdog_timeout")}
    assert f["lines"][0].startswith("Rank 3 failed first: KeyError: 'labels' at /job/train.py:41 in batch")


def test_two_failures_of_their_own_are_ordered_by_time(tmp_path: Path) -> None:
    _error(tmp_path, 5, "ValueError: late", T0 + 2 * 10**9)
    _error(tmp_path, 2, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 8.00 GiB", T0 + 10**9)
    f = diagnose_failure(tmp_path)
    assert f is not None
    assert (f["first"]["rank"], f["first"]["family"], f["first"]["exception"]) == (2, "oom", "OutOfMemoryError")
    assert "memory section" in f["first"]["next_step"]
    assert [(o["rank"], o["exception"]) for o in f["others"]] == [(5, "ValueError")]


def test_every_error_an_echo_names_no_cause(tmp_path: Path) -> None:
    _error(tmp_path, 0, "RuntimeError: [Rank 0] Watchdog caught collective operation timeout", T0)
    _error(tmp_path, 1, "RuntimeError: [Rank 1] Watchdog caught collective operation timeout", T0 + 10)
    f = diagnose_failure(tmp_path)
    assert f is not None and f["first"] is None
    assert "every error is an echo" in f["summary"] and "rank 0 reported first" in f["summary"]


def test_fatal_signal_dump(tmp_path: Path) -> None:
    (tmp_path / "stacks").mkdir()
    (tmp_path / "stacks" / "rank4.txt").write_text(
        "Fatal Python error: Aborted\n\nThread 0x1 (most recent call first):\n  File \"/x/threading.py\", line 1 in run\n\n"
        "Current thread 0x2 (most recent call first):\n"
        "  File \"/usr/lib/python3.11/site-packages/apex/fused.py\", line 80 in forward\n"
        "  File \"/job/model.py\", line 212 in forward\n  File \"/job/train.py\", line 9 in <module>\n")
    f = diagnose_failure(tmp_path)
    assert f is not None
    assert (f["first"]["rank"], f["first"]["family"], f["first"]["signal"]) == (4, "abort", "SIGABRT")
    assert f["first"]["where"] == "/job/model.py:212 in forward"


def test_attempts_are_listed_and_the_last_failed_one_answers(tmp_path: Path) -> None:
    _error(tmp_path, 1, "RuntimeError: CUDA error: an illegal memory access was encountered", T0 + 25 * 10**9)
    _progress(tmp_path, 1, 25, T0 + 24 * 10**9)
    _progress(tmp_path, 0, 25, T0 + 24 * 10**9)
    _progress(tmp_path, 0, 40, T0 + 90 * 10**9, "attempts/attempt1")
    _progress(tmp_path, 1, 40, T0 + 90 * 10**9, "attempts/attempt1")
    f = diagnose_failure(tmp_path)
    assert f is not None and f["attempt"] == 0 and f["first"]["rank"] == 1
    assert [(a["attempt"], a["steps"], a["failed"]) for a in f["attempts"]] == [(0, 25, True), (1, 40, False)]
    assert f["attempts"][0]["steps_lost"] == 25
    assert "2 attempts (torchrun restarts)" in f["summary"]


def test_damaged_error_file_is_one_problem_not_a_traceback(tmp_path: Path) -> None:
    (tmp_path / "errors").mkdir()
    (tmp_path / "errors" / "rank0.json").write_text("{not json")
    (tmp_path / "run.json").write_text(json.dumps({"exit_code": 1}))
    f = diagnose_failure(tmp_path)
    assert f is not None and f["first"] is None and f["exit_code"] == 1
    assert any("rank0.json" in p for p in f["problems"])


def test_a_clean_run_has_no_failure(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text(json.dumps({"exit_code": 0}))
    _progress(tmp_path, 0, 10, T0)
    assert diagnose_failure(tmp_path) is None


def test_one_process_killed_by_the_oom_killer(tmp_path: Path) -> None:
    """A plain ``python train.py`` (no torchrun) SIGKILLed: collect exits 128+9, the rank left no error and never
    reached its exit: killed by SIGKILL, with the OOM killer / scheduler as the next step."""
    (tmp_path / "run.json").write_text(json.dumps({"exit_code": 137}))
    (tmp_path / "ranks").mkdir()
    (tmp_path / "ranks" / "rank0.json").write_text(json.dumps({"rank": 0, "host": "node7", "pid": 4242,
                                                               "clock": [{"label": "start", "time_ns": T0}]}))
    _progress(tmp_path, 0, 31, T0 + 10**9)
    # the watch's per-step series and exit mark sit beside it and are not progress files (sorted after it)
    (tmp_path / "progress" / "rank0.steps").write_text("".join(f"{s} {T0 + s}\n" for s in range(1, 32)))
    (tmp_path / "progress" / "rank0.exit").write_text(f"{T0 + 2 * 10**9}\n")
    f = diagnose_failure(tmp_path)
    assert f is not None
    first = f["first"]
    assert (first["rank"], first["family"], first["signal"], first["host"], first["step"]) == \
        (0, "killed", "SIGKILL", "node7", 31)
    assert "OOM killer" in first["next_step"]


def test_a_job_the_collector_killed_on_a_hang_did_not_fail_of_its_own(tmp_path: Path) -> None:
    """``--on-hang kill``: collect stopped the hung one-process job and exits 1. That exit code is the collector's,
    not a rank's failure: no first failure, the summary sends the reader to the hang (which leads the report).
    The same folder without the kill record is a failure of rank 0 (its exit code), so the rule has two sides."""
    run = {"exit_code": 1, "hang": {"action": "kill", "timeout_s": 15.0}}
    (tmp_path / "run.json").write_text(json.dumps(run))
    (tmp_path / "ranks").mkdir()
    (tmp_path / "ranks" / "rank0.json").write_text(json.dumps({"rank": 0, "host": "node7", "pid": 4242,
                                                               "clock": [{"label": "start", "time_ns": T0}]}))
    _progress(tmp_path, 0, 20, T0 + 10**9)
    f = diagnose_failure(tmp_path)
    assert f is not None and f["first"] is None
    assert "found the job hung and stopped it" in f["summary"]
    (tmp_path / "run.json").write_text(json.dumps({"exit_code": 1}))
    g = diagnose_failure(tmp_path)
    assert g is not None and g["first"]["rank"] == 0


def test_terminal_control_in_an_error_message_is_made_visible(tmp_path: Path) -> None:
    _error(tmp_path, 2, "RuntimeError: boom \x1b[2J\x1b]0;owned\x07 here", T0)
    f = diagnose_failure(tmp_path)
    assert f is not None and "\x1b" not in json.dumps(f, ensure_ascii=False)
    assert "\\x1b[2J" in f["first"]["message"]
