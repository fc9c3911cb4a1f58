"""The ``[rankN]:`` / ``[defaultN]:`` prefixes on a distributed job's log lines, read in one place.

Two writers put them there:

* PyTorch's own logging (``torch._logging``, c10d) writes ``[rank3]:`` with the **global** rank
  (``dist.get_rank()``), also inside a line that a launcher prefixed again;
* torchrun (``--tee``/``--redirects``, the elastic agent) writes ``[${role_name}${local_rank}]:``:
  ``[default3]:`` for the default role, with the **local** rank on that node.

The NCCL log reader and ``traceread hang``'s log tails take the prefix at the start of a line
(either kind); the c10d-line reader takes PyTorch's ``[rankN]:`` anywhere in it. One pattern serves
all three, so a prefix one of them learns the others read too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: ``[rank3]:`` or ``[default3]:`` (``\d`` as before: any Unicode decimal digit, as int() reads it).
RANK_PREFIX = re.compile(r"\[(rank|default)(\d+)\]:")


@dataclass(frozen=True)
class RankPrefix:
    """One prefix: the rank it names, who wrote it (``"rank"``: PyTorch, the global rank;
    ``"default"``: torchrun, the local rank of the default role), and the line after it."""

    rank: int
    kind: str
    rest: str


def leading_rank_prefix(line: str) -> RankPrefix | None:
    """The prefix the line starts with (after leading white space), or None."""
    text = line.lstrip()
    m = RANK_PREFIX.match(text)
    if m is None:
        return None
    return RankPrefix(int(m.group(2)), m.group(1), text[m.end():])


def pytorch_rank(line: str) -> int | None:
    """The global rank of PyTorch's own ``[rankN]:`` anywhere in the line (the first one), or None;
    torchrun's ``[defaultN]:`` is not one (its number is the local rank)."""
    for m in RANK_PREFIX.finditer(line):
        if m.group(1) == "rank":
            return int(m.group(2))
    return None
