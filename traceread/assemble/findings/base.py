"""The one way a finding is made: a share of the window ledger, per step and in total.

Every finding (:mod:`traceread.assemble.findings.ledger` builds them all) is a claim on the window
ledger's budget (:class:`Budget`): each µs of the window is in at most one finding, so findings never
add up to more than the window and never count one stall twice. :func:`make_finding` turns a claim
into the document's ``Finding``: ``impact_us_total`` is the share of the window,
``impact_us_per_step`` that share per step on average, ``impact_pct`` its percentage of the window,
and ``predicted_saving_us`` (per step) is never above the share.
"""

from __future__ import annotations

from typing import Any

from traceread.assemble.findings.window import Key, Window
from traceread.report_schema import Finding

#: Below this share of the window a problem is not worth a reader's attention (a hang always is).
MIN_IMPACT_PCT = 1.0


class Budget:
    """Remaining µs of each window part; claims never exceed them."""

    def __init__(self, parts: dict[Key, float]) -> None:
        self.left = dict(parts)

    def claim(self, keys: list[Key], want: float | None = None) -> float:
        """Take from ``keys`` in order, everything left or up to ``want`` µs in all; returns what was taken."""
        got = 0.0
        for k in keys:
            have = self.left.get(k, 0.0)
            take = have if want is None else min(have, max(want - got, 0.0))
            if take <= 0:
                continue
            self.left[k] = have - take
            got += take
        return got

    def keys(self, category: str, role: Any = ..., rank: int | None = None) -> list[Key]:
        """Keys of ``category`` (and ``role`` / ``rank`` when given) that still hold time, largest first."""
        out = [k for k, v in self.left.items() if v > 0 and k[0] == category
               and (role is ... or k[1] == role) and (rank is None or k[2] == rank)]
        return sorted(out, key=lambda k: -self.left[k])


def make_finding(id_: str, title: str, share_us: float, win: Window | None, category: str, role: str | None,
                 rank: int | None, explanation: str, evidence: list[str], suggestions: list[str],
                 predicted_us: float | None = None, **extra: Any) -> Finding:
    """A finding for ``share_us`` of the window (µs over the whole window; ``predicted_us`` likewise)."""
    share = max(float(share_us), 0.0)
    n = win.n if win is not None and win.n else 1
    total = win.total_us if win is not None else 0.0
    f: dict[str, Any] = {
        "id": id_, "title": title, "impact_us_per_step": share / n, "impact_us_total": share,
        "impact_pct": (100.0 * share / total if total else None), "explanation": explanation,
        "evidence": evidence, "suggestions": suggestions, "category": category, "role": role, "rank": rank,
    }
    if predicted_us is not None:
        f["predicted_saving_us"] = min(max(float(predicted_us), 0.0), share) / n
    f.update(extra)
    return f  # type: ignore[return-value]
