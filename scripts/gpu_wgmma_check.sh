#!/usr/bin/env bash
# One call on a lent H200 (carry .whl; ~6 min): the wgmma form of the 4-bit GEMM (gemm_q4.cu's gemm_q4wg{z,m},
# sm_90a). 1. its kernel tests and the GEMM / GEMV / quantized-parity tests; 2. scripts/bench_gemm_q4_forms.py (the
# 7B's four AWQ linears at 64 .. 4096 tokens: mma.sync, wgmma, dequantize + cuBLAS, and bf16 cuBLAS alone);
# 3. WG_PROFILE=1: the AWQ 7B decode step at 64 / 256 sequences under `llmrs profile` with and without the wgmma
# form; 4. WG_SERVE=1: the synthetic 7B AWQ server at 64 and 256 concurrent (new prompts), LLMRS_Q4_WGMMA=0 / 1 (the
# issue-6 target: >= the bf16 server's 15.3k at 256). Items 3 and 4 take ~3 min each: not both in one call with 1-2.
# WG_SKIP_TESTS=1 leaves out 1 and 2.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-wg}; mkdir -p "$OUT"; R=/tmp/res-wg; rm -rf $R; mkdir -p $R
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
{
step "sm_90a module"
timeout 120 python3 -c "
from llmrs.engine.backends.cuda_kernels import get_kernels
k = get_kernels(); print('cc', k.cc, 'wgmma', k.wgmma)" 2>&1 | tail -5
if [ -z "${WG_SKIP_TESTS:-}" ]; then
step "tests: gemm_q4 (wgmma included), gemv_q4, quantized parity"
TEST_TIMEOUT=420 TEST_PATHS="tests/test_gemm_q4_gpu.py ${WG_TESTS:-}" TEST_ARGS="-x" gpu_tests
step "bench: four AWQ linears per form"
timeout 300 python3 scripts/bench_gemm_q4_forms.py --tokens ${WG_TOKENS:-64,128,192,256,512,1024,4096} \
  --json $R/forms.json > $R/forms.txt 2>&1; tail -12 $R/forms.txt
fi
if [ -n "${WG_PROFILE:-}" ]; then
  for v in 0 1; do
    step "profile 7B AWQ, batch 64,256, LLMRS_Q4_WGMMA=$v"
    LLMRS_Q4_WGMMA=$v timeout 240 python3 -m llmrs profile --synthetic qwen2.5-7b-awq --batch 64,256 --context 512 \
      --out $R/profile-awq-wg$v.json > $R/profile-awq-wg$v.txt 2>&1; grep -E "step|busy|gemm|dequant|matmul" \
      $R/profile-awq-wg$v.txt | head -12
  done
fi
if [ -n "${WG_SERVE:-}" ]; then
  for v in 0 1; do
    step "server 7B AWQ, LLMRS_Q4_WGMMA=$v: 64 and 256 concurrent"
    SERVE_MODEL=qwen2.5-7b-awq serve_up awq-wg$v LLMRS_Q4_WGMMA=$v || continue
    for c in 64 256; do load_bench bench-7b-awq-wg$v-c$c $c $((5000 + 10 * v + c)); done
    serve_down
  done
  bench_table $R
fi
} 2>&1 | tee $OUT/summary.txt
cp $R/forms.txt $OUT/ 2>/dev/null
tar czf $OUT/results.tgz -C $R .
