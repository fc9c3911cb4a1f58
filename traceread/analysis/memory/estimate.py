"""The guide's model of training memory per GPU: weights, gradients and optimizer state, by ZeRO stage.

Training keeps, for every parameter, its weight and its gradient (in the training dtype: 2 bytes in
bf16/fp16, 4 in fp32) and the optimizer's state: Adam/AdamW two fp32 moments (8 bytes), SGD with
momentum one (4), plain SGD none; mixed precision that keeps an fp32 master copy of the weights adds
4 bytes more to the optimizer's share. With bf16 and Adam that is 2 + 2 + 8 = 12 bytes per parameter
(16 with the master copy), the guide's headline number.

Model parallelism (tensor and pipeline) splits the parameters: one GPU holds ``P = N / (TP·PP)`` of
the model's ``N``. ZeRO then shards over the ``D`` ranks of the data-parallel (or FSDP) group what
DDP replicates:

* stage 0 (DDP): ``P·(w + g + o)``;
* stage 1, optimizer state sharded: ``P·(w + g + o/D)``;
* stage 2, gradients too: ``P·(w + (g + o)/D)``;
* stage 3 (FSDP full shard), weights too: ``P·(w + g + o)/D``.

With bf16 and Adam these are the guide's ``P·(2 + 2 + 8/D)``, ``P·(2 + 10/D)`` and ``12·P/D``. What a
GPU holds beyond this at its peak is activations (tensors saved for backward), temporary buffers
(ZeRO-3's gathered weights, communication buckets) and allocator rounding.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

#: Bytes per value of the weights and gradients.
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2}
#: Optimizer state bytes per parameter (fp32 moments).
OPTIMIZER_BYTES: dict[str, int] = {"adamw": 8, "adam": 8, "sgd-momentum": 4, "sgd": 0}
MASTER_BYTES = 4
ZERO_STAGES = (0, 1, 2, 3)


@dataclass(frozen=True)
class StateEstimate:
    """Bytes per GPU of each part of the training state (floats: shards need not be whole bytes)."""

    params_total: float  # the model's parameters (--params)
    params_per_gpu: float  # after tensor/pipeline parallelism
    zero_stage: int
    shard_degree: int  # ranks the ZeRO stage shards over
    model_parallel: int  # TP x PP
    dtype: str
    optimizer: str
    master_weights: bool
    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.gradients_bytes + self.optimizer_bytes

    def to_json(self) -> dict[str, Any]:
        return asdict(self) | {"total_bytes": self.total_bytes}


def training_state(params: float, *, zero_stage: int = 0, shard_degree: int = 1, model_parallel: int = 1,
                   dtype: str = "bf16", optimizer: str = "adamw", master_weights: bool = False) -> StateEstimate:
    """Weights, gradients and optimizer state per GPU (module docstring)."""
    if zero_stage not in ZERO_STAGES:
        raise ValueError(f"ZeRO stage {zero_stage} is not one of 0, 1, 2, 3")
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(DTYPE_BYTES)}")
    if optimizer not in OPTIMIZER_BYTES:
        raise ValueError(f"optimizer {optimizer!r} is not one of {', '.join(OPTIMIZER_BYTES)}")
    d = max(1, int(shard_degree))
    p = float(params) / max(1, int(model_parallel))
    w = p * DTYPE_BYTES[dtype]
    g = p * DTYPE_BYTES[dtype]
    o = p * (OPTIMIZER_BYTES[optimizer] + (MASTER_BYTES if master_weights else 0))
    if zero_stage >= 1:
        o /= d
    if zero_stage >= 2:
        g /= d
    if zero_stage >= 3:
        w /= d
    return StateEstimate(float(params), p, zero_stage, d, max(1, int(model_parallel)), dtype, optimizer,
                         master_weights, w, g, o)


def at_stage(est: StateEstimate, stage: int) -> StateEstimate:
    """The same model and sharding at another ZeRO stage (what-if)."""
    return training_state(est.params_total, zero_stage=stage, shard_degree=est.shard_degree,
                          model_parallel=est.model_parallel, dtype=est.dtype, optimizer=est.optimizer,
                          master_weights=est.master_weights)
