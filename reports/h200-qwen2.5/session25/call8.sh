#!/usr/bin/env bash
# Session 25, call 8 (carry .whl): the final tree (the norm chain "auto": hidden size <= 2048). The GEMV's GPU tests
# (less the timing one), then the default step against LLMRS_Q4_GEMV_NORM off, best of 3 a process: 7B AWQ (auto
# leaves it off there: both rows the same path), 3B AWQ (auto takes it).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s25}; mkdir -p "$OUT"; R=/tmp/res-s25c8; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
TEST_TIMEOUT=200 TEST_PATHS="tests/test_gemv_q4_gpu.py" TEST_K="not bandwidth" gpu_tests
for p in qwen2.5-7b qwen2.5-3b; do
  step "$p AWQ: default / chain off, best of 3 a process"
  timeout 100 python3 scripts/ablate_decode.py --like $p --quant awq --rounds 3 \
    --variants "full/set:q4_gemv_norm=False" --json $R/ab-$p-awq.json > $R/ab-$p-awq.log 2>&1
  tail -3 $R/ab-$p-awq.log
done
} 2>&1 | tee $OUT/summary.txt
cp $R/gpu_tests.log $OUT/ 2>/dev/null
rm -f $R/*.csv; tar czf $OUT/results.tgz -C $R .
