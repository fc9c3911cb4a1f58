"""Connecting to Ray: a leaf, so the Ray executor and node-local listing both use it without a cycle."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


class RayNotInstalled(RuntimeError):
    """``--executor ray`` without the ``ray`` extra."""


def ensure_ray(address: str | None) -> Any:
    """``ray``, connected (to ``address``, ``$RAY_ADDRESS`` or a new local instance)."""
    try:
        import ray
    except ImportError as exc:
        raise RayNotInstalled("--executor ray needs Ray: pip install 'traceread[ray]'") from exc
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR"}
        if address or os.environ.get("RAY_ADDRESS"):
            ray.init(address=address or os.environ["RAY_ADDRESS"], **kwargs)
        else:
            # A local instance: its workers import this very checkout of traceread.
            src = str(Path(__file__).resolve().parents[2])
            path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p)
            ray.init(runtime_env={"env_vars": {"PYTHONPATH": path}}, **kwargs)
    return ray
