"""Decode a trace's ``traceEvents`` in bounded batches straight from the uncompressed stream.

Memory is one batch of text and its decoded events, never the whole document. A batch ends at an
event boundary found by a byte pattern (``}`` ``,`` ``{`` with any whitespace between), and the
pattern is checked, not trusted: ``[`` + the events before the cut + ``]`` must decode as a list of
events. A cut inside a string or a nested object makes that text invalid JSON *at its end* (a
string or object left open), so a failure at the end moves the cut one boundary back, while a
failure before the end is a real error in the file, reported with its byte offset in the
uncompressed stream. The top-level keys before the array are decoded by closing the prefix
(``...]}``), the keys after it by decoding the tail as ``{"traceEvents":[`` + tail. No assumption
about one event per line, key order or whitespace.

Hostile input is bounded here: :data:`MAX_PENDING` bytes without a complete event (a whitespace
or garbage bomb) stop the read after that many bytes, whatever the file's size.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec

from traceread.errors import TraceFileError
from traceread.read.decode import Event, decode_top, first_json_char, fix_lone_surrogates, json_problem
from traceread.read.inflate import human_bytes

#: Text decoded per batch (about 15-30 thousand events): large enough that the per-batch work is
#: noise, small enough that one batch's objects stay cheap.
BATCH_BYTES = 6 << 20
#: No real event or header is this large: this much text without a complete event is not a trace.
MAX_PENDING = 64 << 20

_TRACE_EVENTS = re.compile(rb'"traceEvents"\s*:\s*\[')
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_AT_BYTE = re.compile(r"\(byte (\d+)\)")
_AT_INDEX = re.compile(r"\$\[(\d+)\]")
_TOP_DECODER = msgspec.json.Decoder(dict[str, msgspec.Raw])
_EVENTS_DECODER = msgspec.json.Decoder(list[Event])
_SYNTAX = msgspec.json.Decoder(msgspec.Raw)
_WS = b" \t\r\n"


class EventStream:
    """Iterate to get batches of :class:`Event`; afterwards :attr:`top` holds the top-level keys
    (values undecoded) in document order, ``traceEvents`` included as an empty list.

    ``decode`` turns the text of one batch (a JSON array of events) into what the iteration yields
    (default: msgspec's list of :class:`Event`). Another decoder's batch is first checked by
    msgspec's syntax pass (about 1 GB/s, no objects built): a cut inside a string must fail as
    ``msgspec.DecodeError`` for the stream to move it back a boundary."""

    def __init__(self, path: Path, chunks: Iterator[bytes], head: bytearray,
                 decode: Callable[[bytes | bytearray], Any] | None = None, batch_bytes: int = BATCH_BYTES) -> None:
        self.path = path
        self._decode = decode or _EVENTS_DECODER.decode
        self._check = _SYNTAX.decode if decode is not None else None
        self._batch = batch_bytes
        self.top: dict[str, msgspec.Raw] = {}
        self._chunks = chunks
        self._buf = head  # uncompressed text not yet consumed
        self._off = 0  # stream offset of _buf[0]
        self._events = 0  # events decoded so far (to number them in messages)
        self._scanned = 0  # _buf[:_scanned] was searched for event boundaries

    # ---- reading ---------------------------------------------------------------------------

    def _more(self) -> bool:
        chunk = next(self._chunks, None)
        if chunk is None:
            return False
        self._buf += chunk
        return True

    def _fail(self, what: str) -> TraceFileError:
        return TraceFileError(what, str(self.path))

    def _too_long(self, start: int, what: str) -> TraceFileError:
        pending = self._buf[start:]
        text = len(pending.rstrip(_WS))
        if len(pending) - text > len(pending) // 2:
            run = len(pending) - text
            at = self._off + start + text
            return self._fail(f"{human_bytes(run)} of whitespace at byte {at}: not a trace")
        at = self._off + start
        return self._fail(f"no complete {what} in {human_bytes(len(pending))} from byte {at}: "
                          "not a Kineto trace")

    # ---- the header (keys before traceEvents) ----------------------------------------------

    def _open_array(self) -> int:
        """Decode the keys before ``traceEvents``; returns the position just after its ``[``."""
        checked = 0
        while not self._buf[checked:].strip(_WS):  # only whitespace so far: a bomb, or nothing
            checked = len(self._buf)
            if checked > MAX_PENDING or not self._more():
                raise self._too_long(0, "JSON document")
        head = bytes(self._buf[:4096])
        if head.lstrip(_WS)[:1] != b"{":
            kind = first_json_char(head)
            if kind == "not an object":
                raise self._fail("invalid JSON: the document does not start with '{'")
            raise self._fail(f"not a Kineto trace: the JSON document is {kind}, "
                             "not an object with traceEvents")
        searched = 0
        while True:
            for m in _TRACE_EVENTS.finditer(self._buf, max(0, searched - 64)):
                try:
                    self.top = _TOP_DECODER.decode(fix_lone_surrogates(bytes(self._buf[: m.end()]) + b"]}"))
                except msgspec.DecodeError:
                    continue  # the words sit inside a string or a nested value
                return m.end()
            searched = len(self._buf)
            if searched > MAX_PENDING:
                raise self._too_long(0, "traceEvents array")
            if not self._more():
                decode_top(bytes(self._buf), self.path)  # words the error
                raise self._fail("not a Kineto trace: no traceEvents")

    # ---- the events ------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        start = self._open_array()
        buf = self._buf
        while True:
            while len(buf) - start < self._batch and self._more():
                pass
            if len(buf) - start < self._batch:  # end of file: the last events and the tail
                yield from self._tail(start)
                return
            cut = self._decode_cut(start)
            if cut is None:
                if len(buf) - start > MAX_PENDING:
                    raise self._too_long(start, "event")
                if not self._more():
                    yield from self._tail(start)
                    return
                continue
            events, nxt = cut
            del buf[:nxt]
            self._off += nxt
            self._scanned = 0
            start = 0
            self._events += len(events)
            yield events

    def _decode_cut(self, start: int) -> tuple[Any, int] | None:
        """Decode the events of ``_buf[start:]`` up to its last checked boundary: the events and
        where the next batch starts; None when the text holds no complete event yet."""
        buf = self._buf
        lo = max(start, self._scanned - 64)  # text searched before held no usable boundary
        window = max(lo, len(buf) - (1 << 20))
        cuts = [m.start() for m in _BOUNDARY.finditer(buf, window)]
        if not cuts and window > lo:
            cuts = [m.start() for m in _BOUNDARY.finditer(buf, lo)]
        self._scanned = len(buf)
        for tries, at in enumerate(reversed(cuts)):
            doc = fix_lone_surrogates(b"[" + bytes(buf[start : at + 1]) + b"]")
            try:
                if self._check is not None:
                    self._check(doc)
                events = self._decode(doc)
            except msgspec.ValidationError as exc:
                raise self._malformed(exc) from None
            except msgspec.DecodeError as exc:
                pos = _byte_of(exc)
                if pos is not None and pos < len(doc) - 1 or tries >= 16:
                    self._invalid(exc, start - 1)
                continue  # the cut was inside a string or a nested value: one boundary back
            return events, buf.index(b"{", at)
        return None

    def _tail(self, start: int) -> Iterator[Any]:
        """The events after the last cut, the end of the array and the keys after it."""
        prefix = b'{"traceEvents":['
        doc = fix_lone_surrogates(prefix + bytes(self._buf[start:]))
        try:
            tail = _TOP_DECODER.decode(doc)
        except msgspec.DecodeError as exc:
            self._invalid(exc, start - len(prefix))
        raw = tail.pop("traceEvents")
        try:
            # msgspec takes the Raw slice as it is; another decoder gets bytes (no syntax check:
            # the top-level decode above has checked the tail)
            events = self._decode(raw if self._check is None else bytes(raw))
        except msgspec.ValidationError as exc:
            if not bytes(raw).lstrip().startswith(b"["):
                raise self._fail("traceEvents is not a list of events") from None
            raise self._malformed(exc) from None
        self.top.update(tail)
        self._events += len(events)
        yield events

    # ---- errors, worded like the whole-document path ---------------------------------------

    def _malformed(self, exc: msgspec.ValidationError) -> TraceFileError:
        msg = json_problem(exc)
        m = _AT_INDEX.search(msg)
        n = self._events + (int(m.group(1)) if m else 0)
        msg = _AT_INDEX.sub("$", msg, count=1).replace(" - at `$`", "")
        return self._fail(f"malformed event: event #{n}: {msg}")

    def _invalid(self, exc: msgspec.DecodeError, doc_at: int) -> None:
        """Raise the one-line error for a syntax error in text that starts at buffer position
        ``doc_at`` (offsets are turned into offsets in the uncompressed stream)."""
        problem = json_problem(exc)
        if problem.startswith("truncated"):
            raise self._fail(problem)
        pos = _byte_of(exc)
        if pos is not None:
            problem = _AT_BYTE.sub(f"(byte {self._off + doc_at + pos})", problem)
        raise self._fail(f"invalid JSON: {problem}")


def _byte_of(exc: Exception) -> int | None:
    m = _AT_BYTE.search(str(exc))
    return int(m.group(1)) if m else None
