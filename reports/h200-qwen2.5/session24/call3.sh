#!/usr/bin/env bash
# Session 24, call 3 (carry .whl, ~7 min): the final rule (SiLU x up fused into the wgmma forms' gate_up, the RoPE
# form taken out):
#   1. the whole GPU suite (the SmolLM2 GGUF not carried: its tests skip);
#   2. `llmrs profile --synthetic qwen2.5-7b-awq --batch 64,128,256 --context 512` (the default tree);
#   3. the 7B AWQ and bf16 servers: 256 concurrent three times, 64 once each (prompt 256, 256 new tokens, every run
#      its own prompts).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s24}; mkdir -p "$OUT"; R=/tmp/res-s24c3; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
TEST_TIMEOUT=330 gpu_tests
step "profile 7B AWQ, batch 64,128,256"
timeout 120 python3 -m llmrs profile --synthetic qwen2.5-7b-awq --batch 64,128,256 --context 512 \
  --out $R/profile-7b-awq.json > $R/profile-7b-awq.txt 2>&1
grep -E "step wall|gate_up" $R/profile-7b-awq.txt
for m in qwen2.5-7b-awq qwen2.5-7b; do
  step "server $m (defaults): 256 concurrent three times, 64 once"
  SERVE_MODEL=$m serve_up $m && {
    for run in 1 2 3; do load_bench bench-${m#qwen2.5-}-run$run-c256 256 $((2400 + 100 * run)); done
    load_bench bench-${m#qwen2.5-}-run1-c64 64 2464
    serve_down
  }
done
bench_table $R
} 2>&1 | tee $OUT/summary.txt
cp $R/gpu_tests.log $OUT/ 2>/dev/null
rm -f $R/*.csv; tar czf $OUT/results.tgz -C $R .
