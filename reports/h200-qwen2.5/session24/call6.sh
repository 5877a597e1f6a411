#!/usr/bin/env bash
# Session 24, call 6 (carry .whl, ~2 min): the final rule (mma.sync's SiLU form at MT 4 only: 33-192 tokens; MT 2
# lost in call5): tests/test_gemm_q4_silu_gpu.py.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s24}; mkdir -p "$OUT"; R=/tmp/res-s24c6; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
TEST_TIMEOUT=200 TEST_PATHS="tests/test_gemm_q4_silu_gpu.py" gpu_tests
} 2>&1 | tee $OUT/summary.txt
cp $R/gpu_tests.log $OUT/ 2>/dev/null
