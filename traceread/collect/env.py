"""Environment given to the job: set before torchrun starts, so torchrun's own defaults don't win.

Rule: a variable the user already set is never changed (the user's NCCL_*/TORCH_* settings win);
``PYTHONPATH`` is the one exception, where the bootstrap folder is prepended.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from traceread.collect.inject import bootstrap_dir, prepend_pythonpath


def collect_env(run_dir: Path, base: Mapping[str, str], config: Mapping[str, Any], launcher_pid: int,
                *, inject: bool = True, fr_buffer: int = 20000) -> tuple[dict[str, str], dict[str, str]]:
    """Return ``(env, added)``: the child's full environment and the variables traceread set.

    ``run_dir`` is the folder this host writes into (``RUN`` or ``RUN/<host>``), absolute.

    * ``NCCL_DEBUG=INFO``, ``NCCL_DEBUG_SUBSYS=INIT,BOOTSTRAP,ENV,NET,GRAPH`` (topology, not per-collective
      lines), ``NCCL_DEBUG_FILE=RUN/nccl/nccl.%h.%p.log`` (NCCL expands %h host, %p pid).
    * Flight Recorder: ``TORCH_FR_BUFFER_SIZE`` (torch >= 2.8 name; default 2000 entries in 2.13),
      ``TORCH_FR_DUMP_TEMP_FILE=RUN/fr/rank`` (NCCL's automatic dump on timeout lands in ``RUN/fr/rank<R>``,
      pickle), plus the legacy names ``TORCH_NCCL_TRACE_BUFFER_SIZE`` / ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``
      for older torch
      (ranks with torch >= 2.8 unset those again before importing torch, to avoid deprecation warnings).
    * ``TORCH_NCCL_DUMP_ON_TIMEOUT=1``, ``TORCH_NCCL_ASYNC_ERROR_HANDLING=3``: torchrun would otherwise set
      1 (TearDown), which can skip the dump (pytorch#121055).
    * ``TORCH_NCCL_DEBUG_INFO_PIPE_FILE=RUN/fr/pipe_rank``: NCCL builds create the FIFO
      ``RUN/fr/pipe_rank<R>.pipe``; one byte written to it makes that rank dump its NCCL Flight Recorder
      to ``RUN/fr/rank<R>`` from C++, without the GIL (the watchdog does this on a hang).
    * ``TORCHELASTIC_ERROR_FILE``: torchrun sets its own per worker; ranks copy errors into ``RUN/errors``.
    """
    env = dict(base)
    added: dict[str, str] = {}

    def put(key: str, value: str) -> None:
        if key not in env:
            env[key] = value
            added[key] = value

    run = str(run_dir)
    put("NCCL_DEBUG", "INFO")
    put("NCCL_DEBUG_SUBSYS", "INIT,BOOTSTRAP,ENV,NET,GRAPH")
    put("NCCL_DEBUG_FILE", os.path.join(run, "nccl", "nccl.%h.%p.log"))
    put("TORCH_FR_BUFFER_SIZE", str(fr_buffer))
    put("TORCH_FR_DUMP_TEMP_FILE", os.path.join(run, "fr", "rank"))
    legacy = []
    if "TORCH_FR_BUFFER_SIZE" in added and "TORCH_NCCL_TRACE_BUFFER_SIZE" not in env:
        put("TORCH_NCCL_TRACE_BUFFER_SIZE", str(fr_buffer))
        legacy.append("TORCH_NCCL_TRACE_BUFFER_SIZE")
    if "TORCH_FR_DUMP_TEMP_FILE" in added and "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" not in env:
        put("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", os.path.join(run, "fr", "rank"))
        legacy.append("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    if legacy:  # the rank bootstrap unsets these again when its torch is >= 2.8 (they only warn there)
        env["TRACEREAD_LEGACY_ENV"] = ",".join(legacy)
        added["TRACEREAD_LEGACY_ENV"] = env["TRACEREAD_LEGACY_ENV"]
    put("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    put("TORCH_NCCL_DEBUG_INFO_PIPE_FILE", os.path.join(run, "fr", "pipe_rank"))
    put("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
    put("PYTHONUNBUFFERED", "1")  # the job's output goes through a pipe; keep it line-timely
    env["TRACEREAD_RUN_DIR"] = run
    env["TRACEREAD_CONFIG"] = json.dumps(dict(config), sort_keys=True)
    env["TRACEREAD_LAUNCHER_PID"] = str(launcher_pid)
    env.pop("TRACEREAD_INJECTED_PID", None)
    added.update({k: env[k] for k in ("TRACEREAD_RUN_DIR", "TRACEREAD_CONFIG", "TRACEREAD_LAUNCHER_PID")})
    if inject:
        env["PYTHONPATH"] = prepend_pythonpath(env, bootstrap_dir())
        added["PYTHONPATH"] = env["PYTHONPATH"]
    return env, added
