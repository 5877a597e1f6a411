#!/usr/bin/env bash
# Session 25, call 6 (carry .whl): the RMSNorms between the 4-bit GEMVs carried by them (gemm_q4.cu GV_NORM_OUT /
# GV_NORM_IN, cuda_q4gemm.q4_norm_chain, LLMRS_Q4_GEMV_NORM): o / down also write x * g and the tiles' sums of x^2,
# gate_up / qkv scale by 1 / rms; the GEMVs' main loops untouched (the in-loop fold of calls 1-2 lost).
#   1. GPU tests: the producer's outputs, the consumer against rms_norm + the plain form, the tiny AWQ model's steps
#      against the CPU reference, the fused-epilogue bit-exactness test (with the chain off);
#   2. the step A/B, best of 3 a process (scripts/ablate_decode.py "full/set:q4_gemv_norm=False"): 7B AWQ, 3B AWQ;
#   3. the 7B AWQ decode bench, one run a process, LLMRS_Q4_GEMV_NORM=1/0 interleaved, twice.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s25}; mkdir -p "$OUT"; R=/tmp/res-s25c6; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
TEST_TIMEOUT=200 TEST_PATHS="tests/test_gemv_q4_gpu.py" TEST_K="norm or fused or pair" gpu_tests
grep -h "norm chain" $R/gpu_figures.jsonl
for p in qwen2.5-7b qwen2.5-3b; do
  step "$p AWQ: norm chain on / off, best of 3 a process"
  timeout 150 python3 scripts/ablate_decode.py --like $p --quant awq --rounds 3 \
    --variants "full/set:q4_gemv_norm=False" --json $R/ab-$p-awq.json > $R/ab-$p-awq.log 2>&1
  tail -3 $R/ab-$p-awq.log
done
step "7B AWQ decode bench, one run a process, LLMRS_Q4_GEMV_NORM=1/0 interleaved"
for r in 1 2; do
  for n in 1 0; do
    LLMRS_Q4_GEMV_NORM=$n timeout 100 python3 -m llmrs synth --like qwen2.5-7b --quant awq --decode-bench \
      --bandwidth-gbs 4296 --prompt-len 256 --steps 256 --json $R/decode-7b-awq-norm$n-r$r.json \
      > $R/decode-7b-awq-norm$n-r$r.log 2>&1
    python3 -c "import json; d=json.load(open('$R/decode-7b-awq-norm$n-r$r.json')); print('7B AWQ norm chain $n round $r:', d['ms_per_token'], 'ms/token', round(100 * d['fraction_of_floor_measured'], 1), '% of floor')"
  done
done
} 2>&1 | tee $OUT/summary.txt
cp $R/gpu_tests.log $OUT/ 2>/dev/null
rm -f $R/*.csv; tar czf $OUT/results.tgz -C $R .
