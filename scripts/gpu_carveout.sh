#!/usr/bin/env bash
# One call on a lent H200 (carry .whl; ~3 min): does matvec_bf16_smem (the o projection's matrix copied into
# shared memory before pdl_wait) lose because its 200 KB blocks cannot join SMs configured with a small shared
# carveout until they drain? The same A/B with every kernel's preferred carveout at the maximum
# (LLMRS_SMEM_CARVEOUT=100), and at the default, single stream (scripts/ablate_decode.py, 3 rounds).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-carveout}; mkdir -p "$OUT"; R=/tmp/res-carveout; rm -rf $R; mkdir -p $R
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
{
for cv in "" 100; do
  for p in qwen2.5-7b qwen2.5-3b; do
    step "A/B $p LLMRS_SMEM_CARVEOUT=$cv"
    LLMRS_SMEM_CARVEOUT=$cv timeout 150 python3 scripts/ablate_decode.py --like $p --rounds 3 \
      --variants "set:matvec_smem=False/full" --json $R/ab-$p-cv$cv.json > $R/ab-$p-cv$cv.log 2>&1
    sed -n '/^---/,$p' $R/ab-$p-cv$cv.log; tail -2 $R/ab-$p-cv$cv.log | grep -i error
  done
done
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
