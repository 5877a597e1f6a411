#!/usr/bin/env bash
# Session 13, call 1 (carry .whl; _silu = `git archive exp/silu-template llmrs tests` made before the call):
#   1. exp/silu-template's kernel and parity tests (silu_mul_bf16 / _bf16_bf16 from one template; never run on a GPU);
#   2. the 4-bit GPU tests with gemm_q4's ring in dynamic shared memory (default stages: as before);
#   3. scripts/bench_gemm_q4.py: pipeline depths for MT 4 / MT 8 at 128-512 tokens beside dequantize + cuBLAS.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s13}; mkdir -p "$OUT"; R=/tmp/res-s13; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
if [ -d _silu ]; then
  step "exp/silu-template: kernel and parity tests"
  (cd _silu && PYTHONPATH=$PWD:/tmp/site timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_cuda_kernels.py tests/test_cuda_parity.py > $R/silu-tests.log 2>&1; tail -4 $R/silu-tests.log)
fi
step "4-bit GPU tests, gemm_q4 ring in dynamic shared memory"
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gemm_q4_gpu.py tests/test_quant_gpu.py \
  tests/test_gemv_q4_gpu.py > $R/q4-tests.log 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" $R/q4-tests.log | tail -8
step "bench_gemm_q4: stages"
timeout 240 python3 scripts/bench_gemm_q4.py --tokens 128,192,256,512 \
  --stages "8:2,4:3;8:3,4:4;8:4,4:4;8:4,4:6" --json $R/bench-gemm-q4.json > $R/bench-gemm-q4.txt 2>&1
tail -30 $R/bench-gemm-q4.txt
} 2>&1 | tee $OUT/summary.txt
cp $R/bench-gemm-q4.txt $OUT/ 2>/dev/null
tar czf $OUT/results.tgz -C $R .
