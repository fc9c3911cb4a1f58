"""JSON-text columns (what the columnar reader hands over) -> the typed columns the tables keep.

Why text: duckdb's JSON reader converts a value to a declared type silently (``2.5`` into an
integer column becomes 2, a string into a float column its number), where the msgspec path keeps
the rules of :mod:`traceread.read.columns`. Read as JSON text, a column keeps what was recorded:
the plain values (bare integers, numbers, simple strings) convert in one vectorised pass, and only
the rest ("odd" rows) is decoded value by value and converted by the very functions the msgspec
path uses, so both paths give the same column. A value the msgspec path would refuse (a number as
an event's name, a string as its ``ts``) raises :class:`Refused`, and the caller reads the file that
way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import polars as pl

from traceread.read.columns import id_int, to_float, to_int, to_text, triple

_PLAIN_INT = r"^-?\d+$"
_TRIPLE = r"^\[(-?\d+),(-?\d+),(-?\d+)\]$"
_ODD = "__odd_"


class Refused(Exception):
    """The columnar read cannot give the tables the msgspec path gives for this file."""


@dataclass(frozen=True)
class Conv:
    """One output column from one JSON-text column: a vectorised expression, the rows it cannot
    convert (``odd``), the exact conversion for those, and whether an odd row refuses the file."""

    name: str
    fast: pl.Expr
    odd: pl.Expr
    exact: Callable[[Any], Any]
    dtype: Any
    source: str
    refuse: pl.Expr | None = None


def _is_str(c: pl.Expr) -> pl.Expr:
    return c.str.starts_with('"')


def as_int(name: str, source: str, exact: Callable[[Any], Any] = to_int) -> Conv:
    """Int64 by :func:`to_int` (or ``exact``, e.g. :func:`id_int`) of each JSON value."""
    c = pl.col(source)
    fast = c.str.to_integer(base=10, strict=False).cast(pl.Int64)
    return Conv(name, fast, c.is_not_null() & fast.is_null(), exact, pl.Int64, source)


def as_id(name: str, source: str, exact: Callable[[Any], Any] = id_int) -> Conv:
    """``pid``/``tid``/``id``: an integer or a string (the msgspec path refuses anything else)."""
    conv = as_int(name, source, exact)
    c = pl.col(source)
    refuse = conv.odd & ~_is_str(c) & ~c.str.contains(_PLAIN_INT)
    return Conv(name, conv.fast, conv.odd, exact, pl.Int64, source, refuse)


def as_float(name: str, source: str) -> Conv:
    """Float64 by :func:`to_float` of each JSON value."""
    c = pl.col(source)
    fast = pl.when(_is_str(c)).then(None).otherwise(c.cast(pl.Float64, strict=False))
    return Conv(name, fast, c.is_not_null() & fast.is_null(), to_float, pl.Float64, source)


def as_number(name: str, source: str) -> Conv:
    """``ts``/``dur``: JSON numbers only (the msgspec path refuses a string or a list there)."""
    conv = as_float(name, source)
    return Conv(name, conv.fast, conv.odd, to_float, pl.Float64, source, conv.odd)


def as_text(name: str, source: str) -> Conv:
    """A string as it is, any other JSON value as its compact JSON text (:func:`to_text`): plain
    strings and integers convert in the pass, the rest (escapes, floats, lists) by msgspec, whose
    number formatting the msgspec path's text has."""
    c = pl.col(source)
    plain_str = _is_str(c) & ~c.str.contains("\\", literal=True)
    fast = (pl.when(plain_str).then(c.str.strip_prefix('"').str.strip_suffix('"'))
            .when(c.str.contains(_PLAIN_INT)).then(c))
    return Conv(name, fast, c.is_not_null() & fast.is_null(), to_text, pl.Utf8, source)


def as_string(name: str, source: str) -> Conv:
    """A field the msgspec path types as a string (``ph``, ``cat``, ``name``): anything else refuses."""
    conv = as_text(name, source)
    c = pl.col(source)
    return Conv(name, conv.fast, conv.odd, to_text, pl.Utf8, source, c.is_not_null() & ~_is_str(c))


def as_raw(name: str, source: str) -> Conv:
    """The JSON text of a shape argument (compact: the reader re-serialises it)."""
    return Conv(name, pl.col(source), pl.lit(False), to_text, pl.Utf8, source)


def as_triple(name: str, source: str, j: int) -> Conv:
    """``<name>_x``/``_y``/``_z`` (``j`` = 0, 1, 2) of ``grid``/``block``: ``[x, y, z]`` fast,
    :func:`triple` for the rest."""
    c = pl.col(source)
    fast = c.str.extract(_TRIPLE, j + 1).str.to_integer(base=10, strict=False).cast(pl.Int64)
    odd = c.is_not_null() & c.str.extract(_TRIPLE, 1).is_null()
    return Conv(name, fast, odd, lambda v: triple(v)[j], pl.Int64, source)


def convert(df: pl.DataFrame, convs: list[Conv]) -> pl.DataFrame:
    """``df``'s JSON-text columns converted by ``convs`` in one parallel pass; the odd rows of a
    column are then converted value by value; raises
    :class:`Refused` where a ``refuse`` condition holds on any row."""
    refusals = [c.refuse.any().alias(c.name) for c in convs if c.refuse is not None]
    if refusals:
        bad = df.select(refusals).row(0, named=True)
        if any(bad.values()):
            raise Refused(f"{next(k for k, v in bad.items() if v)}: a value the msgspec path refuses")
    empty = {c for c, n in zip(df.columns, df.null_count().row(0)) if n == df.height}
    blank = [pl.lit(None, c.dtype).alias(c.name) for c in convs if c.source in empty]
    convs = [c for c in convs if c.source not in empty]  # all-null sources: no pass over them
    exprs = [*(c.fast.alias(c.name) for c in convs), *blank]
    odd = [c.odd.alias(_ODD + c.name) for c in convs]
    out = df.select([*exprs, *odd])
    flags = out.select(pl.col(_ODD + c.name).any() for c in convs).row(0)
    patched = [_patched(out, df, c) for c, flag in zip(convs, flags) if flag]
    out = out.drop([_ODD + c.name for c in convs])
    return out.with_columns(patched) if patched else out


def _patched(out: pl.DataFrame, df: pl.DataFrame, c: Conv) -> pl.Series:
    idx = np.flatnonzero(out.get_column(_ODD + c.name).fill_null(False).to_numpy())
    texts = df.get_column(c.source).gather(idx).to_list()
    vals = [c.exact(msgspec.json.decode(t)) for t in texts]
    return out.get_column(c.name).scatter(idx, pl.Series(vals, dtype=c.dtype))
