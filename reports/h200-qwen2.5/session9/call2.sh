#!/usr/bin/env bash
# Session 9, call 2 (carry .whl): main + decode_attn_tc merged with the auto rule (tc from 2 tokens; from one for
# heads <= 64 dims; 32-key minimum splits). Every GPU test; `llmrs profile` decode walls at B = 1..32 with
# LLMRS_ATTN_KERNEL=partial (the rule before: partial below 32 x 7B sequences) against auto; single-stream decode
# auto vs tc twice; then the server, cold prompts per point, bf16 7B and AWQ 7B (1 stream, 64 / 256 concurrent x 2).
cd "$(dirname "$0")/../../.."
export OUT=${OUT:-/tmp/llmrs-s9c2}; mkdir -p $OUT; R=/tmp/res-s9c2; mkdir -p $R
. scripts/gpu_lib.sh; use_wheels
{
TEST_TIMEOUT=200 gpu_tests
for p in qwen2.5-7b qwen2.5-0.5b; do
  for v in partial auto; do
    step "profile $p B=1,2,4,8,16,32 LLMRS_ATTN_KERNEL=$v"
    LLMRS_ATTN_KERNEL=$v timeout 90 python3 -m llmrs profile --synthetic $p --batch 1,2,4,8,16,32 --context 512 \
      --steps 3 > $R/profile-$p-$v.txt 2>&1
    grep -E "step wall|decode attention" $R/profile-$p-$v.txt
  done
done
} 2>&1 | tee $OUT/summary.txt
cp $R/gpu_tests.log $OUT/
OUT=$OUT/ab TESTS=0 RUNS="1 2" AWQ=0 AB_VAR=LLMRS_ATTN_KERNEL AB_VALUES="auto tc" \
  SERVE_MODELS="qwen2.5-7b qwen2.5-7b-awq" bash scripts/gpu_ab.sh 2>&1 | grep -v '^$'
tar czf $OUT/results.tgz -C $R .
