"""Turn lists of loosely-typed trace values into typed polars columns without failing on odd ones.

Real traces write the same arg as int, string (``"bytes": "2560"``), float or list depending on
the producer and version. The fast path hands the list to polars untouched; only when polars
refuses (mixed types, 128-bit ints) do we convert value by value, and a value that has no
faithful representation in the column type becomes null rather than an error.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import chain
from typing import TYPE_CHECKING, Any, cast

import msgspec
import numpy as np
import polars as pl

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_INT_RE = re.compile(r"^\s*[-+]?(0[xX][0-9a-fA-F]+|\d+)\s*$")
_DIGITS_RE = re.compile(r"(\d+)\s*$")


def to_int(v: Any) -> int | None:
    """An int64 for ints, integral floats, numeric strings and booleans (1/0, as polars converts a
    column of ints and booleans: one rule whatever else the column holds); None for anything else."""
    if v is None:
        return None
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v if _INT64_MIN <= v <= _INT64_MAX else None
    if isinstance(v, float):
        if v != v or v in (float("inf"), float("-inf")) or not v.is_integer():
            return None
        return to_int(int(v))
    if isinstance(v, str) and _INT_RE.match(v):
        return to_int(int(v.strip(), 0) if "x" in v.lower() else int(v))
    return None


def to_float(v: Any) -> float | None:
    """A float for numbers, numeric strings and booleans (see :func:`to_int`); None otherwise."""
    if v is None:
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        try:
            return float(v)
        except ValueError:
            return None
    return None


def to_text(v: Any) -> str | None:
    """Strings as they are; other JSON values as compact JSON text (so nothing is lost)."""
    if v is None:
        return None
    if isinstance(v, str):
        return v
    try:
        return msgspec.json.encode(v).decode()
    except (TypeError, msgspec.EncodeError):
        return str(v)


def raw_text_col(name: str, raws: Sequence[msgspec.Raw | None]) -> pl.Series:
    """Exact recorded JSON text of ``Raw`` args; absent or JSON null become null.

    The texts are joined with NUL (never part of valid JSON text) and decoded and split in one
    go instead of one ``str`` per value.
    """
    if _all_none(raws):
        return null_series(name, pl.Utf8, len(raws))
    # no None left: the check below keeps the common all-present batch from being copied
    chunks = [r if r is not None else _EMPTY for r in raws] if None in raws else cast("Sequence[msgspec.Raw]", raws)
    joined = b"\x00".join(chunks)
    if joined.count(b"\x00") != len(chunks) - 1:  # pragma: no cover - NUL inside a JSON text
        texts = [str(r, "utf-8", "replace") if r else None for r in chunks]
        return pl.Series(name, texts, dtype=pl.Utf8).replace("null", None)
    text = pl.Series(name, [joined.decode("utf-8", "replace")], dtype=pl.Utf8)
    vals = text.str.split("\x00").explode()
    return vals.set((vals == "") | (vals == "null"), None).alias(name)


_EMPTY = b""


def raw_text(r: msgspec.Raw | None) -> str | None:
    """Exact recorded JSON text of a ``Raw`` arg; JSON null becomes null."""
    if r is None or len(r) == 0:
        return None
    s = bytes(r).decode("utf-8", "replace")
    return None if s == "null" else s


def raw_id_text(r: msgspec.Raw | None) -> str | None:
    """An id recorded as number or string, as text without quotes (keeps 64-bit hashes exact)."""
    s = raw_text(r)
    if s is not None and len(s) >= 2 and s[0] == '"' and s[-1] == '"':
        try:
            return str(msgspec.json.decode(s.encode()))
        except msgspec.DecodeError:
            return s[1:-1]
    return s


def null_series(name: str, dtype: PolarsDataType, n: int) -> pl.Series:
    """An all-null column that costs (almost) no memory: its zeroed buffer is never touched.

    Most comm/shape columns are null on most rows; built from a list of Nones they would cost
    8-16 bytes per row each.
    """
    return pl.Series(name, [None], dtype=dtype).new_from_index(0, n)


def _all_none(vals: Sequence[Any]) -> bool:
    # The first value decides most columns without a scan.
    return (
        isinstance(vals, (list, tuple))
        and (not vals or vals[0] is None)
        and vals.count(None) == len(vals)
    )


def cheap_nulls(df: pl.DataFrame) -> pl.DataFrame:
    """Replace every all-null column of ``df`` by a :func:`null_series` (same name and dtype)."""
    n = df.height
    repl = [
        null_series(c, df.schema[c], n)
        for c in df.columns
        if n and df[c].null_count() == n
    ]
    return df.with_columns(repl) if repl else df


def int_col(name: str, vals: Sequence[Any], conv: Any = None) -> pl.Series:
    """Int64 column; values polars cannot take as they are go through ``conv`` (default to_int)."""
    if _all_none(vals):
        return null_series(name, pl.Int64, len(vals))
    # Id columns (a ``conv`` is given) often mix in text ids: test the types first, a failing
    # polars constructor costs several times a successful one.
    types = set(map(type, vals)) if conv is not None else None
    try:
        if types is None or types <= _INT_NONE:
            return pl.Series(name, vals, dtype=pl.Int64)
    except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError):
        pass
    conv = conv or to_int
    if (types or set(map(type, vals))) <= _INT_STR:
        # ids repeat (pid/tid): convert each distinct value once; int and str keys never
        # collide in a dict (bool/float, which would, take the general path).
        table = {
            v: v if type(v) is int and _INT64_MIN <= v <= _INT64_MAX else conv(v)
            for v in set(vals)
        }
        return pl.Series(name, list(map(table.__getitem__, vals)), dtype=pl.Int64)
    vals = [v if type(v) is int and _INT64_MIN <= v <= _INT64_MAX else conv(v) for v in vals]
    return pl.Series(name, vals, dtype=pl.Int64)


_INT_STR = {int, str, type(None)}
_INT_NONE = {int, type(None)}


def float_col(name: str, vals: Sequence[Any]) -> pl.Series:
    if _all_none(vals):
        return null_series(name, pl.Float64, len(vals))
    try:
        return pl.Series(name, vals, dtype=pl.Float64)
    except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError):
        return pl.Series(name, [to_float(v) for v in vals], dtype=pl.Float64)


def str_col(name: str, vals: Sequence[Any]) -> pl.Series:
    if _all_none(vals):
        return null_series(name, pl.Utf8, len(vals))
    try:
        return pl.Series(name, vals, dtype=pl.Utf8)
    except (TypeError, ValueError, pl.exceptions.PolarsError):
        return pl.Series(name, [to_text(v) for v in vals], dtype=pl.Utf8)


def id_int(v: Any) -> int | None:
    """pid/tid/stream as int: ints, numeric strings and Kineto's legacy ``"stream 7"`` labels."""
    if isinstance(v, int) and not isinstance(v, bool):
        return v if _INT64_MIN <= v <= _INT64_MAX else None
    if isinstance(v, str):
        if v.isdigit():
            return to_int(int(v))
        if v.startswith("stream"):
            m = _DIGITS_RE.search(v)
            return to_int(int(m.group(1))) if m else None
    return None


def triples(name: str, vals: list[Any]) -> list[pl.Series]:
    """``<name>_x``/``_y``/``_z`` Int64 columns from ``grid``/``block`` values (see :func:`triple`).

    Fast path: every value is None or a list of three plain ints, converted by numpy at once.
    """
    names = [f"{name}_x", f"{name}_y", f"{name}_z"]
    lists = [v for v in vals if v is not None]
    if (
        lists
        and set(map(type, lists)) == _LIST
        and set(map(len, lists)) == _THREE
        and set(map(type, chain.from_iterable(lists))) == _INT
    ):
        try:
            arr = np.array(lists, dtype=np.int64)
        except (OverflowError, ValueError, TypeError):
            pass
        else:
            if len(lists) == len(vals):
                return [pl.Series(c, arr[:, j], dtype=pl.Int64) for j, c in enumerate(names)]
            missing = np.array([v is None for v in vals])
            full = np.zeros((len(vals), 3), dtype=np.int64)
            full[~missing] = arr
            mask = pl.Series(missing)
            return [
                pl.Series(c, full[:, j], dtype=pl.Int64).set(mask, None)
                for j, c in enumerate(names)
            ]
    trip = [triple(v) for v in vals]
    return [pl.Series(c, [t[j] for t in trip], dtype=pl.Int64) for j, c in enumerate(names)]


_LIST = {list}
_THREE = {3}
_INT = {int}


def triple(v: Any) -> tuple[int | None, int | None, int | None]:
    """``grid``/``block`` recorded as ``[x, y, z]`` (or that list written as a string)."""
    if isinstance(v, str):
        try:
            v = msgspec.json.decode(v.encode())
        except msgspec.DecodeError:
            return (None, None, None)
    if isinstance(v, list) and len(v) == 3:
        return (to_int(v[0]), to_int(v[1]), to_int(v[2]))
    return (None, None, None)
