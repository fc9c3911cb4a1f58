"""The collector never changes the job, on real 2-rank torchrun/gloo jobs.

* The job's own SIGUSR2 handler fires under ``collect`` (SLURM ``--signal=USR2@60``, checkpoint on
  preemption), no signal is blocked in a rank or in the processes it starts, SIGUSR1 keeps its
  default action, and the hang dump still works (tests/test_collect_unit.py, test_collect_e2e.py).
* A run folder that cannot be created (a path through a file, a read-only file system, an immutable
  parent, no free inodes) runs the job anyway, uncollected, with one warning.
* A disk that fills up mid-run: the job's output still passes through, the collector says once that
  ``launcher.log`` stopped, and no temporary file is left in the run folder.
* A job that never imports torch is told so, not "use --wait 0".

Mounting a small tmpfs needs root (as in CI here): those cases are marked `root` and fail with one line
for another user (`-m "not root"` leaves them out on purpose).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import needs
import pytest
from test_collect_faults import FAULT_JOB, JOBS, collect_cmd, env, torchrun

needs.module("torch")
pytestmark = pytest.mark.slow
SHORT_WINDOW = ["--wait", "0", "--warmup", "1", "--active", "2"]


def _lines(text: str) -> list[str]:
    """The ranks' report lines (two ranks share torchrun's stdout: a line may be cut by another's)."""
    return re.findall(r"rank \d: handler [^;]*; SigBlk \S+; child SigBlk \S+; SIGUSR1 caught (?:True|False)", text)


def test_job_keeps_its_own_sigusr2_and_signal_mask(tmp_path: Path) -> None:
    job = torchrun(JOBS / "signal_train.py")
    bare = subprocess.run(job, env=env(), capture_output=True, text=True, timeout=120)
    assert bare.returncode == 0, bare.stderr[-2000:]
    res = subprocess.run(collect_cmd(tmp_path / "run", torchrun(JOBS / "signal_train.py"), *SHORT_WINDOW),
                         env=env(), capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    expected = [f"rank {r}: handler fired; SigBlk 0x0; child SigBlk 0x0; SIGUSR1 caught False" for r in (0, 1)]
    assert sorted(_lines(bare.stdout)) == expected  # the job as it is without traceread ...
    assert sorted(_lines(res.stdout)) == expected  # ... and under collect
    assert len(list((tmp_path / "run" / "traces").glob("rank*.pt.trace.json.gz"))) == 2  # still collected
    triggers = [json.loads(p.read_text())["dump_trigger"] for p in (tmp_path / "run" / "ranks").glob("rank*.json")]
    assert len(triggers) == 2 and not any(map(os.path.exists, triggers))  # the dump FIFOs are gone


def _mount_tmpfs(path: Path, options: str) -> None:
    needs.root("mount a tmpfs")
    path.mkdir(parents=True, exist_ok=True)
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, f"cannot mount a tmpfs as root: {res.stderr.strip()}"


@contextmanager
def unusable(kind: str, tmp_path: Path) -> Iterator[Path]:
    """A run folder path that cannot be created, for each way that happens."""
    undo: list[list[str]] = []
    try:
        if kind == "path-through-file":
            (tmp_path / "afile").write_text("not a folder")
            yield tmp_path / "afile" / "run"
        elif kind == "read-only-fs":
            _mount_tmpfs(tmp_path / "ro", "ro,size=1m")
            undo.append(["umount", "-l", str(tmp_path / "ro")])
            yield tmp_path / "ro" / "run"
        elif kind == "immutable-parent":
            parent = tmp_path / "frozen"
            parent.mkdir()
            if os.geteuid() == 0 and shutil.which("chattr"):
                subprocess.run(["chattr", "+i", str(parent)], check=True)
                undo.append(["chattr", "-i", str(parent)])
            else:
                parent.chmod(0o555)
                undo.append(["chmod", "755", str(parent)])
            yield parent / "run"
        elif kind == "no-free-inodes":
            mnt = tmp_path / "inodes"
            _mount_tmpfs(mnt, "size=1m,nr_inodes=16")
            undo.append(["umount", "-l", str(mnt)])
            for i in range(100):
                try:
                    (mnt / f"f{i}").touch()
                except OSError:
                    break
            yield mnt / "run"
        else:
            raise AssertionError(kind)
    finally:
        for cmd in undo:
            subprocess.run(cmd, capture_output=True)


@pytest.mark.parametrize("kind", ["path-through-file", pytest.param("read-only-fs", marks=pytest.mark.root),
                                  "immutable-parent", pytest.param("no-free-inodes", marks=pytest.mark.root)])
def test_unusable_run_folder_still_runs_the_job(tmp_path: Path, kind: str) -> None:
    with unusable(kind, tmp_path) as run:
        res = subprocess.run(collect_cmd(run, torchrun(FAULT_JOB, "--steps", "3")), env=env(),
                             capture_output=True, text=True, timeout=120)
        assert not run.exists()
    assert res.returncode == 0, res.stderr[-3000:]
    assert "step 2 loss" in res.stdout  # every step ran
    ours = [line for line in res.stderr.splitlines() if line.startswith("[traceread]")]
    assert len(ours) == 1 and ours[0].startswith(f"[traceread] cannot use {run}: "), ours
    assert "running the command without collection" in ours[0]
    assert "Traceback" not in res.stderr


@pytest.mark.root
def test_disk_full_mid_run(tmp_path: Path) -> None:
    """A 256 KiB file system: the job prints 512 KiB after its first step, which fills it."""
    disk = tmp_path / "small"
    _mount_tmpfs(disk, "size=256k")
    try:
        run = disk / "run"
        res = subprocess.run(collect_cmd(run, torchrun(FAULT_JOB, "--steps", "6", "--print-kb", "512"), *SHORT_WINDOW),
                             env=env(), capture_output=True, text=True, timeout=120)
        leftovers = [str(p.relative_to(run)) for p in run.rglob("*")
                     if p.name.startswith(".") or ".tmp" in p.name or p.name.endswith(".dump")]
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
    assert res.returncode == 0, res.stderr[-3000:]
    chatter = [line for line in res.stdout.splitlines() if line.startswith("chatter ")]
    assert len(chatter) == 512 * 16 and "step 5 loss" in res.stdout  # all of the job's output, every step
    stopped = [line for line in res.stderr.splitlines() if "launcher.log: cannot write any more" in line]
    assert len(stopped) == 1 and "No space left on device" in stopped[0], res.stderr[-2000:]
    assert leftovers == []  # no temporary file (empty or partial) left behind
    assert "Traceback" not in res.stderr


def test_job_without_torch_is_told_so(tmp_path: Path) -> None:
    res = subprocess.run(collect_cmd(tmp_path / "run", torchrun(JOBS / "no_torch.py")), env=env(),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "no rank imported torch (2 rank(s) ran without it)" in res.stderr  # in the closing summary
    assert "--wait" not in res.stderr
