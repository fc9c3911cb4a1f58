"""The per-rank stage as Ray tasks (``traceread report --executor ray``); imported only when asked for.

Each work item runs as one Ray task (1 CPU) wherever the cluster places it (on the node that holds
its file, for traces on node-local disks: :mod:`traceread.engine.node_local`); the task returns bytes
(the data-only summary of :mod:`traceread.engine.tasks`), so nothing of ours is unpickled on the
driver. Ray retries a task whose worker died or raised once (``max_retries=1``,
``retry_exceptions=True``); after that the rank is reported missing with the reason. At most
:data:`IN_FLIGHT` tasks are submitted at a time so the driver holds a bounded number of results.

Without an address, Ray starts (or joins, via ``RAY_ADDRESS``) a local instance; traceread must be
importable on every worker: a cluster image with it installed, or ``runtime_env`` (see docs/engine.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from traceread.engine.base import Done, TaskFailed
from traceread.engine.ray_init import ensure_ray

#: Tasks submitted but not yet collected.
IN_FLIGHT = 512


class RayExecutor:
    """Runs each item as a Ray task; ``alongside`` runs on the driver while the tasks run."""

    def __init__(self, address: str | None = None, alongside: Callable[[], None] | None = None) -> None:
        self.ray = ensure_ray(address)
        self.alongside = alongside

    def map(self, fn: Callable[..., Any], items: Sequence[tuple[Any, ...]], done: Done) -> None:
        ray = self.ray
        remote = ray.remote(num_cpus=1, max_retries=1, retry_exceptions=True)(fn)
        refs: dict[Any, int] = {}
        next_item = 0

        def submit() -> None:
            nonlocal next_item
            while next_item < len(items) and len(refs) < IN_FLIGHT:
                refs[_placed(remote, items[next_item]).remote(*items[next_item])] = next_item
                next_item += 1

        submit()
        if self.alongside:
            self.alongside()
        while refs:
            ready, _ = ray.wait(list(refs), num_returns=min(len(refs), 16), timeout=1.0)
            if not ready:
                ready, _ = ray.wait(list(refs), num_returns=1)
            for ref in ready:
                i = refs.pop(ref)
                try:
                    res = ray.get(ref)
                except Exception as exc:  # task failed twice (retried by Ray)
                    msg = str(exc).strip().splitlines()
                    res = TaskFailed(f"Ray task failed twice: {type(exc).__name__}: {msg[-1] if msg else ''}"[:300])
                done(i, res)
            submit()


def _placed(remote: Any, item: tuple[Any, ...]) -> Any:
    """``remote``, pinned to the node that holds the item's file when it is on a node's own disk
    (:mod:`traceread.engine.node_local`); anywhere otherwise."""
    from traceread.engine.node_local import pinned, placement

    where = placement(getattr(item[0], "file", None)) if item else None
    if where is None:
        return remote
    node_id, soft = where
    return remote.options(scheduling_strategy=pinned(node_id, soft))
