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


#: A host span of the window: (family, name); None for host time no recorded span covers.
SpanId = tuple[str | None, str] | None


class Budget:
    """Remaining µs of each window part; claims never exceed them.

    Host parts are also held per covering span (``ledger.window.spans``): a claim on such a part
    takes its µs from the spans too (``prefer`` first, then the largest), so every finding knows
    exactly which span its time was in (:meth:`drain`), and no span's time is named twice."""

    def __init__(self, parts: dict[Key, float], spans: list[dict[str, Any]] | None = None) -> None:
        self.left = dict(parts)
        self.spans: dict[Key, dict[SpanId, float]] = {}
        for s in spans or []:
            key = (str(s["category"]), s.get("role"), int(s["rank"]))
            if key in self.left:
                d = self.spans.setdefault(key, {})
                sid: SpanId = (s.get("family"), str(s["span"]))
                d[sid] = d.get(sid, 0.0) + float(s["us"])
        for key, d in self.spans.items():  # what no span covers, so that a key's spans sum to it
            covered = sum(d.values())
            if covered > self.left[key]:  # rounding of the µs in the document
                scale = self.left[key] / covered if covered else 0.0
                for sid in d:
                    d[sid] *= scale
            else:
                d[None] = self.left[key] - covered
        self._taken: dict[tuple[int, SpanId], float] = {}

    def claim(self, keys: list[Key], want: float | None = None, prefer: list[SpanId] | None = None) -> float:
        """Take from ``keys`` in order, everything left or up to ``want`` µs in all; returns what was taken.
        On parts held per span, ``prefer``'s spans are taken first (then the largest)."""
        got = 0.0
        for k in keys:
            have = self.left.get(k, 0.0)
            take = have if want is None else min(have, max(want - got, 0.0))
            if take <= 0:
                continue
            self.left[k] = have - take
            got += take
            self._take_spans(k, take, prefer or [])
        return got

    def _take_spans(self, key: Key, take: float, prefer: list[SpanId]) -> None:
        d = self.spans.get(key)
        if not d:
            return
        order = [s for s in prefer if s in d] + sorted((s for s in d if s not in prefer),
                                                       key=lambda s: (-d[s], s is None, str(s)))
        for sid in order:
            t = min(d[sid], take)
            if t <= 0:
                continue
            d[sid] -= t
            take -= t
            self._taken[(key[2], sid)] = self._taken.get((key[2], sid), 0.0) + t
            if take <= 1e-12:
                break

    def drain(self) -> dict[tuple[int, SpanId], float]:
        """The host spans the claims since the last drain took their time from: (rank, span) -> µs."""
        out, self._taken = self._taken, {}
        return out

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
