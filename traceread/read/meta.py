"""What a trace says about itself outside the event list -> :class:`RankMeta`.

``deviceProperties`` (name, numSms per device), ``distributedInfo`` (rank, world size, backend,
NCCL version, process groups), ``baseTimeNanoseconds`` (to put ``ts`` on the epoch clock),
``displayTimeUnit`` (display only: ``ts`` stays µs), schema version and trace name.
"""

from __future__ import annotations

from typing import Any

import msgspec
import polars as pl

from traceread.model import RankMeta
from traceread.read.columns import to_int
from traceread.read.decode import decode_value


def _str_or_none(v: Any) -> str | None:
    if v is None:
        return None
    s = v if isinstance(v, str) else str(v)
    return s or None


def top_values(top: dict[str, msgspec.Raw]) -> dict[str, Any]:
    """Decode every top-level value except the event list (they are small)."""
    return {k: decode_value(v) for k, v in top.items() if k != "traceEvents"}


def build_meta(
    top: dict[str, Any], keys: list[str], gpu: pl.DataFrame, event_counts: dict[str, int]
) -> RankMeta:
    """Meta from the decoded top-level values; ``rank`` is left to :mod:`traceread.read.ranks`."""
    dist = top.get("distributedInfo")
    if not isinstance(dist, dict):
        dist = None
    devices = top.get("deviceProperties")
    devices = [d for d in devices if isinstance(d, dict)] if isinstance(devices, list) else []

    device_id = _main_device(gpu)
    device_name: str | None = None
    num_sms: int | None = None
    if device_id is not None:
        match = [d for d in devices if to_int(d.get("id")) == device_id]
        if not match and devices:
            # ROCm traces number kernel devices differently from deviceProperties (kernels on
            # device 9, one property entry with id 0): when every listed device is the same
            # model, that model is the answer.
            if len({(d.get("name"), d.get("numSms")) for d in devices}) == 1:
                match = devices[:1]
        if match:
            device_name = _str_or_none(match[0].get("name"))
            num_sms = to_int(match[0].get("numSms"))

    top_value = top.get
    pg_config = dist.get("pg_config") if dist else None
    return RankMeta(
        rank=to_int(dist.get("rank")) if dist else None,
        world_size=to_int(dist.get("world_size")) if dist else None,
        backend=_str_or_none(dist.get("backend")) if dist else None,
        nccl_version=_str_or_none(dist.get("nccl_version")) if dist else None,
        pg_config=[p for p in pg_config if isinstance(p, dict)]
        if isinstance(pg_config, list)
        else [],
        distributed_info=dist,
        devices=devices,
        device_id=device_id,
        device_name=device_name,
        num_sms=num_sms,
        base_time_ns=to_int(top_value("baseTimeNanoseconds")),
        display_time_unit=_str_or_none(top_value("displayTimeUnit")),
        schema_version=to_int(top_value("schemaVersion")),
        trace_name=_str_or_none(top_value("traceName")),
        top_level_keys=list(keys),
        event_counts=event_counts,
    )


def _main_device(gpu: pl.DataFrame) -> int | None:
    """The device most kernels ran on (memcpy/memset count only when there are no kernels)."""
    if gpu.height == 0:
        return None
    kernels = gpu.filter(pl.col("kind") == "kernel")
    src = kernels if kernels.height else gpu
    counts = (
        src.filter(pl.col("device").is_not_null())
        .group_by("device")
        .len()
        .sort(["len", "device"], descending=[True, False])
    )
    return int(counts["device"][0]) if counts.height else None
