#!/usr/bin/env bash
# Session 28, call 5 (no carry, ~2 min): where call 4's 0.5B and 3B steps go at 256 decodes: `llmrs profile` at
# batch 1 and 256, context 384 (about call 4's mean context), and a 256-token prefill: the GPU's step wall to set
# against the server's TPOT (0.5B 3.7-5.6 ms, 3B 6.3-6.5 ms at 256 concurrent).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/llmrs-s28}; mkdir -p "$OUT"
for m in 0.5b 3b; do
  echo "=== qwen2.5-$m ($(date +%T))"
  timeout 150 python3 -m llmrs profile --synthetic qwen2.5-$m --batch 1,256 --context 384 --prefill-len 256 --top 8 \
    -o $OUT/profile-$m.json > $OUT/profile-$m.txt 2>&1
  sed -n 1,16p $OUT/profile-$m.txt
done 2>&1 | tee $OUT/call5.log
