"""The decode floor of a trace file: gunzip + msgspec typed decode of every event's fields.

What no reader of this JSON with these libraries can go below: the text is inflated in 8 MiB
chunks and every event is decoded into a typed Struct holding the fields any analysis needs
(``ph cat name pid tid ts dur id``), its ``args`` left as raw undecoded text. Written
independently of ``traceread.read`` (its own boundary search, its own structs) so the reader
cannot set its own bar. Streams, so it runs on a 5 GB rank in bounded memory.

    python bench/floor.py FILE...      # prints {"wall": s, "events": n, "bytes": n} per file
"""

from __future__ import annotations

import json
import sys
import time
import zlib
from pathlib import Path

import msgspec


class FloorEvent(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: float | None = None
    dur: float | None = None
    id: int | str | None = None
    args: msgspec.Raw = msgspec.Raw()


_EVENTS = msgspec.json.Decoder(list[FloorEvent])
_TAIL = msgspec.json.Decoder(dict[str, msgspec.Raw])
_OPEN = b'"traceEvents"'


def _chunks(path: Path):  # type: ignore[no-untyped-def]
    with open(path, "rb") as fh:
        gz = fh.read(2) == b"\x1f\x8b"
        fh.seek(0)
        d = zlib.decompressobj(wbits=31) if gz else None
        while raw := fh.read(1 << 20):
            if d is None:
                yield raw
                continue
            while raw:
                yield d.decompress(raw, 8 << 20)
                raw = d.unconsumed_tail
                if d.eof:  # a multi-member file (bench/make_large.py writes three): next member
                    raw = d.unused_data + raw
                    d = zlib.decompressobj(wbits=31)
                    if not raw:
                        break


def floor(path: Path) -> tuple[int, int]:
    """Decode every event of ``path``; returns (events, uncompressed bytes)."""
    buf = bytearray()
    n = total = 0
    start = -1
    for chunk in _chunks(path):
        total += len(chunk)
        buf += chunk
        if start < 0:
            at = buf.find(_OPEN)
            if at < 0:
                continue
            start = buf.index(b"[", at) + 1
        cut = buf.rfind(b"},\n", start)
        if cut < 0 or len(buf) - start < (8 << 20):
            continue
        # Kineto (and make_large.py) end each event with "},\n": a cut, not part of a string.
        n += len(_EVENTS.decode(b"[" + bytes(buf[start : cut + 1]) + b"]"))
        del buf[: cut + 2]
        start = 0
    tail = _TAIL.decode(b'{"traceEvents":[' + bytes(buf[start:]))
    n += len(_EVENTS.decode(tail["traceEvents"]))
    return n, total


def main() -> None:
    for f in sys.argv[1:]:
        t = time.perf_counter()
        n, size = floor(Path(f))
        print(json.dumps({"file": f, "wall": time.perf_counter() - t, "events": n, "bytes": size}))


if __name__ == "__main__":
    main()
