#!/usr/bin/env bash
# Session 25, call 5 (carry .whl): decode_attn_tc with 3 K / V stages a warp (decode_attn_tc3_*, two tiles in flight;
# LLMRS_ATTN_TC_STAGES):
#   1. GPU tests: decode_attn_tc against float64 / attn_partial, 3 stages == 2 stages bit for bit, in graphs; its
#      timing figure (7B, 64 / 256 decodes at context 512, 2 and 3 stages);
#   2. `llmrs profile --synthetic qwen2.5-7b --batch 64,256 --context 512`, LLMRS_ATTN_TC_STAGES=3 / 2 interleaved,
#      two rounds: the graph walls and the attention rows.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s25}; mkdir -p "$OUT"; R=/tmp/res-s25c5; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
TEST_TIMEOUT=200 TEST_PATHS="tests/test_attention_tc_gpu.py" TEST_ARGS="-s" gpu_tests
grep -h "7B attention" $R/gpu_tests.log
for round in 1 2; do
  for st in 3 2; do
    step "profile 7B bf16, batch 64,256, LLMRS_ATTN_TC_STAGES=$st (round $round)"
    LLMRS_ATTN_TC_STAGES=$st timeout 150 python3 -m llmrs profile --synthetic qwen2.5-7b --batch 64,256 \
      --context 512 --steps 5 --out $R/profile-st$st-r$round.json > $R/profile-st$st-r$round.txt 2>&1
    grep -E "step wall|decode_attn_tc" $R/profile-st$st-r$round.txt || tail -5 $R/profile-st$st-r$round.txt
  done
done
} 2>&1 | tee $OUT/summary.txt
cp $R/gpu_tests.log $OUT/ 2>/dev/null
tar czf $OUT/results.tgz -C $R .
