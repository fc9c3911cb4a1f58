"""Helpers for the engine tests: compare two report documents field by field."""

from __future__ import annotations

import math
from typing import Any

#: Fields that measure how long something took rather than what the trace says.
TIMING_FIELDS = frozenset({"elapsed_s", "generated_at", "took_s"})


def differences(a: Any, b: Any, path: str = "$", out: list[str] | None = None, limit: int = 20) -> list[str]:
    """Paths where ``a`` and ``b`` differ (timing fields aside); empty when they are the same."""
    out = [] if out is None else out
    if len(out) >= limit:
        return out
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k in TIMING_FIELDS:
                continue
            if k not in a or k not in b:
                out.append(f"{path}.{k}: only in {'second' if k not in a else 'first'}")
                continue
            differences(a[k], b[k], f"{path}.{k}", out, limit)
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            out.append(f"{path}: {len(a)} vs {len(b)} items")
        for i, (x, y) in enumerate(zip(a, b)):
            differences(x, y, f"{path}[{i}]", out, limit)
    elif isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        pass
    elif a != b:
        out.append(f"{path}: {a!r} != {b!r}")
    return out
