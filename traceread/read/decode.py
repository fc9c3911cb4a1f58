"""Decode trace text into typed events (the bytes come from :mod:`traceread.read.inflate`).

Why typed msgspec Structs: the decoder skips every field we do not keep (``Call stack``, python
ids, ``Ev Idx``) without building Python objects for it, which is what makes a 50 MB
trace decode in a fraction of a second. Every failure becomes one :class:`TraceFileError` line
naming the file and, when the decoder knows it, the byte offset.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec

from traceread.errors import TraceFileError

_NO_RAW = msgspec.Raw()


class Args(msgspec.Struct, gc=False):
    """The ``args`` keys the tables keep; everything else is skipped by the decoder.

    Numeric args are typed ``Any`` on purpose: real traces carry ints as strings (``"bytes":
    "2560"``), 64-bit hashes and lists; conversion to column types happens later, per column, and
    an odd value becomes null instead of failing the whole file. ``Raw`` keeps shape arguments as
    the exact JSON text that was recorded.
    """

    external_id: Any = msgspec.field(default=None, name="External id")
    external_id_legacy: Any = msgspec.field(default=None, name="external id")
    correlation: Any = None
    device: Any = None
    stream: Any = None
    grid: Any = None
    block: Any = None
    registers: Any = msgspec.field(default=None, name="registers per thread")
    shared_memory: Any = msgspec.field(default=None, name="shared memory")
    blocks_per_sm: Any = msgspec.field(default=None, name="blocks per SM")
    warps_per_sm: Any = msgspec.field(default=None, name="warps per SM")
    occupancy: Any = msgspec.field(default=None, name="est. achieved occupancy %")
    bytes: Any = None
    input_dims: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Dims")
    input_dims_legacy: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input dims")
    input_types: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input type")
    input_strides: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Strides")
    concrete_inputs: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Concrete Inputs")
    seq_num: Any = msgspec.field(default=None, name="Sequence number")
    fwd_tid: Any = msgspec.field(default=None, name="Fwd thread id")
    coll_name: Any = msgspec.field(default=None, name="Collective name")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    group_size: Any = msgspec.field(default=None, name="Group size")
    dtype: Any = None
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    pg_desc: Any = msgspec.field(default=None, name="Process Group Description")
    pg_ranks: Any = msgspec.field(default=None, name="Process Group Ranks")
    seq: Any = msgspec.field(default=None, name="Seq")
    comms_id: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Comms Id")
    src_rank: Any = msgspec.field(default=None, name="Src Rank")
    dst_rank: Any = msgspec.field(default=None, name="Dst Rank")
    # ``[memory]`` instant events (``profile_memory=True``): one allocation (Bytes > 0) or free (< 0)
    mem_bytes: Any = msgspec.field(default=None, name="Bytes")
    total_allocated: Any = msgspec.field(default=None, name="Total Allocated")
    total_reserved: Any = msgspec.field(default=None, name="Total Reserved")
    device_type: Any = msgspec.field(default=None, name="Device Type")
    device_id: Any = msgspec.field(default=None, name="Device Id")
    addr: Any = msgspec.field(default=None, name="Addr")


class Event(msgspec.Struct, gc=False):
    """One Chrome-trace event. Structural fields are typed: a garbled ``ts`` fails the file."""

    ph: str = ""
    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float | None = None
    dur: float | None = None
    id: int | str | None = None
    args: Args | None = None


_TOP_DECODER = msgspec.json.Decoder(dict[str, msgspec.Raw])

#: A JSON escape token, left to right: an escaped backslash (so ``\\\\ud800`` is text, not an escape),
#: a UTF-16 surrogate pair, or a lone surrogate.
_ESCAPE_TOKEN = re.compile(rb"\\\\|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}|\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_SURROGATE_HINT = re.compile(rb"\\u[dD][89a-fA-F]")
_REPLACEMENT = rb"\ufffd"


def fix_lone_surrogates(data: bytes | bytearray) -> bytes | bytearray:
    """``data`` with every lone UTF-16 surrogate escape (``\\ud800`` without its pair) written as
    U+FFFD. Python's own ``json`` writes and reads them; msgspec (strictly) refuses the whole
    document, so one odd op name made the whole rank unreadable. Same length, so byte offsets hold;
    ``data`` itself is returned when it holds no surrogate escape (the common case: one fast scan)."""
    if _SURROGATE_HINT.search(data) is None:
        return data
    return _ESCAPE_TOKEN.sub(lambda m: _REPLACEMENT if len(m.group()) == 6 else m.group(), data)
_BYTE_RE = re.compile(r"\(byte (\d+)\)")


def json_problem(exc: Exception) -> str:
    """msgspec's message, kept to one line; it already carries ``(byte N)`` for syntax errors."""
    msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if msg == "Input data was truncated":
        return "truncated JSON: the file ends in the middle of the document"
    return msg


def decode_top(data: bytes | bytearray, path: Path) -> dict[str, msgspec.Raw]:
    """Split the document into its top-level keys (values stay undecoded, zero-copy)."""
    try:
        top = _TOP_DECODER.decode(data)
    except msgspec.ValidationError:
        kind = first_json_char(data)
        raise TraceFileError(
            f"not a Kineto trace: the JSON document is {kind}, not an object with traceEvents",
            str(path),
        ) from None
    except msgspec.DecodeError as exc:
        problem = json_problem(exc)
        if not problem.startswith("truncated"):
            problem = f"invalid JSON: {problem}"
        raise TraceFileError(problem, str(path)) from None
    if "traceEvents" not in top:
        keys = ", ".join(sorted(top)[:6]) or "none"
        raise TraceFileError(
            f"not a Kineto trace: no traceEvents (top-level keys: {keys})", str(path)
        )
    return top


_RAWS_DECODER = msgspec.json.Decoder(list[msgspec.Raw])


def split_events(raw: msgspec.Raw, path: Path) -> list[msgspec.Raw]:
    """The ``traceEvents`` array as one zero-copy slice per event (decoded later in batches)."""
    try:
        return _RAWS_DECODER.decode(raw)
    except msgspec.ValidationError:
        raise TraceFileError("traceEvents is not a list of events", str(path)) from None
    except msgspec.DecodeError as exc:  # pragma: no cover - top-level decode validated syntax
        raise TraceFileError(f"invalid JSON: {json_problem(exc)}", str(path)) from None


_EVENT_DECODER = msgspec.json.Decoder(Event)


def decode_events(raws: list[msgspec.Raw], path: Path, first: int = 0) -> list[Event]:
    """Decode a batch of event slices into typed events; ``first`` numbers them in messages.

    One decode call per event straight from its zero-copy slice: as fast as decoding the whole
    array at once, and only one batch of Python event objects is alive at a time.
    """
    dec = _EVENT_DECODER.decode
    try:
        return [dec(r) for r in raws]
    except msgspec.ValidationError:
        for i, r in enumerate(raws):
            try:
                dec(r)
            except msgspec.ValidationError as exc:
                msg = json_problem(exc)
                raise TraceFileError(
                    f"malformed event: event #{first + i}: {msg}", str(path)
                ) from None
        raise  # pragma: no cover - the loop above always finds the failing event
    except msgspec.DecodeError as exc:  # pragma: no cover - top-level decode validated syntax
        raise TraceFileError(f"invalid JSON: {json_problem(exc)}", str(path)) from None


_ALL_DECODER = msgspec.json.Decoder(list[Event])


def decode_all(raw: msgspec.Raw, path: Path) -> list[Event]:
    """The whole ``traceEvents`` array in one decoder call (no per-event slices). Any problem
    is re-diagnosed event by event so the message names the event, as :func:`decode_events`
    words it."""
    try:
        return _ALL_DECODER.decode(raw)
    except msgspec.DecodeError:
        pass
    return decode_events(split_events(raw, path), path)


def decode_value(raw: msgspec.Raw) -> Any:
    """Generic decode of a (syntax-checked) top-level value such as ``distributedInfo``."""
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return None


def first_json_char(data: bytes | bytearray) -> str:
    head = bytes(data[:64]).lstrip()
    if head[:3] == b"\xef\xbb\xbf":
        head = head[3:].lstrip()
    c = head[:1]
    return {
        b"[": "a list",
        b'"': "a string",
        b"n": "null",
        b"t": "a boolean",
        b"f": "a boolean",
    }.get(c, "a number" if c[:1].isdigit() or c == b"-" else "not an object")
