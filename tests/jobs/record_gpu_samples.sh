#!/usr/bin/env bash
# Record the real H100 samples (sample_traces/h100_*) with `traceread collect` around tests/jobs/transformer_train.py.
# Needs a CUDA machine with torch; run from the repo root. OUT (default sample_traces) receives the run folders.
#   h100_transformer_1gpu     1 rank, NCCL, GPT-style 4-layer d=1024 transformer, bf16, flash attention, fused AdamW
#   h100_compiled_1gpu        the same model under torch.compile (Inductor/Triton kernels)
#   h100_ddp_gloo_2proc_1gpu  2 ranks sharing the one GPU, DDP over gloo (CUDA tensors): NCCL refuses two ranks per GPU
#   h100_nccl_dup_gpu_crash   the same 2 ranks with NCCL: the job dies in init ("Duplicate GPU detected"); NCCL logs only
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
out="${OUT:-sample_traces}"
py="${PYTHON:-python}"
port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
sched=(--wait 5 --warmup 2 --active 5)
job=tests/jobs/transformer_train.py

record() {  # record NAME NPROC JOB-ARGS...
  local name=$1 nproc=$2; shift 2
  rm -rf "${out:?}/$name"
  "$py" -m traceread.cli collect -o "$out/$name" "${sched[@]}" -- \
    "$py" -m torch.distributed.run --nproc-per-node "$nproc" --master-port "$(port)" "$job" "$@"
  echo "$name exit $?"
}

record h100_transformer_1gpu 1 --steps 16
record h100_compiled_1gpu 1 --steps 16 --compile
record h100_ddp_gloo_2proc_1gpu 2 --steps 16 --same-gpu --backend gloo --layers 2 --batch 4
record h100_nccl_dup_gpu_crash 2 --steps 16 --same-gpu --layers 2 --batch 4
