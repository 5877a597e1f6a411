#!/usr/bin/env bash
# Session 24, call 2 (carry .whl): which of the wgmma GEMM's fused followers pays inside the graphed step:
#   1. the end-to-end paired-form test (fixed: a lone prefill replays its 128-token graph bucket);
#   2. `llmrs profile --synthetic qwen2.5-7b-awq --batch 128,256 --context 512 --prefill-len 256` with
#      LLMRS_Q4_GEMM_EPILOGUE = 1 / silu / rope / 0, three rounds, interleaved (step walls: graph replays).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s24}; mkdir -p "$OUT"; R=/tmp/res-s24c2; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
TEST_TIMEOUT=200 TEST_PATHS="tests/test_gemm_q4_pair_gpu.py" TEST_K="awq_batched" gpu_tests
for round in 1 2 3; do
  for epi in 1 silu rope 0; do
    LLMRS_Q4_GEMM_EPILOGUE=$epi timeout 120 python3 -m llmrs profile --synthetic qwen2.5-7b-awq --batch 128,256 \
      --context 512 --prefill-len 256 --out $R/profile-$epi-r$round.json > $R/profile-$epi-r$round.txt 2>&1
    echo "epilogue $epi round $round: $(grep -E 'step wall' $R/profile-$epi-r$round.txt)"
  done
done
} 2>&1 | tee $OUT/summary.txt
cp $R/gpu_tests.log $OUT/ 2>/dev/null
tar czf $OUT/results.tgz -C $R .
