#!/usr/bin/env bash
# Wall time of a 200-step GPU training job with and without `traceread collect` (default options), interleaved,
# RUNS times each; prints one line per run and the medians. Needs a CUDA machine with torch. Run from the repo root.
set -uo pipefail
py="${PYTHON:-python}"
runs="${RUNS:-5}"
out="${OUT:-/tmp/overhead}"
mkdir -p "$out"
port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
job=(tests/jobs/transformer_train.py --steps 200 --layers 2 --batch 4)
now() { date +%s.%N; }
for i in $(seq "$runs"); do
  t0=$(now); "$py" -m torch.distributed.run --nproc-per-node 1 --master-port "$(port)" "${job[@]}" >/dev/null 2>&1; t1=$(now)
  rm -rf "$out/run$i"
  "$py" -m traceread.cli collect -o "$out/run$i" -- \
    "$py" -m torch.distributed.run --nproc-per-node 1 --master-port "$(port)" "${job[@]}" >/dev/null 2>&1; t2=$(now)
  echo "run $i plain $(awk "BEGIN{print $t1 - $t0}") s collect $(awk "BEGIN{print $t2 - $t1}") s"
done | tee "$out/times.txt"
"$py" - "$out/times.txt" <<'PY'
import statistics, sys
rows = [line.split() for line in open(sys.argv[1])]
plain = statistics.median(float(r[3]) for r in rows)
coll = statistics.median(float(r[6]) for r in rows)
print(f"median plain {plain:.2f} s, with collect {coll:.2f} s, overhead {100 * (coll / plain - 1):+.1f} %")
PY
