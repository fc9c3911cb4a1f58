"""Hostile run folders through ``traceread hang`` (issue 28's cases on the Flight Recorder loader and the hang
sources): non-finite numbers, nesting bombs, a pickle "billion laughs", container-opcode pickles, FIFOs
where files should be, and huge logs and stacks, each answered with one line or a diagnosis, in bounded
memory and time, never a traceback or a hang."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from click.testing import CliRunner

from traceread.analysis.hang.diagnose import diagnose
from traceread.analysis.hang.flight_recorder import read_dump
from traceread.cli import cli
from traceread.errors import TraceFileError

DATA = Path(__file__).parent / "data" / "fr"
RUN = DATA / "gloo_skip"
REPO = Path(__file__).resolve().parents[1]


def _run(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    return run


def _hang(path: Path, *extra: str) -> tuple[int, str]:
    res = CliRunner().invoke(cli, ["hang", str(path), *extra])
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output
    return res.exit_code, res.output


@pytest.mark.parametrize("field", ["record_id", "collective_seq_id", "last_enqueued_collective"])
def test_infinity_in_a_json_dump(tmp_path: Path, field: str) -> None:
    run = _run(tmp_path)
    (run / "fr" / "rank0.pkl").unlink()
    doc = json.loads((run / "fr" / "rank0.json").read_text())
    if field == "last_enqueued_collective":
        doc["pg_status"]["0"][field] = float("inf")
    else:
        doc["entries"][-1][field] = float("inf")
    (run / "fr" / "rank0.json").write_text(json.dumps(doc))  # Python writes Infinity
    code, out = _hang(run)
    assert code == 0  # the dump is refused with one line; rank 1's pickle and the stacks still answer
    assert "rank0.json: not valid JSON" in out


@pytest.mark.parametrize("field", ["record_id", "collective_seq_id", "last_enqueued_collective"])
def test_infinity_and_huge_numbers_in_a_pickle(tmp_path: Path, field: str) -> None:
    run = _run(tmp_path)
    doc = pickle.loads((run / "fr" / "rank0.pkl").read_bytes())  # our own fixture
    for bad in (float("inf"), float("nan"), 10**400, "12x"):
        if field == "last_enqueued_collective":
            doc["pg_status"]["0"][field] = bad
        else:
            doc["entries"][-1][field] = bad
        (run / "fr" / "rank0.pkl").write_bytes(pickle.dumps(doc, protocol=2))
        code, _out = _hang(run, "--format", "json")
        assert code == 0


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("where", ["fr/rank1.json", "hang.json", "errors/rank0.json", "run.json"])
def test_deep_nesting(tmp_path: Path, where: str) -> None:
    run = _run(tmp_path)
    if where.startswith("fr/"):
        (run / "fr" / "rank1.pkl").unlink()
    (run / where).write_text('{"version": "2.10", "entries": ' + _nested(200_000) + "}")
    code, out = _hang(run)
    assert code == 0
    assert "nested too deeply" in out or where == "run.json"


def _laughs(depth: int) -> object:
    """2**depth leaves reached through ``depth`` shared lists: a few hundred bytes pickled."""
    x: object = [1]
    for _ in range(depth):
        x = [x, x]
    return x


def test_pickle_billion_laughs_is_bounded(tmp_path: Path) -> None:
    run = _run(tmp_path)
    doc = pickle.loads((run / "fr" / "rank0.pkl").read_bytes())  # our own fixture
    bomb = _laughs(40)
    doc["entries"][-1]["input_sizes"] = bomb
    doc["entries"][-1]["frames"] = [{"name": bomb, "filename": bomb, "line": bomb}] * 1000
    doc["pg_config"] = {"0": {"name": "0", "desc": bomb, "ranks": bomb}}
    data = pickle.dumps(doc, protocol=2)
    assert len(data) < 40_000
    (run / "fr" / "rank0.pkl").write_bytes(data)
    tracemalloc.start()
    try:
        d = diagnose(run, workers=1)
        _cur, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert d is not None and d.entry["missing_ranks"] == [1]
    assert peak < 64 << 20
    assert len(d.entry["groups"][0]["sizes"]) < 4096  # printed up to a bound


def test_container_opcode_pickle_is_refused_before_it_loads(tmp_path: Path) -> None:
    f = tmp_path / "rank0.pkl"
    f.write_bytes(b"\x80\x02}q\x00(X\x07\x00\x00\x00versionX\x04\x00\x00\x002.10X\x07\x00\x00\x00entries]("
                  + b"}" * 12_000_000 + b"eu.")
    with pytest.raises(TraceFileError, match="would need up to"):
        read_dump(f)


def _fifo_run(tmp_path: Path) -> Path:
    run = _run(tmp_path)
    os.mkfifo(run / "errors" / "rank2.json")
    os.mkfifo(run / "stacks" / "rank3.txt")
    os.mkfifo(run / "fr" / "rank2.json")
    os.mkfifo(run / "launcher.log")
    os.mkfifo(run / "hang_stack.txt")
    return run


def test_fifos_never_block(tmp_path: Path) -> None:
    run = _fifo_run(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    res = subprocess.run([sys.executable, "-m", "traceread", "hang", str(run)], capture_output=True, text=True,
                         timeout=120, env=env, stdin=subprocess.DEVNULL)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("Rank 1 never joined all_reduce #12")
    assert "Traceback" not in res.stderr


def test_a_frame_pointing_at_a_fifo_or_a_device_is_not_read(tmp_path: Path) -> None:
    from traceread.analysis.hang.stack_dumps import Frame, source_line

    os.mkfifo(tmp_path / "train.py")
    assert source_line(Frame(str(tmp_path / "train.py"), 3, "f")) is None
    assert source_line(Frame("/dev/zero", 3, "f")) is None


def test_huge_logs_and_stacks_are_read_by_their_tails(tmp_path: Path) -> None:
    """A 1 GiB launcher.log cost 2 GiB: logs and stacks are now read by their last MiBs (the watchdog lines
    are streamed)."""
    run = _run(tmp_path)
    line = "[rank0]: " + "step 41 loss 2.3456 lr 0.0001 tokens/s 123456 " * 24 + "\n"
    with open(run / "launcher.log", "w") as fh:
        for _ in range((40 << 20) // len(line)):
            fh.write(line)
        fh.write("[rank1]: about to save the checkpoint\n")
    stack = (run / "stacks" / "rank1.txt").read_text()
    (run / "stacks" / "rank1.txt").write_text(stack * ((6 << 20) // len(stack)))
    tracemalloc.start()
    try:
        d = diagnose(run, workers=1)
        _cur, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert d.entry["culprits"][0]["log"] == "about to save the checkpoint"
    assert any("launcher.log: 41,9" in x and "last 6 MiB were read" in x for x in d.entry["evidence"])
    assert d.entry["stacks"]["1"].endswith("in train_step")
    assert peak < 24 << 20, peak  # reading the log whole took more than 100 MiB
