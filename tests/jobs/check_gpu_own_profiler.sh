#!/usr/bin/env bash
# GPU check of issue #36 (a job's own profiler under `traceread collect`): the CPU suite covers it
# (tests/test_collect_job_profiler.py); this runs the same cases where CUPTI records CUDA activity.
# Needs a CUDA machine with torch; run from the repo root. 2 ranks share GPU 0 (DDP over gloo on CUDA
# tensors). Each case must print "exit 0", a traceread summary line "the job ran its own profiler", and
# list the job's own trace files (and traceread's where both can exist). OUT (default /tmp/own_prof).
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
out="${OUT:-/tmp/own_prof}"
py="${PYTHON:-python}"
port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
rm -rf "${out:?}" && mkdir -p "$out"
fail=0
run() {  # run NAME "COLLECT OPTIONS" JOB-ARGS...
  local name=$1 opts=$2; shift 2
  # shellcheck disable=SC2086
  "$py" -m traceread.cli collect -o "$out/$name/run" $opts -- "$py" -m torch.distributed.run --nproc-per-node 2 \
    --master-port "$(port)" tests/jobs/own_profiler_train.py --cuda --trace-dir "$out/$name/job_traces" "$@" \
    > "$out/$name.log" 2>&1
  local code=$?
  echo "$name exit $code"; [ "$code" = 0 ] || fail=1
  grep '^\[traceread\]' "$out/$name.log" | sed 's/^/    /'
  ls "$out/$name/job_traces" "$out/$name/run/traces" 2>/dev/null | sed 's/^/    /'
}
run schedule-inside-defaults "" --api schedule --first 10 --iters 5
run schedule-inside-kept "--wait 2 --warmup 1 --active 10" --api schedule --first 10 --iters 5
run startstop-before "--wait 0 --warmup 1 --active 3" --api startstop --first 0 --iters 2
run context-after "--wait 0 --warmup 1 --active 3" --api context --first 16 --iters 3
run autograd-inside "--wait 1 --warmup 1 --active 10" --api autograd --first 8 --iters 3
exit $fail
