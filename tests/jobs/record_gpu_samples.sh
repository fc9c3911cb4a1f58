#!/usr/bin/env bash
# Record the real H100 samples (sample_traces/h100_*) with `traceread collect` around tests/jobs/transformer_train.py.
# Needs a CUDA machine with torch; run from the repo root. OUT (default sample_traces) receives the run folders.
#   h100_transformer_1gpu     1 rank, NCCL, GPT-style 4-layer d=1024 transformer, bf16, flash attention, fused AdamW
#   h100_compiled_1gpu        the same model under torch.compile (Inductor/Triton kernels)
#   h100_ddp_gloo_2proc_1gpu  2 ranks sharing the one GPU, DDP over gloo (CUDA tensors): NCCL refuses two ranks per GPU
#   h100_nccl_dup_gpu_crash   the same 2 ranks with NCCL: the job dies in init ("Duplicate GPU detected"); NCCL logs only
#   h100_memory_1gpu          2-layer transformer with --profile-memory --memory-snapshot (allocator events + snapshot)
#   h100_nccl_gpu_stall_1gpu  NCCL job whose GPU stops at step 16 (a spinning kernel): the collector's hang watchdog
#                             asks NCCL for its Flight Recorder dump, then kills the job
#   h100_nccl_timeout_1gpu    the same stall left to NCCL's own watchdog (timeout 20 s, TORCH_NCCL_ENABLE_TIMING=1):
#                             torch dumps its Flight Recorder on timeout (pickle) and tears the job down
# ONLY="name ..." records only those.
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
out="${OUT:-sample_traces}"
py="${PYTHON:-python}"
port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
sched=(--wait 5 --warmup 2 --active 5)
job=tests/jobs/transformer_train.py

extra=()
record() {  # record NAME NPROC JOB-ARGS...   (collect options in the array extra)
  local name=$1 nproc=$2; shift 2
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then return; fi
  rm -rf "${out:?}/$name"
  "$py" -m traceread.cli collect -o "$out/$name" "${sched[@]}" "${extra[@]}" -- \
    "$py" -m torch.distributed.run --nproc-per-node "$nproc" --master-port "$(port)" "$job" "$@"
  echo "$name exit $?"
}

record h100_transformer_1gpu 1 --steps 16
record h100_compiled_1gpu 1 --steps 16 --compile
record h100_ddp_gloo_2proc_1gpu 2 --steps 16 --same-gpu --backend gloo --layers 2 --batch 4
record h100_nccl_dup_gpu_crash 2 --steps 16 --same-gpu --layers 2 --batch 4
sched=(--wait 5 --warmup 2 --active 3)
extra=(--profile-memory --memory-snapshot)
record h100_memory_1gpu 1 --steps 12 --layers 2
sched=(--wait 5 --warmup 2 --active 3)
extra=(--hang-timeout 15 --on-hang kill)
record h100_nccl_gpu_stall_1gpu 1 --steps 40 --layers 2 --batch 4 --stall-gpu-step 16 --nccl-timeout 300
extra=(--hang-timeout 600)
TORCH_NCCL_ENABLE_TIMING=1 record h100_nccl_timeout_1gpu 1 --steps 40 --layers 2 --batch 4 --stall-gpu-step 16 --nccl-timeout 20
