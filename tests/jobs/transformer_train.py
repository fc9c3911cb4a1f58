"""Small GPT-style transformer trained with DDP; knows nothing about traceread.

Used to record the real H100 samples (`sample_traces/h100_*`, see tests/jobs/record_gpu_samples.sh):
NCCL on CUDA (bf16 autocast, flash attention through scaled_dot_product_attention), gloo on CPU.
Several ranks may share one GPU (``--same-gpu``) when a machine has a single GPU.

Knobs: --steps, --layers, --d-model, --heads, --seq, --batch, --vocab, --same-gpu, --backend, --compile,
--stall-gpu-step K (CUDA only: at step K the GPU is made to spin for --stall-s seconds before the forward, as a
GPU that stopped would; DDP's gradient all-reduces queue behind it, the host blocks at the next loss print, and
NCCL's watchdog / a Flight Recorder dump sees those collectives scheduled but never started),
--nccl-timeout S (the process group's timeout), --big-batch-rank R --big-batch-factor F (rank R trains on F times the
batch: late by its own GPU work).
"""

import argparse
import datetime
import math
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int, seq: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--same-gpu", action="store_true", help="every rank uses cuda:0")
    ap.add_argument("--backend", default=None, help="nccl (CUDA default) or gloo (CPU default; also CUDA tensors)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (Triton kernels)")
    ap.add_argument("--stall-gpu-step", type=int, default=-1, help="CUDA: the GPU spins at this step")
    ap.add_argument("--stall-s", type=float, default=600.0, help="how long the GPU spins (seconds)")
    ap.add_argument("--nccl-timeout", type=float, default=600.0, help="process group timeout (seconds)")
    ap.add_argument("--big-batch-rank", type=int, default=-1, help="this rank's batch is --big-batch-factor times larger")
    ap.add_argument("--big-batch-factor", type=int, default=1)
    args = ap.parse_args()

    cuda = torch.cuda.is_available()
    if args.stall_gpu_step >= 0 and not cuda:
        raise SystemExit("--stall-gpu-step needs a CUDA GPU")
    timeout = datetime.timedelta(seconds=args.nccl_timeout)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        dev = torch.device("cuda", 0 if args.same_gpu else local)
        torch.cuda.set_device(dev)
        backend = args.backend or "nccl"
        dist.init_process_group(backend, device_id=dev if backend == "nccl" else None, timeout=timeout)
    else:
        dev = torch.device("cpu")
        dist.init_process_group(args.backend or "gloo", timeout=timeout)
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = GPT(args.vocab, args.d_model, args.heads, args.layers, args.seq).to(dev)
    model = DDP(model, device_ids=[dev.index] if cuda else None)
    if args.compile:
        model = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=cuda)
    g = torch.Generator(device="cpu").manual_seed(rank)
    batch = args.batch * (args.big_batch_factor if rank == args.big_batch_rank else 1)
    for step in range(args.steps):
        if step == args.stall_gpu_step:
            torch.cuda._sleep(int(args.stall_s * 2e9))  # one kernel spins >= stall_s (SM clock <= 2 GHz): it "stopped"
        idx = torch.randint(0, args.vocab, (batch, args.seq + 1), generator=g).to(dev, non_blocking=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
            logits = model(idx[:, :-1])
            loss = F.cross_entropy(logits.float().view(-1, args.vocab), idx[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if rank == 0 and step % 5 == 0:
            print(f"step {step} loss {loss.item():.3f} (ln V = {math.log(args.vocab):.3f})", flush=True)
    if cuda:
        torch.cuda.synchronize()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
