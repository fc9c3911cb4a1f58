#!/usr/bin/env bash
# Regenerate sample_traces/cpu_ddp_gloo, cpu_straggler_gloo and cpu_hang_gloo: real 2-rank CPU (gloo) runs
# recorded with `traceread collect` around tests/jobs/ddp_train.py. Run from anywhere; needs torch.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
export OMP_NUM_THREADS=1
py="${PYTHON:-python}"
port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# 1. healthy DDP: 6 optimizer steps; profiler waits 1, warms up 1, records 2 (ProfilerStep#2, #3)
rm -rf sample_traces/cpu_ddp_gloo
"$py" -m traceread.cli collect -o sample_traces/cpu_ddp_gloo --wait 1 --warmup 1 --active 2 -- \
  "$py" -m torch.distributed.run --nproc-per-node 2 --master-port "$(port)" --monitor-interval 0.5 \
  tests/jobs/ddp_train.py --steps 6

# 2. straggler: rank 1 sleeps 150 ms at the start of every step (host-side delay); rank 0 waits for it
#    in the DDP gradient all_reduce. The report must name rank 1 (~150 ms/step).
rm -rf sample_traces/cpu_straggler_gloo
"$py" -m traceread.cli collect -o sample_traces/cpu_straggler_gloo --wait 1 --warmup 1 --active 2 -- \
  "$py" -m torch.distributed.run --nproc-per-node 2 --master-port "$(port)" --monitor-interval 0.5 \
  tests/jobs/ddp_train.py --steps 6 --sleep-rank 1 --sleep-s 0.15

# 3. deadlock: rank 1 skips the loss all_reduce after optimizer step 6 and sleeps; rank 0 waits in it.
#    The profiled cycle (steps 2-3) is written before the hang; the watchdog fires after 5 s without a
#    step, dumps stacks + Flight Recorder of both ranks, then kills the job (exit code non-zero).
rm -rf sample_traces/cpu_hang_gloo
"$py" -m traceread.cli collect -o sample_traces/cpu_hang_gloo --hang-timeout 5 --on-hang kill -- \
  "$py" -m torch.distributed.run --nproc-per-node 2 --master-port "$(port)" --monitor-interval 0.5 \
  tests/jobs/ddp_train.py --steps 50 --hang-rank 1 --hang-step 5 || echo "hang run exited $? (expected non-zero)"

du -sh sample_traces/cpu_ddp_gloo sample_traces/cpu_straggler_gloo sample_traces/cpu_hang_gloo
