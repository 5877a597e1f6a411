#!/usr/bin/env bash
# One call on a lent H200 (carry .whl; ~3 min): does matvec_bf16_smem (the o projection's matrix copied into
# shared memory before pdl_wait) lose because its 200 KB blocks cannot join SMs configured with a small shared
# carveout until they drain? The A/B (scripts/ablate_decode.py, single stream, 3 rounds) with the maximum
# preferred carveout (LLMRS_SMEM_CARVEOUT=100) for the kernels listed in each CVK value (empty: every kernel;
# "-": none, the default).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-carveout}; mkdir -p "$OUT"; R=/tmp/res-carveout; rm -rf $R; mkdir -p $R
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
{
i=0
for cvk in ${CVKS:-"attn_,matvec_bf16_smem,matvec_rope" "attn_,matvec_bf16_smem" "attn_,matvec_bf16_smem,matvec_rope,rms_norm"}; do
  i=$((i + 1))
  for p in ${PRESETS:-qwen2.5-7b qwen2.5-3b}; do
    step "A/B $p carveout 100 for: $cvk"
    LLMRS_SMEM_CARVEOUT=100 LLMRS_SMEM_CARVEOUT_KERNELS=$cvk timeout 150 python3 scripts/ablate_decode.py --like $p \
      --rounds 3 --variants "set:matvec_smem=False/full" --json $R/ab-$p-cvk$i.json > $R/ab-$p-cvk$i.log 2>&1
    sed -n '/^---/,$p' $R/ab-$p-cvk$i.log; tail -2 $R/ab-$p-cvk$i.log | grep -i error
  done
done
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
