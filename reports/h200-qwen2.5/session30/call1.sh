#!/usr/bin/env bash
# Session 30, call 1 (no carry, ~2 min): what a kernel boundary costs against a grid barrier in one persistent kernel
# (scripts/grid_barrier_bench.py: 72 dependent one-token matvecs of the 3B's o shape and of the 7B's, as a PDL chain
# in a graph, without PDL, and as phases of one kernel), then the 3B one-stream baseline on this lease.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/llmrs-s30}; mkdir -p "$OUT"; R=/tmp/res-s30c1; rm -rf $R; mkdir -p $R
{
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv
for n in 2048 1024; do
  python3 scripts/grid_barrier_bench.py --n $n --k 2048 --layers 72 --json $R/grid-barrier-n$n.json
done
timeout 100 python3 -m llmrs synth --like qwen2.5-3b --decode-bench --bandwidth-gbs 4296 --prompt-len 256 \
  --steps 256 --json $R/decode-3b.json > $R/decode-3b.log 2>&1
python3 -c "import json; d=json.load(open('$R/decode-3b.json')); print('3b:', d['ms_per_token'], 'ms/token')"
} 2>&1 | tee $OUT/call1.log
cp $R/*.json $OUT/
