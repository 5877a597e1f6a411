#!/usr/bin/env bash
# session11 call8: call7's tree with the tests mended (references that read the row form upload with it kept;
# call7: an illegal address from test_gemm_q4_gpu's dequant_q4_bf16 reference given a released row form's NULL,
# which failed every later test of that process): the 4-bit test files first, then the whole GPU suite.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s11}; mkdir -p "$OUT"; R=/tmp/res-s11c8; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
step "4-bit GPU test files"
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider -x tests/test_gemm_q4_gpu.py tests/test_gemv_q4_gpu.py \
  tests/test_quant_gpu.py > $R/q4-tests.log 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|^E " $R/q4-tests.log | head -20
TEST_TIMEOUT=330 gpu_tests
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
