#!/usr/bin/env bash
# One call on a lent H200 (carry .whl; ~6 min): the wgmma form of the 4-bit GEMM (gemm_q4.cu's gemm_q4wg{z,m},
# sm_90a). 1. its kernel tests and the GEMM / GEMV / quantized-parity tests; 2. scripts/bench_gemm_q4_forms.py (the
# 7B's four AWQ linears at 64 .. 4096 tokens: mma.sync, wgmma, dequantize + cuBLAS, and bf16 cuBLAS alone);
# 3. the AWQ 7B decode step at 64 / 256 sequences under `llmrs profile` with and without the wgmma form.
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
step "tests: gemm_q4 (wgmma included), gemv_q4, quantized parity"
TEST_TIMEOUT=420 TEST_PATHS="tests/test_gemm_q4_gpu.py ${WG_TESTS:-}" TEST_ARGS="-x" gpu_tests
step "bench: four AWQ linears per form"
timeout 300 python3 scripts/bench_gemm_q4_forms.py --tokens ${WG_TOKENS:-64,128,192,256,512,1024,4096} \
  --json $R/forms.json > $R/forms.txt 2>&1; tail -12 $R/forms.txt
if [ -n "${WG_PROFILE:-}" ]; then
  for v in 0 1; do
    step "profile 7B AWQ, batch 64,256, LLMRS_Q4_WGMMA=$v"
    LLMRS_Q4_WGMMA=$v timeout 240 python3 -m llmrs profile --synthetic qwen2.5-7b-awq --batch 64,256 --context 512 \
      --out $R/profile-awq-wg$v.json > $R/profile-awq-wg$v.txt 2>&1; grep -E "step|busy|gemm|dequant|matmul" \
      $R/profile-awq-wg$v.txt | head -12
  done
fi
} 2>&1 | tee $OUT/summary.txt
cp $R/forms.txt $OUT/ 2>/dev/null
tar czf $OUT/results.tgz -C $R .
