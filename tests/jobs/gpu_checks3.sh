#!/usr/bin/env bash
# Third GPU call: a rank late by its own GPU work on real hardware. Two ranks share the one lent GPU and
# all-reduce over gloo (NCCL refuses two ranks on one GPU); rank 0 trains on 8x the batch, so the others
# wait for its longer forward/backward. Recorded here, judged on the CPU machine (tests/test_real_h200.py):
# the straggler is rank 0 and its cause is "gpu" (never "host" or "cpu_ops").
set -u
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
PYTHON="${PYTHON:-python3}"
work=/tmp/gpu_checks3
rm -rf "$work" && mkdir -p "$work"
run="$work/h200_bigbatch_2proc_1gpu"
timeout 300 "$PYTHON" -m traceread.cli collect -o "$run" --wait 3 --warmup 1 --active 4 -- \
  "$PYTHON" -m torch.distributed.run --nproc-per-node 2 --master-port 29561 --monitor-interval 0.5 \
  tests/jobs/transformer_train.py --same-gpu --backend gloo --layers 2 --d-model 512 --heads 8 --vocab 1024 \
  --seq 2048 --batch 16 --big-batch-rank 0 --big-batch-factor 8 --steps 12 > "$work/collect.log" 2>&1
echo "collect: exit $?"
tail -n 25 "$work/collect.log"
find "$run" -name '*.pt.trace.json*' -exec ls -la {} \;
tar czf "${OUT:-/tmp}/gpu_runs3.tar.gz" -C "$work" .
ls -la "${OUT:-/tmp}/gpu_runs3.tar.gz"
