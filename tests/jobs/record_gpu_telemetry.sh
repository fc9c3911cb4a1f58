#!/usr/bin/env bash
# Record real GPU telemetry (NVML through nvidia-ml-py) beside a real `traceread collect` on one GPU, and check
# the readers on it. Needs a CUDA machine with torch and `pip install 'traceread[gpu]'` (nvidia-ml-py); run from
# the repo root. Leaves the GPU's settings (clocks, power limit) as they are: it only reads its sensors.
#   <gpu>_telemetry_1gpu   1 rank, NCCL, the 4-layer d=1024 transformer of record_gpu_samples.sh for ~60 s
#                          (3000 steps), default collect options: RUN/telemetry/gpu{i}.jsonl at ~1 Hz for every
#                          local GPU (clocks, temperature, power vs limit, throttle reasons, ECC/retired pages,
#                          PCIe replays, NVLink errors, Xid events), run.json "telemetry" = the sampler's state.
# OUT (default sample_traces) receives the run folder; NAME overrides its name (default: h200_telemetry_1gpu).
# Size: one gpu{i}.jsonl line is ~400 bytes; 60 s x 8 GPUs is ~200 KB (gzip the folder's traces as usual).
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"
out="${OUT:-sample_traces}"
name="${NAME:-h200_telemetry_1gpu}"
py="${PYTHON:-python}"
port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

"$py" -c 'import pynvml; pynvml.nvmlInit(); print("NVML", pynvml.nvmlSystemGetDriverVersion(), pynvml.nvmlDeviceGetCount(), "GPU(s)")' \
  || { echo "nvidia-ml-py cannot talk to the driver: pip install 'traceread[gpu]' on a CUDA machine"; exit 2; }

rm -rf "${out:?}/$name"
"$py" -m traceread.cli collect -o "$out/$name" --wait 5 --warmup 2 --active 5 -- \
  "$py" -m torch.distributed.run --nproc-per-node 1 --master-port "$(port)" tests/jobs/transformer_train.py --steps 3000
echo "$name exit $?"

# The readers on what was recorded: one line per GPU, the sampler's state, and the report.
PYTHONPATH="$repo" "$py" - "$out/$name" <<'PY'
import json, sys
from pathlib import Path
from traceread.read.telemetry import read_telemetry
from traceread.analysis.telemetry import gpu_state
run = Path(sys.argv[1])
print("run.json telemetry:", json.loads((run / "run.json").read_text()).get("telemetry"))
warns = []
for g in read_telemetry(run, warns.append):
    st = gpu_state(g, int(g.t_ns[0]), int(g.t_ns[-1])) if len(g.t_ns) else None
    print(f"gpu{g.gpu} {g.info.get('name')}: {len(g.t_ns)} samples, xids {g.xids}, state {st}")
print("warnings:", warns)
PY
"$py" -m traceread.cli report "$out/$name" --format text --no-html | head -20
