#!/usr/bin/env bash
# Session 24, call 7 (carry .whl, ~2 min): the two tiny-AWQ-model tests after their setup moved into
# tests/cuda_helpers.tiny_awq_runners (the GEMV's fused epilogues, the GEMMs' SiLU forms).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s24}; mkdir -p "$OUT"; R=/tmp/res-s24c7; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
TEST_TIMEOUT=150 TEST_PATHS="tests/test_gemv_q4_gpu.py tests/test_gemm_q4_silu_gpu.py" \
  TEST_K="awq_decode_with_the_fused or awq_batched_steps" gpu_tests
} 2>&1 | tee $OUT/summary.txt
cp $R/gpu_tests.log $OUT/ 2>/dev/null
