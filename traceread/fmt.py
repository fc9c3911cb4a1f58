"""How numbers, durations, sizes and rank lists are written, the same in every output.

A leaf: the findings (document text), the renderers and the analyses' warnings all write numbers
through these, so "3.0 ms" or "0-3, 7" reads the same wherever it appears.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def ms(us: float | None, digits: int = 1) -> str:
    """Microseconds as a human duration whose unit scales: "740 µs", "12.3 ms", "40.26 s", or "n/a".

    Under 1 ms the value is whole µs ("<1 µs" for a non-zero value that would round to 0, so a real
    cost never reads as nothing); from 1 s on it is seconds with ``digits + 1`` decimals."""
    if us is None:
        return "n/a"
    a = abs(us)
    if round(a) < 1000:
        if 0 < a < 0.5:
            return "<1 µs" if us > 0 else "-<1 µs"
        return f"{us:.0f} µs"
    if round(a / 1000.0, digits) < 1000:
        return f"{us / 1000.0:.{digits}f} ms"
    return f"{us / 1e6:.{digits + 1}f} s"


def pct(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}%"


def nbytes(value: float | None) -> str:
    """Bytes with a decimal unit that scales (kB, MB, GB, TB; 1 GB = 1e9, as the bandwidths)."""
    if value is None:
        return "n/a"
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B"


def ibytes(value: float | None) -> str:
    """Bytes with a binary unit (KiB, MiB, GiB: memory and disk, as ``du -h`` counts them)."""
    if value is None:
        return "n/a"
    for unit, scale in (("TiB", 2.0**40), ("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10)):
        if abs(value) >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value:.0f} B"


#: Names longer than this are shortened to their readable core in terminal and chart labels.
NAME_LIMIT = 60


def _close(text: str, i: int, open_ch: str, close_ch: str) -> int:
    """Index just past the bracket that closes the one at ``i`` (len(text) when unbalanced)."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == open_ch:
            depth += 1
        elif text[j] == close_ch:
            depth -= 1
            if depth == 0:
                return j + 1
    return len(text)


def elide_templates(text: str, keep: int = 0) -> str:
    """Every C++ template argument list in ``text`` whose body is longer than ``keep`` characters
    written ``<…>``: ``f<4, at::native::Functor<float>, Array<char*, 3> >`` → ``f<…>``. Comparisons
    such as ``a < b`` (a space before ``<``) are left alone."""
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "<" and i > 0 and (text[i - 1].isalnum() or text[i - 1] in "_:>") and not text.startswith("<<", i):
            end = _close(text, i, "<", ">")
            body = text[i + 1: end - 1]
            out.append("<…>" if len(body) > keep else text[i:end])
            i = end
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def short_name(name: object, limit: int = NAME_LIMIT) -> str:
    """A kernel or operator name shortened to its readable core (the full name stays in JSON/HTML):
    the return type and the parameter list dropped, template arguments elided, leading namespaces
    dropped while still too long, and the rest cut with "…"::

        void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, ...>(int, ...)
        → at::native::vectorized_elementwise_kernel<…>
    """
    s = " ".join(str(name).split()).replace("(anonymous namespace)::", "")
    if len(s) <= limit and "<" not in s:
        return s
    if s.endswith(")"):  # a signature: drop its parameter list
        depth, cut = 0, -1
        for j in range(len(s) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(s[j], 0)
            if depth == 0:
                cut = j
                break
        if cut > 0 and (s[cut - 1].isalnum() or s[cut - 1] in "_>"):
            s = s[:cut]
    s = elide_templates(s).strip()
    head, sep, tail = s.rpartition(" ")  # "void f<…>" -> "f<…>": a return type before the name
    if sep and tail and all(t in _RETURN_TYPES or "::" in t or t.endswith(("<…>", "*")) for t in head.split()):
        s = tail
    while len(s) > limit and "::" in s.split("<", 1)[0]:
        s = s.split("::", 1)[1]
    return s if len(s) <= limit else s[: limit - 1] + "…"


_RETURN_TYPES = {"void", "int", "float", "double", "bool", "auto", "static", "__global__"}


def rank_runs(ranks: Iterable[int]) -> list[str]:
    """Runs of consecutive ranks: ``[0, 1, 2, 5, 7, 8]`` → ``["0-2", "5", "7-8"]``."""
    rs = sorted(set(int(r) for r in ranks))
    if not rs:
        return []
    parts: list[str] = []
    start = prev = rs[0]
    for r in rs[1:] + [None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if r is not None:
            start = prev = r
    return parts


def rank_list(ranks: Iterable[int], limit: int = 8) -> str:
    """"0-3, 7" style compact list of ranks (ranges collapsed, long lists cut)."""
    rs = sorted(set(int(r) for r in ranks))
    if not rs:
        return "none"
    parts = rank_runs(rs)
    if len(parts) > limit:
        return ", ".join(parts[:limit]) + f", … ({len(rs)} ranks)"
    return ", ".join(parts)


def ranks_words(ranks: Iterable[int], limit: int = 8) -> str:
    """``rank 0`` / ``ranks 0-3, 7`` / ``no rank``: a list of ranks never reads as a count."""
    rs = sorted(set(int(r) for r in ranks))
    if not rs:
        return "no rank"
    return f"rank{'s' if len(rs) != 1 else ''} {rank_list(rs, limit)}"


def export_command(report: Any) -> str:
    """The command that writes the merged multi-rank timeline for this report's traces."""
    import shlex

    paths = " ".join(shlex.quote(p) for p in (report.get("source") or {}).get("paths") or ["RUN"])
    return f"traceread export {paths} -o timeline.json.gz"


#: The step number of a trace without ``ProfilerStep#`` markers: one window spans the whole trace
#: (``analysis/time/steps.py`` numbers it so that it is never mistaken for a real ``ProfilerStep#0``).
NO_MARKER_STEP = -1
#: How that window is written wherever a step would be named.
WHOLE_TRACE = "the whole trace (no step markers)"


def step_name(step: object, median: bool = False) -> str:
    """"step 12" / "median step 12", or "the whole trace (no step markers)" — never "step -1"."""
    if step == NO_MARKER_STEP:
        return WHOLE_TRACE
    return f"{'median step' if median else 'step'} {step}"


def whole_trace(report: Any) -> bool:
    """True when the document's only step is the whole trace (no step markers)."""
    if not isinstance(report, dict):
        return False
    led = report.get("ledger") or {}
    w = led.get("window") or {}
    if w:
        return w.get("median_step") == NO_MARKER_STEP and int(w.get("steps") or 0) == 1
    if led:
        return led.get("step") == NO_MARKER_STEP
    return {s.get("step") for r in report.get("ranks") or [] for s in r.get("steps") or []} == {NO_MARKER_STEP}
