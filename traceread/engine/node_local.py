"""Traces on each node's own disk (``traceread report PATHS --executor ray --node-local``).

A job that profiles thousands of GPUs often writes each rank's trace to the local NVMe of the node
it ran on: copying terabytes to shared storage first is the slow part. With ``--node-local`` the
driver lists ``PATHS`` on every alive Ray node (one small task pinned to each node: the same folder
name holds different ranks on different nodes), and each rank's read + summarise task is pinned to
the node that holds its file, so the trace never crosses the network; only its summary does.

Paths are made absolute on the driver, then ``$VARS`` and ``~`` are expanded on each node (quote
them: ``'/scratch/$SLURMD_NODENAME/run7'``). A file that several nodes list with the same size and
``mtime_ns`` is on a shared file system: it is read once, preferably (not necessarily) on the first
node that listed it. Only trace files are read this way: ``run.json``, NCCL logs and hang evidence
are read on the driver when the paths hold them there.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import PurePosixPath
from typing import Any

SCHEME = "node://"


@dataclass(frozen=True)
class NodeFile:
    """A trace file on one Ray node's disk: where it is, and what says it is unchanged."""

    host: str  # the node's host name: with the path, the file's stable identity (caches key on it)
    path: str  # absolute, as the node sees it
    size: int
    mtime_ns: int
    node_id: str  # the Ray node to run on (changes when the node restarts; not part of the identity)
    shared: bool = False  # several nodes list it identically: a shared file system, any node can read it

    #: Same attribute as an object URL's: the driver passes it through without peeking into it.
    @property
    def url(self) -> str:
        return f"{SCHEME}{self.host}{self.path}"

    @property
    def name(self) -> str:
        return PurePosixPath(self.path).name

    def identity(self) -> dict[str, Any]:
        return {"url": self.url, "size": self.size, "mtime_ns": self.mtime_ns}

    def __str__(self) -> str:
        return self.url


def list_here(paths: list[str]) -> dict[str, Any]:
    """Runs on one node: its host name, and the trace files (path, size, mtime_ns) under ``paths``."""
    import socket

    from traceread.read.discover import find

    found = find([os.path.expanduser(os.path.expandvars(p)) for p in paths])
    files = []
    for f in found.files:
        try:
            st = os.stat(f)
        except OSError:
            continue
        files.append((str(os.path.abspath(f)), st.st_size, st.st_mtime_ns))
    return {"host": socket.gethostname(), "files": files}


def placement(file: Any) -> tuple[str, bool] | None:
    """(Ray node id, soft) for a work item's file: pinned for a node-local file, preferred for a
    shared one, free (None) for anything else."""
    if isinstance(file, NodeFile):
        return file.node_id, file.shared
    return None


def pinned(node_id: str, soft: bool) -> Any:
    """The scheduling strategy that runs a task on ``node_id`` (or prefers it, when ``soft``)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=soft)


def find_on_nodes(paths: list[str], address: str | None) -> tuple[list[NodeFile], list[str]]:
    """Every alive node's trace files under ``paths`` (listed there), and one warning per node that
    could not list them. Files found identically on several nodes appear once, marked shared."""
    from traceread.engine.ray_init import ensure_ray

    ray = ensure_ray(address)
    absolute = [p if os.path.isabs(os.path.expanduser(p)) or p.startswith("$") else os.path.abspath(p)
                for p in map(str, paths)]
    nodes = sorted((n for n in ray.nodes() if n.get("Alive")), key=lambda n: n["NodeID"])
    lister = ray.remote(num_cpus=0, max_retries=1)(list_here)
    refs = {lister.options(scheduling_strategy=pinned(n["NodeID"], False)).remote(absolute): n for n in nodes}
    warnings: list[str] = []
    seen: dict[tuple[str, int, int], int] = {}
    files: list[NodeFile] = []
    for ref, node in refs.items():
        try:
            listed = ray.get(ref, timeout=300)
        except Exception as exc:  # a node that cannot list is one warning, not the report
            where = node.get("NodeManagerHostname") or node["NodeID"][:12]
            warnings.append(f"node {where}: could not list {', '.join(absolute)}: {type(exc).__name__}")
            continue
        for path, size, mtime_ns in listed["files"]:
            same = seen.get((path, size, mtime_ns))
            if same is not None:
                files[same] = replace(files[same], shared=True)
                continue
            seen[(path, size, mtime_ns)] = len(files)
            files.append(NodeFile(listed["host"], path, size, mtime_ns, node["NodeID"]))
    files.sort(key=lambda f: (f.host, f.path))
    return files, warnings
