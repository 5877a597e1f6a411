#!/usr/bin/env bash
# One call on a lent H200 (carry .whl; ~4 min): matvec_bf16_smem (one token, the matrix copied into shared memory
# before pdl_wait: the o projection loads while the attention runs). Its GPU tests (bits equal to the warp-per-row
# matvec; the kernel, graph and parity files), then single-stream A/Bs in one process a preset
# (scripts/ablate_decode.py, variants "full" = on, "set:matvec_smem=False" = off, 3 rounds).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-mvsmem}; mkdir -p "$OUT"; R=/tmp/res-mvsmem; rm -rf $R; mkdir -p $R
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
{
TEST_TIMEOUT=300 TEST_PATHS="tests/test_cuda_kernels.py tests/test_cuda_graphs.py tests/test_cuda_parity.py" gpu_tests
for p in qwen2.5-7b qwen2.5-3b qwen2.5-0.5b; do
  step "A/B $p"
  timeout 150 python3 scripts/ablate_decode.py --like $p --rounds 3 --variants "full/set:matvec_smem=False/-attn" \
    --json $R/ab-$p.json > $R/ab-$p.log 2>&1
  sed -n '/^---/,$p' $R/ab-$p.log; tail -2 $R/ab-$p.log | grep -i error
done
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
