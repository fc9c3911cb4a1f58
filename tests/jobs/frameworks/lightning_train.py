"""PyTorch Lightning job (``pytorch-lightning``), 2 CPU ranks over gloo (DDP); knows nothing about traceread.

A tiny transformer encoder, a synthetic dataset, Lightning's own loop: ``training_step`` logs the loss
with ``.item()`` every step, ``ModelCheckpoint`` saves every ``--ckpt-every`` optimizer steps. The fault,
with exact truth from this script: the checkpoint storage is slow — a ``CheckpointIO`` plugin (how
Lightning writes to remote storage) that sleeps ``--ckpt-sleep-ms`` after each save. Only global rank 0
writes checkpoints, so rank 0 is late by ``ckpt-sleep-ms / ckpt-every`` per step and rank 1 waits for it.

``--lightning-profiler``: the job also runs Lightning's own ``PyTorchProfiler`` (its ``[LightningModule]``,
``[Callback]``, ``[Strategy]`` spans), which starts ``torch.profiler`` in every rank: ``traceread collect``
steps aside and the report reads Lightning's traces (``--profiler-dir``).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import ModelCheckpoint
from pytorch_lightning.plugins.io import TorchCheckpointIO
from pytorch_lightning.profilers import PyTorchProfiler
from pytorch_lightning.strategies import DDPStrategy


class SlowStorageIO(TorchCheckpointIO):
    """``torch.save`` to the checkpoint folder, then the storage's own latency (a network file system)."""

    def __init__(self, sleep_s: float) -> None:
        super().__init__()
        self.sleep_s = sleep_s
        self.saves = 0

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        super().save_checkpoint(checkpoint, path, storage_options)
        time.sleep(self.sleep_s)
        self.saves += 1


class TinyLM(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(d_model=64, nhead=2, dim_feedforward=128, batch_first=True)
        self.body = torch.nn.TransformerEncoder(layer, num_layers=2)
        self.head = torch.nn.Linear(64, 64)
        self.last_loss = 0.0

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.head(self.body(x)), y)
        self.last_loss = loss.item()  # logged every step
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-steps", type=int, default=12)
    ap.add_argument("--ckpt-every", type=int, default=2)
    ap.add_argument("--ckpt-sleep-ms", type=float, default=150.0)
    ap.add_argument("--ckpt-dir", default="ckpt")
    ap.add_argument("--lightning-profiler", action="store_true")
    ap.add_argument("--profiler-dir", default="lightning_profile")
    ap.add_argument("--truth", default="")
    args = ap.parse_args()
    pl.seed_everything(0, verbose=False)
    data = torch.utils.data.TensorDataset(torch.randn(512, 16, 64), torch.randn(512, 16, 64))
    loader = torch.utils.data.DataLoader(data, batch_size=4, num_workers=0)
    io = SlowStorageIO(args.ckpt_sleep_ms / 1e3)
    profiler = None
    if args.lightning_profiler:
        profiler = PyTorchProfiler(dirpath=args.profiler_dir, filename="lightning", export_to_chrome=True,
                                   schedule=torch.profiler.schedule(wait=2, warmup=1, active=6, repeat=1))
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend="gloo"), max_steps=args.max_steps,
        logger=False, enable_progress_bar=False, enable_model_summary=False, plugins=[io], profiler=profiler,
        callbacks=[ModelCheckpoint(dirpath=args.ckpt_dir, every_n_train_steps=args.ckpt_every, save_top_k=-1)])
    trainer.fit(TinyLM(), loader)
    rank = trainer.global_rank
    if args.truth:
        with open(f"{args.truth}.rank{rank}.json", "w", encoding="utf-8") as fh:
            json.dump({"framework": "pytorch_lightning", "late_rank": 0, "cause": "checkpoint",
                       "saves": io.saves, "ckpt_every": args.ckpt_every, "ckpt_sleep_ms": args.ckpt_sleep_ms,
                       "sleep_ms_per_step": args.ckpt_sleep_ms / args.ckpt_every if rank == 0 else 0.0}, fh)
    print(f"rank {rank} done saves={io.saves} pid={os.getpid()}", flush=True)


if __name__ == "__main__":
    main()
