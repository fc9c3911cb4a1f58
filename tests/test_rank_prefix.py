"""The one ``[rankN]:`` / ``[defaultN]:`` reader (traceread/read/rank_prefix.py) against the three
patterns it replaced, kept here verbatim as the oracle:

* the NCCL log reader's torchrun prefix (``strip_launcher``): ``\\[(?:default|rank)(\\d+)\\]:`` matched
  at the start of the line once leading white space is gone, the rest of the line kept;
* ``traceread hang``'s log tails: ``^\\s*\\[(?:rank|default)(\\d+)\\]:\\s?(.*)$``, a rank's last line
  only when something follows the prefix;
* the c10d-line reader's rank: ``\\[rank(\\d+)\\]:`` anywhere in the line (PyTorch's own prefix, the
  global rank; torchrun's ``[defaultN]:`` carries the local rank and is not taken there).

Every prefix each of them accepted is accepted the same way, every line each rejected is rejected,
on a table of named cases and on generated lines made of the characters that matter.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from traceread.analysis.comm.nccl.lines import strip_launcher
from traceread.read.rank_prefix import leading_rank_prefix, pytorch_rank

OLD_TORCHRUN = re.compile(r"\[(?:default|rank)(\d+)\]:")  # analysis/comm/nccl/lines.py
OLD_HANG_TAIL = re.compile(r"^\s*\[(?:rank|default)(\d+)\]:\s?(.*)$")  # analysis/hang/sources.py
OLD_C10D = re.compile(r"\[rank(\d+)\]:")  # analysis/comm/nccl/torch_lines.py


def old_leading(line: str) -> tuple[int, str] | None:
    m = OLD_TORCHRUN.match(line.lstrip())
    return (int(m.group(1)), line.lstrip()[m.end():]) if m else None


def old_tail(line: str) -> tuple[int, str] | None:
    m = OLD_HANG_TAIL.match(line)
    return (int(m.group(1)), m.group(2).strip()) if m and m.group(2).strip() else None


def old_c10d(line: str) -> int | None:
    m = OLD_C10D.search(line)
    return int(m.group(1)) if m else None


def new_leading(line: str) -> tuple[int, str] | None:
    p = leading_rank_prefix(line)
    return (p.rank, p.rest) if p else None


def new_tail(line: str) -> tuple[int, str] | None:  # how analysis/hang/sources.py uses it
    p = leading_rank_prefix(line)
    return (p.rank, p.rest.strip()) if p and p.rest.strip() else None


# (line, leading prefix -> (rank, rest), hang tail -> (rank, last line), c10d rank)
CASES = [
    ("[rank3]: NCCL INFO x", (3, " NCCL INFO x"), (3, "NCCL INFO x"), 3),
    ("[default3]: NCCL INFO x", (3, " NCCL INFO x"), (3, "NCCL INFO x"), None),  # torchrun: local rank
    ("[default0]:[rank8]:[E ProcessGroupNCCL.cpp:1] Watchdog", (0, "[rank8]:[E ProcessGroupNCCL.cpp:1] Watchdog"),
     (0, "[rank8]:[E ProcessGroupNCCL.cpp:1] Watchdog"), 8),  # both writers: the c10d reader takes PyTorch's
    ("  \t[rank12]:tail", (12, "tail"), (12, "tail"), 12),  # leading white space, no space after the colon
    ("[rank0]:", (0, ""), None, 0),  # nothing after it: no last line
    ("[rank0]:    ", (0, "    "), None, 0),
    ("[rank٣]: arabic-indic digit", (3, " arabic-indic digit"), (3, "arabic-indic digit"), 3),  # \d, as before
    ("[rank007]: x", (7, " x"), (7, "x"), 7),
    ("x [rank5]: in the middle", None, None, 5),  # only the c10d reader looks past the start
    ("x [default5]: in the middle", None, None, None),
    ("[rank]: no number", None, None, None),
    ("[rank5] no colon", None, None, None),
    ("[rank 5]: a space", None, None, None),
    ("[Rank5]: capital", None, None, None),
    ("[trainer5]: another role", None, None, None),
    ("[5]: global-rank template", None, None, None),
    ("[1,3]<stdout>: mpirun", None, None, None),
    ("[rank-1]: negative", None, None, None),
    ("", None, None, None),
]


@pytest.mark.parametrize(("line", "leading", "tail", "c10d"), CASES, ids=[repr(c[0]) for c in CASES])
def test_each_prefix_is_read_as_each_old_pattern_read_it(line: str, leading: tuple[int, str] | None,
                                                         tail: tuple[int, str] | None, c10d: int | None) -> None:
    assert old_leading(line) == leading and new_leading(line) == leading
    assert old_tail(line) == tail and new_tail(line) == tail
    assert old_c10d(line) == c10d and pytorch_rank(line) == c10d


def test_the_kind_says_who_wrote_it() -> None:
    assert leading_rank_prefix("[rank2]: x").kind == "rank"  # type: ignore[union-attr]
    assert leading_rank_prefix("[default2]: x").kind == "default"  # type: ignore[union-attr]


def test_strip_launcher_keeps_the_mpirun_rank_and_drops_both_prefixes() -> None:
    assert strip_launcher("[1,3]<stdout>:[default0]: host:1:2 [0] NCCL INFO x") == (" host:1:2 [0] NCCL INFO x", 3)
    assert strip_launcher("  [rank4]:host:1:2 [0] NCCL INFO x") == ("host:1:2 [0] NCCL INFO x", 4)
    assert strip_launcher("host:1:2 [0] NCCL INFO [rank4]: x") == ("host:1:2 [0] NCCL INFO [rank4]: x", None)


# Lines (no newline: every caller reads lines split by str.splitlines) of the characters that matter.
LINES = st.lists(st.sampled_from(["[", "]", ":", "rank", "default", "Rank", "0", "7", "42", "٣", " ", "\t",
                                  "\u00a0", "x", ",", "<stdout>"]), max_size=14).map("".join)


@settings(max_examples=600, deadline=None)
@given(LINES)
def test_generated_lines_read_as_the_old_patterns_read_them(line: str) -> None:
    assert new_leading(line) == old_leading(line)
    assert new_tail(line) == old_tail(line)
    assert pytorch_rank(line) == old_c10d(line)
