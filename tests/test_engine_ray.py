"""The per-rank stage on Ray gives the same report document as the local engine.

A local Ray head with 2 CPUs (module-scoped: started once) runs each rank's read + summarise as a
task; the driver does the cross-rank reduce. Compared field by field (timing fields aside) on the
sample run and on simulated jobs (tensor parallel with data parallel, pipeline parallel, a 3D job:
DP x TP x PP), with a broken rank among them, which both engines must report the same way.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import needs
import pytest
from engine_docs import differences

from traceread.assemble.report import ReportOptions, build_report
from traceread.simulate import simulate

ray = needs.module("ray")

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "sample_traces" / "ddp_straggler_h100"


@pytest.fixture(scope="module")
def ray_head() -> object:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    for attempt in range(3):  # Ray gives its raylet a fixed 30 s to register: a busy CI box may need another go
        if ray.is_initialized():
            break
        try:
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
                     runtime_env={"env_vars": {"PYTHONPATH": path}})
        except Exception:
            ray.shutdown()
            if attempt == 2:
                raise
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("jobs")
    out = {"sample": root / "sample"}
    shutil.copytree(SAMPLE, out["sample"])
    simulate("tp", root / "tp_dp", ranks=8, tp=4, steps=2, layers=2)  # 2 data-parallel replicas of TP 4
    simulate("pp", root / "pp", ranks=4, microbatches=4, steps=2, layers=2)
    simulate("3d", root / "3d", steps=2)  # DP 2 x TP 4 x PP 2, one TP group across two nodes
    out["tp_dp"], out["pp"], out["3d"] = root / "tp_dp", root / "pp", root / "3d"
    (root / "pp" / "rank9.pt.trace.json.gz").write_bytes(b"\x1f\x8b broken")  # one rank lost in transit
    return out


def _doc(path: Path, executor: str) -> dict:
    return build_report([path], ReportOptions(use_cache=False, workers=2, executor=executor))  # type: ignore[return-value]


@pytest.mark.parametrize("job", ["sample", "tp_dp", "pp", "3d"])
def test_ray_document_equals_local(job: str, jobs: dict[str, Path], ray_head: object) -> None:
    local, on_ray = _doc(jobs[job], "local"), _doc(jobs[job], "ray")
    assert local["ranks"] and local["collectives"]
    if job == "pp":
        assert local["pipeline"] is not None and local["pipeline"]["bubble_pct"] is not None
        assert any("rank 9 missing" in w for w in local["warnings"])
    assert differences(local, on_ray) == []


def _die(code: int) -> bytes:
    os._exit(code)


def test_lost_task_is_retried_once_then_reported(ray_head: object) -> None:
    """A task whose worker dies is retried by Ray once, then becomes the rank's reason."""
    from ray import cloudpickle  # vendored by ray: no extra dependency

    from traceread.engine.base import TaskFailed
    from traceread.engine.ray_executor import RayExecutor

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    got: dict[int, object] = {}
    RayExecutor().map(_die, [(3,)], lambda i, r: got.__setitem__(i, r))
    assert isinstance(got[0], TaskFailed) and "Ray task failed twice" in got[0].reason


def test_cli_executor_ray_without_ray_is_one_line(tmp_path: Path) -> None:
    """``--executor ray`` where Ray cannot be imported: one line saying what to install, exit 2."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    code = "import sys; sys.modules['ray'] = None; from traceread.cli import main; main()"  # ray not importable
    r = subprocess.run([sys.executable, "-c", code, "report", str(SAMPLE), "--executor", "ray", "--format", "json"],
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == "traceread: error: --executor ray needs Ray: pip install 'traceread[ray]'"


def test_second_report_is_served_on_the_driver(jobs: dict[str, Path], ray_head: object, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Summaries that came back from Ray tasks are cached on the driver: no task runs the second time."""
    from traceread.engine import caches, ray_executor

    opts = ReportOptions(cache_dir=tmp_path / "cache", executor="ray")
    first = build_report([jobs["tp_dp"]], opts)
    shutil.rmtree(tmp_path / "cache" / caches.DOCUMENT_FOLDER)

    def no_tasks(self: object, *a: object) -> None:
        raise AssertionError("a Ray task ran although every summary was cached")

    monkeypatch.setattr(ray_executor.RayExecutor, "map", no_tasks)
    assert differences(first, build_report([jobs["tp_dp"]], opts)) == []


def test_max_rank_bytes_travels_with_the_task(jobs: dict[str, Path], ray_head: object, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """``--max-rank-bytes`` set on the driver after Ray started (so no worker inherited it) still
    bounds every Ray task: the limit is part of the task, not of the environment."""
    from traceread.assemble import run_map
    from traceread.errors import TraceFileError
    from traceread.read.inflate import MAX_RANK_BYTES_ENV

    files = sorted(jobs["tp_dp"].glob("rank*.pt.trace.json.gz"))
    monkeypatch.setenv(MAX_RANK_BYTES_ENV, str(64 << 10))  # every simulated rank expands past 64 KiB
    got = run_map.summarise_files(files, ReportOptions(use_cache=False, executor="ray"))
    assert set(got) == set(files)
    assert all(isinstance(r, TraceFileError) and "--max-rank-bytes" in r.message for r in got.values()), got
    monkeypatch.delenv(MAX_RANK_BYTES_ENV)
    got = run_map.summarise_files(files, ReportOptions(use_cache=False, executor="ray"))
    assert not any(isinstance(r, TraceFileError) for r in got.values())
