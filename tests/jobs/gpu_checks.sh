#!/usr/bin/env bash
# The GPU checks of this wave in one call (a lent GPU machine with a CUDA torch; not in CI), each bounded:
#   1. tests/jobs/record_gpu_telemetry.sh   a real `traceread collect` with NVML telemetry (issue #34)
#   2. tests/jobs/check_gpu_own_profiler.sh  a job's own profiler with CUDA activity under collect (issue #36)
#   3. tests/jobs/nccl_failures_gpu.py       real NCCL failure logs (issue #35)
# Everything recorded goes into one tarball, $OUT/gpu_runs.tar.gz; it is analysed on the CPU machine
# (the GPU image has no polars: the reports there are expected to fail).
set -u
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
export PYTHON="${PYTHON:-python3}"
work=/tmp/gpu_checks
rm -rf "$work" && mkdir -p "$work"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv > "$work/nvidia-smi.csv" 2>&1
"$PYTHON" -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))' > "$work/torch.txt" 2>&1
OUT="$work" NAME=h200_telemetry_1gpu timeout 240 bash tests/jobs/record_gpu_telemetry.sh > "$work/telemetry.log" 2>&1
echo "telemetry: exit $?"
OUT="$work/own_prof" timeout 240 bash tests/jobs/check_gpu_own_profiler.sh > "$work/own_prof.log" 2>&1
echo "own profiler: exit $?"
timeout 150 "$PYTHON" tests/jobs/nccl_failures_gpu.py "$work/nccl_failures" > "$work/nccl_failures.log" 2>&1
echo "nccl failures: exit $?"
tail -n 40 "$work/telemetry.log" "$work/own_prof.log" "$work/nccl_failures.log"
tar czf "${OUT:-/tmp}/gpu_runs.tar.gz" -C "$work" .
ls -la "${OUT:-/tmp}/gpu_runs.tar.gz"
