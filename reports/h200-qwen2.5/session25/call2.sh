#!/usr/bin/env bash
# Session 25, call 2 (carry .whl): the norm fold's x / g loads made branch-free (call1: a branch per k32 block
# serialized their round trips; 7B AWQ 1.87 -> 2.43 ms/token with the fold):
#   1. GPU tests of the fold (kernels; the tiny AWQ model's steps now against the exact CPU reference);
#   2. the step A/B, best of 3 a process: 7B AWQ, 3B AWQ.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s25}; mkdir -p "$OUT"; R=/tmp/res-s25c2; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
TEST_TIMEOUT=200 TEST_PATHS="tests/test_gemv_q4_gpu.py" TEST_K="norm or fused" gpu_tests
grep -h "norm fold" $R/gpu_figures.jsonl
for p in qwen2.5-7b qwen2.5-3b; do
  step "$p AWQ: fold on / off, best of 3 a process"
  timeout 200 python3 scripts/ablate_decode.py --like $p --quant awq --rounds 3 \
    --variants "full/set:q4_gemv_norm=False" --json $R/ab-$p-awq.json > $R/ab-$p-awq.log 2>&1
  tail -3 $R/ab-$p-awq.log
done
} 2>&1 | tee $OUT/summary.txt
cp $R/gpu_tests.log $OUT/ 2>/dev/null
rm -f $R/*.csv; tar czf $OUT/results.tgz -C $R .
