"""Stack dump parsing on real faulthandler and py-spy 0.4.3 output (tests/data)."""

from __future__ import annotations

import faulthandler
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from traceread.analysis.hang.stack_dumps import (
    collective_call,
    parse_stack_text,
    read_stack_file,
    read_stacks_dir,
    stuck_frame,
)
from traceread.errors import TraceFileError

DATA = Path(__file__).parent / "data"
JOB = DATA / "hang_job.py"


def _line_of(path: Path, needle: str) -> int:
    return next(i for i, text in enumerate(path.read_text().splitlines(), 1) if needle in text)


def test_faulthandler_real_dump_picks_main_thread_user_frame() -> None:
    # written by faulthandler.dump_traceback from a helper thread while the main thread was blocked
    rs = read_stack_file(DATA / "fr" / "gloo_skip" / "stacks" / "rank1.txt")
    assert rs.rank == 1 and rs.fmt == "faulthandler" and len(rs.threads) == 2
    main = rs.main
    assert main is not None and not main.current  # the dumping thread is not the training loop
    f = stuck_frame(main)
    assert f is not None and f.func == "train_step"
    assert f.short() == f"hang_job.py:{_line_of(JOB, 'time.sleep(')} in train_step"
    assert collective_call(main) is None


def test_faulthandler_waiting_rank_is_in_all_reduce() -> None:
    rs = read_stack_file(DATA / "fr" / "gloo_skip" / "stacks" / "rank0.txt")
    main = rs.main
    assert collective_call(main) == "all_reduce"
    # innermost frames are torch internals; the stuck frame is the user's call site
    assert main.frames[0].file.endswith("distributed_c10d.py")
    assert stuck_frame(main).short() == f"hang_job.py:{_line_of(JOB, 'dist.all_reduce(x)')} in train_step"


def test_pyspy_real_dumps() -> None:
    stacks, problems = read_stacks_dir(DATA / "stacks" / "pyspy_gloo" / "stacks")
    assert problems == [] and sorted(stacks) == [0, 1]
    assert stacks[0].fmt == "py-spy"
    assert stacks[0].main.name == "MainThread"
    assert collective_call(stacks[0].main) == "all_reduce"
    assert stuck_frame(stacks[0].main).short() == "train_gloo.py:9 in train_step"
    assert collective_call(stacks[1].main) is None
    assert stuck_frame(stacks[1].main).short() == "train_gloo.py:8 in train_step"


def test_pyspy_locals_blocks_and_threads() -> None:
    rs = read_stack_file(DATA / "stacks" / "pyspy_locals_threads.txt", rank=5)
    assert [t.name for t in rs.threads] == ["MainThread", "loader"]
    assert [f.func for f in rs.threads[0].frames] == ["train_step", "<module>"]
    assert stuck_frame(rs.main).short() == "train.py:8 in train_step"
    # a non-main thread's own user frame is not confused with the main thread
    assert stuck_frame(rs.threads[1]).short() == "train.py:5 in loader"


def test_appended_dumps_last_one_wins(tmp_path: Path) -> None:
    """faulthandler appends (SIGUSR1 twice, or dump_traceback_later repeating): use the newest."""
    script = tmp_path / "two_dumps.py"
    out = tmp_path / "stacks.txt"
    script.write_text(textwrap.dedent(f"""
        import faulthandler
        fh = open({str(out)!r}, "w")
        def first():
            faulthandler.dump_traceback(file=fh, all_threads=True)
        def second():
            faulthandler.dump_traceback(file=fh, all_threads=True)
        first()
        second()
    """))
    subprocess.run([sys.executable, str(script)], check=True, timeout=30)
    rs = read_stack_file(out, rank=0)
    assert stuck_frame(rs.main).func == "second"


def test_own_process_dump(tmp_path: Path) -> None:
    out = tmp_path / "rank3.txt"
    with open(out, "w") as fh:
        faulthandler.dump_traceback(file=fh, all_threads=True)
    rs = read_stack_file(out)
    assert rs.rank == 3 and rs.threads
    assert any(f.func == "test_own_process_dump" for t in rs.threads for f in t.frames)


@pytest.mark.parametrize("text", ["", "hello\nworld\n", "Traceback (most recent call last):\n  File x"])
def test_not_a_stack_dump(text: str) -> None:
    with pytest.raises(TraceFileError):
        parse_stack_text(text, 0, Path("stacks/rank0.txt"))


def test_garbled_files_are_problems_not_crashes(tmp_path: Path) -> None:
    (tmp_path / "rank0.txt").write_bytes(b"\xff\xfe garbage \x00")
    (tmp_path / "rank1.txt").write_text((DATA / "fr" / "gloo_skip" / "stacks" / "rank1.txt").read_text()[:200])
    stacks, problems = read_stacks_dir(tmp_path)
    assert len(problems) == 1 and "rank0.txt" in problems[0]
    assert 1 in stacks  # truncated dump still parses what it has
