#!/usr/bin/env bash
# session 18 call1 (branch down-pair-rebased = main ae90df2 + exp/down-pair): the synth.single_stream refactor's GPU
# check (tests/test_quant_gpu.py runs decode_benchmark) and the long-K matvec A/B (scripts/gpu_down_ab.sh).
set -uo pipefail
. scripts/gpu_lib.sh && use_wheels || exit 1
R=/tmp/res-c1; mkdir -p $R
{
TEST_TIMEOUT=200 TEST_PATHS="tests/test_quant_gpu.py" gpu_tests
} 2>&1 | tee $OUT/quant_tests.txt
cp $R/gpu_tests.log $OUT/quant_tests.log
bash scripts/gpu_down_ab.sh
