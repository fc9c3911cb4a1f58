"""Damage to real traces for the property tests: events' keys deleted or given values of another
JSON type (tests/test_fuzz_reader.py: only one-line errors leave the reader; tests/test_read_paths.py:
both read paths agree)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

#: Real traces (in ../shared/traces) the property tests damage: compact and indented JSON, gzip,
#: CUDA and ROCm.
SOURCES = [
    "kineto_docs_traces/before_fix_trace.json",
    "hta_trace_compare_base/base.json.gz",
    "hta_amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
    "hta_trace_file_list/inference_rank_1.json.gz",
]
#: A value of any JSON type, including ints past 64 bits.
JSON_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


def damage_events(doc: dict[str, Any], data: st.DataObject, values: st.SearchStrategy[Any], most: int) -> None:
    """Up to ``most`` edits of ``doc``'s events, in place: at a random event (or its args) a key is
    deleted or its value replaced by one drawn from ``values``."""
    events = doc["traceEvents"]
    for _ in range(data.draw(st.integers(1, most))):
        ev = events[data.draw(st.integers(0, len(events) - 1))]
        target = ev
        if isinstance(ev.get("args"), dict) and ev["args"] and data.draw(st.booleans()):
            target = ev["args"]
        if not target:
            continue
        key = data.draw(st.sampled_from(sorted(target)))
        if data.draw(st.booleans()):
            del target[key]
        else:
            target[key] = data.draw(values)
