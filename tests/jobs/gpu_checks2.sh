#!/usr/bin/env bash
# Second GPU call of this wave: the slow-step watch on a real GPU (tests/jobs/record_watch_gpu.sh, one rank)
# and real NCCL failure logs (tests/jobs/nccl_failures_gpu.py, recorded here, judged on the CPU machine).
set -u
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
export PYTHON="${PYTHON:-python3}"
work=/tmp/gpu_checks2
rm -rf "$work" && mkdir -p "$work"
NPROC=1 OUT="$work/h200_watch_1gpu" timeout 240 bash tests/jobs/record_watch_gpu.sh > "$work/watch.log" 2>&1
echo "watch: exit $?"
timeout 200 "$PYTHON" tests/jobs/nccl_failures_gpu.py "$work/nccl_failures" > "$work/nccl_failures.log" 2>&1
echo "nccl failures: exit $?"
tail -n 25 "$work/watch.log" "$work/nccl_failures.log"
tar czf "${OUT:-/tmp}/gpu_runs2.tar.gz" -C "$work" .
ls -la "${OUT:-/tmp}/gpu_runs2.tar.gz"
