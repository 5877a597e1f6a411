#!/usr/bin/env bash
# One call on a lent H200 (carry .whl; ~6 min without items 3-4): gemm_q4.cu's wgmma GEMMs (sm_90a), written in the
# fourteenth session without device time: the 4-bit GEMM's Hopper form (gemm_q4wg{z,m}) and the bf16 GEMM with K
# split over a cluster (gemm_bf16wg_s{S}). 1. their tests (tests/test_gemm_q4_gpu.py, test_gemm_bf16_wgmma_gpu.py;
# WG_TESTS adds paths); 2. scripts/bench_gemm_q4_forms.py (the 7B's four AWQ linears at 64 .. 4096 tokens: mma.sync,
# wgmma, dequantize + cuBLAS, bf16 cuBLAS) and scripts/bench_gemm_bf16_forms.py (the 7B's bf16 linears: cuBLAS
# against each cluster size); 3. WG_PROFILE=1: `llmrs profile` of the AWQ 7B step at 64 / 256 sequences with and
# without the 4-bit form; 4. WG_SERVE=1: the synthetic 7B servers at 64 and 256 concurrent (new prompts), AWQ with
# LLMRS_Q4_WGMMA=0 / 1 (issue 6: >= bf16 under load) and bf16 with LLMRS_BF16_WGMMA=0 / 1 (issue 8: >= 16,000 at
# 256). Items 3 and 4 take ~3 and ~6 min: one call each (WG_SKIP_TESTS=1 leaves out 1 and 2). Item 1 also runs the
# quantized / bf16 parity and graph tests with every opt-in on (LLMRS_Q4_BF16_INPUT=1 included).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-wg}; mkdir -p "$OUT"; R=/tmp/res-wg; rm -rf $R; mkdir -p $R
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
{
step "sm_90a module"
timeout 120 python3 -c "
from llmrs.backends.cuda_kernels import get_kernels
k = get_kernels(); print('cc', k.cc, 'arch', k.wgmma_arch, 'kernels', sorted(k.wgmma_fns()))" 2>&1 | tail -5
if [ -z "${WG_SKIP_TESTS:-}" ]; then
step "probe: one tile, structured inputs (where a layout error would show)"
timeout 120 python3 scripts/wgmma_probe.py > $R/probe.txt 2>&1; tail -40 $R/probe.txt
step "tests: gemm_q4 (wgmma included), gemv_q4, quantized parity"
TEST_TIMEOUT=420 TEST_PATHS="tests/test_gemm_q4_gpu.py tests/test_gemm_bf16_wgmma_gpu.py ${WG_TESTS:-}" \
  TEST_ARGS="-x" gpu_tests
step "end to end with every opt-in on: quantized / bf16 parity and graph tests"
LLMRS_Q4_WGMMA=1 LLMRS_BF16_WGMMA=1 LLMRS_Q4_BF16_INPUT=1 timeout 300 python3 -m pytest -q -m gpu -p no:cacheprovider \
  -x tests/test_quant_gpu.py tests/test_cuda_parity.py tests/test_cuda_graphs.py > $R/optin-tests.log 2>&1
tail -3 $R/optin-tests.log
step "bench: four AWQ linears per form"
timeout 240 python3 scripts/bench_gemm_q4_forms.py --tokens ${WG_TOKENS:-64,128,192,256,512,1024,4096} \
  --json $R/forms.json > $R/forms.txt 2>&1; tail -12 $R/forms.txt
step "bench: bf16 linears, cuBLAS against the cluster GEMM"
timeout 180 python3 scripts/bench_gemm_bf16_forms.py --json $R/forms-bf16.json > $R/forms-bf16.txt 2>&1
tail -8 $R/forms-bf16.txt
fi
if [ -n "${WG_PROFILE:-}" ]; then
  for v in 0 1; do
    step "profile 7B AWQ, batch 64,256, LLMRS_Q4_WGMMA=$v"
    LLMRS_Q4_WGMMA=$v LLMRS_Q4_BF16_INPUT=$v timeout 240 python3 -m llmrs profile --synthetic qwen2.5-7b-awq --batch 64,256 --context 512 \
      --out $R/profile-awq-wg$v.json > $R/profile-awq-wg$v.txt 2>&1; grep -E "step|busy|gemm|dequant|matmul" \
      $R/profile-awq-wg$v.txt | head -12
  done
fi
if [ -n "${WG_SERVE:-}" ]; then
  for model in ${WG_SERVE_MODELS:-qwen2.5-7b-awq qwen2.5-7b}; do
    var=$([ $model = qwen2.5-7b ] && echo LLMRS_BF16_WGMMA || echo LLMRS_Q4_WGMMA)
    for v in 0 1; do
      step "server $model, $var=$v: 64 and 256 concurrent"
      SERVE_MODEL=$model serve_up $model-wg$v $var=$v LLMRS_Q4_BF16_INPUT=$v || continue
      for c in 64 256; do load_bench bench-7b-$model-wg$v-c$c $c $((5000 + 10 * v + c)); done
      serve_down
    done
  done
  bench_table $R
fi
} 2>&1 | tee $OUT/summary.txt
cp $R/forms.txt $R/forms-bf16.txt $R/probe.txt $OUT/ 2>/dev/null
tar czf $OUT/results.tgz -C $R .
