#!/usr/bin/env bash
# Session 25, call 1 (carry .whl): the RMSNorm folded into gemv_q4's paired forms (gemm_q4.cu NORM,
# LLMRS_Q4_GEMV_NORM / q4_gemv_norm):
#   1. GPU tests: the GEMV (new: the fold kernel by kernel and through a tiny AWQ model's decode graphs), the 4-bit
#      loaders and graphs;
#   2. the step A/B, best of 3 a process (scripts/ablate_decode.py "full/set:q4_gemv_norm=False"): 7B AWQ, 3B AWQ;
#   3. the 7B AWQ decode bench, one run a process, fold on / off interleaved, twice.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s25}; mkdir -p "$OUT"; R=/tmp/res-s25c1; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
TEST_TIMEOUT=300 TEST_PATHS="tests/test_gemv_q4_gpu.py tests/test_quant_gpu.py tests/test_cuda_graphs.py" \
  TEST_K="not bandwidth" gpu_tests
for p in qwen2.5-7b qwen2.5-3b; do
  step "$p AWQ: fold on / off, best of 3 a process"
  timeout 200 python3 scripts/ablate_decode.py --like $p --quant awq --rounds 3 \
    --variants "full/set:q4_gemv_norm=False" --json $R/ab-$p-awq.json > $R/ab-$p-awq.log 2>&1
  tail -4 $R/ab-$p-awq.log
done
step "7B AWQ decode bench, one run a process, LLMRS_Q4_GEMV_NORM=1/0 interleaved"
for r in 1 2; do
  for n in 1 0; do
    LLMRS_Q4_GEMV_NORM=$n timeout 100 python3 -m llmrs synth --like qwen2.5-7b --quant awq --decode-bench \
      --bandwidth-gbs 4296 --prompt-len 256 --steps 256 --json $R/decode-7b-awq-norm$n-r$r.json \
      > $R/decode-7b-awq-norm$n-r$r.log 2>&1
    python3 -c "import json; d=json.load(open('$R/decode-7b-awq-norm$n-r$r.json')); print('7B AWQ norm fold $n round $r:', d['ms_per_token'], 'ms/token', round(100 * d['fraction_of_floor_measured'], 1), '% of floor')"
  done
done
} 2>&1 | tee $OUT/summary.txt
cp $R/gpu_tests.log $OUT/ 2>/dev/null
rm -f $R/*.csv; tar czf $OUT/results.tgz -C $R .
