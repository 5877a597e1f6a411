#!/usr/bin/env bash
# Session 23, call 9 (carry .whl, ~2.5 min): every 4-bit shape on the GEMV at one token (the rule's threshold 0,
# calls 7-8): the GEMV and quantized-model GPU tests under the new default.
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh
use_wheels || exit 1
R=/tmp/res-s23c9; mkdir -p $R
{
TEST_TIMEOUT=150 TEST_PATHS="tests/test_quant_gpu.py tests/test_gemv_q4_gpu.py" TEST_K="not bandwidth and not timing" gpu_tests
cp $R/gpu_tests.log $OUT/
} 2>&1 | tee $OUT/summary.txt
