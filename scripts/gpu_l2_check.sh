#!/usr/bin/env bash
# One call on a lent H200 (carry .whl; ~3 min): the L2 prefetch of the next decode weights (LLMRS_L2_PREFETCH,
# cuda_l2 + elementwise.cu's l2_prefetch): its GPU test (bit-identical logits, eager and graphs), then single-stream
# decode A/Bs of its points and budgets (scripts/l2_prefetch_ab.py: one process a preset, variants in turn).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-l2}; mkdir -p "$OUT"; R=/tmp/res-l2; rm -rf $R; mkdir -p $R
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
{
TEST_TIMEOUT=150 TEST_PATHS="tests/test_l2_prefetch_gpu.py tests/test_cuda_graphs.py" gpu_tests
ab() {  # NAME ARGS...
  step "A/B $1"; shift_name=$1; shift
  timeout ${AB_T:-150} python3 scripts/l2_prefetch_ab.py "$@" --json $R/ab-$shift_name.json > $R/ab-$shift_name.log 2>&1
  tail -${AB_TAIL:-8} $R/ab-$shift_name.log
}
ab 7b --like qwen2.5-7b --variants "${V7:-0/attn@24/attn@40/attn,norm2@24/all@24/all@40/norm1,norm2@24}"
ab 7b-awq --like qwen2.5-7b --quant awq --variants "${VQ:-0/attn@24/attn@40/all@24/all@40}"
ab 3b --like qwen2.5-3b --variants "0/attn@16/attn@32/all@32"
ab 0.5b --like qwen2.5-0.5b --variants "0/attn@8/all@16"
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
