#!/usr/bin/env bash
# The slow-step watch on a CUDA machine (not run by CI): tests/jobs/slow_train.py on the GPU(s), NCCL,
# `traceread collect` with default options. Checks that the watch caught the slowdown and that each
# capture trace holds the asked ProfilerStep numbers and GPU kernels. Run from the repo root:
#   NPROC=1 bash tests/jobs/record_watch_gpu.sh          # one GPU: one rank (job-wide slowdown)
#   NPROC=2 bash tests/jobs/record_watch_gpu.sh          # two GPUs: rank 1 slow between backward and step
# OUT (default /tmp/watch_gpu) receives the run folder.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
py="${PYTHON:-python}"
nproc="${NPROC:-1}"
out="${OUT:-/tmp/watch_gpu}"
port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
where=data; slow_rank=-1
if [ "$nproc" -gt 1 ]; then where=step; slow_rank=1; fi
rm -rf "$out"
"$py" -m traceread.cli collect -o "$out" -- "$py" -m torch.distributed.run --nproc-per-node "$nproc" \
  --master-port "$port" tests/jobs/slow_train.py --device cuda --steps 320 --slow-rank "$slow_rank" \
  --slow-steps 200:239 --slow-ms 40 --slow-where "$where"
"$py" - "$out" "$nproc" <<'PY'
import gzip, json, sys
from pathlib import Path
run, nproc = Path(sys.argv[1]), int(sys.argv[2])
trig = json.loads((run / "captures" / "capture1" / "trigger.json").read_text())
print("trigger:", {k: trig[k] for k in ("kind", "ranks", "since_step", "detected_at_step", "steps", "factor")})
first, last = trig["steps"]
assert 200 <= first and last <= 239, trig
for r in range(nproc):
    events = json.load(gzip.open(run / "captures" / "capture1" / f"rank{r}.pt.trace.json.gz", "rt"))["traceEvents"]
    steps = {int(e["name"].split("#")[1]) for e in events if str(e.get("name", "")).startswith("ProfilerStep#")}
    kernels = sum(1 for e in events if e.get("cat") == "kernel")
    print(f"rank {r}: ProfilerStep {min(steps)}-{max(steps)}, {kernels} GPU kernels")
    assert steps == set(range(first, last + 1)) and kernels > 0
print("ok")
PY
