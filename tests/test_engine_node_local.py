"""Traces on each node's own disk (``--node-local``), on a real two-node local Ray cluster.

Both nodes run on this machine, so they share its file system; each node's raylet gets its own
``TRACEREAD_TEST_NODE`` (a or b), and the report's path ``ROOT/$TRACEREAD_TEST_NODE`` is expanded on
each node, so node a lists ranks 0-3 and node b ranks 4-7, as two machines with local NVMe would.
The report must equal the local one of the same eight files, each rank's task must run on the node
that listed its file, and a folder both nodes list identically (a shared file system) is read once.
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
NODE_VAR = "TRACEREAD_TEST_NODE"


@pytest.fixture(scope="module")
def cluster() -> object:
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "env_vars": {NODE_VAR: "a"}})
    c.add_node(num_cpus=1, env_vars={NODE_VAR: "b"})
    c.wait_for_nodes()
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    ray.init(address=c.address, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield c
    ray.shutdown()
    c.shutdown()


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ROOT/full: an 8-rank TP x DP job; ROOT/a and ROOT/b: its ranks 0-3 and 4-7 (one "disk" each)."""
    root = tmp_path_factory.mktemp("nodes")
    simulate("tp", root / "full", ranks=8, tp=4, steps=2, layers=2)
    for node, ranks in (("a", range(4)), ("b", range(4, 8))):
        (root / node).mkdir()
        for r in ranks:
            shutil.copy2(root / "full" / f"rank{r}.pt.trace.json.gz", root / node)
    return root


def _without_paths(doc: dict) -> dict:
    """The document minus where the files were (local paths vs node:// URLs) and the cycle note."""
    doc = dict(doc)
    # profiling cycles are grouped on the driver for files it can peek into (as for object URLs)
    doc["source"] = {k: v for k, v in doc["source"].items() if k not in ("paths", "cycle")}
    doc["ranks"] = [{k: v for k, v in r.items() if k != "file"} for r in doc["ranks"]]
    return doc


def test_each_node_lists_its_own_files(job: Path, cluster: object) -> None:
    from traceread.engine.node_local import find_on_nodes

    files, notes = find_on_nodes([f"{job}/${NODE_VAR}"], None)
    assert notes == []
    by_node: dict[str, set[str]] = {}
    for f in files:
        by_node.setdefault(f.node_id, set()).add(Path(f.path).parent.name + "/" + f.name)
        assert not f.shared and f.url == f"node://{f.host}{f.path}"
    assert sorted(map(sorted, by_node.values())) == [
        [f"a/rank{r}.pt.trace.json.gz" for r in range(4)], [f"b/rank{r}.pt.trace.json.gz" for r in range(4, 8)]]


def test_a_shared_folder_is_read_once(job: Path, cluster: object) -> None:
    from traceread.engine.node_local import find_on_nodes

    files, _ = find_on_nodes([str(job / "full")], None)
    assert len(files) == 8 and all(f.shared for f in files)


def test_node_local_report_equals_local(job: Path, cluster: object) -> None:
    local = build_report([job / "full"], ReportOptions(use_cache=False, workers=2))
    nodes = build_report([f"{job}/${NODE_VAR}"], ReportOptions(use_cache=False, executor="ray", node_local=True))
    assert nodes["source"]["ranks_read"] == 8
    assert all(r["file"].startswith("node://") for r in nodes["ranks"])
    assert differences(_without_paths(local), _without_paths(nodes)) == []


def _node_id(task: object) -> str:
    return ray.get_runtime_context().get_node_id()


def test_each_task_runs_on_the_node_that_holds_its_file(job: Path, cluster: object) -> None:
    """The executor's placement, probed: the same map with a function that says where it ran."""
    from ray import cloudpickle

    from traceread.engine.node_local import find_on_nodes
    from traceread.engine.ray_executor import RayExecutor
    from traceread.engine.tasks import RankTask

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    files, _ = find_on_nodes([f"{job}/${NODE_VAR}"], None)
    assert len({f.node_id for f in files}) == 2
    ran_on: dict[int, str] = {}
    RayExecutor().map(_node_id, [(RankTask(f),) for f in files], lambda i, r: ran_on.__setitem__(i, r))
    assert [ran_on[i] for i in range(len(files))] == [f.node_id for f in files]


def test_a_file_changed_after_listing_is_one_line(job: Path, cluster: object, tmp_path: Path) -> None:
    from traceread.assemble import run_map
    from traceread.engine.node_local import find_on_nodes
    from traceread.errors import TraceFileError

    folder = tmp_path / "changing"
    shutil.copytree(job / "a", folder)
    files, _ = find_on_nodes([str(folder)], None)
    victim = Path(files[0].path)
    victim.write_bytes(victim.read_bytes() + b"\n")
    got = run_map.summarise_files(files, ReportOptions(use_cache=False, executor="ray", node_local=True))
    assert isinstance(got[files[0]], TraceFileError) and "changed since it was listed" in got[files[0]].message
    assert not any(isinstance(got[f], TraceFileError) for f in files[1:])


def test_node_local_needs_ray_executor(job: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "traceread", "report", str(job / "a"), "--node-local",
                        "--format", "json"], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert r.returncode == 2 and "--node-local goes with --executor ray" in r.stderr


def test_cycle_choice_on_node_local_files_is_said(job: Path, cluster: object) -> None:
    """Node-local files are not grouped into cycles on the driver: ``--cycle 2`` cannot be applied,
    and the report says so instead of ignoring it silently."""
    doc = build_report([f"{job}/${NODE_VAR}"], ReportOptions(use_cache=False, executor="ray", node_local=True,
                                                             cycle="2"))
    assert doc["source"]["ranks_read"] == 8
    assert any(w.startswith("--cycle 2 applies to files this machine can read") for w in doc["warnings"])
