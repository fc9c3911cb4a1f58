"""What the user asked of ``traceread report``: the analysis knobs and how to run the per-rank stage.

Kept apart from the engine and the analyses so that every layer (commands, analyze, engine,
crossrank) can read the options without importing each other. :meth:`ReportOptions.analysis_key`
lists the fields that change the report *document* (used by the document cache); the others
(cache, workers, executor, progress) change only how fast it is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Kernels kept per rank before merging across ranks (by total time and by SM time lost).
KERNELS_PER_RANK = 40
#: Kernels in the report.
TOP_KERNELS = 30
#: Collective mismatches listed one by one before the rest are counted.
MAX_MISMATCH_WARNINGS = 10
#: Where the per-rank stage runs: this process's pool or a Ray cluster.
EXECUTORS = ("local", "ray")


@dataclass
class ReportOptions:
    """Knobs of ``traceread report``: the analysis ones and the engine ones."""

    use_cache: bool = True
    cache_dir: Path | None = None
    workers: int | None = None
    progress: bool = False
    params: float | None = None  # model parameters, for formula MFU (6·N·D)
    tokens_per_step: float | None = None  # tokens processed per step by the whole job
    n_layers: int | None = None  # with seq_len and d_model: the attention term 12·L·s·d per token
    seq_len: int | None = None
    d_model: int | None = None
    device_spec: Path | None = None  # user file with device peaks (--device-spec)
    zero_stage: int | None = None  # memory model: ZeRO stage (None: 3 with an FSDP group, else 0)
    param_dtype: str = "bf16"  # memory model: dtype of weights and gradients
    optimizer: str = "adamw"  # memory model: optimizer whose state is kept (adamw, adam, sgd-momentum, sgd)
    master_weights: bool = False  # memory model: an fp32 master copy of the weights in the optimizer state
    snapshots: list[Path] = field(default_factory=list)  # memory snapshots named with --snapshot
    cycle: str | None = None  # profiling cycle to analyse: None/latest, N, RUN:N (reader.cycles)
    top_kernels: int = TOP_KERNELS
    executor: str = "local"  # "local" | "ray"
    ray_address: str | None = None  # None: start (or join) a local Ray
    node_local: bool = False  # with ray: PATHS are on each node's own disk (engine.node_local)
    storage_options: dict[str, Any] = field(default_factory=dict)  # fsspec options for URLs

    def analysis_key(self) -> dict[str, Any]:
        """The fields that change the document (the device-spec file enters by content elsewhere)."""
        return {"params": self.params, "tokens_per_step": self.tokens_per_step, "n_layers": self.n_layers,
                "seq_len": self.seq_len, "d_model": self.d_model, "top_kernels": self.top_kernels, "cycle": self.cycle,
                "device_spec": str(self.device_spec) if self.device_spec else None, "zero_stage": self.zero_stage,
                "param_dtype": self.param_dtype, "optimizer": self.optimizer, "master_weights": self.master_weights,
                "snapshots": [str(p) for p in self.snapshots]}
