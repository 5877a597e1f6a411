#!/usr/bin/env bash
# Session 16, call 3 (carry .whl): W2_UPPER_FROM 424 (the crossover call2 measured); below 128 tokens, does the
# 128-token wgmma form with its K slices filling the GPU (wave_fill_splits) beat mma.sync?
#   1. tests/test_gemm_q4_gpu.py (the 480-token case of the backend path);
#   2. the forms at 32 / 64 / 96 tokens, every cluster size;
#   3. `llmrs profile --synthetic qwen2.5-7b-awq --batch 32,64,96` with LLMRS_Q4_WGMMA_FROM=128 (default) and 33;
#   4. the 7B AWQ server at 64 concurrent, both, twice each.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s16}; mkdir -p "$OUT"; R=/tmp/res-s16c3; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
TEST_TIMEOUT=100 TEST_PATHS="tests/test_gemm_q4_gpu.py" gpu_tests
step "forms at 32-96 tokens"
timeout 150 python3 scripts/bench_gemm_q4_forms.py --tokens 32,64,96 --splits --json $R/forms.json \
  > $R/forms.txt 2>&1; tail -5 $R/forms.txt
for from in 128 33; do
  step "profile 7B AWQ, batch 32,64,96, LLMRS_Q4_WGMMA_FROM=$from"
  LLMRS_Q4_WGMMA_FROM=$from timeout 100 python3 -m llmrs profile --synthetic qwen2.5-7b-awq --batch 32,64,96 \
    --context 512 --out $R/profile-from$from.json > $R/profile-from$from.txt 2>&1
  grep -E "step wall|gemm_q4" $R/profile-from$from.txt | head -13
done
for from in 128 33; do
  step "server qwen2.5-7b-awq, LLMRS_Q4_WGMMA_FROM=$from: 64 concurrent, twice"
  SERVE_MODEL=qwen2.5-7b-awq serve_up awq-from$from LLMRS_Q4_WGMMA_FROM=$from && {
    for run in 1 2; do load_bench bench-7b-awq-from$from-run$run-c64 64 $((7000 + 100 * run + from)); done
    serve_down
  }
done
bench_table $R
} 2>&1 | tee $OUT/summary.txt
cp $R/forms.txt $OUT/ 2>/dev/null
tar czf $OUT/results.tgz -C $R .
