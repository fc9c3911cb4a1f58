#!/usr/bin/env bash
# Every benchmark, in the order the README's speed tables were measured (make bench).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
$PY bench/make_large.py                 # bench/data/large8: 8 ranks x ~45 MB, tiled from a real DLRM trace
$PY bench/bench_read.py                 # reader: cold / cached vs HTA TraceAnalysis load
# reader vs the decode floor (gunzip + typed decode) and HTA, one big set at a time (README "Speed")
$PY bench/bench_stream.py bench/data/large8 --hta
$PY bench/make_large.py --set a100 --ranks 8 --mb 31 && $PY bench/bench_stream.py bench/data/a100_8x31 --hta
$PY bench/make_large.py --set a100 --ranks 1 --mb 1000 && $PY bench/bench_stream.py bench/data/a100_1x1000
$PY bench/bench_report.py large         # whole report vs HTA load + temporal + overlap + idle breakdown
$PY bench/bench_report.py scale         # 1024 simulated ranks within the machine's memory
$PY bench/bench_cross_rank.py           # cross-rank analyses on 1024 ranks x 300 collectives
$PY bench/bench_layout.py                # parallel layout on 1024 ranks x 360 collectives (TP x DP, generic descs)
$PY bench/bench_ledger.py --ranks 1024     # step ledger: map side on a real trace, reduce side on 1024 ranks
$PY bench/bench_watch.py --steps 20000 --ranks 8 --step-ms 15 --seconds 20   # slow-step watch: rank hook + launcher CPU
