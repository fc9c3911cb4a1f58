"""Hugging Face Trainer job (transformers + accelerate), 2 CPU ranks over gloo; knows nothing about traceread.

A tiny GPT-2 built from its config (no download), a synthetic token dataset, the Trainer's own loop:
gradient accumulation (``--accum`` micro-batches per optimizer step), a log line every step (the
Trainer's ``.item()`` of the loss), DDP over gloo. The fault, with exact truth from this script:
rank ``--slow-rank``'s dataset ``__getitem__`` sleeps ``--sleep-ms`` per sample, so each of its
optimizer steps waits ``sleep-ms * batch * accum`` ms in the data loader; the other rank waits for it in
the gradient all-reduce. The truth is written to ``--truth`` (JSON) by rank 0.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class SlowTokens(torch.utils.data.Dataset):
    """Random token sequences; on the slow rank each sample costs ``sleep_s`` (a slow decode/read)."""

    def __init__(self, n: int, seq: int, vocab: int, sleep_s: float) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, seq), generator=g)
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-steps", type=int, default=12)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--accum", type=int, default=2)
    ap.add_argument("--slow-rank", type=int, default=1)
    ap.add_argument("--sleep-ms", type=float, default=25.0)
    ap.add_argument("--output-dir", default="hf_out")
    ap.add_argument("--truth", default="")
    args = ap.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=256, n_positions=32)
    model = GPT2LMHeadModel(config)
    sleep_s = args.sleep_ms / 1e3 if rank == args.slow_rank else 0.0
    data = SlowTokens(n=args.max_steps * args.batch * args.accum * 2 + 64, seq=32, vocab=256, sleep_s=sleep_s)
    targs = TrainingArguments(
        output_dir=args.output_dir, max_steps=args.max_steps, per_device_train_batch_size=args.batch,
        gradient_accumulation_steps=args.accum, logging_steps=1, save_strategy="no", report_to=[],
        use_cpu=True, ddp_backend="gloo", dataloader_num_workers=0, disable_tqdm=True, learning_rate=1e-3,
        seed=0)
    trainer = Trainer(model=model, args=targs, train_dataset=data)
    trainer.train()
    if rank == 0 and args.truth:
        per_step = args.sleep_ms * args.batch * args.accum
        with open(args.truth, "w", encoding="utf-8") as fh:
            json.dump({"framework": "transformers.Trainer", "late_rank": args.slow_rank, "cause": "data loading",
                       "loader_sleep_ms_per_step": per_step, "micro_steps_per_step": args.accum,
                       "samples_per_micro_step": args.batch}, fh)
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
